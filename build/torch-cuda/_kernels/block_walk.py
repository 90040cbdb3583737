"""The key blocks a forward tile visits, and the query tiles a backward key tile visits, from block-sparse
lists (arch-free).

The dense mainloops walk a range ``[n_start, n_end)`` from ``block_info``. A block-sparse call instead lists,
per (batch, head, query block), the key blocks to visit in two classes (``block_sparse.py``): **mask** blocks
(the element mask and the mask_mod apply) and **full** blocks (no mask_mod). ``SparseWalk`` turns the two lists
into a step sequence: the mask list, then the full list, each read last to first, a sparse block of
``per`` kernel tiles (``block_size[1] / tile_n``) expanded into its tiles, last tile first.

Safety against corrupt lists (the host checks shapes, not contents): counts are clamped to the lists' lengths
and block indices to the key blocks the sequence has, so a step never addresses K / V past the tensors;
the mainloop loads every sparse tile bounded by seqlen_k. A full block still gets the element mask where the
dense range says a block needs one (the sequence end, the causal diagonal, a window edge).

The backward's key-major walk (``tile_walk``) reads lists the host derives from the forward's
(``block_sparse.backward_lists``): per (batch, KV head, key tile), entries ``g * query_tiles + m`` naming the
group's query head g and query tile m, already in the kernel's tiles (``per`` = 1).
"""

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr


@dataclass(frozen=True)
class SparseWalk:
    """A tile's block-sparse step sequence (see the module docstring)."""

    #: this (batch, head, query block)'s mask-list and full-list rows (1-D views; ``full_idx`` None without)
    mask_idx: Any
    full_idx: Any
    #: steps of each list: clamped counts x ``per``
    n_mask: Any
    n_full: Any
    #: kernel tiles per sparse key block (compile-time) and the last valid sparse block index
    per: int
    last: Any

    @property
    def count(self):
        return self.n_mask + self.n_full

    @cute.jit
    def block(self, it: Int32) -> Int32:
        """The tile of step ``it`` (< ``count``: callers clamp a look-ahead step)."""
        n = Int32(0)
        if it < self.n_mask:
            e = self.n_mask - 1 - it
            n = cutlass.min(cutlass.max(Int32(self.mask_idx[e // self.per]), 0), self.last) * self.per + e % self.per
        else:
            if const_expr(self.full_idx is not None):
                e = self.count - 1 - it
                n = (cutlass.min(cutlass.max(Int32(self.full_idx[e // self.per]), 0), self.last) * self.per
                     + e % self.per)
        return n


@cute.jit
def raw_entry(walk: SparseWalk, it: Int32) -> Int32:
    """A one-tile-per-entry walk's (``per`` 1: the backward's) entry of step ``it`` as stored, unclamped, or 0
    past the walk's last step: a look-ahead read whose value is first used a step later (``clamp_entry`` then),
    so that nothing waits on the load where it is issued."""
    v = Int32(0)
    if it < walk.n_mask:
        v = Int32(walk.mask_idx[walk.n_mask - 1 - it])
    elif it < walk.count:
        v = Int32(walk.full_idx[walk.count - 1 - it])
    return v


@cute.jit
def clamp_entry(walk: SparseWalk, v: Int32) -> Int32:
    """``raw_entry``'s value held to the walk's entries (as ``SparseWalk.block`` holds it)."""
    return cutlass.min(cutlass.max(v, 0), walk.last)


def _row(t, batch, head, q_block):
    """Row ``(b, h, q_block)`` of a block-sparse tensor whose batch / head dimensions may be 1 (broadcast: the
    host checks each is 1 or the call's, so the min picks 0 or the index)."""
    return cutlass.min(batch, t.shape[0] - 1), cutlass.min(head, t.shape[1] - 1), q_block


@cute.jit
def sparse_walk(mCnt: cute.Tensor, mIdx: cute.Tensor, mFullCnt, mFullIdx, batch: Int32, head: Int32,
                m_block: Int32, tiles_per_q_block: cutlass.Constexpr[int], per: cutlass.Constexpr[int],
                seqlen_k: Int32, tile_n: cutlass.Constexpr[int]) -> SparseWalk:
    """The walk of M tile ``m_block`` of (``batch``, query ``head``): query block ``m_block // tiles_per_q_block``,
    sparse key blocks of ``per`` tiles of ``tile_n`` keys."""
    q_block = m_block // tiles_per_q_block
    b, h, q = _row(mCnt, batch, head, q_block)
    last = cutlass.max((seqlen_k + per * tile_n - 1) // (per * tile_n) - 1, 0)
    n_mask = cutlass.min(cutlass.max(Int32(mCnt[b, h, q]), 0), mIdx.shape[3]) * per
    mask_row = mIdx[b, h, q, None]
    n_full = Int32(0)
    full_row = None
    if const_expr(mFullCnt is not None):
        fb, fh, fq = _row(mFullCnt, batch, head, q_block)
        n_full = cutlass.min(cutlass.max(Int32(mFullCnt[fb, fh, fq]), 0), mFullIdx.shape[3]) * per
        full_row = mFullIdx[fb, fh, fq, None]
    return SparseWalk(mask_idx=mask_row, full_idx=full_row, n_mask=n_mask, n_full=n_full, per=per, last=last)


@cute.jit
def tile_walk(mCnt: cute.Tensor, mIdx: cute.Tensor, mFullCnt: cute.Tensor, mFullIdx: cute.Tensor, batch: Int32,
              row: Int32, tile: Int32, num_entries: Int32) -> SparseWalk:
    """The backward's walk of key tile ``tile`` of CTA row ``row`` (a KV head): the host's lists
    (``block_sparse.backward_lists``) are already in kernel tiles, entries ``g * query_tiles + m`` below
    ``num_entries`` (clamped there)."""
    b, h, n = _row(mCnt, batch, row, tile)
    n_mask = cutlass.min(cutlass.max(Int32(mCnt[b, h, n]), 0), mIdx.shape[3])
    n_full = cutlass.min(cutlass.max(Int32(mFullCnt[b, h, n]), 0), mFullIdx.shape[3])
    return SparseWalk(mask_idx=mIdx[b, h, n, None], full_idx=mFullIdx[b, h, n, None], n_mask=n_mask, n_full=n_full,
                      per=1, last=cutlass.max(num_entries - 1, 0))
