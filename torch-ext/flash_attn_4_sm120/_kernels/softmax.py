"""Online softmax over key blocks, in the accumulator's (rows, cols) view (arch-free).

State per accumulator row owned by this thread: ``row_max`` (raw scores, before scaling) and
``row_sum`` (this thread's partial sum; the 4 lanes of a row are combined once, in ``finalize``).

Step for one key block S (scores for this block, masked entries = -inf):
  1. m_new = max(row_max, rowmax(S))                     (quad all-reduce)
  2. P = exp2(S * scale_log2 - m_new * scale_log2); corr = exp2((row_max - m_new) * scale_log2)
  3. row_sum = row_sum * corr + rowsum(P); O *= corr; row_max = m_new
A row that has seen no key holds the finite ``NO_KEY_MAX``, so its first key gives corr = 0 and no exponent ever
meets -inf - (-inf). The reference max only moves when the block max exceeds it by more than ``RESCALE_LOG2``
(log2 units); otherwise corr = exp2(0) = 1 exactly (a row's O never depends on another row's scores) and, when no
row of the warp moved, O is not touched at all.
Finalize: O /= rowsum, LSE = ln(rowsum) + row_max * scale; rows that saw no key give O = 0 and
LSE = -inf (the log-sum-exp of an empty set). A learnable sink (gpt-oss) adds exp(sink) to the
denominator and to the LSE.
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .fragments import quad_allreduce_max, quad_allreduce_sum

LN2 = math.log(2.0)
#: A row's reference max moves only when a block's max exceeds it by more than this (log2 units):
#: P <= 2^8 is exact enough in 16 bits and far from fp32 overflow, and O is rescaled far less often.
RESCALE_LOG2 = 8.0
#: the reference max of a row that has seen no key yet: finite, so that the rescale exponent (m_old - m_new) * scale
#: is exactly 0 for a row whose reference stayed and -huge (corr = 0) for one that saw its first key, never
#: -inf - -inf; far below any score of q.k (fp16 inputs stay under 1.1e12 at 256 dims), and finite times any scale
#: under 1e18. A score below it counts as masked: a row whose every visible score is (only a score_mod can
#: write one) ends with O = 0 and LSE = -inf (or the sink's), where a plain softmax would spread it evenly
NO_KEY_MAX = -1.0e20


class OnlineSoftmax:
    """Row statistics for ``num_rows`` accumulator rows of this thread."""

    def __init__(self, scale_log2: Float32, num_rows: cutlass.Constexpr[int], rescale_log2: float = RESCALE_LOG2):
        self.scale_log2 = scale_log2
        self.num_rows = num_rows
        #: how far past the reference a block's max may go before the reference moves (log2 units)
        self.rescale_log2 = rescale_log2
        self.row_max = cute.make_rmem_tensor(num_rows, Float32)
        self.row_sum = cute.make_rmem_tensor(num_rows, Float32)
        self.row_max.fill(NO_KEY_MAX)
        self.row_sum.fill(0.0)
        #: ``row_sum`` holds whole rows' sums (merged state, ``fwd_keysplit``), not this thread's share
        self.rows_summed = False

    @cute.jit
    def step(self, acc_S_rc: cute.Tensor, acc_O_rc: cute.Tensor):
        """Turn scores into unnormalized probabilities in place and rescale O (only when some row of
        the warp raised its reference max: most key blocks after the first change nothing)."""
        softmax_step(self.row_max, self.row_sum, acc_S_rc, acc_O_rc, self.scale_log2, self.rescale_log2)

    @cute.jit
    def finalize(self, acc_O_rc: cute.Tensor, lse: cute.Tensor, sink_log2: cute.Tensor = None, o_scale=None):
        """Normalize O in place and write each row's natural-log LSE into ``lse`` (num_rows,).

        ``sink_log2`` (num_rows,): per row, a learnable sink logit times log2(e) (rows of one tile may
        belong to different heads when GQA is packed); it adds exp(sink) to the row's denominator
        and to its LSE. Exponents are taken against max(row max, sink) so nothing overflows; a row that
        saw no key then gets O = 0 and LSE = sink. ``o_scale``: a factor on O only (dropout's 1 / (1 - p))."""
        for r in cutlass.range_constexpr(self.num_rows):
            total = self.row_sum[r] if cutlass.const_expr(self.rows_summed) else quad_allreduce_sum(self.row_sum[r])
            if cutlass.const_expr(sink_log2 is None):
                seen = total > Float32(0.0)
                inv = cute.arch.rcp_approx(total) if seen else Float32(0.0)
                if cutlass.const_expr(o_scale is not None):
                    inv = inv * o_scale
                acc_O_rc[r, None].store(acc_O_rc[r, None].load() * inv)
                lse[r] = (
                    (self.row_max[r] * self.scale_log2 + cute.math.log2(total, fastmath=True)) * LN2
                    if seen
                    else -Float32.inf
                )
            else:
                m_log2 = self.row_max[r] * self.scale_log2  # NO_KEY_MAX * scale when the row saw no key
                top = cute.arch.fmax(m_log2, sink_log2[r])
                keep = cute.math.exp2(m_log2 - top, fastmath=True)
                denom = total * keep + cute.math.exp2(sink_log2[r] - top, fastmath=True)
                factor = keep * cute.arch.rcp_approx(denom)
                if cutlass.const_expr(o_scale is not None):
                    factor = factor * o_scale
                acc_O_rc[r, None].store(acc_O_rc[r, None].load() * factor)
                lse[r] = (top + cute.math.log2(denom, fastmath=True)) * LN2


@cute.jit
def softmax_step(row_max: cute.Tensor, row_sum: cute.Tensor, acc_S_rc: cute.Tensor, acc_O_rc: cute.Tensor,
                 scale: Float32, rescale_log2: cutlass.Constexpr[float] = RESCALE_LOG2, block_max: cute.Tensor = None):
    """``OnlineSoftmax.step`` on its state tensors with an explicit scale (plain tensors can cross a
    dynamic ``if``; the ping-pong step passes a scale it reloaded after its turn's arrive). ``block_max``: the
    rows' maxima over the whole key block when other warps hold some of its keys (``fwd_wide``); else this
    warp's own (``row_block_max``)."""
    corr = cute.make_rmem_tensor(cute.size(row_max), Float32)
    changed = False
    for r in cutlass.range_constexpr(cute.size(row_max)):
        s_row = acc_S_rc[r, None].load()
        m_blk = row_block_max(acc_S_rc, r) if cutlass.const_expr(block_max is None) else block_max[r]
        m_old = row_max[r]
        m_cand = cute.arch.fmax(m_old, m_blk)
        # Keep the old reference unless the new max exceeds it by more than rescale_log2 (then P
        # stays below 2^rescale_log2); +inf takes the new max.
        m_new = m_old if (m_cand - m_old) * scale <= Float32(rescale_log2) else m_cand
        changed = changed | (m_new != m_old)
        p_row = cute.math.exp2(s_row * scale - m_new * scale, fastmath=True)
        # exactly 1 for a row whose reference stayed (a difference, then a product: nothing to contract into an
        # FFMA; written as exp2(m_old * scale - m_new * scale), the FFMA's rounding makes it ~1 +- 2^-20, which the
        # warp vote below applies to this row only when another row of the warp moved -- rows past the sequence end
        # among them, whose scores come from unwritten shared memory: O then differs between runs, H100, 2026-11-27)
        corr[r] = cute.math.exp2((m_old - m_new) * scale, fastmath=True)
        row_sum[r] = row_sum[r] * corr[r] + p_row.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
        row_max[r] = m_new
        acc_S_rc[r, None].store(p_row)
    if cute.arch.vote_any_sync(changed):
        for r in cutlass.range_constexpr(cute.size(row_max)):
            acc_O_rc[r, None].store(acc_O_rc[r, None].load() * corr[r])


@cute.jit
def row_block_max(acc_S_rc: cute.Tensor, r: cutlass.Constexpr[int]) -> Float32:
    """Row ``r``'s max over this warp's scores of the block (the 4 lanes of a row all-reduced)."""
    return quad_allreduce_max(acc_S_rc[r, None].load().reduce(cute.ReductionOp.MAX, -Float32.inf, 0))
