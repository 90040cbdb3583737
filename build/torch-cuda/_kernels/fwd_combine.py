"""Split-KV combine: merge the forward's per-split partial outputs into O and LSE (arch-free).

Each split ``s`` of a query row (sequence position, head) left its softmax over its own key range:
``O_s`` normalized (fp32) and ``lse_s`` (natural log, -inf when the split saw no key of the row).
The whole row is their log-sum-exp merge, with the learnable sink entering once, here:
    lse = log(sum_s exp(lse_s) [+ exp(sink_h)]),     O = sum_s exp(lse_s - lse) O_s
A row no split saw a key of (and without a sink) gets O = 0 and lse = -inf, as unsplit.

One warp per row: lane l reads the LSEs of splits l, l + 32, ... once into registers and reduces them
(max, then sum of exponentials, both warp all-reduced) to the row's LSE and its own splits' weights;
then every lane accumulates 4 consecutive columns (16-byte loads) of each split's O, the split's weight
shuffled from the lane that holds it, ``UNROLL_SPLITS`` splits' loads in flight at a time, and stores
them in the output dtype. At most ``config.MAX_SPLITS`` splits (the host caps every call there). Rows
are (position, head) pairs flattened so a CTA stays busy whether the queries are long or a single
decode token. The LSEs are read once, ahead of the O loads: re-reading each split's LSE before its O load and
branching on its weight costs a dependent load pair per split, 5.5 us for 16 splits of 32 rows (H100,
2026-11-25), a tenth of a 1 x 32768 decode.

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

from ..config import MAX_SPLITS
from ..execution_model import ExecutionModel
from ..problem import LOG2_E, MAX_HEAD_DIM, CombineSpec
from . import CUTLASS_DTYPES
from .grid_dependency import enter_grid
from .seqlen_info import lse_row, num_batches, num_heads, sequence_heads, split_view

LN2 = math.log(2.0)
#: fp32 columns per lane per chunk (one 16-byte load); a warp covers 128 columns per chunk
COLS_PER_LANE = 4
#: LSE / weight registers per lane: lane l holds splits l, l + 32, ... up to the most splits a call makes
SPLIT_REGS = MAX_SPLITS // 32
#: splits whose partial O loads one unrolled step of the merge issues back to back
UNROLL_SPLITS = 4


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
            use_pdl=self.model.has_pdl,
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
        enter_grid(self.model.has_pdl)  # the split forward's partials are complete from here on
        lane = tidx % 32
        heads = num_heads(mO, mCuSeqlensQ is not None)
        row = bx * self.num_warps + tidx // 32
        q_row, head = row // heads, row % heads
        mO_h, seqlen_q = sequence_heads(mO, batch, mCuSeqlensQ, mSeqUsedQ)
        if q_row < seqlen_q:
            num_splits = mOpart.shape[0]
            # Lane l holds the LSEs of splits l, l + 32, ... (read once), then their weights.
            lse_r = cute.make_rmem_tensor(SPLIT_REGS, Float32)
            lse_max = -Float32.inf
            for j in cutlass.range_constexpr(SPLIT_REGS):
                lse_j = -Float32.inf
                if j * 32 + lane < num_splits:
                    lse_j = self.split_lse(mLSEpart, mCuSeqlensQ, j * 32 + lane, batch, head, q_row)
                lse_r[j] = lse_j
                lse_max = cute.arch.fmax(lse_max, lse_j)
            sink = Float32(0.0)
            if const_expr(self.spec.has_sink):
                sink = Float32(mSink[head])
                lse_max = cute.arch.fmax(lse_max, sink)
            lse_max = warp_allreduce(lse_max, "max")
            # exponents against the max; 0 stands in for -inf (no key, no sink) so nothing is NaN
            base = Float32(0.0) if lse_max == -Float32.inf else lse_max
            total = Float32(0.0)
            for j in cutlass.range_constexpr(SPLIT_REGS):
                total += cute.math.exp2((lse_r[j] - base) * LOG2_E, fastmath=True)
            total = warp_allreduce(total, "sum")
            if const_expr(self.spec.has_sink):
                total += cute.math.exp2((sink - base) * LOG2_E, fastmath=True)
            lse = base + cute.math.log2(total, fastmath=True) * LN2 if total > Float32(0.0) else -Float32.inf
            lse_base = Float32(0.0) if lse == -Float32.inf else lse
            w_r = cute.make_rmem_tensor(SPLIT_REGS, Float32)
            for j in cutlass.range_constexpr(SPLIT_REGS):
                w_r[j] = cute.math.exp2((lse_r[j] - lse_base) * LOG2_E, fastmath=True)

            for c in cutlass.range_constexpr(self.chunks):
                col0 = (c * 32 + lane) * COLS_PER_LANE
                acc = cute.make_rmem_tensor(COLS_PER_LANE, Float32)
                acc.fill(0.0)
                for j in cutlass.range_constexpr(SPLIT_REGS):
                    if j * 32 < num_splits:
                        # every lane takes part in the shuffles; only lanes with columns load. A split's
                        # weight is 0 where it saw no key, and its partial O there is 0, never NaN, so no
                        # split is skipped: the loads of consecutive splits issue back to back.
                        for src in cutlass.range(cutlass.min(num_splits - j * 32, 32), unroll=UNROLL_SPLITS):
                            w = cute.arch.shuffle_sync(w_r[j], src)
                            if col0 < self.spec.head_dim_v:
                                mPart_h, _ = sequence_heads(split_view(mOpart, j * 32 + src), batch, mCuSeqlensQ,
                                                            mSeqUsedQ)
                                part = cute.local_tile(mPart_h[q_row, head, None], (COLS_PER_LANE,), (c * 32 + lane,))
                                frag = cute.make_rmem_tensor(COLS_PER_LANE, Float32)
                                cute.autovec_copy(part, frag)
                                acc.store(acc.load() + frag.load() * w)
                if col0 < self.spec.head_dim_v:
                    out = cute.make_rmem_tensor(COLS_PER_LANE, self.dtype)
                    out.store(acc.load().to(self.dtype))
                    cute.autovec_copy(out, cute.local_tile(mO_h[q_row, head, None], (COLS_PER_LANE,), (c * 32 + lane,)))
            if lane == 0:
                lse_row(mLSE, batch, head, mCuSeqlensQ)[q_row] = lse

    @cute.jit
    def split_lse(self, mLSEpart: cute.Tensor, mCuSeqlensQ, split, batch, head, q_row) -> Float32:
        """The LSE split ``split`` left for (q_row, head) of sequence ``batch``."""
        return lse_row(split_view(mLSEpart, split), batch, head, mCuSeqlensQ)[q_row]
