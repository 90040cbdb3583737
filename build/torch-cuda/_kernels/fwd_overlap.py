"""The forward kernel's overlapped mainloop and its ping-pong turns (a part of ``FlashFwdMultistage``).

Overlapped (``config.overlap``): step ``it`` issues the S MMAs of block it, then the P V MMAs of block it - 1,
then the softmax of block it, so each warp's exp2 / max / sum work has tensor-pipe work beside it. K runs one
block ahead of V: load slot s brings K of block s (buffer s % 2) and V of block s - 1 (buffer (s - 1) % 2); the
prologue loads slot 0 (K only), step it loads slot it + 1 (the buffers step it - 1 read) and the tail P V waits
for slot n. The first block is peeled off (no P V before it), and a block-sparse walk runs the same steps over
its listed tiles (``overlap_sparse_mainloop``).

Ping-pong (``config.pingpong``): the CTA's two warp groups take turns at the tensor pipe, each group's softmax
running under the other's MMAs, on named barriers ``_BAR_TURN`` + group (``take_turn`` / ``pass_turn``).

The loads are cp.async here; the TMA variant (``fwd_tma``) overrides the slot hooks (``overlap_prologue``,
``issue_slot``, ``wait_slot``, ``end_step``) and the persistent one (``fwd_persistent``) ``tail_hook``.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from .softmax import softmax_step
from .fragments import acc_rows_cols
from .fwd_state import FwdTileState

_BAR_TURN = 2  # named barriers 2 and 3: the ping-pong turns of the two warp groups (0: CTA, 1: MMA warps)


class OverlappedMainloop:
    """The overlapped mainloop and the ping-pong turns of ``FlashFwdMultistage``."""

    @cute.jit
    def overlap_prologue(self, ctx: FwdTileState, walk=None):
        """Q and K of the first block (block n_end - 1, possibly partial; a block-sparse ``walk``'s first tile),
        landed and visible."""
        kv = ctx.kv
        self.load_q(ctx)
        first, has_block = self.first_block(ctx, walk)
        if has_block:
            kv.load_k(first, 0, bounded=True)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()

    @cute.jit
    def first_block(self, ctx: FwdTileState, walk=None):
        """(the first key block, whether there is one): block n_end - 1 of the range, or a walk's step 0 (an empty
        walk reads no list entry: its first slot may lie before the tensor)."""
        first = ctx.n_end - 1
        has_block = first >= ctx.n_start
        if const_expr(walk is not None):
            has_block = walk.count > 0
            if has_block:
                first = walk.block(0)
        return first, has_block

    @cute.jit
    def next_k(self, ctx: FwdTileState, it: Int32, v_block: Int32, walk=None, k_next=None):
        """(the key block whose K step ``it`` prefetches, whether there is one): v_block - 1 in the range, or the
        walk's step it + 1 (``k_next``: that block, read by the caller ahead of time)."""
        k_block = v_block - 1
        has_k = k_block >= ctx.n_start
        if const_expr(walk is not None):
            has_k = it + 1 < walk.count
            if const_expr(k_next is None):
                k_block = walk.block(cutlass.min(it + 1, walk.count - 1))
            else:
                k_block = k_next
        return k_block, has_k

    @cute.jit
    def issue_slot(self, ctx: FwdTileState, slot: Int32, v_block: Int32, first: cutlass.Constexpr[bool], it: Int32,
                   k_next=None):
        """Start load slot ``slot`` of step ``it``: the next K (``next_k``) and V of block ``v_block`` (the range's
        first block when ``first``: rows past seqlen_k are zero-filled; a walk's tiles always, bounded)."""
        kv = ctx.kv
        k_block, has_k = self.next_k(ctx, it, v_block, ctx.walk, k_next)
        if has_k:
            kv.load_k(k_block, slot % 2, bounded=ctx.walk is not None)
        kv.load_v(v_block, (slot + 1) % 2, bounded=first or ctx.walk is not None)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def wait_slot(self, ctx: FwdTileState, slot: Int32):
        """Before reading K of block ``slot`` / V of block slot - 1 (cp.async: already waited at the end
        of the previous step)."""
        pass

    @cute.jit
    def end_step(self, ctx: FwdTileState, slot: Int32):
        """After a step: slot ``slot`` has landed (cp.async) and every warp is done with the buffers
        the next step refills."""
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()

    @cute.jit
    def overlap_step(self, ctx: FwdTileState, rP: cute.Tensor, it: Int32, n_block: Int32,
                     masked: cutlass.Constexpr[bool], first: cutlass.Constexpr[bool],
                     mask_mod: cutlass.Constexpr[bool] = True, k_next=None):
        """Step ``it`` (block ``n_block``): S of this block, P V of the previous one (``rP``, then
        overwritten with this block's P), softmax of this block in between. The next K comes from the range or
        from ``ctx.walk``'s next step (``next_k``); ``mask_mod`` off: a block-sparse full-list tile."""
        slot = it + ctx.slot_base  # load slots (and their buffers) count on across a persistent CTA's tiles
        if const_expr(self.config.pingpong):
            # the turn hands back the buffers slot it + 1 refills (both groups' MMAs of step it - 1 are done)
            self.wait_slot(ctx, slot)
            self.take_turn(ctx)
            self.issue_slot(ctx, slot + 1, n_block, first, it, k_next)
        else:
            self.issue_slot(ctx, slot + 1, n_block, first, it, k_next)
            self.wait_slot(ctx, slot)
        acc_S = self.scores(ctx, n_block, slot % 2, masked, mask_mod)
        if const_expr(not first):
            self.pv(ctx, rP, (slot + 1) % 2)
        scale = self.pass_turn(ctx, last=False)
        row_max, row_sum, acc_O_rc = ctx.softmax.row_max, ctx.softmax.row_sum, ctx.acc_O_rc
        if const_expr(self.config.pingpong):
            if scale == scale:  # always true; a branch ptxas cannot sink the MMAs past
                self.softmax_to_p(row_max, row_sum, acc_S, acc_O_rc, rP, scale, ctx, n_block)
        else:
            self.softmax_to_p(row_max, row_sum, acc_S, acc_O_rc, rP, scale, ctx, n_block)
        self.end_step(ctx, slot + 1)

    @cute.jit
    def softmax_to_p(self, row_max, row_sum, acc_S: cute.Tensor, acc_O_rc: cute.Tensor, rP: cute.Tensor, scale,
                     ctx: FwdTileState = None, n_block: Int32 = None):
        """The overlapped step's softmax of this block (key block ``n_block``), its P kept in 16 bits for the next
        step's P V."""
        softmax_step(row_max, row_sum, acc_rows_cols(acc_S), acc_O_rc, scale)
        self.dropped_p(ctx, acc_S, n_block, rP)

    @cute.jit
    def overlap_mainloop(self, ctx: FwdTileState, num_right: Int32, num_full: Int32):
        """The first block is peeled off (no P V before it; masked, whatever its class), then each
        class's remaining blocks, then the last block's P V."""
        n_total = ctx.n_end - ctx.n_start
        rP = cute.make_rmem_tensor(ctx.thr_mma.partition_shape_C((self.tile_m, self.tile_n)), self.dtype)
        if n_total > 0:
            self.first_turn(ctx)
            self.overlap_step(ctx, rP, 0, ctx.n_end - 1, masked=True, first=True)
            for it in cutlass.range(1, num_right, unroll=1):
                self.overlap_step(ctx, rP, it, ctx.n_end - 1 - it, masked=True, first=False)
            first_full = num_right if num_right > 0 else 1
            for it in cutlass.range(first_full, num_right + num_full, unroll=1):
                self.overlap_step(ctx, rP, it, ctx.n_end - 1 - it, masked=False, first=False)
            if const_expr(self.spec.local):
                first_left = num_right + num_full if num_right + num_full > 0 else 1
                for it in cutlass.range(first_left, n_total, unroll=1):
                    self.overlap_step(ctx, rP, it, ctx.n_end - 1 - it, masked=True, first=False)
            self.overlap_tail(ctx, rP, n_total)

    @cute.jit
    def overlap_tail(self, ctx: FwdTileState, rP: cute.Tensor, n_total: Int32):
        """After ``n_total`` overlapped steps: the last block's P V, in its turn."""
        self.wait_slot(ctx, n_total + ctx.slot_base)
        self.take_turn(ctx)
        self.tail_hook(ctx)
        self.pv(ctx, rP, (n_total + ctx.slot_base + 1) % 2)
        self.pass_turn(ctx, last=True)

    @cute.jit
    def overlap_sparse_mainloop(self, ctx: FwdTileState, walk):
        """``overlap_mainloop`` over a block-sparse walk (``block_walk``): the first step peeled off (masked), the
        mask-list tiles masked with the mask_mod, the full-list tiles without it, element-masked only where the
        dense range says a tile needs it; K runs one walk step ahead of V (``next_k``)."""
        n_total = walk.count
        rP = cute.make_rmem_tensor(ctx.thr_mma.partition_shape_C((self.tile_m, self.tile_n)), self.dtype)
        if n_total > 0:
            self.first_turn(ctx)
            # each step's block is the previous step's look-ahead (one list read per step), read before the step
            # takes its turn (the read's latency passes while the other group's MMAs run)
            n_block = walk.block(0)
            k_next = walk.block(cutlass.min(1, n_total - 1))
            if walk.n_mask > 0:
                self.overlap_step(ctx, rP, 0, n_block, masked=True, first=True, k_next=k_next)
            else:
                self.overlap_step(ctx, rP, 0, n_block, masked=True, first=True, mask_mod=False, k_next=k_next)
            n_block = k_next
            for it in cutlass.range(1, walk.n_mask, unroll=1):
                k_next = walk.block(cutlass.min(it + 1, n_total - 1))
                self.overlap_step(ctx, rP, it, n_block, masked=True, first=False, k_next=k_next)
                n_block = k_next
            for it in cutlass.range(cutlass.max(walk.n_mask, 1), n_total, unroll=1):
                k_next = walk.block(cutlass.min(it + 1, n_total - 1))
                if n_block >= ctx.n_unmasked_start and n_block < ctx.n_unmasked_end:
                    self.overlap_step(ctx, rP, it, n_block, masked=False, first=False, mask_mod=False,
                                      k_next=k_next)
                else:
                    self.overlap_step(ctx, rP, it, n_block, masked=True, first=False, mask_mod=False, k_next=k_next)
                n_block = k_next
            self.overlap_tail(ctx, rP, n_total)

    @cute.jit
    def tail_hook(self, ctx: FwdTileState):
        """At the start of the tail P V turn (the K buffers are free): nothing here; persistent tiles
        start the next tile's first K load."""
        pass

    # Ping-pong (``config.pingpong``): group g waits on named barrier _BAR_TURN + g before its MMAs
    # and, after issuing them, arrives on the other group's. Every group has n_total + 1 MMA turns
    # (n_total steps and the tail P V); group 1 opens group 0's first turn and skips its last arrive,
    # so both barriers end balanced.
    def turn_group(self, ctx: FwdTileState):
        return cute.arch.make_warp_uniform(cute.arch.warp_idx()) // (self.config.num_warps // 2)

    @cute.jit
    def first_turn(self, ctx: FwdTileState):
        if const_expr(self.config.pingpong and not self.config.persistent):  # persistent: once per CTA
            self.open_turns()

    @cute.jit
    def open_turns(self):
        """Group 1 opens group 0's first turn."""
        if const_expr(self.config.pingpong):
            if self.turn_group(None) == 1:
                cute.arch.barrier_arrive(barrier_id=_BAR_TURN, number_of_threads=self.num_threads)

    @cute.jit
    def take_turn(self, ctx: FwdTileState):
        if const_expr(self.config.pingpong):
            cute.arch.barrier(barrier_id=_BAR_TURN + self.turn_group(ctx), number_of_threads=self.num_threads)

    @cute.jit
    def pass_turn(self, ctx: FwdTileState, last: cutlass.Constexpr[bool]):
        """After a group's MMAs: open the other group's turn. Returns the softmax scale for the step:
        with ping-pong, reloaded from shared memory after the arrive (ptxas moves register-only code
        across a bar.arrive, and would otherwise pull the softmax ahead of it, which closes the
        turn only after the softmax; a shared load cannot cross it, and the exponentials need it)."""
        scale = ctx.softmax.scale_log2
        if const_expr(self.config.pingpong):
            group = self.turn_group(ctx)
            if const_expr(last and not self.config.persistent):
                if group == 0:
                    cute.arch.barrier_arrive(barrier_id=_BAR_TURN + 1, number_of_threads=self.num_threads)
            else:
                cute.arch.barrier_arrive(barrier_id=_BAR_TURN + 1 - group, number_of_threads=self.num_threads)
                scale = ctx.sScale[0]
        return scale
