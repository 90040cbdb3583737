"""Backward postprocess: dQ = scale * the fp32 accumulator, in Q's dtype and layout (no MMA).

The main kernel adds every key block's dS K into the fp32 accumulator (workspace rows, padded head
dim; ``seqlen_info.workspace_row``); this kernel scales by the softmax scale once (it commutes
with the sums), converts, and writes the rows of each sequence (rows past its length are not
written: the caller zero-fills dQ where such rows exist, i.e. with seqused_q). One CTA = 64 rows of
one (sequence, head); each thread moves 8 columns at a time (two 16-byte fp32 loads, one 16-byte store).
"""

from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ..execution_model import ExecutionModel
from ..problem import BwdSpec
from . import CUTLASS_DTYPES
from .grid_dependency import enter_grid
from .seqlen_info import num_batches, num_heads, sequence_heads, workspace_row

_THREADS = 128
_ROWS = 64
_VEC = 8


class FlashBwdPostprocess:
    def __init__(self, spec: BwdSpec, model: ExecutionModel):
        self.spec = spec
        self.model = model
        self.dtype = CUTLASS_DTYPES[spec.dtype]

    @staticmethod
    def can_implement(spec: BwdSpec, model: ExecutionModel) -> tuple[str, ...]:
        return () if spec.head_dim % _VEC == 0 else (f"head_dim={spec.head_dim} is not a multiple of 8",)

    @cute.jit
    def __call__(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32,
                 mCuSeqlensQ: Optional[cute.Tensor], mSeqUsedQ: Optional[cute.Tensor], max_seqlen_q: Int32,
                 stream: cuda.CUstream):
        packed = mCuSeqlensQ is not None
        rows = max_seqlen_q if const_expr(packed) else mdQ.shape[1]
        grid = (cute.ceil_div(rows, _ROWS), num_heads(mdQ, packed), num_batches(mdQ, mCuSeqlensQ))
        self.kernel(mdQacc, mdQ, softmax_scale, mCuSeqlensQ, mSeqUsedQ).launch(
            grid=grid, block=[_THREADS, 1, 1], use_pdl=self.model.has_pdl, stream=stream)

    @cute.kernel
    def kernel(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32,
               mCuSeqlensQ: Optional[cute.Tensor], mSeqUsedQ: Optional[cute.Tensor]):
        enter_grid(self.model.has_pdl)
        tidx, _, _ = cute.arch.thread_idx()
        blk, head, batch = cute.arch.block_idx()
        mdQ_s, seqlen = sequence_heads(mdQ, batch, mCuSeqlensQ, mSeqUsedQ)
        if blk * _ROWS < seqlen:
            gAcc = workspace_row(mdQacc, batch, head, mCuSeqlensQ, mdQ.shape[0])
            chunks = self.spec.head_dim // _VEC
            for p in cutlass.range_constexpr((_ROWS * chunks + _THREADS - 1) // _THREADS):
                idx = p * _THREADS + tidx
                row = blk * _ROWS + idx // chunks
                c = idx % chunks
                if idx < _ROWS * chunks and row < seqlen:
                    acc = cute.make_rmem_tensor((_VEC,), Float32)
                    cute.autovec_copy(cute.local_tile(gAcc[row, None], (_VEC,), (c,)), acc)
                    out = cute.make_rmem_tensor((_VEC,), self.dtype)
                    out.store((acc.load() * softmax_scale).to(self.dtype))
                    cute.autovec_copy(out, cute.local_tile(mdQ_s[row, head, None], (_VEC,), (c,)))
