"""Element masks on a score tile (arch-free).

Entries outside the key range (``col >= seqlen_k``), above the causal diagonal, or outside a local
window become -inf. The visibility rules and the bottom-right alignment are those of
``block_info``: query ``i`` sees key ``j`` iff ``j < seqlen_k`` and ``i + off - left <= j <= i + off + right``
(``off = seqlen_k - seqlen_q``; causal is ``right = 0`` with no left bound).

With packed GQA (query heads of a KV group folded into the M tile) tile row ``p`` is query row
``p // group``: the diagonal and window edges are per query row, the same for every head.

Coordinates come from an identity tensor partitioned like the accumulator. Thread 0's partition
(``t0ScS``) has compile-time coordinates; the thread's own offset is folded into the limits once,
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
    window_left: Int32,
    window_right: Int32,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    causal: cutlass.Constexpr[bool],
    local: cutlass.Constexpr[bool],
    group: Int32 = None,
    select: cutlass.Constexpr[bool] = True,
):
    """Set masked entries of this thread's (rows, cols) score view to -inf. With ``group`` (packed
    GQA) tile row p is query row p // group. ``select`` (``FwdConfig.mask_select``): write every
    element through a select; else store -inf under a condition, which ptxas turns into chains of
    64-bit pair selects (the accumulator lives in register pairs) but which packs registers
    differently."""
    thr_row0 = tScS_rc[0, 0][0]
    thr_col0 = tScS_rc[0, 0][1]
    # Limits relative to this thread's first column of this block.
    col_base = n_block * tile_n + thr_col0
    col_limit_seq = seqlen_k - col_base
    for r in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[0])):
        col_hi = col_limit_seq  # exclusive
        col_lo = 0  # inclusive, used when local
        if cutlass.const_expr(causal or local):
            row = m_block * tile_m + thr_row0 + t0ScS_rc[r, 0][0]
            if cutlass.const_expr(group is not None):
                row = row // group
            diag = row + seqlen_k - seqlen_q - col_base
            right = window_right if cutlass.const_expr(local) else 0
            col_hi = cutlass.min(col_hi, diag + 1 + right)
            if cutlass.const_expr(local):
                col_lo = diag - window_left
        for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
            col = t0ScS_rc[0, c][1]
            hidden = (col >= col_hi or col < col_lo) if cutlass.const_expr(local) else col >= col_hi
            if cutlass.const_expr(select):
                # one FSEL per element (the d64 causal masked step: 1091 -> 790 instructions on sm_120a)
                s = acc_S_rc[r, c]
                acc_S_rc[r, c] = -Float32.inf if hidden else s
            else:
                if hidden:
                    acc_S_rc[r, c] = -Float32.inf
