"""flash_attn_4_sm120: FlashAttention for consumer Blackwell GPUs (SM120/SM121), in CuTe DSL.

Load it through the Hub (``kernels.get_kernel("sm120-kernels/flash-attn-4-sm120", version=1)``) or from
a clone (``sys.path.insert(0, "build/torch-cuda"); import flash_attn_4_sm120``). Importing registers
this build's namespaced custom op and nothing else: cutlass is imported at the first compile.
"""

from ._version import CUTLASS_DSL_VERSION, KERNEL_VERSION, __version__
from .execution_model import ExecutionModel, UnsupportedDeviceError
from .combine import flash_attn_combine
from .interface import dispatch_model, flash_attn_bwd, flash_attn_func, flash_attn_fwd, flash_attn_varlen_func
from .kvcache import flash_attn_with_kvcache
from .scheduler_metadata import SchedulerMetadata, get_scheduler_metadata

__all__ = [
    "flash_attn_func",
    "flash_attn_fwd",
    "flash_attn_bwd",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "get_scheduler_metadata",
    "SchedulerMetadata",
    "dispatch_model",
    "ExecutionModel",
    "UnsupportedDeviceError",
    "__version__",
    "KERNEL_VERSION",
    "CUTLASS_DSL_VERSION",
]


def __getattr__(name):
    """``fa.precompile`` is imported on first use (it is tooling, not the call path)."""
    if name == "precompile":
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
