"""Backward attention, main kernel: dK, dV and the fp32 dQ partial sums (SM120 execution model).

For one (batch, KV head) and one key block n of ``tile_n`` keys, with the forward's logits
l_ij = scale * Q[i] K[j] (softcap c: l_ij = c * tanh(u_ij), u_ij = scale * Q[i] K[j] / c), its
LSE, and D'_i = dO_i . O_i - dLSE_i from the preprocess:
    P_ij  = exp(l_ij - LSE_i)                        (0 where the forward's mask hides j from i)
    dV_j  = sum_i P_ij dO_i                          dP_ij = dO_i . V_j
    dS_ij = P_ij (dP_ij - D'_i)   (softcap: times 1 - tanh(u_ij)^2)
    dK_j  = scale * sum_i dS_ij Q_i                  dQ_i += sum_j dS_ij K_j  (scaled in the postprocess)
summed over every query head of the KV group (MHA, GQA, MQA): the CTA walks all of them, so dK/dV are
reduced in registers and stored once in 16 bits. With ``spec.group_split`` = s > 1 (small GQA grids) a
KV head's group is walked by s CTAs: CTA row y reads KV head y // s, walks query heads y * group / s
onward and writes partial dK / dV head y, which the host sums. dQ of each query block is added into an fp32
accumulator with ``red.global.add`` (the other key blocks of the head add theirs: order-dependent), in
the MMA-fragment order of ``dq_accum`` (one 16-byte reduction per thread and m16n8 atom).

The workspaces come from the preprocess, with ``bwd_config.ROW_PAD`` rows reserved per started block of a
sequence (dense: (batch, heads, seqlen_pad); packed: (heads, total + batch * ROW_PAD), sequence b from
``cu_seqlens_q[b] + b * ROW_PAD``): LSE2 = LSE * log2(e) (0 for a row that saw no key, +inf for rows
past the sequence, so P = 0 there) and D'. The dQ accumulator (same rows, padded head dim, fragment
order per query block) is zeroed by the caller.

Algorithm (one CTA of ``num_warps`` warps; three tiled MMAs, each splitting its GEMM over the warps as
the config says):
  1. Load K_n and V_n once (rows past seqlen_k zero-filled), and the first query block's Q and dO.
  2. For each (query head of the group, query block m that sees block n), Q/dO in stage it % stages:
     a. start the next block's Q (and dO, when double-buffered) loads;
     b. S = Q K^T; softcap; element mask where the block pair needs one; P = exp2(S * scale_log2 - LSE2);
     c. dP = dO V^T; dS = P (dP - D') (softcap: * (1 - t^2));
     d. P and dS (16-bit) to shared memory; CTA barrier;
     e. dQ_m = dS K, added into the accumulator (first: its reductions drain under the next MMAs);
     f. dV += P^T dO (ldmatrix.trans of the P and dO tiles); a single-buffered dO tile refills after
        a CTA barrier, under g;
     g. dK += dS^T Q (ldmatrix.trans of the dS and Q tiles); a single-buffered Q tile refills after a
        CTA barrier;
     h. wait for the next step's tiles; CTA barrier.
  3. dK *= scale; dK and dV to global memory (rows past seqlen_k skipped). A key block no query sees
     stores zeros.

This module holds the setup, the kernel entry and the per-step math (steps 2b-2h); the key block's loads, step
order and dK / dV stores (steps 1, 2a's coordinates and 3) are ``bwd_walk``'s. The role-split variant
(``bwd_rolesplit``) subclasses it.

The query blocks a key block visits are ``block_info.query_block_range`` (every block with a row that sees
one of its keys); which of them need an element mask follows the forward's ``block_info.block_range`` (a
pair is unmasked exactly when the forward treats it so).
"""

from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp

from .. import flex
from ..bwd_config import (BwdConfig, bwd_banded, bwd_config_problems, bwd_kv_copy_threads, bwd_padded_head_dim,
                          bwd_rotated_start, bwd_sdp_n_step, bwd_smem_bytes, bwd_step_divisor, bwd_tile_bytes,
                          bwd_v_region_bytes)
from ..execution_model import ExecutionModel
from ..problem import BwdSpec
from . import CUTLASS_DTYPES, block_info
from .bwd_state import BwdSmem, BwdSmemLayouts, BwdTileState, MmaOperands
from .bwd_walk import KeyBlockWalk
from .dq_accum import add_fragment, dq_tiled_mma, pass_turn, slice_offset, wait_turn, warp_tiled_mma
from .block_walk import raw_entry, tile_walk
from .dropout_mask import DropoutMask, check_cells, warp_cell_columns
from .flex_mods import FlexMods, SeqlenInfo, apply_mods, apply_score_mod_bwd, aux_inputs
from .fragments import acc_rows_cols, convert
from .grid_dependency import enter_grid
from .mask import mask_scores
from .seqlen_info import num_batches, num_heads, sequence_heads, workspace_row
from .tile_scheduler import KeyBlockScheduler
from .tile_io import g2s_tiled_copy, smem_layout_atom


def ldmatrix_atom(dtype, transpose: bool, num_matrices: int = 4) -> cute.CopyAtom:
    return cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=transpose, num_matrices=num_matrices), dtype)


def transposed(s: cute.Tensor, rows: int, cols: int, stages: int = 0) -> cute.Tensor:
    """A (cols, rows[, stages]) view of a (rows, cols[, stages]) smem tile (the same bytes)."""
    if stages:
        return cute.composition(s, cute.make_layout((cols, rows, stages), stride=(rows, 1, rows * cols)))
    return cute.composition(s, cute.make_layout((cols, rows), stride=(rows, 1)))


class FlashBwdMultistage(KeyBlockWalk):
    """cp.async + mma.sync backward main kernel. Build with a spec, a config and an execution model."""

    def __init__(self, spec: BwdSpec, config: BwdConfig, model: ExecutionModel):
        self.spec = spec
        self.config = config
        self.model = model
        self.dtype = CUTLASS_DTYPES[spec.dtype]
        self.head_dim = bwd_padded_head_dim(spec.head_dim, config)
        self.head_dim_v = bwd_padded_head_dim(spec.head_dim_v, config, qk=False)
        self.pad_qk = spec.head_dim != self.head_dim
        self.pad_v = spec.head_dim_v != self.head_dim_v
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        self.num_threads = config.num_threads
        self.key_blocks = KeyBlockScheduler(bwd_banded(spec, config))  # the grid's order of key blocks
        #: dense steps' (query head, query block) by a FastDivmod divisor (``bwd_config.bwd_step_divisor``)
        self.step_divisor = bwd_step_divisor(spec, config)
        #: key block n starts at query block n, mod the query blocks (``bwd_config.bwd_rotated_start``)
        self.rotated_start = bwd_rotated_start(spec, config)
        #: dynamic smem to launch with when larger than the kernel's own (occupancy on a larger part)
        self.launch_smem = 0

    @staticmethod
    def can_implement(spec: BwdSpec, config: BwdConfig, model: ExecutionModel) -> tuple[str, ...]:
        return bwd_config_problems(spec, config, model)

    # ------------------------------------------------------------------------------------------
    # Host-side (trace-time) setup
    # ------------------------------------------------------------------------------------------
    def _setup(self):
        dt, cfg = self.dtype, self.config
        tm, tn, d, dv = self.tile_m, self.tile_n, self.head_dim, self.head_dim_v
        atom_qk, atom_v, atom_mn = smem_layout_atom(dt, d), smem_layout_atom(dt, dv), smem_layout_atom(dt, tn)
        self.sQ_layout = cute.tile_to_shape(atom_qk, (tm, d, cfg.stages_q), (0, 1, 2))
        self.sdO_layout = cute.tile_to_shape(atom_v, (tm, dv, cfg.stages_do), (0, 1, 2))
        self.sK_layout = cute.tile_to_shape(atom_qk, (tn, d), (0, 1))
        self.sV_layout = cute.tile_to_shape(atom_v, (tn, dv), (0, 1))
        if self.spec.dropout and bwd_sdp_n_step(cfg) == 8:
            # P / dS written by warps whose S columns are runs of 24 (``sdp_cells``): unswizzled 8 x 8 blocks (each
            # a contiguous 128 B, conflict-free for the 32-bit stores and the ldmatrix reads), which the runs'
            # 24-column stride divides (the 32-column swizzle atom does not)
            atom_mn = cute.make_composed_layout(cute.make_swizzle(0, 3, 3), 0, cute.make_layout((8, 8), stride=(8, 1)))
        self.sP_layout = cute.tile_to_shape(atom_mn, (tm, tn), (0, 1))
        cp_async = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
        self.g2s_qk = g2s_tiled_copy(dt, atom_qk.outer.shape[1], self.num_threads, cp_async)
        self.g2s_v = g2s_tiled_copy(dt, atom_v.outer.shape[1], self.num_threads, cp_async)
        #: threads per K / V tile copy: the CTA, or a warp group per tile (``bwd_kv_copy_threads``)
        self.kv_threads = bwd_kv_copy_threads(cfg, d, dv)
        nw = cfg.num_warps
        self.mma_sdp = warp_tiled_mma(dt, nw, cfg.sdp_warps_m, cells=self.sdp_cells(nw))
        self.mma_dkv = warp_tiled_mma(dt, nw, cfg.dkv_warps_n)
        self.mma_dq = dq_tiled_mma(dt, cfg)

        # V's region: the V tile, with ``kv_in_regs`` also P and dS once V has gone to registers
        # (``bwd_config.bwd_v_region_bytes``; no P / dS tiles of their own then)
        v_elems = bwd_v_region_bytes(cfg, dv) * 8 // dt.width

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sdO_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, v_elems], 1024]
            if not cfg.kv_in_regs:
                sP: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sP_layout)], 1024]
                sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sP_layout)], 1024]

        if SharedStorage.size_in_bytes() != bwd_smem_bytes(self.spec, self.config):
            raise RuntimeError(f"smem accounting mismatch: struct {SharedStorage.size_in_bytes()} B vs "
                               f"predicate {bwd_smem_bytes(self.spec, self.config)} B")
        self.SharedStorage = SharedStorage

    def ds_over_scale(self) -> bool:
        """Whether the kernel's dropout dS in shared memory is dS (1 - p), to be scaled back in dQ's fragment and
        dK's epilogue (the role split's: it saves group 1 a multiply per score); this kernel stores dS itself."""
        return False

    def sdp_cells(self, warps: int) -> int:
        """``warp_tiled_mma``'s ``cells`` for the S / dP MMA on ``warps`` warps: dropout's Philox cells (32 columns per
        warp where the tile holds them: whole calls), else none; a ``kv_in_regs`` split whose warp share of the keys
        is not whole 16-column atom pairs: that share as one run of n8 atoms (``dropout_mask.RunKeepFlags``)."""
        if not self.spec.dropout:
            return 0
        warps_n = warps // self.config.sdp_warps_m
        if bwd_sdp_n_step(self.config) == 8:  # (a kv_in_regs split's share of 24 keys: d128's 64x96)
            return self.tile_n // warps_n
        return warp_cell_columns(self.tile_n, warps_n)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE2: cute.Tensor,
        mD: cute.Tensor,
        mdQacc: cute.Tensor,
        mSem: Optional[cute.Tensor],
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        softmax_scale: Float32,
        scale_log2: Float32,
        softcap_scale: Float32,
        window_left: Int32,
        window_right: Int32,
        mCuSeqlensQ: Optional[cute.Tensor],
        mCuSeqlensK: Optional[cute.Tensor],
        mSeqUsedQ: Optional[cute.Tensor],
        mSeqUsedK: Optional[cute.Tensor],
        max_seqlen_k: Int32,
        band: Int32,
        mAux0: Optional[cute.Tensor],
        mAux1: Optional[cute.Tensor],
        mAux2: Optional[cute.Tensor],
        mAux3: Optional[cute.Tensor],
        sAux0,
        sAux1,
        sAux2,
        sAux3,
        mBlockCnt: Optional[cute.Tensor],
        mBlockIdx: Optional[cute.Tensor],
        mFullCnt: Optional[cute.Tensor],
        mFullIdx: Optional[cute.Tensor],
        mRng: Optional[cute.Tensor],
        stream: cuda.CUstream,
    ):
        if const_expr(not (mQ.element_type == mK.element_type == mV.element_type == mdO.element_type
                           == mdK.element_type == mdV.element_type == self.dtype)):
            raise TypeError("Q, K, V, dO, dK, dV must have the spec's dtype")
        self._setup()
        packed_k = mCuSeqlensK is not None
        seqlen_k = max_seqlen_k if const_expr(packed_k) else mK.shape[1]
        # a CTA row per dK / dV head: the KV heads, each ``group_split`` times (partial heads, summed by the host)
        grid = self.key_blocks.grid(
            cute.ceil_div(seqlen_k, self.tile_n), num_heads(mK, packed_k) * self.spec.group_split,
            num_batches(mK, mCuSeqlensK))
        self.kernel(
            mQ, mK, mV, mdO, mLSE2, mD, mdQacc, mSem, mdK, mdV, softmax_scale, scale_log2, softcap_scale,
            window_left, window_right, mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK, band,
            self.sQ_layout, self.sdO_layout, self.sK_layout, self.sV_layout, self.sP_layout,
            self.g2s_qk, self.g2s_v, self.mma_sdp, self.mma_dkv, self.mma_dq, mAux0, mAux1, mAux2, mAux3,
            sAux0, sAux1, sAux2, sAux3, mBlockCnt, mBlockIdx, mFullCnt, mFullIdx, mRng,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            smem=max(self.SharedStorage.size_in_bytes(), self.launch_smem),
            preferred_smem_carveout=-1,
            use_pdl=self.model.has_pdl,
            stream=stream,
        )

    # ------------------------------------------------------------------------------------------
    # Device code
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE2: cute.Tensor,
        mD: cute.Tensor,
        mdQacc: cute.Tensor,
        mSem: Optional[cute.Tensor],
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        softmax_scale: Float32,
        scale_log2: Float32,
        softcap_scale: Float32,
        window_left: Int32,
        window_right: Int32,
        mCuSeqlensQ: Optional[cute.Tensor],
        mCuSeqlensK: Optional[cute.Tensor],
        mSeqUsedQ: Optional[cute.Tensor],
        mSeqUsedK: Optional[cute.Tensor],
        band: Int32,
        sQ_layout: cute.ComposedLayout,
        sdO_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        g2s_qk: cute.TiledCopy,
        g2s_v: cute.TiledCopy,
        mma_sdp: cute.TiledMma,
        mma_dkv: cute.TiledMma,
        mma_dq: cute.TiledMma,
        mAux0: Optional[cute.Tensor],
        mAux1: Optional[cute.Tensor],
        mAux2: Optional[cute.Tensor],
        mAux3: Optional[cute.Tensor],
        sAux0,
        sAux1,
        sAux2,
        sAux3,
        mBlockCnt: Optional[cute.Tensor],
        mBlockIdx: Optional[cute.Tensor],
        mFullCnt: Optional[cute.Tensor],
        mFullIdx: Optional[cute.Tensor],
        mRng: Optional[cute.Tensor],
    ):
        self.g2s_qk, self.g2s_v, self.mma_sdp, self.mma_dkv, self.mma_dq = g2s_qk, g2s_v, mma_sdp, mma_dkv, mma_dq
        self.aux = aux_inputs(mAux0, mAux1, mAux2, mAux3, sAux0, sAux1, sAux2, sAux3)  # the mods' aux inputs
        enter_grid(self.model.has_pdl)  # the preprocess's LSE2 / D' and the zeroed accumulator
        tidx, _, _ = cute.arch.thread_idx()
        packed_q = mCuSeqlensQ is not None
        split = self.spec.group_split
        heads_kv = num_heads(mK, mCuSeqlensK is not None)
        # head_kv: the dK / dV (partial) head this CTA writes
        n_block, head_kv, batch = self.key_blocks.tile(
            heads_kv * split, num_batches(mK, mCuSeqlensK), band)
        group = num_heads(mQ, packed_q) // heads_kv
        if const_expr(split > 1):
            group = group // split  # the query heads this CTA walks
        mK_s, seqlen_k = sequence_heads(mK, batch, mCuSeqlensK, mSeqUsedK)
        mV_s, _ = sequence_heads(mV, batch, mCuSeqlensK, mSeqUsedK)
        mQ_s, seqlen_q = sequence_heads(mQ, batch, mCuSeqlensQ, mSeqUsedQ)
        mdO_s, _ = sequence_heads(mdO, batch, mCuSeqlensQ, mSeqUsedQ)
        if const_expr(self.spec.deterministic and not self.spec.lowest_first):
            # the highest-first order: key blocks launch highest first, a CTA waits only on CTAs launched before it
            n_block = (seqlen_k + self.tile_n - 1) // self.tile_n - 1 - n_block
        if n_block * self.tile_n < seqlen_k and n_block >= 0:
            m_start, m_end = block_info.query_block_range(n_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n,
                                                          self.spec.causal, self.spec.local, window_left,
                                                          window_right)
            sm = self.shared_tiles(BwdSmemLayouts(sQ=sQ_layout, sdO=sdO_layout, sK=sK_layout, sV=sV_layout,
                                                  sP=sP_layout))
            ctx = self.mma_context(tidx, sm)
            ctx.update(
                tidx=tidx, batch=batch, head_kv=head_kv, group=group, n_block=n_block, seqlen_q=seqlen_q,
                seqlen_k=seqlen_k, m_start=m_start, num_m=m_end - m_start, mQ_s=mQ_s, mdO_s=mdO_s,
                window_left=window_left, window_right=window_right, scale_log2=scale_log2,
                softcap_scale=softcap_scale, total_q=mQ.shape[0],
                seqlen_info=(SeqlenInfo.of(batch, mCuSeqlensQ, mCuSeqlensK, seqlen_q, seqlen_k)
                             if const_expr(self.spec.mods is not None) else None),
            )
            ctx.dropout = None  # the forward's keep mask, regenerated (``dropout_mask``)
            if const_expr(self.spec.dropout):
                check_cells(self.mma_sdp, self.tile_m, self.tile_n, bwd_sdp_n_step(self.config))
                ctx.dropout = DropoutMask.of(mRng, ctx.tScS_rc, ctx.t0ScS_rc)
                ctx.rng_slot = mRng  # (the role split reads it where used: ``FlashBwdRoleSplit.dropout_words``)
                ctx.num_heads = num_heads(mQ, packed_q)
            self.load_kv(ctx, sm, mK_s, mV_s, head_kv // split if const_expr(split > 1) else head_kv)
            ctx.walk = None
            num_steps = group * ctx.num_m
            if const_expr(self.spec.block_sparse is not None):
                # the host's (query head, query tile) lists of this key tile (``block_sparse.backward_lists``)
                ctx.num_m = (seqlen_q + self.tile_m - 1) // self.tile_m
                ctx.walk = tile_walk(mBlockCnt, mBlockIdx, mFullCnt, mFullIdx, batch, head_kv, n_block,
                                     group * ctx.num_m)
                num_steps = ctx.walk.count
            ctx.m_rotation = None
            if const_expr(self.rotated_start):
                rotation = n_block % cutlass.max(ctx.num_m, 1)
                if const_expr(self.spec.rotated_turns):  # rotated only where the ranks are (dq_accum.turn_rank)
                    if (ctx.seqlen_k + self.tile_n - 1) // self.tile_n > ctx.num_m:
                        rotation = Int32(0)
                ctx.m_rotation = rotation
            # the inner count of a dense step index: the query blocks, or the heads (the lowest-first order)
            ctx.step_inner = group if const_expr(self.spec.lowest_first) else ctx.num_m
            ctx.step_div = None
            if const_expr(self.step_divisor):
                ctx.step_div = cute.fast_divmod_create_divisor_v2(
                    ctx.step_inner if const_expr(self.spec.lowest_first) else cutlass.max(ctx.num_m, 1))
            if num_steps > 0:
                self.load_q_do(ctx, sm, 0, True, True)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()
            self.main_loop(ctx, sm, num_steps, mLSE2, mD, mdQacc, mSem, mCuSeqlensQ)
            ctx.sK_out, ctx.sV_out = sm.sK, sm.sV
            self.store_dkv(ctx, mdK, mdV, mCuSeqlensK, mSeqUsedK, softmax_scale)

    @cute.jit
    def shared_tiles(self, layouts: BwdSmemLayouts) -> BwdSmem:
        """The CTA's tiles: sQ (tile_m, d, stages_q), sdO (tile_m, dv, stages_do), sK (tile_n, d), sV
        (tile_n, dv), sP and sdS (tile_m, tile_n), and their transposed views for the operands that are
        read across the stored rows (ldmatrix.trans)."""
        storage = cutlass.memory.SmemAllocator().allocate(self.SharedStorage)
        cfg = self.config
        sQ = storage.sQ.get_tensor(layouts.sQ)
        sdO = storage.sdO.get_tensor(layouts.sdO)
        sK = storage.sK.get_tensor(layouts.sK)
        sV = storage.sV.get_tensor(layouts.sV)
        tm, tn, d, dv = self.tile_m, self.tile_n, self.head_dim, self.head_dim_v
        if const_expr(cfg.kv_in_regs):  # P and dS in V's region (``_setup``)
            p_elems = bwd_tile_bytes(tm, tn) * 8 // self.dtype.width
            sP = cute.make_tensor(sV.iterator, layouts.sP)
            sdS = cute.make_tensor((sV.iterator + p_elems).align(1024), layouts.sP)
        else:
            sP = storage.sP.get_tensor(layouts.sP)
            sdS = storage.sdS.get_tensor(layouts.sP)
        return BwdSmem(
            sQ=sQ, sdO=sdO, sK=sK, sV=sV, sP=sP, sdS=sdS,
            sQt=transposed(sQ, tm, d, cfg.stages_q), sdOt=transposed(sdO, tm, dv, cfg.stages_do),
            sKt=transposed(sK, tn, d), sPt=transposed(sP, tm, tn), sdSt=transposed(sdS, tm, tn),
        )

    @cute.jit
    def mma_context(self, tidx, sm: BwdSmem) -> BwdTileState:
        """Per thread: the three MMAs' operand fragments with their ldmatrix copies and smem partitions
        (stage modes kept), the dK / dV accumulators (zeroed), the P / dS register-to-smem copy and the S
        coordinates for masking (this thread's and thread 0's compile-time partition)."""
        dt = self.dtype
        thr_sdp, thr_dkv, thr_dq = (m.get_slice(tidx) for m in (self.mma_sdp, self.mma_dkv, self.mma_dq))
        ctx = BwdTileState(thr_sdp=thr_sdp, thr_dkv=thr_dkv, thr_dq=thr_dq)
        ctx.S = self.operands(thr_sdp, self.mma_sdp, tidx, sm.sQ, sm.sQ[None, None, 0], False, sm.sK, sm.sK, False)
        ctx.dP = self.operands(thr_sdp, self.mma_sdp, tidx, sm.sdO, sm.sdO[None, None, 0], False, sm.sV, sm.sV,
                               False)
        ctx.dQ = self.operands(thr_dq, self.mma_dq, tidx, sm.sdS, sm.sdS, False, sm.sKt, sm.sKt, True)
        # dV += P^T dO and dK += dS^T Q in ``dkv_chunks`` head-dim slices, each with its own accumulator
        # and B operand (only one slice's Q / dO fragments are live at a time)
        cfg = self.config
        ctx.dV, ctx.dK, ctx.acc_dV, ctx.acc_dK = [], [], [], []
        for ch in cutlass.range_constexpr(cfg.dkv_chunks):
            for ops, accs, s_a, s_bt, width, stages in (
                    (ctx.dV, ctx.acc_dV, sm.sPt, sm.sdOt, self.head_dim_v // cfg.dkv_chunks, cfg.stages_do),
                    (ctx.dK, ctx.acc_dK, sm.sdSt, sm.sQt, self.head_dim // cfg.dkv_chunks, cfg.stages_q)):
                s_b = cute.local_tile(s_bt, (width, self.tile_m, stages), (ch, 0, 0))
                ops.append(self.operands(thr_dkv, self.mma_dkv, tidx, s_a, s_a, True, s_b, s_b[None, None, 0], True))
                acc = cute.make_rmem_tensor(thr_dkv.partition_shape_C((self.tile_n, width)), Float32)
                acc.fill(0.0)
                accs.append(acc)
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt,
                                                         num_bits_per_copy=2 * dt.width), self.mma_sdp)
        thr_r2s = r2s.get_slice(tidx)
        ctx.r2s, ctx.thr_r2s = r2s, thr_r2s
        ctx.tPsP, ctx.tdSsdS = thr_r2s.partition_D(sm.sP), thr_r2s.partition_D(sm.sdS)
        cS = cute.make_identity_tensor((self.tile_m, self.tile_n))
        ctx.tScS_rc = acc_rows_cols(thr_sdp.partition_C(cS))
        ctx.t0ScS_rc = acc_rows_cols(self.mma_sdp.get_slice(0).partition_C(cS))
        return ctx

    @cute.jit
    def operands(self, thr_mma, tiled_mma, t, s_a, s_a0, trans_a: cutlass.Constexpr[bool], s_b, s_b0,
                 trans_b: cutlass.Constexpr[bool], b_matrices: cutlass.Constexpr[int] = 4) -> MmaOperands:
        """Fragments A/B of ``thr_mma`` and their ldmatrix copies for thread ``t`` of the MMA's threads (``b_matrices``:
        the B copy's 8x8 matrices, 2 for an MMA of one n8 atom per warp step)."""
        dt = self.dtype
        s2r_a = cute.make_tiled_copy_A(ldmatrix_atom(dt, trans_a), tiled_mma)
        s2r_b = cute.make_tiled_copy_B(ldmatrix_atom(dt, trans_b, b_matrices), tiled_mma)
        rA = thr_mma.make_fragment_A(thr_mma.partition_A(s_a0))
        rB = thr_mma.make_fragment_B(thr_mma.partition_B(s_b0))
        ta, tb = s2r_a.get_slice(t), s2r_b.get_slice(t)
        return MmaOperands(rA=rA, rB=rB, sA=ta.partition_S(s_a), rA_v=ta.retile(rA), sB=tb.partition_S(s_b),
                           rB_v=tb.retile(rB), s2r_a=s2r_a, s2r_b=s2r_b, mma=tiled_mma)

    @cute.jit
    def gemm(self, acc, ops: MmaOperands, a_stage, b_stage, rB=None):
        """acc += A B^T, both operands read from smem by ldmatrix one k16 step ahead; ``a_stage`` /
        ``b_stage`` select the stage of an operand with a stage mode (None: it has none); ``rB``: the whole B
        fragment already in registers (``b_stage`` unused). Returns ``acc`` (for a caller that must rebind it inside
        a staged branch)."""
        sA = ops.sA if const_expr(a_stage is None) else ops.sA[None, None, None, a_stage]
        num_k = cute.size(sA, mode=[2])
        cute.copy(ops.s2r_a, sA[None, None, 0], ops.rA_v[None, None, 0])
        if const_expr(rB is None):
            sB = ops.sB if const_expr(b_stage is None) else ops.sB[None, None, None, b_stage]
            cute.copy(ops.s2r_b, sB[None, None, 0], ops.rB_v[None, None, 0])
        for k in cutlass.range_constexpr(num_k):
            if const_expr(k + 1 < num_k):
                cute.copy(ops.s2r_a, sA[None, None, k + 1], ops.rA_v[None, None, k + 1])
                if const_expr(rB is None):
                    cute.copy(ops.s2r_b, sB[None, None, k + 1], ops.rB_v[None, None, k + 1])
            cute.gemm(ops.mma, acc, ops.rA[None, None, k], (ops.rB if const_expr(rB is None) else rB)[None, None, k],
                      acc)
        return acc

    @cute.jit
    def main_loop(self, ctx: BwdTileState, sm: BwdSmem, num_steps, mLSE2, mD, mdQacc, mSem, mCuSeqlensQ):
        # a block-sparse walk's entries travel with the loop (``sparse_schedule``), but on key tiles under 64 keys
        # (d256's 32 x 32 tile: at 255 registers the carried entries spill), whose steps read them at their start
        if const_expr(self.spec.block_sparse is not None and self.tile_n >= 64):
            ent0, ent1 = raw_entry(ctx.walk, Int32(0)), raw_entry(ctx.walk, Int32(1))
            for it in cutlass.range(num_steps, unroll=1):
                ent0, ent1 = self.step(ctx, sm, it, num_steps, mLSE2, mD, mdQacc, mSem, mCuSeqlensQ, (ent0, ent1))
        else:
            for it in cutlass.range(num_steps, unroll=1):
                self.step(ctx, sm, it, num_steps, mLSE2, mD, mdQacc, mSem, mCuSeqlensQ)

    # ------------------------------------------------------------------------------------------
    # The step
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def step(self, ctx: BwdTileState, sm: BwdSmem, it, num_steps, mLSE2, mD, mdQacc, mSem,
             mCuSeqlensQ, entries=None):
        """One step; ``entries``: a block-sparse walk's entries of steps ``it`` and ``it + 1`` (``main_loop``),
        returned as those of ``it + 1`` and ``it + 2``."""
        cfg = self.config
        nxt = None
        if const_expr(entries is not None):
            head, m, sq, sdo, has_next, nxt, ent2 = self.sparse_schedule(ctx, it, num_steps, entries)
        else:
            head, m, sq, sdo, has_next = self.step_schedule(ctx, it, num_steps)
        # a. The next step's double-buffered tiles, into the stage the previous step used.
        if const_expr(cfg.stages_q == 2 or cfg.stages_do == 2):
            if has_next:
                self.load_q_do(ctx, sm, it + 1, cfg.stages_q == 2, cfg.stages_do == 2, nxt)
            cute.arch.cp_async_commit_group()
        ranges, turn = self.block_turn(ctx, head, m, mSem, mCuSeqlensQ, ctx.tidx)
        # This block's rows of LSE2 and D' (padded workspaces: every row of the tile exists).
        gLSE2 = workspace_row(mLSE2, ctx.batch, head, mCuSeqlensQ, ctx.total_q)
        gD = workspace_row(mD, ctx.batch, head, mCuSeqlensQ, ctx.total_q)
        num_rows = cute.size(ctx.tScS_rc, mode=[0])
        lse2 = cute.make_rmem_tensor(num_rows, Float32)
        dsum = cute.make_rmem_tensor(num_rows, Float32)
        for r in cutlass.range_constexpr(num_rows):
            row = m * self.tile_m + ctx.tScS_rc[r, 0][0]
            lse2[r] = gLSE2[row]
            dsum[r] = gD[row]
        # b./c. S = Q K^T, dP = dO V^T
        shape_S = ctx.thr_sdp.partition_shape_C((self.tile_m, self.tile_n))
        acc_S = cute.make_rmem_tensor(shape_S, Float32)
        acc_S.fill(0.0)
        self.gemm(acc_S, ctx.S, sq, None)
        acc_dP = cute.make_rmem_tensor(shape_S, Float32)
        acc_dP.fill(0.0)
        self.gemm(acc_dP, ctx.dP, sdo, None)
        if const_expr(self.spec.block_sparse is not None):
            # a mask-list tile: the element mask and the mask_mod; a full-list tile: the element mask where the
            # forward's range needs it
            if it < ctx.walk.n_mask:
                self.gradient_of_scores(ctx, acc_S, acc_dP, m, lse2, dsum, True, head)
            elif ctx.n_block < ranges[1] or ctx.n_block >= ranges[2]:
                self.gradient_of_scores(ctx, acc_S, acc_dP, m, lse2, dsum, True, head, with_mask=False)
            else:
                self.gradient_of_scores(ctx, acc_S, acc_dP, m, lse2, dsum, False, head, with_mask=False)
        elif ctx.n_block < ranges[1] or ctx.n_block >= ranges[2]:
            self.gradient_of_scores(ctx, acc_S, acc_dP, m, lse2, dsum, True, head)
        else:
            self.gradient_of_scores(ctx, acc_S, acc_dP, m, lse2, dsum, False, head)
        # d. P and dS to shared memory for the transposed and the dQ GEMMs
        cute.copy(ctx.r2s, ctx.thr_r2s.retile(convert(acc_S, self.dtype)), ctx.tPsP)
        cute.copy(ctx.r2s, ctx.thr_r2s.retile(convert(acc_dP, self.dtype)), ctx.tdSsdS)
        if const_expr(turn is not None):
            wait_turn(turn[0], turn[1], turn[2], ctx.tidx)  # the barrier below holds the CTA until it is ours
        cute.arch.sync_threads()
        # e. dQ_m (unscaled) into the accumulator, in ``dq_chunks`` head-dim slices: first, so that its
        #    reductions drain while the dV / dK MMAs run
        self.dq_into_accumulator(ctx, sm, workspace_row(mdQacc, ctx.batch, head, mCuSeqlensQ, ctx.total_q), m)
        # f. dV += P^T dO; a single-buffered dO tile is free after it: the next one loads under dK. In the
        #    deterministic mode the barrier after it also orders every thread's reductions before the turn
        #    passes on (the reductions have had the dV MMAs' time to complete)
        for ch in cutlass.range_constexpr(cfg.dkv_chunks):
            self.gemm(ctx.acc_dV[ch], ctx.dV[ch], None, sdo)
        if const_expr(cfg.stages_do == 1 or turn is not None):
            cute.arch.sync_threads()
            if const_expr(turn is not None):
                pass_turn(turn[0], ctx.tidx)
            if const_expr(cfg.stages_do == 1):
                if has_next:
                    self.load_q_do(ctx, sm, it + 1, False, True, nxt)
                cute.arch.cp_async_commit_group()
        # g. dK += dS^T Q; a single-buffered Q tile is free after it
        for ch in cutlass.range_constexpr(cfg.dkv_chunks):
            self.gemm(ctx.acc_dK[ch], ctx.dK[ch], None, sq)
        if const_expr(cfg.stages_q == 1):
            cute.arch.sync_threads()
            if has_next:
                self.load_q_do(ctx, sm, it + 1, True, False, nxt)
            cute.arch.cp_async_commit_group()
        # h. The next step's tiles have landed and every warp is done with P and dS.
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        if const_expr(entries is not None):
            return entries[1], ent2

    @cute.jit
    def dq_into_accumulator(self, ctx: BwdTileState, sm: BwdSmem, gAcc: cute.Tensor, m):
        """dQ_m = dS K (sdS, sK^T) added into the fp32 accumulator of query block m (``gAcc``: the
        (sequence, head)'s workspace rows) in fragment order (``dq_accum``), one head-dim slice of
        ``dq_chunks`` at a time."""
        chunks = self.config.dq_chunks
        width = self.head_dim // chunks
        for ch in cutlass.range_constexpr(chunks):
            ops = ctx.dQ
            if const_expr(chunks > 1):
                thr = ctx.thr_dq
                sKt = cute.local_tile(sm.sKt, (width, self.tile_n), (ch, 0))
                rB = thr.make_fragment_B(thr.partition_B(sKt))
                tb = ops.s2r_b.get_slice(ctx.tidx)
                ops = MmaOperands(rA=ops.rA, rB=rB, sA=ops.sA, rA_v=ops.rA_v, sB=tb.partition_S(sKt),
                                  rB_v=tb.retile(rB), s2r_a=ops.s2r_a, s2r_b=ops.s2r_b, mma=ops.mma)
            acc_dQ = cute.make_rmem_tensor(ctx.thr_dq.partition_shape_C((self.tile_m, width)), Float32)
            acc_dQ.fill(0.0)
            self.gemm(acc_dQ, ops, None, None)
            if const_expr(self.spec.dropout and self.ds_over_scale()):
                acc_dQ.store(acc_dQ.load() * ctx.dropout.scale)
            add_fragment(acc_dQ, gAcc.iterator + slice_offset(m, ch, self.tile_m, self.head_dim, width), ctx.tidx,
                         self.num_threads, self.model.vector_red_f32)

    @cute.jit
    def gradient_of_scores(self, ctx: BwdTileState, acc_S, acc_dP, m, lse2, dsum, masked: cutlass.Constexpr[bool],
                           head=None, with_mask: cutlass.Constexpr[bool] = True):
        """In place: acc_S becomes P = exp2(S * scale_log2 - LSE2) (mods or softcap first, then the element mask
        where ``masked``; dropout: P z, z = keep / (1 - p)), acc_dP becomes dS = P (dP z - D') (softcap: times
        1 - tanh^2, the tanh taken before the mask so that a masked entry's factor stays finite; score_mod: through
        score_mod_bwd at the kept pre-mod scores). ``head``: the query head (read by the mods); ``with_mask`` off: a block-sparse
        full tile, the score_mod only (no mask_mod)."""
        t = None
        pre = None
        if const_expr(self.spec.mods is not None):
            score_mod, score_mod_bwd, mask_mod = flex.callables(self.spec.mods)
            if const_expr(score_mod is not None):
                pre = cute.make_rmem_tensor_like(acc_S, Float32)  # the scaled pre-mod scores, for score_mod_bwd
                pre.store(acc_S.load() * ctx.softcap_scale)
            apply_mods(acc_rows_cols(acc_S), ctx.tScS_rc, FlexMods(score_mod, mask_mod, self.spec.mods.score_vec),
                       ctx.softcap_scale, ctx.batch, head, m, ctx.n_block, self.tile_m, self.tile_n, None,
                       ctx.seqlen_info, self.aux, with_mask)
        if const_expr(self.spec.softcap):
            acc_S.store(cute.math.tanh(acc_S.load() * ctx.softcap_scale, fastmath=True))
            t = cute.make_rmem_tensor_like(acc_S, Float32)
            t.store(acc_S.load())
        S_rc, dP_rc = acc_rows_cols(acc_S), acc_rows_cols(acc_dP)
        if const_expr(masked):
            mask_scores(S_rc, ctx.tScS_rc, ctx.t0ScS_rc, m, ctx.n_block, ctx.seqlen_q, ctx.seqlen_k,
                        ctx.window_left, ctx.window_right, self.tile_m, self.tile_n, self.spec.causal,
                        self.spec.local)
        t_rc = acc_rows_cols(t) if const_expr(self.spec.softcap) else None
        rows, cols = cute.size(S_rc, mode=[0]), cute.size(S_rc, mode=[1])
        flags = None
        if const_expr(self.spec.dropout):
            flags = ctx.dropout.keep_flags(ctx.batch, head, ctx.num_heads, m * self.tile_m,
                                           ctx.n_block * self.tile_n).draw_all()
        for i in cutlass.range_constexpr(rows * cols):
            r, c = i // cols, i % cols
            p = cute.math.exp2(S_rc[r, c] * ctx.scale_log2 - lse2[r], fastmath=True)
            S_rc[r, c] = p
            dp = dP_rc[r, c]
            if const_expr(self.spec.dropout):
                # dropout: O used P * z (z = keep / (1 - p)), so dV takes P * z and dP * z enters dS (dS from the
                # fp32 P: unlike the role split's, no 16-bit P z enters it)
                z = ctx.dropout.scale if flags(r, c) else Float32(0.0)
                S_rc[r, c] = p * z
                dp = dp * z
            ds = p * (dp - dsum[r])
            if const_expr(self.spec.softcap):
                ds = ds * (Float32(1.0) - t_rc[r, c] * t_rc[r, c])
            dP_rc[r, c] = ds
        if const_expr(pre is not None):
            apply_score_mod_bwd(dP_rc, acc_rows_cols(pre), ctx.tScS_rc, score_mod_bwd, self.spec.mods.score_vec,
                                ctx.batch, head, m, ctx.n_block, self.tile_m, self.tile_n, ctx.seqlen_info,
                                self.aux)
