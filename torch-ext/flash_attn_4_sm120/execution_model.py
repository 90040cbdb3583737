"""The execution model: the only module that knows SM numbers.

Every kernel in this bundle is written against one contract, the SM120 execution model: warp-level
``mma.sync`` (m16n8k16, fp32 accumulate), ``ldmatrix``, at most 101376 bytes of shared memory per CTA,
no wgmma, no tcgen05/TMEM, single-CTA TMA without multicast. A GPU *runs* that model when it has the
instructions the model needs; a part with more (an H100 has 227 KB of smem and wgmma) still gets the
model's limits, so what we verify on it is what an RTX 5090 executes.

Kernels receive an ``ExecutionModel`` as a trace-time constant and branch on its named capabilities
(``model.g2s_copy is CopyKind.CP_ASYNC``), never on an SM number.

Two targets are kept apart:
  * the *dispatch* model: which part we are running on (from the CUDA device, or the
    ``FA4_SM120_DISPATCH_ARCH`` override, e.g. ``sm_120`` to force the SM120 model on another GPU);
  * the *compile* target: what ``cute.compile`` emits (``model.compile_target``, or the
    ``FA4_SM120_COMPILE_TARGET`` override, e.g. ``sm_120a`` for conformance checks on a CPU).
Both overrides are read by the public API at call time and passed down as arguments, so they are
part of every compile-cache key. So is the occupancy rule (``FA4_SM120_OCCUPANCY``): by default a part
with more shared memory per SM than the model (the H100 proxy) pads each launch so it holds the model's
CTAs per SM, since the SM120 runs one 99 KB CTA per SM where an H100 would run two.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Optional

DISPATCH_ENV = "FA4_SM120_DISPATCH_ARCH"
COMPILE_TARGET_ENV = "FA4_SM120_COMPILE_TARGET"
#: ``model`` (default): a part with more shared memory per SM than the model runs each forward kernel at
#: the model's CTAs per SM (``ExecutionModel.occupancy_launch_smem``); ``device``: at the part's own
#: (measurement only: what the H100 proxy gives when it is allowed its 228 KB).
OCCUPANCY_ENV = "FA4_SM120_OCCUPANCY"
OCCUPANCY_MODES = ("model", "device")

#: Shared memory one CTA may use under the SM120 execution model (99 KB: RTX 5090, RTX PRO 6000,
#: GB10). ``cutlass.memory.get_smem_capacity_in_bytes("sm_120")`` reports the same number.
SM120_SMEM_PER_CTA = 101376
#: Shared memory of one SM120 SM (100 KB of its 128 KB L1/shared), and what the hardware reserves per
#: resident CTA on every part since Ampere (1 KB). Together with ``SM120_SMEM_PER_CTA`` they set how
#: many CTAs of a kernel share an SM, which decides how much of one CTA's softmax the others hide.
SM120_SMEM_PER_SM = 102400
SMEM_RESERVED_PER_CTA = 1024


class MmaKind(enum.Enum):
    MMA_SYNC_F16 = "mma.sync.m16n8k16 f16/bf16 -> f32"


class Fp8MmaKind(enum.Enum):
    NONE = "none"
    MMA_SYNC_E4M3 = "mma.sync.m16n8k32 e4m3 -> f32"
    MMA_SYNC_F8F6F4 = "mma.sync kind::f8f6f4 (sm_120a)"


class CopyKind(enum.Enum):
    CP_ASYNC = "cp.async (LDGSTS)"
    TMA = "cp.async.bulk.tensor, single CTA"
    LDMATRIX = "ldmatrix"
    STMATRIX = "stmatrix"
    UNIVERSAL = "st.shared"


@dataclass(frozen=True)
class ExecutionModel:
    """What one GPU part offers to kernels written for the SM120 execution model."""

    name: str
    #: (major, minor) compute capabilities this entry describes.
    capabilities: tuple[tuple[int, int], ...]
    #: Default ``cute.compile`` target for this part.
    compile_target: str
    #: Shared memory per CTA the kernels may use: the model's limit, never the part's larger one.
    smem_per_cta: int
    mma: MmaKind
    fp8_mma: Fp8MmaKind
    #: How global -> shared tiles are loaded by the mainloops this part can run.
    g2s_copies: tuple[CopyKind, ...]
    #: How shared -> register fragments are loaded (ldmatrix on every part here).
    s2r_copy: CopyKind
    #: How register fragments are written to shared memory in epilogues.
    r2s_copy: CopyKind
    tma_multicast: bool = False
    has_setmaxnreg: bool = False
    has_wgmma: bool = False
    has_tmem: bool = False
    #: Programmatic dependent launch (``griddepcontrol``, sm_90 and later): a kernel launched with it may
    #: start while the previous kernel of its stream finishes, and waits for that kernel's memory in
    #: ``griddepcontrol.wait``. It hides the launch gap between the split-KV forward and its combine, and
    #: between the KV-cache append and the forward (``_kernels/grid_dependency``).
    has_pdl: bool = False
    #: ``red.global.add.v2.f32`` / ``.v4.f32`` (sm_90 and later; ptxas rejects them for sm_80 / sm_89): the
    #: backward adds dQ's fp32 partials two adjacent columns per instruction instead of one.
    vector_red_f32: bool = False
    max_regs_per_thread: int = 255
    #: 32-bit registers per SM (64K on every part here: registers bind CTAs per SM the same way).
    regs_per_sm: int = 65536
    #: Shared memory per SM under the model: a part with more (an H100 has 228 KB) launches each
    #: kernel padded so that it holds no more CTAs per SM than this does (``occupancy_launch_smem``).
    smem_per_sm: int = SM120_SMEM_PER_SM
    #: True for the parts the bundle is built for; False for parts that merely run the same model.
    primary: bool = False

    @property
    def has_tma(self) -> bool:
        return CopyKind.TMA in self.g2s_copies

    def supports(self, copy: CopyKind) -> bool:
        return copy in self.g2s_copies

    def ctas_per_sm(self, smem: int) -> int:
        """CTAs of ``smem`` bytes (dynamic + static) one SM of the model holds, by shared memory alone
        (registers bind the same way on every part here: 64K per SM)."""
        return max(1, self.smem_per_sm // (smem + SMEM_RESERVED_PER_CTA))

    def occupancy_launch_smem(self, smem: int, static_smem: int, device_smem_per_sm: int,
                              device_max_smem_per_cta: int) -> int:
        """Dynamic shared memory to launch a kernel that needs ``smem`` bytes (dynamic + ``static_smem``)
        with on a part of ``device_smem_per_sm`` (``device_max_smem_per_cta`` opt-in limit), so that the
        part runs as many of its CTAs per SM as the model does; 0 (no padding) on a part no larger than
        the model. Two co-resident CTAs hide each other's softmax, so this decides what the part measures:
        without it an H100 runs two 99 KB CTAs per SM where an SM120 runs one."""
        if device_smem_per_sm <= self.smem_per_sm:
            return 0
        per_sm = self.ctas_per_sm(smem)
        padded = min(device_smem_per_sm // per_sm - SMEM_RESERVED_PER_CTA, device_max_smem_per_cta) - static_smem
        return max(padded, smem - static_smem)

    def __hash__(self) -> int:
        # The model is in every compile-cache and config-memo key looked up per call; hashing all
        # fields (enums hash in Python) cost microseconds. Equal models have equal names.
        return hash(self.name)


_SM120_COMMON = dict(
    smem_per_cta=SM120_SMEM_PER_CTA,
    mma=MmaKind.MMA_SYNC_F16,
    g2s_copies=(CopyKind.CP_ASYNC, CopyKind.TMA),
    s2r_copy=CopyKind.LDMATRIX,
    r2s_copy=CopyKind.STMATRIX,
    has_setmaxnreg=True,
    has_pdl=True,
    vector_red_f32=True,
)

SM120 = ExecutionModel(
    name="sm120",
    capabilities=((12, 0),),
    compile_target="sm_120a",
    fp8_mma=Fp8MmaKind.MMA_SYNC_F8F6F4,
    primary=True,
    **_SM120_COMMON,
)
SM121 = replace(SM120, name="sm121", capabilities=((12, 1),), compile_target="sm_121a")
#: Hopper runs the SM120 model with its own compile target; wgmma/TMEM stay unused on purpose and the
#: smem limit stays the model's 101376 bytes. Its FP8 mma.sync is the m16n8k32 e4m3 form.
SM90 = replace(
    SM120,
    name="sm90",
    capabilities=((9, 0),),
    compile_target="sm_90a",
    fp8_mma=Fp8MmaKind.MMA_SYNC_E4M3,
    primary=False,
)
#: Ampere/Ada: cp.async + ldmatrix + mma.sync, no TMA, no stmatrix, no setmaxnreg.
SM80 = ExecutionModel(
    name="sm80",
    capabilities=((8, 0), (8, 6), (8, 7)),
    compile_target="sm_80",
    smem_per_cta=SM120_SMEM_PER_CTA,
    mma=MmaKind.MMA_SYNC_F16,
    fp8_mma=Fp8MmaKind.NONE,
    g2s_copies=(CopyKind.CP_ASYNC,),
    s2r_copy=CopyKind.LDMATRIX,
    r2s_copy=CopyKind.UNIVERSAL,
)
SM89 = replace(SM80, name="sm89", capabilities=((8, 9),), compile_target="sm_89",
               fp8_mma=Fp8MmaKind.MMA_SYNC_E4M3)

MODELS: tuple[ExecutionModel, ...] = (SM120, SM121, SM90, SM89, SM80)

#: The arch strings build.toml / metadata.json declare: every capability some model runs.
def declared_cuda_capabilities() -> list[str]:
    return [f"{major}.{minor}" for m in MODELS for (major, minor) in m.capabilities]


class UnsupportedDeviceError(RuntimeError):
    """The GPU lacks what the SM120 execution model needs (or there is no CUDA GPU)."""


def model_for_capability(major: int, minor: int) -> ExecutionModel:
    for m in MODELS:
        if (major, minor) in m.capabilities:
            return m
    supported = ", ".join(declared_cuda_capabilities())
    raise UnsupportedDeviceError(
        f"compute capability {major}.{minor} cannot run the SM120 execution model "
        f"(mma.sync + ldmatrix + cp.async within 99 KB of shared memory); supported capabilities: {supported}. "
        f"On Hopper/Blackwell datacenter parts use upstream flash-attn-4 instead."
    )


def model_for_arch_string(arch: str) -> ExecutionModel:
    """``"sm_120"``, ``"sm_120a"``, ``"120"``, ``"12.0"`` -> the model for that part."""
    s = arch.strip().lower().removeprefix("sm_").removeprefix("sm").rstrip("af")
    if "." in s:
        major, minor = (int(x) for x in s.split(".", 1))
    elif s.isdigit() and len(s) >= 2:
        major, minor = int(s[:-1]), int(s[-1])
    else:
        raise ValueError(f"cannot parse an architecture from {arch!r}; expected e.g. 'sm_120' or '12.0'")
    return model_for_capability(major, minor)


def resolve_dispatch_model(device_capability: Optional[tuple[int, int]], override: Optional[str]) -> ExecutionModel:
    """The model to run as: the override if given, else the device's capability."""
    if override:
        return model_for_arch_string(override)
    if device_capability is None:
        raise UnsupportedDeviceError(
            "no CUDA GPU is available: flash_attn_4_sm120 runs on SM120/SM121 (and SM80-SM90) GPUs. "
            "Without a GPU you can still compile and inspect kernels: see tools/conformance.py."
        )
    return model_for_capability(*device_capability)


def resolve_compile_target(model: ExecutionModel, override: Optional[str]) -> str:
    return override.strip() if override else model.compile_target
