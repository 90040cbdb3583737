"""Which key blocks an M tile visits, and which of them need masking (arch-free).

Rows are queries, columns keys. With causal masking the diagonal is aligned to the bottom-right
corner (query ``i`` sees keys ``j <= i + seqlen_k - seqlen_q``), as in FlashAttention 2/4.

For M tile ``m`` (rows ``[m*tile_m, (m+1)*tile_m)``) the key blocks visited are ``[0, n_end)``; the
mainloop walks them from the last down, so the (at most a few) blocks that need an element mask
come first: ``[n_unmasked_end, n_end)``. Blocks below ``n_unmasked_end`` are full and entirely
visible to every row of the tile.

These functions are plain integer arithmetic on non-negative values: they run unchanged on the
host (tests, Python ints) and in ``@cute.jit`` code (``Int32``).
"""

import cutlass


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else cutlass.min(a, b)


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else cutlass.max(a, b)


def ceil_div(a, b):
    return (a + b - 1) // b


def n_block_end(m_block, seqlen_q, seqlen_k, tile_m: int, tile_n: int, causal: bool):
    """One past the last key block any row of this M tile may see (can be <= 0)."""
    n_end = ceil_div(seqlen_k, tile_n)
    if causal:
        # Last row of the tile sees keys up to (m_block+1)*tile_m - 1 + seqlen_k - seqlen_q.
        last_key = (m_block + 1) * tile_m + seqlen_k - seqlen_q
        n_end = _min(n_end, ceil_div(_max(last_key, 0), tile_n))
    return n_end


def n_block_unmasked_end(m_block, seqlen_q, seqlen_k, tile_m: int, tile_n: int, causal: bool):
    """Key blocks below this index need no element mask for any row of the M tile."""
    full = seqlen_k // tile_n  # blocks with no out-of-range keys
    if causal:
        # The first row of the tile sees keys < m_block*tile_m + 1 + seqlen_k - seqlen_q.
        first_row_keys = m_block * tile_m + 1 + seqlen_k - seqlen_q
        full = _min(full, _max(first_row_keys, 0) // tile_n)
    return full
