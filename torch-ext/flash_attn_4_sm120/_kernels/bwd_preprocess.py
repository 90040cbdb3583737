"""Backward preprocess: the per-row inputs of the main kernel (memory-bound, no MMA).

For every query row i of every (sequence, query head), over the workspace rows of
``bwd_config.ROW_PAD``-row blocks (``seqlen_info.workspace_row``):
    D'_i   = sum_c dO_ic O_ic  - dLSE_i           (fp32; dLSE only when the caller differentiates the LSE)
    LSE2_i = LSE_i * log2(e)                       (0 when LSE_i = -inf: the row saw no key and has no sink,
                                                    every score of it is masked, so P = 0 without -inf - -inf)
Rows past the sequence's length get LSE2 = +inf and D' = 0, so the main kernel's P is 0 there without a
row mask. One CTA = ROW_PAD rows of one (sequence, head): 8 lanes per row, each reading 16-byte vectors
of O and dO, the dot product summed over the 8 lanes with shuffles.
"""

from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ..bwd_config import ROW_PAD
from ..execution_model import ExecutionModel
from ..problem import LOG2_E, BwdSpec
from . import CUTLASS_DTYPES
from .grid_dependency import enter_grid
from .seqlen_info import lse_row, num_batches, num_heads, sequence_heads, workspace_row

_THREADS = 128
_LANES_PER_ROW = 8
_VEC = 8  # 16-bit elements per 16-byte vector


class FlashBwdPreprocess:
    def __init__(self, spec: BwdSpec, model: ExecutionModel):
        self.spec = spec
        self.model = model
        self.dtype = CUTLASS_DTYPES[spec.dtype]

    @staticmethod
    def can_implement(spec: BwdSpec, model: ExecutionModel) -> tuple[str, ...]:
        return () if spec.head_dim_v % _VEC == 0 else (f"head_dim_v={spec.head_dim_v} is not a multiple of 8",)

    @cute.jit
    def __call__(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: Optional[cute.Tensor],
                 mLSE2: cute.Tensor, mD: cute.Tensor, mCuSeqlensQ: Optional[cute.Tensor],
                 mSeqUsedQ: Optional[cute.Tensor], max_seqlen_q: Int32, stream: cuda.CUstream):
        packed = mCuSeqlensQ is not None
        rows = max_seqlen_q if const_expr(packed) else mO.shape[1]
        grid = (cute.ceil_div(rows, ROW_PAD), num_heads(mO, packed), num_batches(mO, mCuSeqlensQ))
        self.kernel(mO, mdO, mLSE, mdLSE, mLSE2, mD, mCuSeqlensQ, mSeqUsedQ).launch(
            grid=grid, block=[_THREADS, 1, 1], use_pdl=self.model.has_pdl, stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: Optional[cute.Tensor],
               mLSE2: cute.Tensor, mD: cute.Tensor, mCuSeqlensQ: Optional[cute.Tensor],
               mSeqUsedQ: Optional[cute.Tensor]):
        enter_grid(self.model.has_pdl)
        tidx, _, _ = cute.arch.thread_idx()
        blk, head, batch = cute.arch.block_idx()
        mO_s, seqlen = sequence_heads(mO, batch, mCuSeqlensQ, mSeqUsedQ)
        mdO_s, _ = sequence_heads(mdO, batch, mCuSeqlensQ, mSeqUsedQ)
        if blk * ROW_PAD < seqlen:  # the main kernel reads rows below ceil(seqlen / tile_m) * tile_m only
            gLSE = lse_row(mLSE, batch, head, mCuSeqlensQ)
            gdLSE = lse_row(mdLSE, batch, head, mCuSeqlensQ) if const_expr(mdLSE is not None) else None
            gLSE2 = workspace_row(mLSE2, batch, head, mCuSeqlensQ, mO.shape[0])
            gD = workspace_row(mD, batch, head, mCuSeqlensQ, mO.shape[0])
            lane = tidx % _LANES_PER_ROW
            chunks = self.spec.head_dim_v // _VEC
            for p in cutlass.range_constexpr(ROW_PAD * _LANES_PER_ROW // _THREADS):
                row = blk * ROW_PAD + p * (_THREADS // _LANES_PER_ROW) + tidx // _LANES_PER_ROW
                dot = Float32(0.0)
                if row < seqlen:
                    for j in cutlass.range_constexpr((chunks + _LANES_PER_ROW - 1) // _LANES_PER_ROW):
                        c = lane + j * _LANES_PER_ROW
                        if c < chunks:
                            rO = cute.make_rmem_tensor((_VEC,), self.dtype)
                            rdO = cute.make_rmem_tensor((_VEC,), self.dtype)
                            cute.autovec_copy(cute.local_tile(mO_s[row, head, None], (_VEC,), (c,)), rO)
                            cute.autovec_copy(cute.local_tile(mdO_s[row, head, None], (_VEC,), (c,)), rdO)
                            o, do = rO.load().to(Float32), rdO.load().to(Float32)
                            for e in cutlass.range_constexpr(_VEC):
                                dot += o[e] * do[e]
                for off in (4, 2, 1):
                    dot += cute.arch.shuffle_sync_bfly(dot, offset=off)
                if lane == 0:
                    lse2 = Float32.inf
                    dval = Float32(0.0)
                    if row < seqlen:
                        lse = Float32(gLSE[row])
                        lse2 = lse * Float32(LOG2_E) if lse != -Float32.inf else Float32(0.0)
                        dval = dot
                        if const_expr(mdLSE is not None):
                            dval = dot - Float32(gdLSE[row])
                    gLSE2[row] = lse2
                    gD[row] = dval
