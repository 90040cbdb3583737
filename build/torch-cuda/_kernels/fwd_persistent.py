"""Persistent ping-pong forward (``config.persistent``; SM120 execution model).

At one CTA per SM (what 99 KB of shared memory allows for the ping-pong tiles) nothing covers a
CTA's prologue and epilogue: the Q tile's load, the first K load and the O stores leave the tensor
pipe idle for several key blocks' worth of time per tile (measured ~10% at 1024 keys). Here one CTA
per SM walks the tiles (``PersistentTileScheduler``) and lets one warp group's tile boundary run
under the other group's MMAs:

* each warp group owns its rows of the tile (the MMA layout gives group g the 64-row blocks
  2i + g): it loads its own Q rows by cp.async, waits on its own named barrier, and after its last
  MMA turn of a tile starts loading the next tile's Q rows (its last S GEMM has read them);
* O goes from registers straight to global memory (``epilogue_rows``): no shared memory, no CTA
  barrier at the tile boundary;
* the K/V load slots and their mbarrier phases count on across tiles (``ctx.slot_base``), and the
  turns keep alternating: warp 0 starts the next tile's first K load as soon as its group begins
  the tile, while the other group finishes its last P V.

Same per-block math, masks and TMA loads as ``fwd_tma`` (this class only adds the tile loop).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from ..config import atom_cols
from . import block_info
from .fwd_state import EpilogueTarget, FwdTileState, NextTileLoad, PersistentArgs, TilePlan
from .fwd_tma import FlashFwdTma
from .kv_source import DenseKV
from .seqlen_info import num_batches, num_heads, sequence_heads
from .tile_scheduler import tile_coords
from .tile_io import column_predicate, copy_rows, g2s_tiled_copy, zero_masked_cols

_BAR_GROUP = 4  # named barriers 4 and 5: one per warp group (its Q rows have landed / been read)


class FlashFwdPersistent(FlashFwdTma):
    """Persistent CTAs over the ping-pong TMA mainloop."""

    @property
    def group_threads(self) -> int:
        return self.num_threads // 2

    @property
    def group_rows(self) -> int:
        """Rows of one group's contiguous row block (16 per warp of the group)."""
        return 16 * (self.config.num_warps // 2)

    @cute.jit
    def group_barrier(self, group):
        cute.arch.barrier(barrier_id=_BAR_GROUP + group, number_of_threads=self.group_threads)

    @cute.jit
    def q_rows(self, sQ, mQ_h, seqlen_q, head, m_block, group, gtid, zero_pad: cutlass.Constexpr[bool]):
        """cp.async group ``group``'s Q rows of tile ``m_block`` (blocks 2i + group of ``group_rows``
        rows) into sQ, one commit group; or, with ``zero_pad``, only zero their padded columns (once per
        CTA: they are never loaded and never overwritten)."""
        copy = g2s_tiled_copy(self.dtype, atom_cols(self.head_dim), self.group_threads,
                              cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL))
        thr = copy.get_slice(gtid)
        cQ = cute.make_identity_tensor((self.group_rows, self.head_dim))
        tQcQ, t0QcQ = thr.partition_S(cQ), copy.get_slice(0).partition_S(cQ)
        col_pred = column_predicate(tQcQ, self.spec.head_dim) if const_expr(self.pad_qk) else None
        blocks_per_tile = self.tile_m // self.group_rows
        for i in cutlass.range_constexpr(blocks_per_tile // 2):
            blk = i * 2 + group
            tQsQ = thr.partition_D(cute.local_tile(sQ, (self.group_rows, self.head_dim), (blk, 0)))
            if const_expr(zero_pad):
                zero_masked_cols(tQsQ, col_pred)
            else:
                gQ = cute.local_tile(mQ_h[None, head, None], (self.group_rows, self.head_dim),
                                     (m_block * blocks_per_tile + blk, 0))
                copy_rows(copy, thr.partition_S(gQ), tQsQ, t0QcQ,
                          seqlen_q - (m_block * self.tile_m + blk * self.group_rows) - tQcQ[0][0], False, col_pred)
        if const_expr(not zero_pad):
            cute.arch.cp_async_commit_group()

    @cute.jit
    def tail_hook(self, ctx: FwdTileState):
        """Group 0's tail turn: warp 0 starts the next tile's first K load (both groups' last S GEMMs,
        the buffer's last readers, are done once this turn is open)."""
        if ctx.next_k.go != 0 and self.turn_group(ctx) == 0:
            self.issue_first_k(ctx.next_k)

    @cute.jit
    def tile_plan(self, p: PersistentArgs, tile, num_m_blocks, heads, ratio,
                  reverse_m: cutlass.Constexpr[bool]) -> TilePlan:
        """What tile ``tile`` is: its coordinates, Q view and lengths, and its key-block ranges (the
        loop plans the current tile and, for the loads it starts early, the next one)."""
        m_block, head, batch = tile_coords(tile, num_m_blocks, heads, reverse_m)
        mQ_h, seqlen_q = sequence_heads(p.mQ, batch, p.mCuSeqlensQ, p.mSeqUsedQ)
        kv_src = DenseKV.locate(p.mK, p.mV, batch, p.mCuSeqlensK, p.mSeqUsedK, (p.tma_atom_K, p.mK_tma),
                                (p.tma_atom_V, p.mV_tma))
        ranges = block_info.block_range_rows(
            m_block * self.tile_m, (m_block + 1) * self.tile_m, seqlen_q, kv_src.seqlen_k, self.tile_n,
            self.causal, self.spec.local, p.window_left, p.window_right,
        )
        head_kv = head // ratio
        return TilePlan(m_block=m_block, head=head, batch=batch, head_kv=head_kv, mQ_h=mQ_h, seqlen_q=seqlen_q,
                        seqlen_k=kv_src.seqlen_k, ranges=ranges,
                        kv_src=kv_src.head(head_kv).blocks(self.tile_n, self.head_dim, self.head_dim_v))

    @cute.jit
    def persistent_tiles(self, p: PersistentArgs):
        """The kernel body for ``config.persistent`` (``p``: the kernel's parameters, see ``kernel``)."""
        mCuSeqlensQ, mSeqUsedQ = p.mCuSeqlensQ, p.mSeqUsedQ
        softmax_scale_log2, window_left, window_right = p.scale_log2, p.window_left, p.window_right
        scheduler, num_m_blocks = p.scheduler, p.num_m_blocks
        tidx, _, _ = cute.arch.thread_idx()
        group = self.turn_group(None)
        gtid = tidx % self.group_threads
        heads = num_heads(p.mQ, mCuSeqlensQ is not None)
        ratio = heads // num_heads(p.mK, p.mCuSeqlensK is not None)
        total = num_m_blocks * heads * num_batches(p.mQ, mCuSeqlensQ)
        sm = self.shared_tiles(tidx, softmax_scale_log2, *p.layouts)
        if const_expr(self.pad_qk):
            self.q_rows(sm.sQ, None, None, None, None, group, gtid, zero_pad=True)
        self.open_turns()

        tile = scheduler.first()
        stride = scheduler.stride()
        reverse_m = scheduler.reverse_m
        slot_base = Int32(0)
        q_loaded = Int32(0)  # this tile's Q rows were started under the previous tile
        k_loaded = Int32(0)  # and its first K block, in the previous tile's tail
        while tile < total:
            cur = self.tile_plan(p, tile, num_m_blocks, heads, ratio, reverse_m)
            m_block, head, batch, head_kv, seqlen_q = cur.m_block, cur.head, cur.batch, cur.head_kv, cur.seqlen_q
            if m_block * self.tile_m < seqlen_q:  # packed batches: tiles past a short sequence do nothing
                n_start, n_unmasked_start, n_unmasked_end, n_end = cur.ranges
                ctx = self.mma_context(tidx, sm, softmax_scale_log2)
                ctx.update(
                    m_block=m_block, seqlen_q=seqlen_q, seqlen_k=cur.seqlen_k, n_start=n_start, n_end=n_end,
                    n_unmasked_start=n_unmasked_start, n_unmasked_end=n_unmasked_end, group=None,
                    tile_rows=seqlen_q, head_kv=head_kv, slot_base=slot_base, walk=None,
                )
                ctx.score = self.score_step(ctx, p.softcap_scale, window_left, window_right, batch, head,
                                            mCuSeqlensQ, p.mCuSeqlensK)
                ctx.kv = self.kv_loader(cur.kv_src, tidx, sm)
                if q_loaded == 0:
                    self.q_rows(sm.sQ, cur.mQ_h, seqlen_q, head, m_block, group, gtid, zero_pad=False)
                if k_loaded == 0:
                    self.issue_first_k(ctx)  # warp 0
                # The next tile's first K block starts loading in this tile's tail P V turn (tail_hook)
                # when this tile has key blocks and the next one is a real tile with some.
                n_total = n_end - n_start
                nxt = tile + stride
                k_loaded = Int32(0)
                nx = self.tile_plan(p, nxt, num_m_blocks, heads, ratio, reverse_m)
                if nxt < total and nx.m_block * self.tile_m < nx.seqlen_q and n_total > 0:
                    if nx.ranges[3] > nx.ranges[0]:
                        k_loaded = Int32(1)
                ctx.next_k = NextTileLoad(
                    go=k_loaded, n_start=nx.ranges[0], n_end=nx.ranges[3], bars=sm.bars, slot_base=slot_base + n_total + 1,
                    kv=self.kv_loader(nx.kv_src, tidx, sm),
                )
                cute.arch.cp_async_wait_group(0)
                self.group_barrier(group)  # the group's Q rows are in smem
                if const_expr(self.config.q_in_regs):
                    cute.copy(ctx.s2r_q, ctx.tSsQ, ctx.tSrQ_v)
                self.overlap_mainloop(ctx, n_end - n_unmasked_end, n_unmasked_end - n_unmasked_start)

                # Start the next tile's Q rows (this group has read its own for the last time).
                q_loaded = Int32(0)
                if nxt < total and nx.m_block * self.tile_m < nx.seqlen_q:
                    self.group_barrier(group)
                    self.q_rows(sm.sQ, nx.mQ_h, nx.seqlen_q, nx.head, nx.m_block, group, gtid, zero_pad=False)
                    q_loaded = Int32(1)
                out = EpilogueTarget(mO=p.mO, mLSE=p.mLSE, mCuSeqlensQ=mCuSeqlensQ, mSeqUsedQ=mSeqUsedQ, batch=batch,
                                     head=head, split=0)
                self.finish(ctx, p.mSink, head, None, out)
                if n_total > 0:
                    slot_base = slot_base + n_total + 1
            tile = tile + stride
        # Group 1 arrived after its every turn, the first one opened by open_turns: consume the last.
        if group == 0:
            self.take_turn(None)
        cute.arch.cp_async_wait_group(0)
