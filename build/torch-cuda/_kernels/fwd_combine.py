"""Split-KV combine: merge the forward's per-split partial outputs into O and LSE (arch-free).

Each split ``s`` of a query row (sequence position, head) left its softmax over its own key range:
``O_s`` normalized (fp32) and ``lse_s`` (natural log, -inf when the split saw no key of the row).
The whole row is their log-sum-exp merge, with the learnable sink entering once, here:
    lse = log(sum_s exp(lse_s) [+ exp(sink_h)]),     O = sum_s exp(lse_s - lse) O_s
A row no split saw a key of (and without a sink) gets O = 0 and lse = -inf, as unsplit.

One warp per row: lane l reduces the LSEs of splits l, l + 32, ... (max, then sum of exponentials,
both warp all-reduced), then every lane accumulates 4 consecutive columns (16-byte loads) of each
split's O, skipping splits of weight 0, and stores them in the output dtype. Rows are (position,
head) pairs flattened so a CTA stays busy whether the queries are long or a single decode token.

Tensors: partial O (num_splits, *O's shape) fp32 and partial LSE (num_splits, *LSE's shape) fp32,
O (batch, seqlen, heads, dv) or (total, heads, dv) with cu_seqlens_q, LSE like the forward's; the
split count is the partials' leading extent.
"""

import math
from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ..execution_model import ExecutionModel
from ..problem import MAX_HEAD_DIM, CombineSpec
from . import CUTLASS_DTYPES
from .seqlen_info import lse_row, num_batches, num_heads, sequence_heads, split_view

LOG2_E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)
#: fp32 columns per lane per chunk (one 16-byte load); a warp covers 128 columns per chunk
COLS_PER_LANE = 4


@cute.jit
def warp_allreduce(x: Float32, op: cutlass.Constexpr) -> Float32:
    """``op`` ("max" or "sum") over the 32 lanes of a warp, result in every lane."""
    for i in cutlass.range_constexpr(5):
        other = cute.arch.shuffle_sync_bfly(x, offset=16 >> i)
        x = cute.arch.fmax(x, other) if const_expr(op == "max") else x + other
    return x


class FlashFwdCombine:
    """Merges split-KV partials. Build with a ``CombineSpec`` and an execution model."""

    num_warps = 4

    def __init__(self, spec: CombineSpec, model: ExecutionModel):
        self.spec = spec
        self.model = model
        self.dtype = CUTLASS_DTYPES[spec.dtype]
        self.chunks = (spec.head_dim_v + 32 * COLS_PER_LANE - 1) // (32 * COLS_PER_LANE)

    @staticmethod
    def can_implement(spec: CombineSpec, model: ExecutionModel) -> tuple[str, ...]:
        d = spec.head_dim_v
        if d % 8 or not 8 <= d <= MAX_HEAD_DIM:
            return (f"head_dim_v={d} is not a multiple of 8 in [8, {MAX_HEAD_DIM}]",)
        return ()

    @cute.jit
    def __call__(
        self,
        mOpart: cute.Tensor,
        mLSEpart: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mSink: Optional[cute.Tensor],
        mCuSeqlensQ: Optional[cute.Tensor],
        mSeqUsedQ: Optional[cute.Tensor],
        max_seqlen_q: Int32,
        stream: cuda.CUstream,
    ):
        if const_expr(mO.element_type != self.dtype or mOpart.element_type != Float32):
            raise TypeError("O must have the spec's dtype and the partial O must be fp32")
        packed_q = mCuSeqlensQ is not None
        rows = max_seqlen_q if const_expr(packed_q) else mO.shape[1]
        heads = num_heads(mO, packed_q)
        self.kernel(mOpart, mLSEpart, mO, mLSE, mSink, mCuSeqlensQ, mSeqUsedQ).launch(
            grid=(cute.ceil_div(rows * heads, self.num_warps), 1, num_batches(mO, mCuSeqlensQ)),
            block=[self.num_warps * 32, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        mOpart: cute.Tensor,
        mLSEpart: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mSink: Optional[cute.Tensor],
        mCuSeqlensQ: Optional[cute.Tensor],
        mSeqUsedQ: Optional[cute.Tensor],
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bx, _, batch = cute.arch.block_idx()
        lane = tidx % 32
        heads = num_heads(mO, mCuSeqlensQ is not None)
        row = bx * self.num_warps + tidx // 32
        q_row, head = row // heads, row % heads
        mO_h, seqlen_q = sequence_heads(mO, batch, mCuSeqlensQ, mSeqUsedQ)
        if q_row < seqlen_q:
            num_splits = mOpart.shape[0]
            lse_max = -Float32.inf
            for s in cutlass.range(lane, num_splits, 32, unroll=1):
                lse_max = cute.arch.fmax(lse_max, self.split_lse(mLSEpart, mCuSeqlensQ, s, batch, head, q_row))
            sink = Float32(0.0)
            if const_expr(self.spec.has_sink):
                sink = Float32(mSink[head])
                lse_max = cute.arch.fmax(lse_max, sink)
            lse_max = warp_allreduce(lse_max, "max")
            # exponents against the max; 0 stands in for -inf (no key, no sink) so nothing is NaN
            base = Float32(0.0) if lse_max == -Float32.inf else lse_max
            total = Float32(0.0)
            for s in cutlass.range(lane, num_splits, 32, unroll=1):
                total += cute.math.exp2((self.split_lse(mLSEpart, mCuSeqlensQ, s, batch, head, q_row) - base) * LOG2_E,
                                        fastmath=True)
            total = warp_allreduce(total, "sum")
            if const_expr(self.spec.has_sink):
                total += cute.math.exp2((sink - base) * LOG2_E, fastmath=True)
            lse = base + cute.math.log2(total, fastmath=True) * LN2 if total > Float32(0.0) else -Float32.inf
            lse_base = Float32(0.0) if lse == -Float32.inf else lse

            for c in cutlass.range_constexpr(self.chunks):
                col0 = (c * 32 + lane) * COLS_PER_LANE
                if col0 < self.spec.head_dim_v:
                    acc = cute.make_rmem_tensor(COLS_PER_LANE, Float32)
                    acc.fill(0.0)
                    for s in cutlass.range(num_splits, unroll=1):
                        w = cute.math.exp2((self.split_lse(mLSEpart, mCuSeqlensQ, s, batch, head, q_row) - lse_base) * LOG2_E,
                                           fastmath=True)
                        if w > Float32(0.0):
                            mPart_h, _ = sequence_heads(split_view(mOpart, s), batch, mCuSeqlensQ, mSeqUsedQ)
                            part = cute.local_tile(mPart_h[q_row, head, None], (COLS_PER_LANE,), (c * 32 + lane,))
                            frag = cute.make_rmem_tensor(COLS_PER_LANE, Float32)
                            cute.autovec_copy(part, frag)
                            acc.store(acc.load() + frag.load() * w)
                    out = cute.make_rmem_tensor(COLS_PER_LANE, self.dtype)
                    out.store(acc.load().to(self.dtype))
                    cute.autovec_copy(out, cute.local_tile(mO_h[q_row, head, None], (COLS_PER_LANE,), (c * 32 + lane,)))
            if lane == 0:
                lse_row(mLSE, batch, head, mCuSeqlensQ)[q_row] = lse

    @cute.jit
    def split_lse(self, mLSEpart: cute.Tensor, mCuSeqlensQ, split, batch, head, q_row) -> Float32:
        """The LSE split ``split`` left for (q_row, head) of sequence ``batch``."""
        return lse_row(split_view(mLSEpart, split), batch, head, mCuSeqlensQ)[q_row]
