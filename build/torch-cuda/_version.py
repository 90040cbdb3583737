"""Version facts of this bundle (pure data, no imports)."""

__version__ = "1.1.0"
#: The Hub branch ``v{KERNEL_VERSION}`` that ``kernels.get_kernel(..., version=KERNEL_VERSION)`` loads.
KERNEL_VERSION = 1
#: The nvidia-cutlass-dsl release every kernel here is compiled and verified with.
CUTLASS_DSL_VERSION = "4.8.1"
