"""Device code: one kernel class per module, plus arch-free ``@cute.jit`` building blocks.

Importing this package imports cutlass; the host side imports it lazily, at first compile.
"""

import cutlass

#: ``FwdSpec.dtype`` / ``CombineSpec.dtype`` -> the cutlass element type (kernels and fake compile arguments);
#: fp32 is an output dtype of the public combine only (``FwdSpec`` takes bf16 / fp16); e4m3 / e5m2 are
#: ``FwdSpec.kv_dtype``'s.
CUTLASS_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32,
                  "e4m3": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2}
