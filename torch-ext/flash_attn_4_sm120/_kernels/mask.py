"""Element masks on a score tile (arch-free).

Entries outside the key range (``col >= seqlen_k``) or above the causal diagonal (bottom-right
aligned: key ``j`` is visible to query ``i`` iff ``j <= i + seqlen_k - seqlen_q``) become -inf.

Coordinates come from an identity tensor partitioned like the accumulator. Thread 0's partition
(``t0ScS``) has compile-time coordinates; the thread's own offset is folded into the limit once,
so the per-element test is a compare against a constant.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32


@cute.jit
def mask_scores(
    acc_S_rc: cute.Tensor,
    tScS_rc: cute.Tensor,
    t0ScS_rc: cute.Tensor,
    m_block: Int32,
    n_block: Int32,
    seqlen_q: Int32,
    seqlen_k: Int32,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    causal: cutlass.Constexpr[bool],
):
    """Set masked entries of this thread's (rows, cols) score view to -inf."""
    thr_row0 = tScS_rc[0, 0][0]
    thr_col0 = tScS_rc[0, 0][1]
    # Column limit relative to this thread's first column: keys in [0, seqlen_k) of this block.
    col_limit_seq = seqlen_k - n_block * tile_n - thr_col0
    for r in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[0])):
        col_limit = col_limit_seq
        if cutlass.const_expr(causal):
            row = m_block * tile_m + thr_row0 + t0ScS_rc[r, 0][0]
            # Keys j <= row + seqlen_k - seqlen_q are visible: limit is one past that, block-relative.
            col_limit = cutlass.min(col_limit, row + 1 + seqlen_k - seqlen_q - n_block * tile_n - thr_col0)
        for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
            if t0ScS_rc[0, c][1] >= col_limit:
                acc_S_rc[r, c] = -Float32.inf
