"""Map a CTA to its work tile (arch-free).

One CTA per (M tile, query head, batch[, KV split]). With causal masking the M tiles run in reverse
so the longest rows (the most key blocks) start first and the short ones fill the tail of the wave.
Split-KV folds the split index into the grid's z dimension next to the batch (z = batch * num_splits
+ split), so the splits of one sequence run side by side. Later schedulers (persistent) implement the
same ``tile()`` contract.
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
