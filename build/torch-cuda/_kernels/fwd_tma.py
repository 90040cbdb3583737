"""Forward attention with TMA-fed K/V stages and mbarrier pipelines (SM120 execution model).

Same tiles, fragments and per-block math as ``fwd_multistage`` (``compute_block``); what changes is
how a K/V tile reaches shared memory and how a stage is handed back:

* ``mainloop="tma"``: warp 0 issues the TMA copies of a stage (no per-thread gmem addresses in
  the MMA warps: registers go to the accumulators); a "full" mbarrier per stage counts the bytes in;
  the stage is handed back by the CTA barrier that ends each step, as in the cp.async mainloop, or,
  with ``config.mbarrier_release``, by each warp's arrival on the stage's "empty" mbarrier, which warp
  0 waits for before the refill: no CTA barrier in the loop, so the warps (one per scheduler at an
  SM120's one CTA per SM) need not meet at the slowest one every step. Measured at SM120 CTAs per SM
  on the H100 (2026-11-23): +3.5-6% for d=256's 64x32 tiles, -4-6% for d=128's 32-rows-per-warp tiles
  (their extra barrier registers cost more than the waits they save).
* ``mainloop="tma_ws"``: warp specialized. A producer warp (one warp past the MMA warps) walks the
  key blocks, waits on each stage's "empty" mbarrier and issues its TMA; the MMA warps wait on
  "full", compute, and each arrives on "empty" (one arrival per warp). No CTA barrier in the loop.
  setmaxnreg is not used: it works per warpgroup, and one producer warp beside the MMA warps is a
  fraction of one; at one CTA per SM (what 99 KB of smem allows) the register file is not the limit.

The K/V copies are ``kv_source.TmaKV``'s; Q is loaded by cp.async (once per CTA). TMA zero-fills
rows past seqlen_k and columns past the head dim, which is why this loader needs dense K/V (varlen
or seqused K use the cp.async mainloop: rows past a sequence's length would be another sequence's
data, and the kernel must not rely on them being finite). Single-CTA TMA only: no multicast, no
clusters.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from ..config import atom_cols
from ..execution_model import ExecutionModel
from ..problem import FwdSpec
from .fwd_multistage import FlashFwdMultistage
from .fwd_state import FwdSmem, FwdTileState
from .kv_source import DenseKV, TmaKV, make_tma_atoms

_BAR_MMA = 1  # named barrier id of the MMA warps (0 is the CTA barrier)


def byte_swizzled_atom(dtype, width: int) -> cute.ComposedLayout:
    """An 8-row atom ``atom_cols(width)`` elements wide whose swizzle acts on byte addresses:
    128/64/32-byte rows use the TMA's SW128/SW64/SW32 patterns (16-byte chunks XOR row % 8)."""
    cols = atom_cols(width)
    row_bytes = cols * dtype.width // 8
    bits = {128: 3, 64: 2, 32: 1}[row_bytes]
    return cute.make_composed_layout(cute.make_swizzle(bits, 4, 3), 0, cute.make_layout((8, cols), stride=(cols, 1)))


class FlashFwdTma(FlashFwdMultistage):
    """TMA loader variants of the forward kernel (``config.mainloop`` "tma" or "tma_ws")."""

    def __init__(self, spec: FwdSpec, config, model: ExecutionModel):
        super().__init__(spec, config, model)
        self.warp_specialized = config.mainloop == "tma_ws"

    # -- hooks --------------------------------------------------------------------------------
    def tma_smem_layouts(self):
        """(K, V) stage layouts as the TMA unit sees them: the swizzle acts on byte addresses
        (SW128/64/32) and rides on the pointer, so TMA partitioning sees whole swizzle atoms. The
        same bytes as the element-swizzled layouts the MMA warps read through (``smem_layout_atom``:
        Swizzle<b,3,3> on 16-bit elements is Swizzle<b,4,3> on bytes, both from a 1024-aligned base).
        Built where they are used (host for the TMA atoms, device for the partitions)."""
        stages = self.config.num_stages
        return (cute.tile_to_shape(byte_swizzled_atom(self.dtype, self.head_dim),
                                   (self.tile_n, self.head_dim, stages), (0, 1, 2)),
                cute.tile_to_shape(byte_swizzled_atom(self.dtype, self.head_dim_v),
                                   (self.tile_n, self.head_dim_v, stages), (0, 1, 2)))

    @property
    def launch_threads(self) -> int:
        return self.num_threads + (32 if self.warp_specialized else 0)

    def num_mbarriers(self) -> int:
        return 2 * self.config.num_stages  # full[stages], empty[stages]

    def make_tma_atoms(self, mK: cute.Tensor, mV: cute.Tensor):
        return make_tma_atoms(mK, mV, *self.tma_smem_layouts(), self.tile_n, self.head_dim, self.head_dim_v)

    def kv_loader(self, kv_src: DenseKV, tidx, sm: FwdSmem) -> TmaKV:
        """The K/V loader: TMA into the stage buffers, re-viewed with the pointer-swizzled layouts of
        ``tma_smem_layouts`` (same bytes)."""
        sK_tma, sV_tma = self.tma_smem_layouts()
        sK = cute.make_tensor(cute.recast_ptr(sm.sK.iterator, swizzle_=sK_tma.inner), sK_tma.outer)
        sV = cute.make_tensor(cute.recast_ptr(sm.sV.iterator, swizzle_=sV_tma.inner), sV_tma.outer)
        return kv_src.tma(sK, sV, self.dtype)

    @cute.jit
    def init_mbarriers(self, storage):
        stages = self.config.num_stages
        bars = storage.bars.data_ptr()
        if cute.arch.thread_idx()[0] == 0:
            for s in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_init(bars + s, 1)  # full: the producer's arrive + the TMA bytes
                cute.arch.mbarrier_init(bars + stages + s, self.num_threads // 32)  # empty: one per MMA warp
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        return bars

    @cute.jit
    def mma_barrier(self):
        if const_expr(self.warp_specialized):
            cute.arch.barrier(barrier_id=_BAR_MMA, number_of_threads=self.num_threads)
        else:
            cute.arch.sync_threads()

    # -- loads --------------------------------------------------------------------------------
    @cute.jit
    def issue_tile(self, ctx: FwdTileState, it: Int32, n_block: Int32):
        """One whole warp (see ``kv_source.TmaKV``): key block ``n_block`` into stage it % stages,
        counted on its full barrier."""
        stage = it % self.config.num_stages
        ctx.kv.issue(n_block, stage, ctx.bars + stage)

    @cute.jit
    def prologue(self, ctx: FwdTileState, walk=None):
        """Q, and warp 0's first stages - 1 key blocks (the dense range: the predicate keeps block-sparse walks,
        ``walk``, to the overlapped schedule)."""
        self.load_q(ctx)
        cute.arch.cp_async_commit_group()
        if const_expr(not self.warp_specialized):
            if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0:
                for j in cutlass.range_constexpr(self.config.num_stages - 1):
                    if ctx.n_end - 1 - j >= ctx.n_start:
                        self.issue_tile(ctx, j, ctx.n_end - 1 - j)
        cute.arch.cp_async_wait_group(0)
        self.mma_barrier()

    @cute.jit
    def producer(self, ctx: FwdTileState):
        """The producer warp: every key block, last first, into the stage its consumers freed."""
        stages = self.config.num_stages
        for it in cutlass.range(ctx.n_end - ctx.n_start, unroll=1):
            stage = it % stages
            if it >= stages:  # wait until every MMA warp released the stage's previous tile
                cute.arch.mbarrier_wait(ctx.bars + stages + stage, (it // stages - 1) % 2)
            self.issue_tile(ctx, it, ctx.n_end - 1 - it)

    @cute.jit
    def mainloop_step(self, ctx: FwdTileState, it: Int32, n_block: Int32, masked: cutlass.Constexpr[bool]):
        stages = self.config.num_stages
        stage = it % stages
        per_warp_release = self.warp_specialized or self.config.mbarrier_release
        if const_expr(not self.warp_specialized):
            # Refill the stage step it - 1 read: every warp passed the CTA barrier after it, or (with
            # mbarrier_release) released it on its empty barrier, which warp 0 waits for here.
            n_ahead = n_block - (stages - 1)
            if n_ahead >= ctx.n_start and cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0:
                if const_expr(self.config.mbarrier_release):
                    if it >= 1:
                        cute.arch.mbarrier_wait(ctx.bars + stages + (it - 1) % stages, ((it - 1) // stages) % 2)
                self.issue_tile(ctx, it + stages - 1, n_ahead)
        cute.arch.mbarrier_wait(ctx.bars + stage, (it // stages) % 2)
        self.compute_block(ctx, n_block, stage, masked)
        if const_expr(per_warp_release):
            cute.arch.sync_warp()  # every lane's ldmatrix of this stage has completed
            if cute.arch.lane_idx() == 0:
                cute.arch.mbarrier_arrive(ctx.bars + stages + stage)
        else:
            cute.arch.sync_threads()

    # -- overlapped mainloop (``config.overlap``; see ``FlashFwdMultistage.overlap_mainloop``) ----
    # Load slot s (K of step s's block, V of step s - 1's) is counted on full barrier s % 2.
    @cute.jit
    def overlap_prologue(self, ctx: FwdTileState, walk=None):
        self.load_q(ctx)
        cute.arch.cp_async_commit_group()
        self.issue_first_k(ctx, walk)
        cute.arch.cp_async_wait_group(0)
        self.mma_barrier()

    @cute.jit
    def issue_first_k(self, ctx: FwdTileState, walk=None):
        """Warp 0: load slot ``ctx.slot_base`` (K of the range's first block, block n_end - 1, or a block-sparse
        ``walk``'s first tile) into its buffer, counted on its full barrier."""
        kv = ctx.kv
        first, has_block = self.first_block(ctx, walk)
        if has_block and cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0:
            full = ctx.bars + ctx.slot_base % 2
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(full, kv.k_bytes)
            kv.load_k(first, ctx.slot_base % 2, full)

    @cute.jit
    def issue_slot(self, ctx: FwdTileState, slot: Int32, v_block: Int32, first: cutlass.Constexpr[bool], it: Int32,
                   k_next=None):
        """Warp 0 (converged, see ``issue_tile``): the next K (``next_k``) when there is one, V of ``v_block`` (TMA
        zero-fills rows past seqlen_k)."""
        kv = ctx.kv
        if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0:
            k_block, has_k = self.next_k(ctx, it, v_block, ctx.walk, k_next)
            full = ctx.bars + slot % 2
            tx = Int32(kv.v_bytes)
            if has_k:
                tx = tx + kv.k_bytes
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(full, tx)
            if has_k:
                kv.load_k(k_block, slot % 2, full)
            kv.load_v(v_block, (slot + 1) % 2, full)

    @cute.jit
    def wait_slot(self, ctx: FwdTileState, slot: Int32):
        cute.arch.mbarrier_wait(ctx.bars + slot % 2, (slot // 2) % 2)

    @cute.jit
    def end_step(self, ctx: FwdTileState, slot: Int32):
        if const_expr(not self.config.pingpong):  # ping-pong: the turns hand the buffers back
            cute.arch.sync_threads()
