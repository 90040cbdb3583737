"""Which key blocks an M tile visits, and which of them need an element mask (arch-free).

Rows are queries, columns keys, ``off = seqlen_k - seqlen_q`` aligns the diagonal to the bottom-right
corner (as in FlashAttention 2/4). Query ``i`` sees key ``j`` iff ``j < seqlen_k`` and
  * causal:                 j <= i + off
  * local (window l, r):    i + off - l <= j <= i + off + r     (causal + window = local with r = 0)
Blocks wholly outside the visible band are never visited: the cost of a window scales with its width.

For M tile ``m`` (rows ``[m*tile_m, (m+1)*tile_m)``) the visited key blocks are ``[start, end)``.
The mainloop walks them from the last down. ``[unmasked_end, end)`` touch the right edge (sequence
end or diagonal) and ``[start, unmasked_start)`` the left edge of a window: those need an element
mask; blocks in between are visible to every row of the tile.

Plain integer arithmetic on non-negative values: runs on the host (tests, Python ints) and in
``@cute.jit`` code (``Int32``).
"""

import cutlass


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else cutlass.min(a, b)


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else cutlass.max(a, b)


def ceil_div(a, b):
    return (a + b - 1) // b


def block_range(m_block, seqlen_q, seqlen_k, tile_m: int, tile_n: int, causal: bool, local: bool,
                window_left=0, window_right=0):
    """(start, unmasked_start, unmasked_end, end) with start <= unmasked_start <= unmasked_end <= end.

    ``window_left``/``window_right`` are used when ``local`` (non-negative; the host clamps
    "unbounded" to seqlen_q + seqlen_k)."""
    off = seqlen_k - seqlen_q
    end = ceil_div(seqlen_k, tile_n)
    unmasked_end = seqlen_k // tile_n  # blocks with no key past seqlen_k
    if causal or local:
        right = window_right if local else 0
        # Last row of the tile sees keys < (m+1)*tile_m + off + right; the first row < m*tile_m + 1 + off + right.
        end = _min(end, ceil_div(_max((m_block + 1) * tile_m + off + right, 0), tile_n))
        unmasked_end = _min(unmasked_end, _max(m_block * tile_m + 1 + off + right, 0) // tile_n)
    start = 0
    unmasked_start = 0
    if local:
        # First row sees keys >= m*tile_m + off - left; the last row >= (m+1)*tile_m - 1 + off - left.
        start = _max(m_block * tile_m + off - window_left, 0) // tile_n
        unmasked_start = ceil_div(_max((m_block + 1) * tile_m - 1 + off - window_left, 0), tile_n)
    end = _max(end, start)
    unmasked_end = _min(_max(unmasked_end, start), end)
    unmasked_start = _min(_max(unmasked_start, start), unmasked_end)
    return start, unmasked_start, unmasked_end, end
