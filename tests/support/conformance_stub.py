"""A tiny conformance provider: the same three functions as ``flash_attn_4_sm120.conformance``.

``PYTHONPATH=tests python tools/conformance.py --provider support.conformance_stub`` runs the gate
over these cases,
so the gate's logic (SASS families, ptxas spill parsing, smem budget) is tested against real
cutlass-dsl output without depending on the attention kernels.

Cases (``kind`` knob):
  * ``mma``: one CTA of 4 warps computes a 64x64x32 bf16 GEMM tile with ``MmaF16BF16Op``
    (m16n8k16 -> HMMA), staging A through shared memory. Conforms (46 registers on sm_120a);
    the gate's ``--maxnreg 32`` makes it spill.
  * ``copy``: an elementwise kernel with no MMA, so the gate must report "no HMMA".
``smem_bytes`` is the dynamic shared memory the launch requests (at least the 4096-byte A tile for
``mma``, 0 for ``copy``); a case over 101376 bytes is
refused by the validity predicate unless ``check_valid=False``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32

SMEM_PER_CTA = 101376

_TILE_M, _TILE_N, _TILE_K = 64, 64, 32


@dataclass(frozen=True)
class Case:
    kind: str = "mma"
    smem_bytes: int = 8192
    subset_ci: bool = True

    @property
    def name(self) -> str:
        return f"stub_{self.kind}_smem{self.smem_bytes}"

    def describe(self) -> dict:
        d = asdict(self)
        d.pop("subset_ci")
        return d


@cute.kernel
def _mma_kernel(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, tiled_mma: cute.TiledMma,
                pad_bytes: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(BFloat16, cute.make_layout((_TILE_M, _TILE_K), stride=(_TILE_K, 1)), byte_alignment=128)
    if cutlass.const_expr(pad_bytes > 0):
        smem.allocate(pad_bytes, 128)  # stands in for the other tiles of a real kernel
    # Each of the 128 threads stages 16 contiguous bf16 of A: (64 x 32) = 128 x 16.
    row = tidx // 2
    col = (tidx % 2) * 16
    for i in cutlass.range_constexpr(16):
        sA[row, col + i] = mA[row, col + i]
    cute.arch.sync_threads()
    thr_mma = tiled_mma.get_slice(tidx)
    tCsA = thr_mma.partition_A(sA)  # (MMA, MMA_M, MMA_K)
    tCgB = thr_mma.partition_B(mB)  # (MMA, MMA_N, MMA_K)
    tCgC = thr_mma.partition_C(mC)  # (MMA, MMA_M, MMA_N)
    tCrA = tiled_mma.make_fragment_A(tCsA)
    tCrB = tiled_mma.make_fragment_B(tCgB)
    acc = tiled_mma.make_fragment_C(tCgC)
    cute.autovec_copy(tCsA, tCrA)
    cute.autovec_copy(tCgB, tCrB)
    acc.fill(0.0)
    cute.gemm(tiled_mma, acc, tCrA, tCrB, acc)
    cute.autovec_copy(acc, tCgC)


@cute.jit
def launch_mma(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream, smem_bytes: cutlass.Constexpr[int]):
    tiled_mma = cute.make_tiled_mma(cute.nvgpu.warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)), (2, 2, 1))
    pad = max(smem_bytes - _TILE_M * _TILE_K * 2, 0)
    _mma_kernel(mA, mB, mC, tiled_mma, pad).launch(grid=[1, 1, 1], block=[128, 1, 1], stream=stream)


@cute.kernel
def _copy_kernel(mA: cute.Tensor, mB: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < mA.shape[0]:
        mB[i] = mA[i] * 2.0


@cute.jit
def launch_copy(mA: cute.Tensor, mB: cute.Tensor, stream):
    _copy_kernel(mA, mB).launch(grid=[cute.ceil_div(mA.shape[0], 128), 1, 1], block=[128, 1, 1], stream=stream)


def make_case(**knobs) -> Case:
    return Case(**knobs)


def conformance_cases() -> list[Case]:
    return [Case(kind="mma"), Case(kind="copy", smem_bytes=0, subset_ci=False)]


def is_valid(case: Case) -> bool:
    return case.smem_bytes <= SMEM_PER_CTA and case.kind in ("mma", "copy")


def compile_for_conformance(case: Case, target: str = "sm_120a", check_valid: bool = True):
    if check_valid and not is_valid(case):
        raise ValueError(f"{case.name} is not a valid configuration: kind must be mma or copy, "
                         f"smem_bytes <= {SMEM_PER_CTA}")
    options = f"--enable-tvm-ffi --keep-ptx --keep-cubin --keep-sass --gpu-arch={target}"
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    if case.kind == "mma":
        a = cute.runtime.make_fake_compact_tensor(BFloat16, (_TILE_M, _TILE_K), stride_order=(1, 0), assumed_align=16)
        b = cute.runtime.make_fake_compact_tensor(BFloat16, (_TILE_N, _TILE_K), stride_order=(1, 0), assumed_align=16)
        c = cute.runtime.make_fake_compact_tensor(Float32, (_TILE_M, _TILE_N), stride_order=(1, 0), assumed_align=16)
        smem = max(case.smem_bytes, _TILE_M * _TILE_K * 2)
        compiled = cute.compile(launch_mma, a, b, c, stream, smem, options=options)
        return compiled, smem
    n = cute.sym_int()
    a = cute.runtime.make_fake_tensor(Float32, (n,), stride=(1,), assumed_align=16)
    b = cute.runtime.make_fake_tensor(Float32, (n,), stride=(1,), assumed_align=16)
    return cute.compile(launch_copy, a, b, stream, options=options), case.smem_bytes
