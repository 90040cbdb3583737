"""Map a CTA to its work tile (arch-free).

One CTA per (M tile, query head, batch[, KV split]). With causal masking the M tiles run in reverse
so the longest rows (the most key blocks) start first and the short ones fill the tail of the wave.
Split-KV folds the split index into the grid's z dimension next to the batch (z = batch * num_splits
+ split), so the splits of one sequence run side by side. ``PersistentTileScheduler`` launches at most
one CTA per SM and hands each CTA a sequence of tiles in the same order.
"""

import cutlass
import cutlass.cute as cute


class SingleTileScheduler:
    def __init__(self, reverse_m: cutlass.Constexpr[bool], split_kv: cutlass.Constexpr[bool] = False):
        self.reverse_m = reverse_m
        self.split_kv = split_kv

    def grid(self, num_m_blocks, num_heads, batch, num_splits=1):
        return (num_m_blocks, num_heads, batch * num_splits if self.split_kv else batch)

    @cute.jit
    def tile(self, num_splits=1):
        """(m_block, head, batch, split) of this CTA (split is 0 without split-KV)."""
        bx, by, bz = cute.arch.block_idx()
        if cutlass.const_expr(self.reverse_m):
            bx = cute.arch.grid_dim()[0] - 1 - bx
        split = 0
        if cutlass.const_expr(self.split_kv):
            split = bz % num_splits
            bz = bz // num_splits
        return bx, by, bz, split


class PersistentTileScheduler:
    """At most ``max_ctas`` CTAs (one per SM) walk the tiles in the order ``SingleTileScheduler``'s
    grid launches them: M tile fastest (reversed with causal/local masks, longest rows first), then
    the head, then the batch. CTA c takes tiles c, c + grid, c + 2 grid, ..."""

    def __init__(self, reverse_m: cutlass.Constexpr[bool]):
        self.reverse_m = reverse_m

    def grid(self, num_m_blocks, num_heads, batch, max_ctas):
        total = num_m_blocks * num_heads * batch
        return (cutlass.min(total, cutlass.max(max_ctas, 1)), 1, 1)

    @cute.jit
    def first(self):
        return cute.arch.block_idx()[0]

    @cute.jit
    def stride(self):
        return cute.arch.grid_dim()[0]

    def coords(self, tile, num_m_blocks, num_heads):
        """(m_block, head, batch) of linear tile index ``tile``."""
        return tile_coords(tile, num_m_blocks, num_heads, self.reverse_m)


@cute.jit
def tile_coords(tile, num_m_blocks, num_heads, reverse_m: cutlass.Constexpr[bool]):
    """(m_block, head, batch) of linear tile index ``tile`` (M tile fastest, reversed if ``reverse_m``).
    A function of plain values, so a dynamic tile loop can call it (the loop cannot carry the
    scheduler object)."""
    m_block = tile % num_m_blocks
    if cutlass.const_expr(reverse_m):
        m_block = num_m_blocks - 1 - m_block
    rest = tile // num_m_blocks
    return m_block, rest % num_heads, rest // num_heads
