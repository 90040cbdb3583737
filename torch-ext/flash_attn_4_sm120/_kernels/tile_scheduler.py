"""Map a CTA to its work tile (arch-free).

One CTA per (M tile, query head, batch). With causal masking the M tiles run in reverse so the
longest rows (the most key blocks) start first and the short ones fill the tail of the wave.
Later schedulers (persistent, varlen, split-KV) implement the same ``tile()`` contract.
"""

import cutlass
import cutlass.cute as cute


class SingleTileScheduler:
    def __init__(self, reverse_m: cutlass.Constexpr[bool]):
        self.reverse_m = reverse_m

    @staticmethod
    def grid(num_m_blocks, num_heads, batch):
        return (num_m_blocks, num_heads, batch)

    @cute.jit
    def tile(self):
        """(m_block, head, batch) of this CTA."""
        bx, by, bz = cute.arch.block_idx()
        if cutlass.const_expr(self.reverse_m):
            bx = cute.arch.grid_dim()[0] - 1 - bx
        return bx, by, bz
