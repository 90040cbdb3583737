"""A key block's walk in the backward main kernel (a part of ``FlashBwdMultistage``; ``bwd_multistage`` has the
algorithm): its data movement and the order of its steps.

* Loads: K_n and V_n once (``load_kv``; rows past seqlen_k zero-filled, a warp group per tile where
  ``bwd_kv_copy_threads`` says so), then each step's Q and dO tiles into their stages (``load_q_do``).
* Steps: step ``it`` visits (query head, query block) ``step_coords(it)``: the group's heads outer and the key
  block's query blocks inner (rotated to start at block n where ``bwd_rotated_start`` says so), or in the
  deterministic lowest-first order the query blocks outer, last first; a block-sparse walk reads its entries
  from the host's lists a step ahead (``sparse_schedule``). ``block_turn`` gives the forward's block range of
  the step (which pairs need an element mask) and, in the deterministic mode, the dQ turn (``dq_accum``).
* Epilogue: dK * scale and dV in 16 bits through the freed K and V tiles, then 16-byte rows to global memory
  (``store_dkv``; rows past seqlen_k and padded head-dim columns are not written).
"""

import cutlass
import cutlass.cute as cute
from cutlass import const_expr
from cutlass.cute.nvgpu import cpasync

from . import block_info
from .block_walk import clamp_entry, raw_entry
from .bwd_state import BwdSmem, BwdTileState
from .dq_accum import read_turn, semaphore_ptr, turn_rank
from .fragments import convert
from .seqlen_info import sequence_heads
from .tile_io import (column_predicate, g2s_tiled_copy, load_rows, smem_layout_atom, store_rows,
                      zero_masked_cols)


class KeyBlockWalk:
    """The loads, the step order and the dK / dV stores of ``FlashBwdMultistage``."""

    # ------------------------------------------------------------------------------------------
    # Loads
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def load_kv(self, ctx: BwdTileState, sm: BwdSmem, mK_s, mV_s, head_kv):
        """cp.async K_n and V_n (rows past seqlen_k zero-filled; padded head-dim columns zeroed once, in
        the K / V tiles and in every Q / dO stage, since no copy writes them)."""
        tidx, n = ctx.tidx, ctx.n_block
        for src, dst, tiled, width, real, owner in (
                (mK_s, sm.sK, self.g2s_qk, self.head_dim, self.spec.head_dim, 1),
                (mV_s, sm.sV, self.g2s_v, self.head_dim_v, self.spec.head_dim_v, 0)):
            g = cute.local_tile(src[None, head_kv, None], (self.tile_n, width), (n, 0))
            if const_expr(self.kv_threads == self.num_threads):
                load_rows(tiled, tidx, g, dst, (self.tile_n, width), real, ctx.seqlen_k - n * self.tile_n, True)
            elif tidx // self.kv_threads == owner:  # a warp group per tile (``bwd_kv_copy_threads``)
                load_rows(self.row_copy(width, self.kv_threads), tidx % self.kv_threads, g, dst, (self.tile_n, width),
                          real, ctx.seqlen_k - n * self.tile_n, True)
        for s_x, tiled, width, real, stages in ((sm.sQ, self.g2s_qk, self.head_dim, self.spec.head_dim,
                                                 self.config.stages_q),
                                                (sm.sdO, self.g2s_v, self.head_dim_v, self.spec.head_dim_v,
                                                 self.config.stages_do)):
            if const_expr(width != real):
                thr = tiled.get_slice(tidx)
                col_pred = column_predicate(thr.partition_S(cute.make_identity_tensor((self.tile_m, width))), real)
                t_x = thr.partition_D(s_x)
                for st in cutlass.range_constexpr(stages):
                    zero_masked_cols(t_x[None, None, None, st], col_pred)

    def row_copy(self, width: int, threads: int, op=None) -> cute.TiledCopy:
        """A 16-byte row copy of a ``width``-wide swizzled tile by ``threads`` threads (``op``: cp.async global ->
        shared by default), for the copies one warp group or a K / V owner makes inside the kernel."""
        op = op if op is not None else cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
        return g2s_tiled_copy(self.dtype, smem_layout_atom(self.dtype, width).outer.shape[1], threads, op)

    @cute.jit
    def load_q_do(self, ctx: BwdTileState, sm: BwdSmem, it, q: cutlass.Constexpr[bool],
                  do: cutlass.Constexpr[bool], coords=None):
        """cp.async step ``it``'s Q tile (with ``q``) and / or dO tile (with ``do``): query block m of query
        head g, rows past seqlen_q zero-filled, into stage it % stages. ``coords``: the step's (head, m) when the
        caller has them."""
        tidx = ctx.tidx
        head, m = self.step_coords(ctx, it) if const_expr(coords is None) else coords
        cfg = self.config
        for wanted, src, dst, tiled, width, real, stages in (
                (q, ctx.mQ_s, sm.sQ, self.g2s_qk, self.head_dim, self.spec.head_dim, cfg.stages_q),
                (do, ctx.mdO_s, sm.sdO, self.g2s_v, self.head_dim_v, self.spec.head_dim_v, cfg.stages_do)):
            if const_expr(wanted):
                gX = cute.local_tile(src[None, head, None], (self.tile_m, width), (m, 0))
                load_rows(tiled, tidx, gX, dst[None, None, it % stages], (self.tile_m, width), real,
                          ctx.seqlen_q - m * self.tile_m)

    # ------------------------------------------------------------------------------------------
    # One (query head, query block) step
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def step_coords(self, ctx: BwdTileState, it):
        """(query head, query block) of step ``it``: the group's query heads outer, the key block's query blocks
        inner; in the deterministic mode's lowest-first order the query blocks outer, last first, and the heads
        inner, so that every key block of a pair reaches a (query head, query block) at the same step of its walk
        and the lowest, which adds first (``dq_accum``), never waits on a walk behind it."""
        if const_expr(self.spec.block_sparse is not None):
            return self.entry_coords(ctx, ctx.walk.block(it))
        outer, inner = (divmod(it, ctx.step_div) if const_expr(self.step_divisor)
                        else (it // ctx.step_inner, it % ctx.step_inner))
        if const_expr(self.spec.lowest_first):
            return ctx.head_kv * ctx.group + inner, ctx.m_start + ctx.num_m - 1 - outer
        g, m = outer, inner
        if const_expr(self.rotated_start):
            m = m + ctx.m_rotation
            if m >= ctx.num_m:
                m = m - ctx.num_m
        return ctx.head_kv * ctx.group + g, ctx.m_start + m

    @cute.jit
    def entry_coords(self, ctx: BwdTileState, t):
        """(query head, query block) of a block-sparse walk's entry ``t`` (``g * query_tiles + m``)."""
        return ctx.head_kv * ctx.group + t // ctx.num_m, t % ctx.num_m

    @cute.jit
    def sparse_schedule(self, ctx: BwdTileState, it, num_steps, entries):
        """``step_schedule`` of a block-sparse walk from the entries of steps ``it`` and ``it + 1`` that
        ``main_loop`` carries, plus the next step's (query head, query block) and the entry of step ``it + 2``,
        read now and first used a step later: no step waits on a list read at its start (ncu, H100, 2026-11-26: read
        at the step's start, they double the long-scoreboard stalls)."""
        head, m = self.entry_coords(ctx, clamp_entry(ctx.walk, entries[0]))
        return (head, m, it % self.config.stages_q, it % self.config.stages_do, it + 1 < num_steps,
                self.entry_coords(ctx, clamp_entry(ctx.walk, entries[1])), raw_entry(ctx.walk, it + 2))

    @cute.jit
    def step_schedule(self, ctx: BwdTileState, it, num_steps):
        """(query head, query block, Q stage, dO stage, whether a step follows) of step ``it``."""
        head, m = self.step_coords(ctx, it)
        return head, m, it % self.config.stages_q, it % self.config.stages_do, it + 1 < num_steps

    @cute.jit
    def block_turn(self, ctx: BwdTileState, head, m, mSem, mCuSeqlensQ, poll_tidx):
        """(the forward's block range of query block m, the deterministic mode's turn or None). The turn is
        (counter, this key block's rank, the first acquire read by the thread whose ``poll_tidx`` is 0, in flight
        under the step's first MMAs; None with ``poll_tidx`` None: the caller reads, ``read_turn``)."""
        ranges = block_info.block_range(m, ctx.seqlen_q, ctx.seqlen_k, self.tile_m, self.tile_n, self.spec.causal,
                                        self.spec.local, ctx.window_left, ctx.window_right)
        turn = None
        if const_expr(self.spec.deterministic):
            sem = semaphore_ptr(mSem, ctx.batch, head, m, self.tile_m, mCuSeqlensQ, ctx.total_q)
            rotated = (m - ctx.m_start, ctx.num_m) if const_expr(self.spec.rotated_turns) else None
            turn = (sem, turn_rank(ctx.n_block, ranges, self.spec.lowest_first, rotated),
                    read_turn(sem, poll_tidx) if const_expr(poll_tidx is not None) else None)
        return ranges, turn

    # ------------------------------------------------------------------------------------------
    # Epilogue
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def store_dkv(self, ctx: BwdTileState, mdK, mdV, mCuSeqlensK, mSeqUsedK, softmax_scale):
        """dK * scale and dV in 16 bits through the (now free) K and V tiles (slice by slice, as accumulated),
        then 16-byte rows to global memory; rows past seqlen_k and padded head-dim columns are not written."""
        tidx = ctx.tidx
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                                         num_bits_per_copy=2 * self.dtype.width), self.mma_dkv)
        thr_r2s = r2s.get_slice(tidx)
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()  # every warp is done with sK / sV
        chunks = self.config.dkv_chunks
        for ch in cutlass.range_constexpr(chunks):
            ctx.acc_dK[ch].store(ctx.acc_dK[ch].load() * softmax_scale)
            for acc, s_out, width in ((ctx.acc_dK[ch], ctx.sK_out, self.head_dim // chunks),
                                      (ctx.acc_dV[ch], ctx.sV_out, self.head_dim_v // chunks)):
                dst = thr_r2s.partition_D(cute.local_tile(s_out, (self.tile_n, width), (0, ch)))
                cute.copy(r2s, thr_r2s.retile(convert(acc, self.dtype)), dst)
        self.store_dkv_rows(ctx, mdK, mdV, mCuSeqlensK, mSeqUsedK)

    @cute.jit
    def store_dkv_rows(self, ctx: BwdTileState, mdK, mdV, mCuSeqlensK, mSeqUsedK):
        """After the dK / dV tiles are in sK_out / sV_out: a CTA barrier, then 16-byte rows to global memory
        (rows past seqlen_k and padded head-dim columns are not written)."""
        tidx = ctx.tidx
        cute.arch.sync_threads()
        for mX, sX, width, real, owner in ((mdK, ctx.sK_out, self.head_dim, self.spec.head_dim, 1),
                                           (mdV, ctx.sV_out, self.head_dim_v, self.spec.head_dim_v, 0)):
            s2g = self.row_copy(width, self.kv_threads, cute.nvgpu.CopyUniversalOp())
            mX_s, _ = sequence_heads(mX, ctx.batch, mCuSeqlensK, mSeqUsedK)
            gX = cute.local_tile(mX_s[None, ctx.head_kv, None], (self.tile_n, width), (ctx.n_block, 0))
            if const_expr(self.kv_threads == self.num_threads):
                store_rows(s2g, tidx, sX, gX, (self.tile_n, width), real, ctx.seqlen_k - ctx.n_block * self.tile_n)
            elif tidx // self.kv_threads == owner:
                store_rows(s2g, tidx % self.kv_threads, sX, gX, (self.tile_n, width), real,
                           ctx.seqlen_k - ctx.n_block * self.tile_n)
