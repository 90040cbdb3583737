"""Backward main kernel with warp-group roles (SM120 execution model): ``FlashBwdMultistage``'s algorithm and
tiles, its per-step GEMMs divided between two 4-warp groups instead of split over 8 warps.

Why: on 8 warps a 64x64 S or dP tile gives each warp 32x16 (4 MMAs per k-step for 3 ldmatrix.x4); the 8-warp
kernel waits on ldmatrix latency and the shared-memory pipe (ncu, H100, 2026-11-25; docs/design-backward.md, "Tiles
and the role split"). Here each GEMM runs
on one group, 32x32 per warp at 64x64 (8 MMAs per k-step for 4 ldmatrix.x4), the two groups' GEMMs run at
the same time, and a thread holds one of dK / dV (so the tile's registers match the 8-warp kernel's).

Per step (query block m of query head g), with named barriers (``bar.arrive`` for the producer, which goes on):
  group 0 (warps 0-3):  S = Q K^T, mask, P = exp2(S * scale_log2 - LSE2), P -> sP (16 bits); barrier P0 (its 4
                        warps); arrive P; dV += P^T dO; wait dS; the next dO tile's cp.async (single-buffered
                        dO: group 1 is past dP, group 0 past dV);
  group 1 (warps 4-7):  dP = dO V^T; wait P; P from sP; dS = P (dP - D') -> sdS; barrier dS1 (its 4 warps);
                        arrive dS; dK += dS^T Q;
  (with ``kv_in_regs``, no dropout: P passes warp pair by warp pair, ``pair_p``: group 0's warp w arrives on its
  pair's barrier before barrier P0, and group 1's warp w waits there instead of on P; in every split (deterministic:
  the kv_in_regs ones), group 1 runs dK a step late, ``lag_dk``: dK(i - 1), a group barrier, the next Q tile's
  cp.async by group 1, then dP(i))
  all 8 warps:          dQ_m = dS K into the fp32 accumulator (``dq_accum``); wait for the next tiles; CTA barrier.
P reaches group 1 in 16 bits (dS = P16 (dP - D'), as the same computation in the input dtype forms it); masked
entries arrive as P = 0, so group 1 needs no mask, and a mask_mod runs in group 0 beside the element mask (on a
block-sparse walk's mask-list tiles only). Dropout: group 0 alone draws the tile's keep flags (both groups drawing
the same flags would spend the Philox work twice per tile), in one of two ways (``signed_p``):
  two tiles (the smem-operand splits): group 0 writes the undropped P; group 1 takes it and arrives on barrier PREAD;
    group 0 rewrites sP as P keep (the forward's 16-bit P V operand; 1 / (1 - p) goes on dV at the end) and arrives
    on barrier PZ; group 1 reads P keep back and forms dS = P keep (dP / (1 - p)) - P D' (or dS (1 - p) where that
    saves group 1 work, ``ds_over_scale``);
  signed (the ``kv_in_regs`` splits, whose group 1 has no registers for P and P keep beside dP and its V rows):
    group 0 writes P with the dropped elements negated (``dropout_mask.keep_pair``'s ``sign``: P >= 0, so the sign
    bit carries the flag); group 1 takes that one tile, arrives on PREAD and forms dS from the signed P ps alone,
    ps (dP / (1 - p) - D') where ps >= 0, ps D' (= -P D') where not; group 0 then zeroes the negative lanes,
    rewrites sP as P keep for its dV and arrives on PZ, which group 1 passes only before its dS barrier (long
    after group 0's arrival: d96 measures the same with and without it, H100, 2026-11-27).
Each group passes the same number of bar.sync and the same number of bar.arrive per step (group 1 one bar.sync of its
own after its reads; 5 and 2 each with dropout): compute-sanitizer's racecheck pairs barriers by count and reported
hazards across the CTA barrier when the counts differ (6 against 5 barriers; the signed protocol without PZ, 5 / 1
bar.sync / bar.arrive against 4 / 2: thousands of RAW hazards between ``store_dkv``'s staging stores and its row
reads, which a ``bar.sync 0`` separates; with PZ none in 4 of 4 runs). Not with
softcap or a score_mod (the tanh tile and the pre-mod scores stay in group 0, dS is formed in group 1) nor with
head_dim != head_dim_v (one accumulator per thread): ``bwd_config_problems`` says so.
With ``kv_in_regs`` (d96's 64x128 and d128's 64x96 entries) S and dP run on 1x4 warps and each group keeps its B
operand in registers for the whole walk (group 0 its warp's K rows, group 1 its V rows: ``kv_fragment``, loaded once,
then a CTA barrier), so no step reads K or V for them and V's shared memory holds P and dS; a warp share of the keys
that is not a 16-multiple (d128: 24) steps one n8 atom per warp (``bwd_config.bwd_sdp_n_step``; with dropout its keep
flags come as one run of n8 atoms per warp, ``dropout_mask.RunKeepFlags``, and P / dS sit in unswizzled 8x8 blocks).
dV / dK and dQ read sK / sP / sdS as before.
Deterministic mode: thread 128 (group 1) reads the query block's counter after dP and polls it before barrier
dS1, which holds group 1 and, through arrive dS, group 0, before any reduction; thread 160 (group 1) releases it
in the next step, after dP (``pass_previous_turn``), when the reductions the step's last barrier ordered have
completed: both in group 1's wait for P, off group 0's critical path.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from .. import flex
from ..bwd_config import bwd_group_scores, bwd_sdp_n_step, bwd_tile_bytes
from .block_walk import raw_entry
from .bwd_multistage import FlashBwdMultistage
from .bwd_state import BwdSmem, BwdTileState, MmaOperands
from .dq_accum import pass_turn, read_turn, semaphore_ptr, wait_turn, warp_tiled_mma
from .dropout_mask import DropoutMask, apply_keep_pairs, signed_to_keep_pairs
from .flex_mods import FlexMods, apply_mods
from .fragments import acc_rows_cols, convert
from .mask import mask_scores
from .seqlen_info import workspace_row
from .tile_io import load_rows

_GROUP = 128  # threads per warp group
# named barriers (0 is the CTA barrier)
_BAR_P, _BAR_P0, _BAR_DS, _BAR_DS1, _BAR_PREAD, _BAR_PZ = 1, 2, 3, 4, 5, 6
_BAR_PAIR = 7  # named barriers 7-10: warp w of group 0 with warp w of group 1 (``pair_p``)
_BAR_LAG0, _BAR_LAG1 = 11, 12  # ``lag_dk``: group 1 past the previous step's dK; group 0's count-balancing twin
_RELEASE = _GROUP + 32  # deterministic mode: the thread that passes the turn on (warp 5, group 1)



@cute.jit
def group_ids():
    """(warp group, thread index in the group), derived where used."""
    tidx, _, _ = cute.arch.thread_idx()
    return cute.arch.make_warp_uniform(tidx // _GROUP), tidx % _GROUP


class FlashBwdRoleSplit(FlashBwdMultistage):
    """Two 4-warp groups with roles; build with a spec, a ``role_split`` config and an execution model.

    CuTe DSL note: a staged branch carries what it writes through a container's leaves (the step context, the
    smem tiles' namespace) out as the branch's results, and such a result would not dominate its uses after
    the main loop. So the group branches of ``step`` touch plain locals only (operands made in the branch, the
    dK-or-dV accumulator a loop-carried local of ``main_loop``), and ``store_dkv`` has no branch at all."""

    def _setup(self):
        super()._setup()
        cfg = self.config
        #: elements from the K tile to the V tile in the shared storage (1024-aligned buffers)
        self.kv_gap_elems = bwd_tile_bytes(self.tile_n, self.head_dim) * 8 // self.dtype.width
        n_step = bwd_sdp_n_step(cfg)
        self.mma_sdp = warp_tiled_mma(self.dtype, cfg.role_warps, cfg.sdp_warps_m, cells=self.sdp_cells(cfg.role_warps),
                                      n_step=n_step)
        #: 8x8 matrices per ldmatrix of the S / dP B operand (one n8 atom per warp step: two)
        self.sdp_b_matrices = 4 if n_step == 16 else 2
        self.mma_dkv = warp_tiled_mma(self.dtype, cfg.role_warps, cfg.dkv_warps_n)

    def pair_p(self) -> bool:
        """Whether P passes from group 0 to group 1 warp by warp (``kv_in_regs`` without dropout): there both groups'
        S / dP GEMMs run on 1x4 warps with one partition, so group 1's warp w reads exactly the P that group 0's warp w
        wrote, and a barrier per warp pair (64 threads) lets it go on as soon as its partner has stored, rather than
        when all four have (ncu, H100, 2026-11-27: group 1's wait for P, all four warps, is 8.6% of the d96 kernel's
        warp samples)."""
        return self.config.kv_in_regs and not self.spec.dropout

    def lag_dk(self) -> bool:
        """Whether group 1 runs each step's dK GEMM at the start of the next step, before its dP: group 1 otherwise
        waits for P through group 0's exponentials, and group 0 for dS through group 1's; with dK(i - 1) ahead of
        dP(i) group 1 reaches P with two GEMMs done against group 0's one and its exponentials. dK(i - 1) reads the
        previous step's Q stage and sdS, so group 1 loads the next Q tile (into that stage) itself, after a group
        barrier that ends every warp's dK, and the last step's dK runs after the walk (``main_loop``). Measured (H100,
        SM120 occupancy, 2026-11-27): the ``kv_in_regs`` splits d96 4x4096 32/8 backward +10-11%, d128 +4-7.5%,
        full and causal; every other split (same-call A/B) d64's 64x128 entry +6.8% full, +3.5% causal,
        forward + backward with dropout 0.1 (the smem-operand splits) d64 -6%, causal -4%, d128 causal -6%, d128
        +1.5%. The deterministic mode lags dK in the ``kv_in_regs`` splits only: d64's deterministic backward runs
        10% slower with it (4x4096 32/8, 5.72 -> 6.30 ms; causal +4%), and d96 / d128's gain 1-2%; nor where its
        highest-first turn and a mask's limits sit beside 64 S registers per thread (d96's 64x128 split, causal or
        windowed: 4-8 B of local memory on sm_120a)."""
        spec, cfg = self.spec, self.config
        s_regs = bwd_group_scores(cfg)
        turn_beside_mask = spec.deterministic and not spec.lowest_first and (spec.causal or spec.local)
        return (cfg.kv_in_regs or not spec.deterministic) and not (turn_beside_mask and s_regs >= 64)

    def signed_p(self) -> bool:
        """Dropout: whether P passes to group 1 signed, the keep flags in its sign bits (one tile, one read), rather
        than as the undropped P and then P keep (two tiles, barrier PZ between them). Signed in the ``kv_in_regs``
        splits: there group 1 holding P and P keep beside dP, its V rows and dK spills (d96's 64x128 split,
        sm_120a: 176 B), and signed it runs without, d96 4x4096 32/8 fwd+bwd with dropout 10.63 ms for the
        smem-operand split, 10.01 signed (H100, SM120 occupancy, 2026-11-27). Two tiles elsewhere: signed, the
        smem-operand splits run 3-13% slower (d64 / d128, full and causal, two rounds), with the Philox words held
        across the walk or read per step alike; why is not established (the two-tile SASS draws the flags ahead of
        barrier PREAD too: ncu)."""
        return self.spec.dropout and self.config.kv_in_regs

    def dropout_words(self, ctx: BwdTileState) -> DropoutMask:
        """Group 0's dropout mask with its key, offset and threshold words read from the slot each step
        (``DropoutMask.reread``; the slot's four words sit in L1) rather than held across the walk beside the scales:
        held, they spill d96's ``kv_in_regs`` split (sm_120a gate: 44 B at 255 registers), and the whole mask rebuilt
        per step (its scales a division) spills d128's 64x64 split 20-112 B. The ``kv_in_regs``
        splits only; the others hold them (``ctx.dropout``)."""
        return ctx.dropout.reread(ctx.rng_slot) if self.config.kv_in_regs else ctx.dropout

    def ds_over_scale(self) -> bool:
        """Dropout: whether group 1 stores dS (1 - p) (P keep dP - P D' (1 - p): no multiply per score), dQ's fragment
        and the dK epilogue taking the 1 / (1 - p), or dS itself (P keep (dP / (1 - p)) - P D'). The first moves a
        multiply per score of group 1 to a multiply per dQ fragment element on all 8 warps: taken where group 1's
        scores per thread are more than twice the dQ fragment's elements per thread (d64's 64x128 split: 64 against
        16; d64's 64x64 split for varlen: 32 against 16, not taken). Measured (H100, SM120 occupancy, 2026-11-27,
        one round): d64 4x4096 32/8 fwd+bwd with dropout 8.44 -> 8.06 ms; d128's 64x64 split (32 against 32) 7.62 ->
        7.74 ms causal."""
        scores = bwd_group_scores(self.config)
        dq_elems = self.tile_m * self.head_dim // self.num_threads
        return scores > 2 * dq_elems

    @cute.jit
    def mma_context(self, tidx, sm: BwdSmem) -> BwdTileState:
        """As the 8-warp kernel's, with the S / dP and dK / dV partitions taken by the thread's index in its
        group; the role GEMMs' operands are made in the group's branch of ``step``."""
        dt = self.dtype
        wtid = tidx % _GROUP
        thr_sdp, thr_dkv, thr_dq = self.mma_sdp.get_slice(wtid), self.mma_dkv.get_slice(wtid), \
            self.mma_dq.get_slice(tidx)
        ctx = BwdTileState(thr_sdp=thr_sdp, thr_dkv=thr_dkv, thr_dq=thr_dq)
        ctx.dQ = self.operands(thr_dq, self.mma_dq, tidx, sm.sdS, sm.sdS, False, sm.sKt, sm.sKt, True)
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt,
                                                         num_bits_per_copy=2 * dt.width), self.mma_sdp)
        ctx.r2s, ctx.thr_r2s = r2s, r2s.get_slice(wtid)
        cS = cute.make_identity_tensor((self.tile_m, self.tile_n))
        ctx.tScS_rc = acc_rows_cols(thr_sdp.partition_C(cS))
        ctx.t0ScS_rc = acc_rows_cols(self.mma_sdp.get_slice(0).partition_C(cS))
        return ctx

    @cute.jit
    def load_by_group(self, mX_s, sX, width: cutlass.Constexpr[int], real: cutlass.Constexpr[int], head, m, seqlen_q):
        """cp.async query block m's rows of ``mX_s`` (Q or dO; ``width`` padded, ``real`` columns) into the stage
        ``sX`` by the 128 threads of the caller's warp group: group 0's dO tile (single-buffered), group 1's next Q
        tile (``lag_dk``)."""
        tiled = self.row_copy(width, _GROUP)
        gX = cute.local_tile(mX_s[None, head, None], (self.tile_m, width), (m, 0))
        load_rows(tiled, group_ids()[1], gX, sX, (self.tile_m, width), real, seqlen_q - m * self.tile_m)

    def dk_operands(self, ctx: BwdTileState, sm: BwdSmem, wtid) -> MmaOperands:
        """Group 1's dK += dS^T Q operands (sdS and Q's stages, read transposed)."""
        return self.operands(ctx.thr_dkv, self.mma_dkv, wtid, sm.sdSt, sm.sdSt, True, sm.sQt, sm.sQt[None, None, 0],
                             True)

    @cute.jit
    def pass_previous_turn(self, ctx: BwdTileState, it, mSem, mCuSeqlensQ, release_tidx):
        """Deterministic mode: the thread whose ``release_tidx`` is 0 releases the query block of step ``it - 1``
        (none at step 0): after the CTA barrier that ended step ``it - 1``, which orders every thread's
        reductions of that step before the release."""
        if it > 0:
            head, m = self.step_coords(ctx, it - 1)
            pass_turn(semaphore_ptr(mSem, ctx.batch, head, m, self.tile_m, mCuSeqlensQ, ctx.total_q), release_tidx)

    @cute.jit
    def main_loop(self, ctx: BwdTileState, sm: BwdSmem, num_steps, mLSE2, mD, mdQacc, mSem, mCuSeqlensQ):
        acc_kv = cute.make_rmem_tensor(ctx.thr_dkv.partition_shape_C((self.tile_n, self.head_dim)), Float32)
        acc_kv.fill(0.0)
        ctx.rB = self.kv_fragment(ctx, sm) if const_expr(self.config.kv_in_regs) else None
        if const_expr(self.lag_dk()):
            self.zero_lag_operands(sm)
        if const_expr(self.spec.block_sparse is not None):  # the walk's entries travel with the loop
            ent0, ent1 = raw_entry(ctx.walk, Int32(0)), raw_entry(ctx.walk, Int32(1))
            for it in cutlass.range(num_steps, unroll=1):
                acc_kv, ent0, ent1 = self.step(ctx, sm, it, num_steps, mLSE2, mD, mdQacc, mSem, mCuSeqlensQ,
                                               acc_kv, (ent0, ent1))
        else:
            for it in cutlass.range(num_steps, unroll=1):
                acc_kv = self.step(ctx, sm, it, num_steps, mLSE2, mD, mdQacc, mSem, mCuSeqlensQ, acc_kv)
        if const_expr(self.lag_dk()):  # group 1: the last step's dK (its Q stage and sdS are untouched since)
            wg, wtid = group_ids()
            if wg == 1 and num_steps > 0:
                last = (num_steps - 1) % self.config.stages_q
                acc_kv = self.gemm(acc_kv, self.dk_operands(ctx, sm, wtid), None, last)
        ctx.acc_kv = acc_kv
        if const_expr(self.spec.deterministic):
            self.pass_previous_turn(ctx, num_steps, mSem, mCuSeqlensQ, ctx.tidx - _RELEASE)  # the last step's

    @cute.jit
    def zero_lag_operands(self, sm: BwdSmem):
        """``lag_dk``: step 0's dK of "the previous step" reads sdS and Q's other stage, whose bytes nothing has
        written (possibly NaN patterns): zeros there make it add exactly 0 (a branch around that GEMM kept dK's 96
        accumulators in two copies and spilled 64-88 B on sm_120a), then a CTA barrier."""
        tidx, _, _ = cute.arch.thread_idx()
        for tile, elems in ((sm.sdS, self.tile_m * self.tile_n), (sm.sQ[None, None, 1], self.tile_m * self.head_dim)):
            words = elems * self.dtype.width // 32
            flat = cute.make_tensor(cute.recast_ptr(tile.iterator, dtype=cutlass.Uint32), cute.make_layout(words))
            for i in cutlass.range_constexpr(-(-words // self.num_threads)):
                if tidx + i * self.num_threads < words:
                    flat[tidx + i * self.num_threads] = cutlass.Uint32(0)
        cute.arch.sync_threads()

    @cute.jit
    def kv_fragment(self, ctx: BwdTileState, sm: BwdSmem) -> cute.Tensor:
        """``kv_in_regs``: the thread's B operand of its group's S / dP GEMM for the whole walk, group 0's from the K
        tile and group 1's from the V tile (V lies kv_gap elements after K; branch-free, as ``store_dkv``), then a
        CTA barrier, after which V's region takes P and dS."""
        wg, wtid = group_ids()
        src = cute.make_tensor((sm.sK.iterator + wg * self.kv_gap_elems).align(1024), sm.sK.layout)
        ops = self.operands(ctx.thr_sdp, self.mma_sdp, wtid, sm.sQ, sm.sQ[None, None, 0], False, src, src, False,
                            self.sdp_b_matrices)
        cute.copy(ops.s2r_b, ops.sB, ops.rB_v)
        cute.arch.sync_threads()
        return ops.rB

    @cute.jit
    def step(self, ctx: BwdTileState, sm: BwdSmem, it, num_steps, mLSE2, mD, mdQacc, mSem, mCuSeqlensQ,
             acc_kv, entries=None):
        """One step; ``entries``: a block-sparse walk's entries of steps ``it`` and ``it + 1`` (``main_loop``),
        returned with ``acc_kv`` as those of ``it + 1`` and ``it + 2``."""
        cfg = self.config
        next_coords = None
        if const_expr(entries is not None):
            head, m, sq, sdo, has_next, next_coords, ent2 = self.sparse_schedule(ctx, it, num_steps, entries)
        else:
            head, m, sq, sdo, has_next = self.step_schedule(ctx, it, num_steps)
        # a. The next step's double-buffered tiles (every thread), into the stage the previous step used.
        if has_next:  # (with ``lag_dk`` group 1 loads the next Q tile once the previous dK has read its stage)
            self.load_q_do(ctx, sm, it + 1, not self.lag_dk(), cfg.stages_do == 2, next_coords)
        cute.arch.cp_async_commit_group()
        ranges, turn = self.block_turn(ctx, head, m, mSem, mCuSeqlensQ, None)  # group 1 reads after dP
        # plain locals for the branches (see the class docstring)
        sQ, sdO, sK, sV, sP, sdS = sm.sQ, sm.sdO, sm.sK, sm.sV, sm.sP, sm.sdS
        sdOt, sPt = sm.sdOt, sm.sPt
        thr_sdp, thr_dkv, r2s, thr_r2s = ctx.thr_sdp, ctx.thr_dkv, ctx.r2s, ctx.thr_r2s
        tScS_rc, t0ScS_rc = ctx.tScS_rc, ctx.t0ScS_rc
        n_block, seqlen_q, seqlen_k = ctx.n_block, ctx.seqlen_q, ctx.seqlen_k
        window_left, window_right, scale_log2 = ctx.window_left, ctx.window_right, ctx.scale_log2
        mdO_s, tidx, rB = ctx.mdO_s, ctx.tidx, ctx.rB
        if const_expr(entries is not None):
            head_next, m_next = next_coords
        else:
            head_next, m_next = self.step_coords(ctx, it + 1)
        gLSE2 = workspace_row(mLSE2, ctx.batch, head, mCuSeqlensQ, ctx.total_q)
        gD = workspace_row(mD, ctx.batch, head, mCuSeqlensQ, ctx.total_q)
        num_rows = cute.size(tScS_rc, mode=[0])
        acc = cute.make_rmem_tensor(thr_sdp.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        acc.fill(0.0)
        wg, wtid = group_ids()
        if wg == 0:
            # b. S -> P -> sP; dV += P^T dO
            ops_s = self.operands(thr_sdp, self.mma_sdp, wtid, sQ, sQ[None, None, 0], False, sK, sK, False,
                                  self.sdp_b_matrices)
            ops_kv = self.operands(thr_dkv, self.mma_dkv, wtid, sPt, sPt, True, sdOt, sdOt[None, None, 0], True)
            lse2 = cute.make_rmem_tensor(num_rows, Float32)
            for r in cutlass.range_constexpr(num_rows):
                lse2[r] = gLSE2[m * self.tile_m + tScS_rc[r, 0][0]]
            acc = self.gemm(acc, ops_s, sq, None, rB)
            S_rc = acc_rows_cols(acc)
            if const_expr(self.spec.block_sparse is not None):
                # block sparsity: a mask-list tile or one the forward's range masks; the mask_mod on mask-list tiles
                if it < ctx.walk.n_mask or n_block < ranges[1] or n_block >= ranges[2]:
                    mask_scores(S_rc, tScS_rc, t0ScS_rc, m, n_block, seqlen_q, seqlen_k, window_left,
                                window_right, self.tile_m, self.tile_n, self.spec.causal, self.spec.local)
                if const_expr(self.spec.mods is not None):
                    if it < ctx.walk.n_mask:
                        self.mask_mod_scores(ctx, S_rc, tScS_rc, head, m, n_block)
            else:
                if n_block < ranges[1] or n_block >= ranges[2]:
                    mask_scores(S_rc, tScS_rc, t0ScS_rc, m, n_block, seqlen_q, seqlen_k, window_left, window_right,
                                self.tile_m, self.tile_n, self.spec.causal, self.spec.local)
                if const_expr(self.spec.mods is not None):
                    self.mask_mod_scores(ctx, S_rc, tScS_rc, head, m, n_block)
            for r in cutlass.range_constexpr(cute.size(S_rc, mode=[0])):
                for c in cutlass.range_constexpr(cute.size(S_rc, mode=[1])):
                    S_rc[r, c] = cute.math.exp2(S_rc[r, c] * scale_log2 - lse2[r], fastmath=True)
            p16 = convert(acc, self.dtype)
            if const_expr(self.signed_p()):  # dropped elements travel as -P (``keep_pair``'s ``sign``)
                self.sign_dropped(ctx, p16, head, m, n_block)
            cute.copy(r2s, thr_r2s.retile(p16), thr_r2s.partition_D(sP))
            if const_expr(self.pair_p()):
                cute.arch.barrier_arrive(barrier_id=_BAR_PAIR + cute.arch.make_warp_uniform(wtid // 32),
                                         number_of_threads=64)
            cute.arch.barrier(barrier_id=_BAR_P0, number_of_threads=_GROUP)
            if const_expr(self.lag_dk()):  # group 1's lag barrier's twin (both groups pass as many per step)
                cute.arch.barrier(barrier_id=_BAR_LAG0, number_of_threads=_GROUP)
            if const_expr(not self.pair_p()):
                cute.arch.barrier_arrive(barrier_id=_BAR_P, number_of_threads=2 * _GROUP)
            if const_expr(self.spec.dropout):
                # dropout: group 1 has taken P, signed or undropped (barrier PREAD); sP now holds P keep for dV (and,
                # two tiles, for group 1: barrier PZ)
                cute.arch.barrier(barrier_id=_BAR_PREAD, number_of_threads=2 * _GROUP)
                if const_expr(self.signed_p()):
                    signed_to_keep_pairs(p16)
                    cute.copy(r2s, thr_r2s.retile(p16), thr_r2s.partition_D(sP))
                else:
                    pk = self.dropped_p(ctx, acc, head, m, n_block)
                    cute.copy(r2s, thr_r2s.retile(pk), thr_r2s.partition_D(sP))
                cute.arch.barrier(barrier_id=_BAR_P0, number_of_threads=_GROUP)
                # two tiles: group 1 reads P keep after this; signed: it only waits here before its dS store's
                # barrier (each group passes as many bar.sync and as many bar.arrive per step)
                cute.arch.barrier_arrive(barrier_id=_BAR_PZ, number_of_threads=2 * _GROUP)
            acc_kv = self.gemm(acc_kv, ops_kv, None, sdo)
            cute.arch.barrier(barrier_id=_BAR_DS, number_of_threads=2 * _GROUP)
            if const_expr(cfg.stages_do == 1):  # group 1 is past dP (it arrived after dS), group 0 past dV
                if has_next:
                    self.load_by_group(mdO_s, sdO[None, None, 0], self.head_dim_v, self.spec.head_dim_v, head_next,
                                       m_next, seqlen_q)
                cute.arch.cp_async_commit_group()
        else:
            # c. dP; P from sP; dS -> sdS; dK += dS^T Q
            ops_dp = self.operands(thr_sdp, self.mma_sdp, wtid, sdO, sdO[None, None, 0], False, sV, sV, False,
                                   self.sdp_b_matrices)
            ops_kv = self.dk_operands(ctx, sm, wtid)
            if const_expr(self.lag_dk()):
                # the previous step's dK (its Q stage and dS), then the next Q tile into that stage
                acc_kv = self.gemm(acc_kv, ops_kv, None, (it + 1) % cfg.stages_q)  # step 0: zeros (main_loop)
                cute.arch.barrier(barrier_id=_BAR_LAG1, number_of_threads=_GROUP)
                if has_next:
                    self.load_by_group(ctx.mQ_s, sQ[None, None, (it + 1) % cfg.stages_q], self.head_dim,
                                       self.spec.head_dim, head_next, m_next, seqlen_q)
                cute.arch.cp_async_commit_group()
            dsum = cute.make_rmem_tensor(num_rows, Float32)
            for r in cutlass.range_constexpr(num_rows):
                dsum[r] = gD[m * self.tile_m + tScS_rc[r, 0][0]]
                if const_expr(self.spec.dropout and self.ds_over_scale()):  # dS (1 - p) below: D' (1 - p) here
                    dsum[r] = dsum[r] * ctx.dropout.keep_prob
            acc = self.gemm(acc, ops_dp, sdo, None, rB)
            seen = None
            if const_expr(turn is not None):
                # deterministic: in group 1's wait for P (its slack), warp 5 releases the previous step's query
                # block and thread 128 reads this one's counter: the release's MEMBAR and the acquire's L1
                # invalidation stall warps that would wait anyway (at the step's ends they hold group 0, the
                # critical path: ncu, H100, 2026-11-26)
                self.pass_previous_turn(ctx, it, mSem, mCuSeqlensQ, tidx - _RELEASE)
                seen = read_turn(turn[0], tidx - _GROUP)
            if const_expr(self.pair_p()):
                cute.arch.barrier(barrier_id=_BAR_PAIR + cute.arch.make_warp_uniform(wtid // 32), number_of_threads=64)
            else:
                cute.arch.barrier(barrier_id=_BAR_P, number_of_threads=2 * _GROUP)
            p16 = cute.make_rmem_tensor_like(acc, self.dtype)
            cute.copy(r2s, thr_r2s.partition_D(sP), thr_r2s.retile(p16))
            p = convert(p16, Float32)
            p_rc, ds_rc = acc_rows_cols(p), acc_rows_cols(acc)
            if const_expr(self.signed_p()):
                # dropout, signed: P is in registers (group 0 may now write P keep): P = |ps|, kept where ps >= 0;
                # dS = ps (dP / (1 - p) - D') where kept, ps D' (= -P D') where dropped (dS (1 - p): dP - D' (1 - p))
                cute.arch.barrier_arrive(barrier_id=_BAR_PREAD, number_of_threads=2 * _GROUP)
                # group 1's own barrier: both groups pass the same number of barriers per step (racecheck, whose
                # model pairs them by count, reports RAW hazards across the CTA barrier without it)
                cute.arch.barrier(barrier_id=_BAR_DS1, number_of_threads=_GROUP)
                for r in cutlass.range_constexpr(cute.size(ds_rc, mode=[0])):
                    for c in cutlass.range_constexpr(cute.size(ds_rc, mode=[1])):
                        ps = p_rc[r, c]
                        if const_expr(self.ds_over_scale()):
                            kept = ds_rc[r, c] - dsum[r]
                        else:
                            kept = ds_rc[r, c] * ctx.dropout.scale - dsum[r]
                        ds_rc[r, c] = ps * (kept if ps >= Float32(0.0) else dsum[r])
            elif const_expr(self.spec.dropout):
                # dropout, two tiles: the undropped P is in registers (group 0 may now write P keep); P keep from
                # group 0 (barrier PZ), dS (1 - p) = P keep dP - P D' (1 - p)
                cute.arch.barrier_arrive(barrier_id=_BAR_PREAD, number_of_threads=2 * _GROUP)
                cute.arch.barrier(barrier_id=_BAR_PZ, number_of_threads=2 * _GROUP)
                pk16 = cute.make_rmem_tensor_like(acc, self.dtype)
                cute.copy(r2s, thr_r2s.partition_D(sP), thr_r2s.retile(pk16))
                cute.arch.barrier(barrier_id=_BAR_DS1, number_of_threads=_GROUP)  # as above
                pk_rc = acc_rows_cols(convert(pk16, Float32))
                for r in cutlass.range_constexpr(cute.size(ds_rc, mode=[0])):
                    for c in cutlass.range_constexpr(cute.size(ds_rc, mode=[1])):
                        if const_expr(self.ds_over_scale()):
                            ds_rc[r, c] = pk_rc[r, c] * ds_rc[r, c] - p_rc[r, c] * dsum[r]  # dS (1 - p)
                        else:
                            ds_rc[r, c] = pk_rc[r, c] * (ds_rc[r, c] * ctx.dropout.scale) - p_rc[r, c] * dsum[r]
            else:
                for r in cutlass.range_constexpr(cute.size(ds_rc, mode=[0])):
                    for c in cutlass.range_constexpr(cute.size(ds_rc, mode=[1])):
                        ds_rc[r, c] = p_rc[r, c] * (ds_rc[r, c] - dsum[r])
            cute.copy(r2s, thr_r2s.retile(convert(acc, self.dtype)), thr_r2s.partition_D(sdS))
            if const_expr(self.signed_p()):  # group 0's P keep arrival (it has long passed it: no wait expected)
                cute.arch.barrier(barrier_id=_BAR_PZ, number_of_threads=2 * _GROUP)
            if const_expr(turn is not None):
                wait_turn(turn[0], turn[1], seen, tidx - _GROUP)  # barrier dS1 holds group 1 until ours
            cute.arch.barrier(barrier_id=_BAR_DS1, number_of_threads=_GROUP)
            cute.arch.barrier_arrive(barrier_id=_BAR_DS, number_of_threads=2 * _GROUP)
            if const_expr(not self.lag_dk()):
                acc_kv = self.gemm(acc_kv, ops_kv, None, sq)
        # d. dQ_m on all 8 warps (sdS is complete for both groups here)
        self.dq_into_accumulator(ctx, sm, workspace_row(mdQacc, ctx.batch, head, mCuSeqlensQ, ctx.total_q), m)
        # e. The next step's tiles have landed; every warp is done with sP, sdS and this step's stages.
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        if const_expr(entries is not None):
            return acc_kv, entries[1], ent2
        return acc_kv

    @cute.jit
    def sign_dropped(self, ctx: BwdTileState, p16: cute.Tensor, head, m, n_block):
        """Group 0, dropout: P in 16 bits with the dropped elements negated, call by call (``KeepFlags.sign_pair``),
        so group 1 reads P and the keep flags in one tile; after group 1's read ``signed_to_keep_pairs`` zeroes them
        (P keep, the forward's 16-bit P V operand, for dV). Unscaled, as the forward's P V (its 1 / (1 - p) on O): dV
        is scaled once in ``store_dkv`` and group 1 scales dP, so both gradients see the forward's P exactly (P z
        rounded to 16 bits would put a rounding of 1 / (1 - p) into dS that the forward never has). A method
        of its own: its temporaries stay out of the group branch (which would carry them out as its results)."""
        apply_keep_pairs(self.tile_keep_flags(ctx, head, m, n_block), p16, sign=True)

    def tile_keep_flags(self, ctx: BwdTileState, head, m, n_block):
        """Group 0's keep flags of step (query block ``m`` of ``head``, key block ``n_block``)."""
        return self.dropout_words(ctx).keep_flags(ctx.batch, head, ctx.num_heads, m * self.tile_m,
                                                  n_block * self.tile_n)

    @cute.jit
    def dropped_p(self, ctx: BwdTileState, acc: cute.Tensor, head, m, n_block) -> cute.Tensor:
        """Group 0, dropout in two tiles: P keep in 16 bits for dV and for group 1's dS, the dropped pairs' lanes
        zeroed call by call (``KeepFlags.apply_pair``); unscaled, as ``sign_dropped`` says. A method of its own for
        the same reason."""
        pk = convert(acc, self.dtype)
        apply_keep_pairs(self.tile_keep_flags(ctx, head, m, n_block), pk)
        return pk

    @cute.jit
    def mask_mod_scores(self, ctx: BwdTileState, S_rc: cute.Tensor, tScS_rc: cute.Tensor, head, m, n_block):
        """The spec's mask_mod on group 0's (rows, cols) score view (the predicate admits mask_mods only here)."""
        _, _, mask_mod = flex.callables(self.spec.mods)
        apply_mods(S_rc, tScS_rc, FlexMods(None, mask_mod, 1), Float32(1.0), ctx.batch, head, m, n_block,
                   self.tile_m, self.tile_n, None, ctx.seqlen_info, self.aux)

    @cute.jit
    def store_dkv(self, ctx: BwdTileState, mdK, mdV, mCuSeqlensK, mSeqUsedK, softmax_scale):
        """Group 0's dV and group 1's dK * scale in 16 bits through the (now free) V and K tiles, then both
        tiles' rows to global memory as in the 8-warp kernel; branch-free (the group picks the scale and the
        tile by arithmetic)."""
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                                         num_bits_per_copy=2 * self.dtype.width), self.mma_dkv)
        wg, wtid = group_ids()
        thr_r2s = r2s.get_slice(wtid)
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()  # every warp is done with sK / sV
        is_dk = wg.to(Float32)
        acc = ctx.acc_kv
        if const_expr(self.spec.dropout and self.ds_over_scale()):  # dV took P keep, dK dS (1 - p): both / (1 - p)
            acc.store(acc.load() * ((is_dk * softmax_scale + (Float32(1.0) - is_dk)) * ctx.dropout.scale))
        elif const_expr(self.spec.dropout):  # dV took P keep: / (1 - p)
            acc.store(acc.load() * (is_dk * softmax_scale + (Float32(1.0) - is_dk) * ctx.dropout.scale))
        else:
            acc.store(acc.load() * (is_dk * softmax_scale + (Float32(1.0) - is_dk)))
        # sK and sV have the same layout (head_dim == head_dim_v here); sK lies kv_gap elements before sV
        dst = cute.make_tensor((ctx.sV_out.iterator - wg * self.kv_gap_elems).align(1024), ctx.sV_out.layout)
        cute.copy(r2s, thr_r2s.retile(convert(acc, self.dtype)), thr_r2s.partition_D(dst))
        self.store_dkv_rows(ctx, mdK, mdV, mCuSeqlensK, mSeqUsedK)
