"""The forward kernel's cp.async mainloops (a part of ``FlashFwdMultistage``; ``fwd_multistage`` has the algorithm).

Two schedules of the per-block math (``FlashFwdMultistage.compute_block``) over the key blocks:

* multistage (``num_stages`` 2-3): the prologue loads Q and the first ``num_stages - 1`` K/V tiles; step ``it``
  refills the stage step ``it - 1`` freed with the tile ``num_stages - 1`` blocks ahead, computes its block
  from stage ``it % num_stages``, then waits for the next tile and meets the CTA at one barrier;
* one stage (``num_stages == 1``): one K and one V buffer; K of the next block loads while this block's
  softmax and P V run, V of the next block while the next S MMAs run (two CTA barriers per block).

Both walk the dense key-block range or a block-sparse walk (``sparse_mainloop``; ``block_walk``). The TMA
loader variant (``fwd_tma``) overrides ``prologue`` and ``mainloop_step``.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from .fragments import acc_rows_cols
from .fwd_state import FwdTileState


class StagedMainloop:
    """The multistage and one-stage cp.async mainloops of ``FlashFwdMultistage``."""

    @cute.jit
    def prologue(self, ctx: FwdTileState, walk=None):
        """cp.async Q and the first stages - 1 K/V tiles (tile 0 = block n_end - 1 may be partial; with a
        block-sparse ``walk``, its first steps' tiles); wait for Q and tile 0."""
        stages, kv = self.config.num_stages, ctx.kv
        self.load_q(ctx)
        for j in cutlass.range_constexpr(stages - 1):
            if const_expr(walk is None):
                n_block = ctx.n_end - 1 - j
                if n_block >= ctx.n_start:
                    kv.load_k(n_block, j, bounded=True)
                    kv.load_v(n_block, j, bounded=True)
            else:
                if j < walk.count:
                    n_block = walk.block(j)
                    kv.load_k(n_block, j, bounded=True)
                    kv.load_v(n_block, j, bounded=True)
            cute.arch.cp_async_commit_group()
        if const_expr(walk is None):
            if ctx.n_end - stages >= ctx.n_start:  # the first refill's pages (paged K/V), read while we wait
                kv.lookahead(ctx.n_end - stages)
        cute.arch.cp_async_wait_group(stages - 2)
        if const_expr(self.widens_kv):  # FP8 K/V: this thread's share of tile 0, widened (kv_dequant)
            kv.widen(0, 0)
        cute.arch.sync_threads()

    @cute.jit
    def mainloop_step(self, ctx: FwdTileState, it: Int32, n_block: Int32, masked: cutlass.Constexpr[bool],
                      walk=None, mask_mod: cutlass.Constexpr[bool] = True):
        """Step ``it``: key block ``n_block``, whose K/V tile sits complete in stage it % stages (one
        stage: K complete, V in flight). ``walk``: the block-sparse walk the next tiles come from (None: the
        dense range); ``mask_mod``: a masked step also applies the mask_mod (not on a full-list tile)."""
        if const_expr(self.single_stage):
            self.single_stage_step(ctx, n_block, masked, walk, it, mask_mod)
        else:
            self.multistage_step(ctx, it, n_block, masked, walk, mask_mod)

    @cute.jit
    def multistage_step(self, ctx: FwdTileState, it: Int32, n_block: Int32, masked: cutlass.Constexpr[bool],
                        walk=None, mask_mod: cutlass.Constexpr[bool] = True):
        stages, kv = self.config.num_stages, ctx.kv
        stage = it % stages
        staged = self.widens_kv  # FP8 K/V: stages are staging, the MMAs read 16-bit buffers (kv_dequant)
        # a. Refill the stage consumed last step (every warp passed the barrier after it).
        if const_expr(walk is None):
            n_ahead = n_block - (stages - 1)
            if n_ahead >= ctx.n_start:
                stage_ahead = (stage + stages - 1) % stages
                kv.load_k(n_ahead, stage_ahead, bounded=False, looked_up=True)
                kv.load_v(n_ahead, stage_ahead, bounded=False, looked_up=True)
                if n_ahead - 1 >= ctx.n_start:  # the next refill's pages (paged K/V) load under this block's math
                    kv.lookahead(n_ahead - 1)
        else:
            if it + stages - 1 < walk.count:  # a listed tile may be the sequence's last: loads stay bounded
                n_ahead = walk.block(it + stages - 1)
                stage_ahead = (stage + stages - 1) % stages
                kv.load_k(n_ahead, stage_ahead, bounded=True)
                kv.load_v(n_ahead, stage_ahead, bounded=True)
        cute.arch.cp_async_commit_group()  # possibly empty: keeps the group count per step fixed
        self.compute_block(ctx, n_block, kv.mma_buffer(it) if const_expr(staged) else stage, masked, mask_mod)
        # f. The next tile has landed (all but the newest stages - 2 groups) and this stage is free.
        cute.arch.cp_async_wait_group(stages - 2)
        if const_expr(staged):
            # FP8 K/V: this thread's share of the next tile, widened into the 16-bit buffer no warp reads now (every
            # warp finished reading it before the previous barrier); the barrier below publishes it
            self.widen_next(ctx, it, n_block, walk)
        cute.arch.sync_threads()

    @cute.jit
    def widen_next(self, ctx: FwdTileState, it: Int32, n_block: Int32, walk=None):
        """FP8 K/V: this thread's share of step ``it + 1``'s tile (landed), widened into its 16-bit buffer, when
        there is a next block (``kv_dequant``)."""
        stages, kv = self.config.num_stages, ctx.kv
        has_next = n_block > ctx.n_start if const_expr(walk is None) else it + 1 < walk.count
        if has_next:
            kv.widen((it + 1) % stages, kv.mma_buffer(it + 1))

    # ------------------------------------------------------------------------------------------
    # One K and one V buffer (``num_stages == 1``, cp.async): K of the next block loads while this
    # block's softmax and P V run, V of the next block while the next S MMAs run. Two CTA barriers
    # per block, half the K/V shared memory of two stages: 128-row tiles of head dims up to 96 fit
    # twice in an SM120 SM.
    # ------------------------------------------------------------------------------------------
    @property
    def single_stage(self) -> bool:
        # the predicate (config.fwd_config_problems) admits one stage only for cp.async without overlap
        return self.config.num_stages == 1

    @cute.jit
    def single_stage_prologue(self, ctx: FwdTileState, walk=None):
        """Q and K of the first block (block n_end - 1, possibly partial; the block-sparse ``walk``'s first
        tile) landed and visible; its V in flight (the second commit group)."""
        kv = ctx.kv
        self.load_q(ctx)
        first, has_block = self.first_block(ctx, walk)
        if has_block:
            kv.load_k(first, 0, bounded=True)
        cute.arch.cp_async_commit_group()
        if has_block:
            kv.load_v(first, 0, bounded=True)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(1)
        cute.arch.sync_threads()

    @cute.jit
    def single_stage_step(self, ctx: FwdTileState, n_block: Int32, masked: cutlass.Constexpr[bool], walk=None,
                          it: Int32 = None, mask_mod: cutlass.Constexpr[bool] = True):
        """Key block ``n_block``: K complete in the buffer, V in flight (one commit group). The next block is
        n_block - 1, or step it + 1 of a block-sparse ``walk`` (loaded bounded: it may be the sequence's last)."""
        kv = ctx.kv
        acc_S = self.scores(ctx, n_block, 0, masked, mask_mod)
        n_next, has_next = self.next_k(ctx, it, n_block, walk)
        cute.arch.cp_async_wait_group(0)  # this block's V
        cute.arch.sync_threads()  # every warp is done with K; V is visible
        if has_next:
            kv.load_k(n_next, 0, bounded=walk is not None)
        cute.arch.cp_async_commit_group()
        ctx.softmax.step(acc_rows_cols(acc_S), ctx.acc_O_rc)
        self.pv(ctx, self.dropped_p(ctx, acc_S, n_block), 0)
        cute.arch.cp_async_wait_group(0)  # the next block's K
        cute.arch.sync_threads()  # every warp is done with V; K is visible
        if has_next:
            kv.load_v(n_next, 0, bounded=walk is not None)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def sparse_mainloop(self, ctx: FwdTileState, walk):
        """The block-sparse walk (``block_walk``): mask-list tiles with the element mask and the mask_mod; full-list
        tiles without the mask_mod, element-masked only where the dense range says a tile needs it (the sequence
        end, the causal diagonal, a window edge)."""
        for i in cutlass.range(walk.n_mask, unroll=1):
            self.mainloop_step(ctx, i, walk.block(i), masked=True, walk=walk)
        for i in cutlass.range(walk.n_mask, walk.count, unroll=1):
            n_block = walk.block(i)
            if n_block >= ctx.n_unmasked_start and n_block < ctx.n_unmasked_end:
                self.mainloop_step(ctx, i, n_block, masked=False, walk=walk, mask_mod=False)
            else:
                self.mainloop_step(ctx, i, n_block, masked=True, walk=walk, mask_mod=False)
