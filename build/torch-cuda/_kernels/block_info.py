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

Plain integer arithmetic (window bounds may be negative: ``(None, -w)`` ends a row's keys w before
the diagonal; a non-empty range lies within ``[0, ceil(seqlen_k / tile_n)]``): runs on the host (tests, Python ints) and in
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
    """(start, unmasked_start, unmasked_end, end) with start <= unmasked_start <= unmasked_end <= end,
    for the query rows ``[m_block * tile_m, (m_block + 1) * tile_m)``.

    ``window_left``/``window_right`` are used when ``local``: offsets from the diagonal, negative ones
    included (FlashAttention-4's convention); the host clamps "unbounded" to the rows Q and K hold."""
    return block_range_rows(m_block * tile_m, (m_block + 1) * tile_m, seqlen_q, seqlen_k, tile_n, causal, local,
                            window_left, window_right)


def packed_rows(m_block, tile_m: int, group):
    """Query rows ``[lo, hi)`` an M tile of packed GQA rows covers: packed row p is query row
    ``p // group`` of head ``p % group`` of the KV group."""
    return (m_block * tile_m) // group, ((m_block + 1) * tile_m - 1) // group + 1


def block_range_rows(row_lo, row_hi, seqlen_q, seqlen_k, tile_n: int, causal: bool, local: bool,
                     window_left=0, window_right=0):
    """``block_range`` for the query rows ``[row_lo, row_hi)`` (an M tile, or the rows a tile of
    packed GQA rows covers)."""
    off = seqlen_k - seqlen_q
    end = ceil_div(seqlen_k, tile_n)
    unmasked_end = seqlen_k // tile_n  # blocks with no key past seqlen_k
    if causal or local:
        right = window_right if local else 0
        # Last row sees keys < row_hi + off + right; the first row < row_lo + 1 + off + right.
        end = _min(end, ceil_div(_max(row_hi + off + right, 0), tile_n))
        unmasked_end = _min(unmasked_end, _max(row_lo + 1 + off + right, 0) // tile_n)
    start = 0
    unmasked_start = 0
    if local:
        # First row sees keys >= row_lo + off - left; the last row >= row_hi - 1 + off - left.
        start = _max(row_lo + off - window_left, 0) // tile_n
        unmasked_start = ceil_div(_max(row_hi - 1 + off - window_left, 0), tile_n)
    # A band that misses every key of the tile gives an empty range [start, start), which may lie past
    # the keys: nothing in it is loaded (every load checks n >= start).
    end = _max(end, start)
    unmasked_end = _min(_max(unmasked_end, start), end)
    unmasked_start = _min(_max(unmasked_start, start), unmasked_end)
    return start, unmasked_start, unmasked_end, end


def split_range(ranges, split, num_splits):
    """The part of a tile's key-block ranges that split ``split`` of ``num_splits`` visits.

    ``ranges`` is ``(start, unmasked_start, unmasked_end, end)`` from ``block_range_rows``. The
    visited blocks ``[start, end)`` are cut into ``num_splits`` contiguous pieces of
    ``ceil((end - start) / num_splits)`` blocks (the last ones may be short or empty); each bound is
    clamped into the piece, so the masked / unmasked classification of every block is unchanged
    and the pieces together visit each block exactly once."""
    start, unmasked_start, unmasked_end, end = ranges
    per_split = ceil_div(end - start, num_splits)
    lo = _min(start + split * per_split, end)
    hi = _min(lo + per_split, end)
    return lo, _min(_max(unmasked_start, lo), hi), _min(_max(unmasked_end, lo), hi), hi


def chunk_range(ranges, split, chunk_blocks: int):
    """The part of a tile's key-block ranges that chunk ``split`` visits: the blocks
    ``[split * chunk_blocks, (split + 1) * chunk_blocks)`` (absolute, from key 0) within ``[start, end)``,
    classified as in ``split_range``. A chunk outside the tile's range is empty (``lo == hi``)."""
    start, unmasked_start, unmasked_end, end = ranges
    lo = _min(_max(split * chunk_blocks, start), end)
    hi = _max(_min((split + 1) * chunk_blocks, end), lo)
    return lo, _min(_max(unmasked_start, lo), hi), _min(_max(unmasked_end, lo), hi), hi


def query_block_range(n_block, seqlen_q, seqlen_k, tile_m: int, tile_n: int, causal: bool, local: bool,
                      window_left=0, window_right=0):
    """The backward's view: ``[m_start, m_end)``, the query blocks with a row that sees a key of key block
    ``n_block`` (the transpose of ``block_range``; query i sees key j iff i + off - left <= j <= i + off + right,
    so the rows that see a key in ``[key_lo, key_hi)`` are ``[key_lo - off - right, key_hi - 1 - off + left]``)."""
    off = seqlen_k - seqlen_q
    key_lo = n_block * tile_n
    key_hi = _min(key_lo + tile_n, seqlen_k)  # exclusive
    num_m = ceil_div(seqlen_q, tile_m)
    m_start = 0
    m_end = num_m
    if causal or local:
        right = window_right if local else 0
        m_start = _max(key_lo - off - right, 0) // tile_m
    if local:
        m_end = _min(ceil_div(_max(key_hi - off + window_left, 0), tile_m), num_m)
    m_end = _max(m_end, m_start)
    return m_start, m_end
