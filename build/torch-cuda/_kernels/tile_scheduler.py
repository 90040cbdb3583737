"""Map a CTA to its work tile (arch-free).

One CTA per (M tile, query head, batch[, KV split]). Split-KV folds the split index next to the batch
(batch * num_splits + split), so the splits of one sequence run side by side.

Unmasked tiles all cost the same: the grid runs M tile fastest, so the tiles of one (batch, head) run
together and share its K/V in L2. Causal (and local) tiles do not: M tile m of a causal sequence visits
about m + 1 key blocks. There the order is longest first within bands of (batch, head) pairs: the grid is
one-dimensional, a band of ``band`` pairs runs all its pairs' last M tiles, then their second-to-last,
and so on, so the short tiles fill the tail of the wave instead of a long one starting last; the band
bounds how many pairs' K/V are live at once (the host sizes it to the L2: ``config.tile_band``; tiles
of fewer than 128 rows keep the per-pair order: ``config.banded_tile_order``). With
M tile fastest, every pair started its longest tile at a different point in the wave (H100 at SM120
occupancy, 2026-11-24: causal 2x4096 32/8 +11-14% at d64-d96 and +5-7% at d128-d192, 4x1024 +9-16%).
``PersistentTileScheduler`` launches at most one CTA per SM and hands each CTA a sequence of tiles in
M-fastest order. ``KeyBlockScheduler`` is the backward's: one CTA per (key block, KV head, batch), its causal
and block-sparse key blocks in the same banded longest-first order.
"""

import cutlass
import cutlass.cute as cute


class SingleTileScheduler:
    """``reverse_m``: M tiles last to first (masked tiles: the longest first); ``banded``: in the banded
    longest-first order over (batch, head) pairs (``config.banded_tile_order``), else per pair."""

    def __init__(self, reverse_m: cutlass.Constexpr[bool], split_kv: cutlass.Constexpr[bool] = False,
                 banded: cutlass.Constexpr[bool] = False):
        self.reverse_m = reverse_m
        self.split_kv = split_kv
        self.banded = banded

    def grid(self, num_m_blocks, num_heads, batch, num_splits=1):
        batches = batch * num_splits if self.split_kv else batch
        if self.banded:
            return (num_m_blocks * num_heads * batches, 1, 1)
        return (num_m_blocks, num_heads, batches)

    @cute.jit
    def tile(self, num_splits, num_m_blocks, num_heads, band):
        """(m_block, head, batch, split) of this CTA (split is 0 without split-KV). ``band``: (batch,
        head) pairs per band of the longest-first order (masked tiles only; at least 1)."""
        bx, by, bz = cute.arch.block_idx()
        if cutlass.const_expr(self.banded):
            m_from_end, by, bz = banded_coords(bx, num_m_blocks, num_heads, band)
            bx = num_m_blocks - 1 - m_from_end
        elif cutlass.const_expr(self.reverse_m):
            bx = cute.arch.grid_dim()[0] - 1 - bx
        split = 0
        if cutlass.const_expr(self.split_kv):
            split = bz % num_splits
            bz = bz // num_splits
        return bx, by, bz, split


class KeyBlockScheduler:
    """The backward's CTA -> (key block, dK / dV head, batch). Key blocks fastest by default: a (batch, head)
    pair's CTAs run together and share its Q, dO and dQ accumulator in L2. Under a causal mask key block n is
    visited by the query blocks at and past its diagonal, so the first key block is the longest; ``banded``
    (``bwd_config.bwd_banded``): the forward's banded longest-first order, key block 0 of every pair of a band,
    then key block 1, ..., in a one-dimensional grid (the band sized to the L2 by ``bwd_schedule.bwd_tile_band``)."""

    def __init__(self, banded: cutlass.Constexpr[bool]):
        self.banded = banded

    def grid(self, num_n_blocks, num_heads, batches):
        if self.banded:
            return (num_n_blocks * num_heads * batches, 1, 1)
        return (num_n_blocks, num_heads, batches)

    @cute.jit
    def tile(self, num_heads, batches, band):
        """(n_block, head, batch) of this CTA; ``band``: pairs per band (at least 1, banded only)."""
        bx, by, bz = cute.arch.block_idx()
        if cutlass.const_expr(self.banded):
            bx, by, bz = banded_coords(bx, cute.arch.grid_dim()[0] // (num_heads * batches), num_heads, band)
        return bx, by, bz


@cute.jit
def banded_coords(bx, num_blocks, num_heads, band):
    """(block index in the longest-first order, head, batch) of linear CTA index ``bx`` in the banded order:
    bands of ``band`` (batch, head) pairs, each running its pairs' first blocks, then their second, ..."""
    pairs = cute.arch.grid_dim()[0] // num_blocks
    first = bx // (band * num_blocks) * band  # the band's first pair
    width = cutlass.min(band, pairs - first)  # pairs in this band (the last one may be short)
    rest = bx - first * num_blocks
    block = rest // width
    pair = first + rest - block * width
    return block, pair % num_heads, pair // num_heads


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
