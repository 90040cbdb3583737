"""Device code: one kernel class per module, plus arch-free ``@cute.jit`` building blocks.

Importing this package imports cutlass; the host side imports it lazily, at first compile.
"""

import cutlass

#: ``FwdSpec.dtype`` / ``CombineSpec.dtype`` -> the cutlass element type (kernels and fake compile arguments).
CUTLASS_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
