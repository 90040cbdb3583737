"""Device code: one kernel class per module, plus arch-free ``@cute.jit`` building blocks.

Importing this package imports cutlass; the host side imports it lazily, at first compile.
"""
