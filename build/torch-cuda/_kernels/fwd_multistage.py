"""Forward attention, cp.async multistage mainloop with warp-level mma.sync (SM120 execution model).

Computes, per (batch, query head) and query row i, with logits l_ij = scale * Q[i] K[j] (or, with a
softcap c, c * tanh(scale * Q[i] K[j] / c)):
    O[i] = sum_j exp(l_ij) V[j] / (sum_j exp(l_ij) [+ exp(sink_h)]),   LSE[i] = log(denominator)
over the visible keys j, for bf16/fp16 inputs with fp32 accumulation. K/V heads are shared by
``num_heads_q / num_heads_kv`` query heads (MHA, GQA, MQA). Visibility (``block_info``): causal or a
local window (left, right), both aligned bottom-right; key blocks outside the band are not visited.
Head dims are any multiples of 8 up to 256 (padded to 16 in shared memory), head_dim_v may differ.

Tensors: Q, O (batch, seqlen_q, heads_q, d); K, V (batch, seqlen_k, heads_kv, d); LSE (batch, heads_q,
seqlen_q) fp32. Sizes and strides are runtime values (last dim contiguous, 16-byte aligned rows).
Paged K/V (``spec.page_size``): K, V (num_pages, page_size, heads_kv, d) caches and a page table
(batch, max_pages) int32 (``kv_source.PagedKV``).

Algorithm (one CTA = one tile_m x d block of Q for one head; ``num_warps`` warps split it by rows;
key blocks are visited from the last to the first, so the few that need an element mask come first):
  1. Prologue: cp.async Q and the first ``num_stages - 1`` K/V tiles (the first can run past seqlen_k:
     its rows are predicated, V's zero-filled); wait for Q and tile 0; optionally keep Q in registers.
  2. For each key block n (tile in smem stage n % num_stages, complete and visible):
     a. start the cp.async of the tile ``num_stages - 1`` blocks ahead into the stage freed last step
     b. S = Q K^T with ldmatrix + mma.sync m16n8k16, fp32 accumulators
     c. softcap; mask S (sequence end, diagonal, window edges) where the block needs it
     d. online softmax: P = exp2(S*scale_log2 - running max), rescale O
     e. O += P V, P kept in registers as the A operand, V^T read by ldmatrix.trans
     f. wait for the next tile; one CTA barrier (the next tile is visible, this stage is free)
  3. O /= row sum; O goes through shared memory (reusing Q's buffer) for 16-byte global stores;
     LSE is written by the lane that owns column 0 of each row.

The kernel class is assembled from parts, one module each: this module holds the setup, the kernel entry
(``__call__`` / ``kernel``) and the per-block math (``compute_block``: S, mask, softmax, P V); the cp.async
schedules of step 2 are ``fwd_mainloop``'s, the overlapped schedule and the ping-pong turns ``fwd_overlap``'s,
step 3 ``fwd_epilogue``'s. Loader variants subclass it (``fwd_tma``, ``fwd_persistent``).

Two jobs are pieces of their own, which every mainloop (here and in the loader variants) calls:
locating a key block's K/V and copying it to a stage (``kv_source``; ``kv_loader`` builds the CTA's
loader, a loader variant overrides it), and step c., what S goes through between the QK^T MMA and
the softmax (``score_step``).

Split-KV (``spec.split_kv``): the grid's z dimension also enumerates ``num_splits`` ranges of each
tile's key blocks (``block_info.split_range``; with ``spec.split_chunk``, fixed chunks of that many blocks from
key 0, ``block_info.chunk_range``); a split writes its normalized fp32 partial O straight
from the accumulators and its LSE into (num_splits, ...) workspaces, merged by ``fwd_combine``.

One stage (``num_stages == 1``): one K and one V buffer; step 2 waits for V after the S MMAs, then
refills K during the softmax and P V, and V after them (``fwd_mainloop.StagedMainloop.single_stage_step``).

Constraints: tile_m a multiple of 16 * num_warps, tile_n a multiple of 16, 1-3 stages, shared memory
within the model's per-CTA limit (see ``config.fwd_config_problems``).
"""

from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp

from ..config import (FwdConfig, banded_tile_order, dropout_on_pairs, fp8_kv_copy, fwd_config_problems,
                      fwd_min_ctas_per_sm, fwd_smem_bytes, smem_head_dims)
from .. import flex
from ..execution_model import CopyKind, ExecutionModel
from ..problem import FwdSpec
from . import CUTLASS_DTYPES, block_info
from .grid_dependency import enter_grid
from .fragments import acc_as_operand_a, acc_rows_cols
from .block_walk import sparse_walk
from .dropout_mask import DropoutMask, apply_keep_pairs, check_cells, convert_keep_pairs
from .flex_mods import FlexMods, SeqlenInfo, aux_inputs
from .fwd_epilogue import FwdEpilogue
from .fwd_mainloop import StagedMainloop
from .fwd_overlap import OverlappedMainloop
from .fwd_state import EpilogueTarget, FwdSmem, FwdTileState, PersistentArgs
from .kv_dequant import MMA_BUFFERS, staged_loader
from .kv_source import CpAsyncKV, DenseKV, PagedKV
from .score_step import ScoreStep
from .softmax import RESCALE_LOG2, OnlineSoftmax
from .tile_io import column_predicate, copy_rows, g2s_tiled_copy, smem_layout_atom, zero_masked_cols
from .seqlen_info import num_batches, num_heads, row_tile, sequence_heads
from .tile_scheduler import PersistentTileScheduler, SingleTileScheduler


class FlashFwdMultistage(StagedMainloop, OverlappedMainloop, FwdEpilogue):
    """cp.async + mma.sync forward kernel. Build with a spec, a config and an execution model."""

    def __init__(self, spec: FwdSpec, config: FwdConfig, model: ExecutionModel):
        self.spec = spec
        self.config = config
        self.model = model
        self.dtype = CUTLASS_DTYPES[spec.dtype]
        #: Q's element type (an FP8 MMA variant reads FP8 Q: ``fwd_fp8_mma``); O has ``dtype``
        self.q_dtype = self.dtype
        #: FP8 K/V: their element type, None when K/V have ``dtype``
        self.kv_dtype = CUTLASS_DTYPES[spec.kv_dtype] if spec.kv_dtype else None
        #: FP8 K/V beside 16-bit MMAs: the copies land in staging stages, widened into 16-bit buffers (``kv_dequant``)
        self.widens_kv = self.kv_dtype is not None
        #: K/V buffers the MMAs read: the stages, or with widened FP8 K/V the two 16-bit buffers beside the staging
        self.mma_stages = MMA_BUFFERS if self.widens_kv else config.num_stages
        #: Q / O's tile lies in the last K/V stage instead of its own storage (``fwd_keysplit_fp8``): the first
        #: mainloop step fills that stage, after a barrier that follows Q's read into registers
        self.q_over_stages = False
        #: MLA (``spec.latent_v``): V is the first head_dim_v columns of the K tile, which has no V tile beside it
        self.v_in_k = spec.latent_v
        #: K's own columns in global memory (the rope part of an MLA key)
        self.k_head_dim = spec.k_head_dim
        self.head_dim, self.head_dim_v = smem_head_dims(spec, config)
        # Padded head dims need column predicates (and zeroed Q/K padding); exact ones compile without.
        self.pad_qk = spec.head_dim != self.head_dim
        self.pad_v = spec.head_dim_v != self.head_dim_v
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        self.num_threads = config.num_threads
        self.causal = spec.causal
        #: a producer warp loads, the MMA warps consume (a loader variant)
        self.warp_specialized = False
        #: dynamic smem to launch with when larger than the kernel's own (set by measurement harnesses
        #: to pin CTAs per SM; 0 = the kernel's own)
        self.launch_smem = 0

    @staticmethod
    def can_implement(spec: FwdSpec, config: FwdConfig, model: ExecutionModel) -> tuple[str, ...]:
        """Reasons this kernel cannot run (empty when it can): the config predicate plus what this
        mainloop needs from the execution model."""
        problems = list(fwd_config_problems(spec, config, model))
        if not model.supports(CopyKind.CP_ASYNC):
            problems.append(f"the {model.name} model has no cp.async")
        if model.s2r_copy is not CopyKind.LDMATRIX:
            problems.append(f"the {model.name} model has no ldmatrix")
        return tuple(problems)

    @staticmethod
    def smem_bytes(spec: FwdSpec, config: FwdConfig) -> int:
        return fwd_smem_bytes(spec, config)

    # ------------------------------------------------------------------------------------------
    # Hooks a loader variant overrides (this class: cp.async by every thread, CTA barriers)
    # ------------------------------------------------------------------------------------------
    @property
    def launch_threads(self) -> int:
        return self.num_threads

    def num_mbarriers(self) -> int:
        return 0

    def make_tma_atoms(self, mK: cute.Tensor, mV: cute.Tensor):
        """(atom_K, tma_K, atom_V, tma_V) for TMA loaders; None here."""
        return None, None, None, None

    def init_mbarriers(self, storage):
        return None

    def kv_loader(self, kv_src, tidx, sm: FwdSmem) -> CpAsyncKV:
        """This thread's K/V loader (``kv_source``; ``kv_src`` narrowed to one KV head and cut into key
        blocks): cp.async into the stages of sK / sV, or with FP8 K/V into the staging stages, widened
        into sK / sV (``kv_dequant``)."""
        if const_expr(self.widens_kv):
            elems, per_row = fp8_kv_copy(self.spec, self.config)
            if const_expr(elems == 16):  # 16-byte vectors past L1; the 16-bit side in the same thread layout
                cp_async = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
                g2s_k8 = g2s_v8 = g2s_tiled_copy(self.kv_dtype, per_row * 16, self.num_threads, cp_async, elems=16)
                widen_k = widen_v = g2s_tiled_copy(self.dtype, per_row * 16, self.num_threads,
                                                   cute.nvgpu.CopyUniversalOp(), elems=16, bits=128)
            else:  # 8-byte vectors (.ca: .cg copies 16 bytes only) in the 16-bit copies' thread layout
                cp_async = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.ALWAYS)
                g2s_k8, g2s_v8 = (g2s_tiled_copy(self.kv_dtype, smem_layout_atom(self.dtype, width).outer.shape[1],
                                                 self.num_threads, cp_async, elems=8)
                                  for width in (self.head_dim, self.head_dim_v))
                widen_k, widen_v = self.g2s_qk, self.g2s_v
            inner = kv_src.cp_async(tidx, sm.sK8, sm.sV8, g2s_k8, g2s_v8)
            return staged_loader(inner, tidx, sm.sK, sm.sV, widen_k, widen_v, self.dtype, self.config.num_stages)
        return kv_src.cp_async(tidx, sm.sK, sm.sV, self.g2s_qk, self.g2s_v)

    @property
    def pv_mma(self) -> cute.TiledMma:
        """The tiled MMA of O += P V (its A operand is S's accumulator): the one of both GEMMs here."""
        return self.tiled_mma

    @property
    def o_mma(self) -> cute.TiledMma:
        """The tiled MMA whose accumulator layout O has (the epilogue's partitions): the one of both GEMMs here."""
        return self.tiled_mma

    @cute.jit
    def mma_barrier(self):
        """Barrier over the MMA warps (the whole CTA here)."""
        cute.arch.sync_threads()

    # ------------------------------------------------------------------------------------------
    # Host-side (trace-time) setup
    # ------------------------------------------------------------------------------------------
    def _setup(self):
        dt = self.dtype
        atom_qk = smem_layout_atom(dt, self.head_dim)
        atom_v = smem_layout_atom(dt, self.head_dim_v)
        self.sQ_layout = cute.tile_to_shape(atom_qk, (self.tile_m, self.head_dim), (0, 1))
        self.sK_layout, self.sV_layout = self.kv_smem_layouts()
        self.sO_layout = cute.tile_to_shape(atom_v, (self.tile_m, self.head_dim_v), (0, 1))
        cp_async = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
        self.g2s_qk = g2s_tiled_copy(dt, atom_qk.outer.shape[1], self.num_threads, cp_async)
        self.g2s_v = g2s_tiled_copy(dt, atom_v.outer.shape[1], self.num_threads, cp_async)
        self.s2g_o = g2s_tiled_copy(dt, atom_v.outer.shape[1], self.num_threads, cute.nvgpu.CopyUniversalOp())
        num_warps = self.num_threads // 32
        self.tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(dt, Float32, (16, 8, 16)),
            (num_warps, 1, 1),
            permutation_mnk=(num_warps * 16, 16, 16),
        )
        self.SharedStorage = self.shared_storage(max(cute.cosize(self.sQ_layout), cute.cosize(self.sO_layout)))

    def kv_smem_layouts(self):
        """(sK, sV) layouts: (tile_n, d | dv, ``mma_stages``) in the 16-bit swizzled atoms."""
        return tuple(cute.tile_to_shape(smem_layout_atom(self.dtype, width), (self.tile_n, width, self.mma_stages),
                                        (0, 1, 2)) for width in (self.head_dim, self.head_dim_v))

    def shared_storage(self, q_o_elems: int):
        """The CTA's shared storage, checked against the host formula (``check_smem``): Q's tile (``q_o_elems``
        16-bit elements, reused for O), the K and V tiles of ``sK_layout`` / ``sV_layout`` (16-bit elements; FP8
        tiles as byte pairs), FP8 K/V's staging stages when the kernel widens them (``staging_layouts``), each
        1024-aligned; ahead of them the TMA mainloops' mbarriers and the ping-pong turns' softmax scale."""
        dt = self.dtype
        fields = {} if self.q_over_stages else {"sQ": cute.struct.Align[cute.struct.MemRange[dt, q_o_elems], 1024]}
        fields["sK"] = cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sK_layout)], 1024]
        if not self.v_in_k:
            fields["sV"] = cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sV_layout)], 1024]
        if self.widens_kv:
            for name, layout in zip(("sK8", "sV8"), self.staging_layouts()):
                fields[name] = cute.struct.Align[cute.struct.MemRange[self.kv_dtype, cute.cosize(layout)], 1024]
        fields.update(self.extra_smem_fields())
        Tiles = cute.struct(type("Tiles", (), {"__annotations__": fields}))
        num_bars = self.num_mbarriers()

        if self.config.pingpong:  # + the softmax scale the turns reload (within the barriers' 1024 B)

            @cute.struct
            class SharedStorage:
                bars: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, num_bars], 8]
                scale: cute.struct.Align[cute.struct.MemRange[Float32, 1], 4]
                tiles: cute.struct.Align[Tiles, 1024]
        elif num_bars:  # TMA mainloops: full/empty mbarriers per stage, ahead of the tiles

            @cute.struct
            class SharedStorage:
                bars: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, num_bars], 8]
                tiles: cute.struct.Align[Tiles, 1024]
        else:

            @cute.struct
            class SharedStorage:
                tiles: cute.struct.Align[Tiles, 1024]

        self.check_smem(SharedStorage)
        return SharedStorage

    def extra_smem_fields(self) -> dict:
        """Shared-storage fields a kernel variant adds after the K/V tiles (``fwd_wide``: P and the row
        statistics its warps exchange), viewed by ``extra_smem_views``."""
        return {}

    def extra_smem_views(self, tiles):
        """``FwdSmem.extra``: the tensors of ``extra_smem_fields`` (None without any)."""
        return None

    def check_smem(self, storage):
        """Trace-time invariant: the host formula (used by the predicate and the gate) is exact."""
        if storage.size_in_bytes() != fwd_smem_bytes(self.spec, self.config):
            raise RuntimeError(f"smem accounting mismatch: struct {storage.size_in_bytes()} B vs "
                               f"predicate {fwd_smem_bytes(self.spec, self.config)} B")

    def staging_layouts(self):
        """FP8 K/V's staging stages (tile_n, d | dv, num_stages): the 16-bit tiles' swizzled atoms in elements
        (``kv_dequant``). Built where they are used, on the host (sizes) and in the kernel (views)."""
        if const_expr(fp8_kv_copy(self.spec, self.config)[0] == 16):  # rows of whole 16-byte vectors, unswizzled
            return tuple(cute.make_layout((self.tile_n, width, self.config.num_stages),
                                          stride=(width, 1, self.tile_n * width))
                         for width in (self.head_dim, self.head_dim_v))
        return tuple(cute.tile_to_shape(smem_layout_atom(self.kv_dtype, width),
                                        (self.tile_n, width, self.config.num_stages), (0, 1, 2))
                     for width in (self.head_dim, self.head_dim_v))

    @cute.jit
    def shared_tiles(self, tidx, softmax_scale_log2, sQ_layout, sK_layout, sV_layout, sO_layout) -> FwdSmem:
        """Allocate the CTA's shared storage and initialize its barriers: bars, sScale (ping-pong),
        sQ (tile_m, d), sK (tile_n, d, stages), sV (tile_n, dv, stages), sO (over sQ's bytes) and the
        V^T view sVt (dv, tile_n, stages) for the B operand of P @ V."""
        storage = cutlass.memory.SmemAllocator().allocate(self.SharedStorage)
        sScale = None
        if const_expr(self.config.pingpong):  # published by init_mbarriers' CTA barrier
            sScale = storage.scale.get_tensor(cute.make_layout(1))
            if tidx == 0:
                sScale[0] = softmax_scale_log2
        bars = self.init_mbarriers(storage)
        sQ = storage.tiles.sQ.get_tensor(sQ_layout)
        sK = storage.tiles.sK.get_tensor(sK_layout)
        # V's tile, or with MLA (v_in_k) the K tile, whose first head_dim_v columns are V
        sV = None if const_expr(self.v_in_k) else storage.tiles.sV.get_tensor(sV_layout)
        v_src, v_row = (sK, self.head_dim) if const_expr(self.v_in_k) else (sV, self.head_dim_v)
        sVt = cute.composition(v_src, cute.make_layout((self.head_dim_v, self.tile_n, self.mma_stages),
                                                       stride=(self.tile_n, 1, self.tile_n * v_row)))
        sK8 = sV8 = None
        if const_expr(self.widens_kv):
            sK8_layout, sV8_layout = self.staging_layouts()
            sK8 = storage.tiles.sK8.get_tensor(sK8_layout)
            sV8 = storage.tiles.sV8.get_tensor(sV8_layout)
        return FwdSmem(bars=bars, sScale=sScale, sQ=sQ, sK=sK, sV=sV,
                       sO=cute.make_tensor(sQ.iterator, sO_layout), sVt=sVt, sK8=sK8, sV8=sV8,
                       extra=self.extra_smem_views(storage.tiles))

    @cute.jit
    def mma_context(self, tidx, sm: FwdSmem, softmax_scale_log2) -> FwdTileState:
        """What a thread's MMAs need, independent of the tile: fragments, ldmatrix copies and their
        smem partitions (with the stage mode), the O accumulator (zeroed), the softmax state and the
        S coordinates for masking (this thread's and thread 0's compile-time partition)."""
        thr_mma, thr_pv = self.tiled_mma.get_slice(tidx), self.pv_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sm.sQ))  # (MMA, MMA_M, MMA_K)
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sm.sK[None, None, 0]))  # (MMA, MMA_N, MMA_K)
        tOrVt = thr_pv.make_fragment_B(thr_pv.partition_B(sm.sVt[None, None, 0]))  # (MMA, MMA_N, MMA_K)
        s2r_q = cute.make_tiled_copy_A(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), self.tiled_mma
        )
        s2r_k = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), self.tiled_mma
        )
        s2r_v = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype), self.pv_mma
        )
        operands = (tSrQ, tSrK, tOrVt)
        return self.tile_state(tidx, sm.bars, sm.sScale, operands, operands, (sm.sQ, sm.sK, sm.sVt),
                               (s2r_q, s2r_k, s2r_v), thr_pv, softmax_scale_log2)

    @cute.jit
    def tile_state(self, tidx, bars, sScale, operands, fills, smem, copies, thr_o, softmax_scale_log2,
                   rescale_log2: cutlass.Constexpr[float] = RESCALE_LOG2) -> FwdTileState:
        """A thread's ``FwdTileState``: its MMA fragments ``operands`` (tSrQ, tSrK, tOrVt); the registers ``fills``
        (the fragments, or 16-bit views of them) that ``copies`` (Q, K, V^T) load from ``smem`` (sQ, sK, sVt) with
        the stage mode; O's (MMA, MMA_M, MMA_N) accumulator, zeroed, in ``thr_o``'s partition and its (rows, cols)
        view; the online softmax (``rescale_log2``: how far a block's max may pass the reference before it moves);
        and the S coordinates for masking (this thread's and thread 0's compile-time partition)."""
        thr_mma = self.tiled_mma.get_slice(tidx)
        thr_q, thr_k, thr_v = copies[0].get_slice(tidx), copies[1].get_slice(tidx), copies[2].get_slice(tidx)
        acc_O = cute.make_rmem_tensor(thr_o.partition_shape_C((self.tile_m, self.head_dim_v)), Float32)
        acc_O.fill(0.0)
        acc_O_rc = acc_rows_cols(acc_O)
        cS = cute.make_identity_tensor((self.tile_m, self.tile_n))
        return FwdTileState(
            tidx=tidx, bars=bars, sScale=sScale,
            tSrQ=operands[0], tSrK=operands[1], tOrVt=operands[2], acc_O=acc_O, acc_O_rc=acc_O_rc,
            tSsQ=thr_q.partition_S(smem[0]), tSrQ_v=thr_q.retile(fills[0]),
            tSsK=thr_k.partition_S(smem[1]), tSrK_v=thr_k.retile(fills[1]),
            tOsVt=thr_v.partition_S(smem[2]), tOrVt_v=thr_v.retile(fills[2]),
            s2r_q=copies[0], s2r_k=copies[1], s2r_v=copies[2], thr_mma=thr_mma,
            tScS_rc=acc_rows_cols(thr_mma.partition_C(cS)),
            t0ScS_rc=acc_rows_cols(self.tiled_mma.get_slice(0).partition_C(cS)),
            softmax=OnlineSoftmax(softmax_scale_log2, cute.size(acc_O_rc, mode=[0]), rescale_log2),
        )

    def score_step(self, ctx: FwdTileState, softcap_scale, window_left, window_right, batch=None, head=None,
                   mCuSeqlensQ=None, mCuSeqlensK=None) -> ScoreStep:
        """What S goes through between the QK^T MMA and the softmax in this tile (``score_step``): the
        spec's features with the tile's runtime values and ``ctx``'s S coordinates; with mods also
        the batch, the grid's head and the sequences' offsets in packed Q / K."""
        mods = seqlen_info = None
        if const_expr(self.spec.mods is not None):
            score_mod, _, mask_mod = flex.callables(self.spec.mods)
            mods = FlexMods(score_mod, mask_mod, self.spec.mods.score_vec)
            seqlen_info = SeqlenInfo.of(batch, mCuSeqlensQ, mCuSeqlensK, ctx.seqlen_q, ctx.seqlen_k)
        return ScoreStep(
            tile_m=self.tile_m, tile_n=self.tile_n, softcap=self.spec.softcap, causal=self.causal,
            local=self.spec.local, mask_select=self.config.mask_select, softcap_scale=softcap_scale,
            window_left=window_left, window_right=window_right, seqlen_q=ctx.seqlen_q, seqlen_k=ctx.seqlen_k,
            m_block=ctx.m_block, group=ctx.group, tScS_rc=ctx.tScS_rc, t0ScS_rc=ctx.t0ScS_rc,
            mods=mods, batch=batch, head=head, seqlen_info=seqlen_info, aux=self.aux,
        )

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        softmax_scale_log2: Float32,
        softcap_scale: Float32,
        window_left: Int32,
        window_right: Int32,
        mSink: Optional[cute.Tensor],
        mCuSeqlensQ: Optional[cute.Tensor],
        mCuSeqlensK: Optional[cute.Tensor],
        mSeqUsedQ: Optional[cute.Tensor],
        mSeqUsedK: Optional[cute.Tensor],
        mPageTable: Optional[cute.Tensor],
        max_seqlen_q: Int32,
        num_splits: Int32,
        max_ctas: Int32,
        tile_band: Int32,
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
        mKDescale: Optional[cute.Tensor],
        mVDescale: Optional[cute.Tensor],
        stream: cuda.CUstream,
    ):
        out_dtype = Float32 if const_expr(self.spec.split_kv) else self.dtype
        kv_dtype = self.kv_dtype if const_expr(self.kv_dtype is not None) else self.dtype
        if const_expr(not (mQ.element_type == self.q_dtype and mK.element_type == mV.element_type == kv_dtype
                           and mO.element_type == out_dtype)):
            raise TypeError("Q must have the spec's dtype (e4m3 with FP8 MMAs), K and V its kv_dtype, O its dtype "
                            "(fp32 partials with split-KV)")
        if const_expr((mKDescale is None or mVDescale is None) != (self.kv_dtype is None)):
            raise TypeError("the descale slots come with FP8 K/V and only with them")
        self._setup()
        # Causal rows get longer down the sequence: start the long tiles first.
        if const_expr(self.config.persistent):
            scheduler = PersistentTileScheduler(reverse_m=self.spec.longest_first)
        else:
            scheduler = SingleTileScheduler(reverse_m=self.spec.longest_first, split_kv=self.spec.split_kv,
                                            banded=banded_tile_order(self.spec, self.config))
        packed_q = mCuSeqlensQ is not None
        # Packed Q: the grid covers the longest sequence; CTAs past a shorter one exit at once.
        rows = max_seqlen_q if const_expr(packed_q) else mQ.shape[1]
        heads = num_heads(mQ, packed_q)
        if const_expr(self.spec.pack_gqa):
            # Packed GQA: one CTA row of tiles per KV head; its M extent holds every query head of the group.
            group = heads // num_heads(mK, mCuSeqlensK is not None)
            rows = rows * group
            heads = heads // group
        num_m_blocks = cute.ceil_div(rows, self.tile_m)
        grid = scheduler.grid(num_m_blocks, heads, num_batches(mQ, mCuSeqlensQ),
                              max_ctas if const_expr(self.config.persistent) else num_splits)
        tma_atom_K, mK_tma, tma_atom_V, mV_tma = self.make_tma_atoms(mK, mV)
        self.kernel(
            mQ, mK, mV, mO, mLSE, softmax_scale_log2, softcap_scale, window_left, window_right, mSink,
            mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK, mPageTable, num_splits,
            self.sQ_layout, self.sK_layout, self.sV_layout, self.sO_layout,
            self.g2s_qk, self.g2s_v, self.s2g_o, self.tiled_mma, scheduler,
            tma_atom_K, mK_tma, tma_atom_V, mV_tma, num_m_blocks, cutlass.max(tile_band, 1), mAux0, mAux1, mAux2, mAux3,
            sAux0, sAux1, sAux2, sAux3, mBlockCnt, mBlockIdx, mFullCnt, mFullIdx, mRng, mKDescale, mVDescale,
        ).launch(
            grid=grid,
            block=[self.launch_threads, 1, 1],
            smem=max(self.SharedStorage.size_in_bytes(), self.launch_smem),
            # The CTAs per SM shared memory allows, down to 128 registers a thread per 16 rows of a warp
            # (config.fwd_min_ctas_per_sm)
            min_blocks_per_mp=fwd_min_ctas_per_sm(self.spec, self.config, self.model, self.launch_threads),
            # -1 = CU_SHAREDMEM_CARVEOUT_DEFAULT, the attribute's own default; giving it keeps the DSL from
            # asking the driver for the build machine's smem per SM when min_blocks_per_mp > 1
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
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        softmax_scale_log2: Float32,
        softcap_scale: Float32,
        window_left: Int32,
        window_right: Int32,
        mSink: Optional[cute.Tensor],
        mCuSeqlensQ: Optional[cute.Tensor],
        mCuSeqlensK: Optional[cute.Tensor],
        mSeqUsedQ: Optional[cute.Tensor],
        mSeqUsedK: Optional[cute.Tensor],
        mPageTable: Optional[cute.Tensor],
        num_splits: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        g2s_qk: cute.TiledCopy,
        g2s_v: cute.TiledCopy,
        s2g_o: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        scheduler: cutlass.Constexpr,
        tma_atom_K: Optional[cute.CopyAtom],
        mK_tma: Optional[cute.Tensor],
        tma_atom_V: Optional[cute.CopyAtom],
        mV_tma: Optional[cute.Tensor],
        num_m_blocks: Int32,
        tile_band: Int32,
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
        mKDescale: Optional[cute.Tensor],
        mVDescale: Optional[cute.Tensor],
    ):
        # Layouts and tiled copies built at trace time on the host arrive as kernel parameters.
        self.g2s_qk, self.g2s_v, self.s2g_o, self.tiled_mma = g2s_qk, g2s_v, s2g_o, tiled_mma
        self.aux = aux_inputs(mAux0, mAux1, mAux2, mAux3, sAux0, sAux1, sAux2, sAux3)  # the mods' aux inputs
        enter_grid(self.model.has_pdl)  # the append's rows, a user kernel's Q: visible from here on
        if const_expr(self.config.persistent):  # one CTA per SM walks the tiles (fwd_persistent)
            self.persistent_tiles(PersistentArgs(
                mQ=mQ, mK=mK, mV=mV, mO=mO, mLSE=mLSE, scale_log2=softmax_scale_log2, softcap_scale=softcap_scale,
                window_left=window_left, window_right=window_right, mSink=mSink, mCuSeqlensQ=mCuSeqlensQ,
                mCuSeqlensK=mCuSeqlensK, mSeqUsedQ=mSeqUsedQ, mSeqUsedK=mSeqUsedK, layouts=(sQ_layout, sK_layout,
                sV_layout, sO_layout), scheduler=scheduler, tma_atom_K=tma_atom_K, mK_tma=mK_tma,
                tma_atom_V=tma_atom_V, mV_tma=mV_tma, num_m_blocks=num_m_blocks))
        else:
            tidx, _, _ = cute.arch.thread_idx()
            pack = self.spec.pack_gqa
            heads_q = num_heads(mQ, mCuSeqlensQ is not None)
            group = heads_q // num_heads(mK, mCuSeqlensK is not None)
            # the grid's heads: KV heads when GQA rows are packed
            m_block, head, batch, split = scheduler.tile(num_splits, num_m_blocks,
                                                         heads_q // group if const_expr(pack) else heads_q, tile_band)
            # Packed GQA: ``head`` is the KV head and tile row p is (query row p // group, query head
            # head * group + p % group). Unpacked: ``head`` is the query head.
            head_kv = head if const_expr(pack) else head // group
            v_descale = None
            if const_expr(self.kv_dtype is not None):
                # FP8 K/V: K's scale multiplies every score, so it joins the scale applied to S (inside tanh with a
                # softcap); V's multiplies O, so it joins O's normalization (``finish``)
                if const_expr(self.spec.softcap):
                    softcap_scale = softcap_scale * mKDescale[batch, head_kv]
                else:
                    softmax_scale_log2 = softmax_scale_log2 * mKDescale[batch, head_kv]
                v_descale = mVDescale[batch, head_kv]
            # Q's (rows, heads, d) view of this sequence and its runtime length (dense or packed); K/V's
            # source for this sequence and KV head (``kv_source``).
            mQ_h, seqlen_q = sequence_heads(mQ, batch, mCuSeqlensQ, mSeqUsedQ)
            if const_expr(self.spec.page_size):
                kv_src = PagedKV.locate(mK, mV, mPageTable, batch, mSeqUsedK, self.spec.page_size, head_kv)
            else:
                kv_src = DenseKV.locate(mK, mV, batch, mCuSeqlensK, mSeqUsedK, (tma_atom_K, mK_tma),
                                        (tma_atom_V, mV_tma), head_kv)
            seqlen_k = kv_src.seqlen_k
            tile_rows = seqlen_q * group if const_expr(pack) else seqlen_q  # M extent of this (batch, head)
            if m_block * self.tile_m < tile_rows:  # packed batches: tiles past a short sequence do nothing
                # Key blocks [n_start, n_end); [n_unmasked_start, n_unmasked_end) need no element mask.
                if const_expr(pack):
                    row_lo, row_hi = block_info.packed_rows(m_block, self.tile_m, group)
                else:
                    row_lo, row_hi = m_block * self.tile_m, (m_block + 1) * self.tile_m
                ranges = block_info.block_range_rows(
                    row_lo, row_hi, seqlen_q, seqlen_k, self.tile_n, self.causal, self.spec.local,
                    window_left, window_right,
                )
                if const_expr(self.spec.split_chunk):
                    ranges = block_info.chunk_range(ranges, split, self.spec.split_chunk)
                elif const_expr(self.spec.split_kv):
                    ranges = block_info.split_range(ranges, split, num_splits)
                n_start, n_unmasked_start, n_unmasked_end, n_end = ranges
                walk = None  # block sparsity: the listed key blocks instead of [n_start, n_end)
                if const_expr(self.spec.block_sparse is not None):
                    q_block, k_block, _ = self.spec.block_sparse
                    walk = sparse_walk(mBlockCnt, mBlockIdx, mFullCnt, mFullIdx, batch, head, m_block,
                                       q_block // self.tile_m, k_block // self.tile_n, seqlen_k, self.tile_n)

                # (tile_m, d) (unpacked; packed rows are gathered one by one); K/V's key blocks
                gQ = cute.local_tile(mQ_h[None, 0 if const_expr(pack) else head, None], (self.tile_m, self.head_dim),
                                     (m_block, 0))
                kv_blocks = kv_src.blocks(self.tile_n, self.k_head_dim, self.head_dim_v)

                sm = self.shared_tiles(tidx, softmax_scale_log2, sQ_layout, sK_layout, sV_layout, sO_layout)

                # Global -> shared partitions of Q: (CPY, CPY_ROWS, CPY_COLS); K/V's are the loader's
                thr_qk = self.g2s_qk.get_slice(tidx)
                tQgQ, tQsQ = thr_qk.partition_S(gQ), thr_qk.partition_D(sm.sQ)
                cQ = cute.make_identity_tensor((self.tile_m, self.head_dim))
                tQcQ, t0QcQ = thr_qk.partition_S(cQ), self.g2s_qk.get_slice(0).partition_S(cQ)
                kv = self.kv_loader(kv_blocks, tidx, sm)

                ctx = self.mma_context(tidx, sm, softmax_scale_log2)
                ctx.update(
                    m_block=m_block, seqlen_q=seqlen_q, seqlen_k=seqlen_k, n_start=n_start, n_end=n_end,
                    group=group if const_expr(pack) else None, tile_rows=tile_rows, head_kv=head_kv, mQ_h=mQ_h,
                    thr_qk=thr_qk, n_unmasked_start=n_unmasked_start, n_unmasked_end=n_unmasked_end,
                    tQgQ=tQgQ, tQsQ=tQsQ, tQcQ=tQcQ, t0QcQ=t0QcQ, kv=kv, slot_base=0, walk=walk,
                )
                ctx.score = self.score_step(ctx, softcap_scale, window_left, window_right, batch, head,
                                            mCuSeqlensQ, mCuSeqlensK)
                ctx.dropout = None  # the keep mask of P (``dropout_mask``), drawn after the softmax
                ctx.v_descale = v_descale
                if const_expr(self.spec.dropout):
                    check_cells(self.tiled_mma, self.tile_m, self.tile_n)
                    ctx.dropout = DropoutMask.of(mRng, ctx.tScS_rc, ctx.t0ScS_rc)
                    ctx.batch, ctx.head, ctx.num_heads = batch, head, heads_q

                out = EpilogueTarget(mO=mO, mLSE=mLSE, mCuSeqlensQ=mCuSeqlensQ, mSeqUsedQ=mSeqUsedQ, batch=batch,
                                     head=head, split=split)
                if const_expr(self.warp_specialized):
                    # A producer warp feeds the stages; the MMA warps only consume them.
                    if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == self.num_threads // 32:
                        self.producer(ctx)
                    else:
                        self.consume(ctx, mSink, head, sm.sO, out)
                else:
                    self.consume(ctx, mSink, head, sm.sO, out)

    @cute.jit
    def consume(self, ctx: FwdTileState, mSink, head, sO, out: EpilogueTarget):
        """Prologue, the key-block loop and the epilogue of the MMA warps."""
        # Padded head dims: the padded Q/K columns are zeroed once and never loaded.
        if const_expr(self.pad_qk or self.pad_v):
            ctx.kv = ctx.kv.padded(self.spec.head_dim if self.pad_qk else None,
                                   self.spec.head_dim_v if self.pad_v else None)
        if const_expr(self.pad_qk):
            zero_masked_cols(ctx.tQsQ, column_predicate(ctx.tQcQ, self.spec.head_dim))
            ctx.kv.zero_k_padding(self.config.num_stages)
        if const_expr(self.config.overlap):
            self.overlap_prologue(ctx, ctx.walk)
        elif const_expr(self.single_stage):
            self.single_stage_prologue(ctx, ctx.walk)
        else:
            self.prologue(ctx, ctx.walk)
        if const_expr(self.config.q_in_regs):
            cute.copy(ctx.s2r_q, ctx.tSsQ, ctx.tSrQ_v)
        if const_expr(self.q_over_stages):
            cute.arch.sync_threads()  # every warp holds Q before the first step refills the stage under it
        # Mainloop, last block first: right-edge blocks (masked), full blocks, left-edge blocks of a window
        # (masked). Step ``it`` handles block n_end - 1 - it.
        num_right = ctx.n_end - ctx.n_unmasked_end
        num_full = ctx.n_unmasked_end - ctx.n_unmasked_start
        if const_expr(self.config.overlap and ctx.walk is not None):
            self.overlap_sparse_mainloop(ctx, ctx.walk)
        elif const_expr(self.config.overlap):
            self.overlap_mainloop(ctx, num_right, num_full)
        elif const_expr(ctx.walk is not None):
            self.sparse_mainloop(ctx, ctx.walk)
        else:
            # block n_end - 1 - it in stage it % stages
            for i in cutlass.range(num_right, unroll=1):
                self.mainloop_step(ctx, i, ctx.n_end - 1 - i, masked=True)
            for i in cutlass.range(num_full, unroll=1):
                self.mainloop_step(ctx, num_right + i, ctx.n_unmasked_end - 1 - i, masked=False)
            if const_expr(self.spec.local):
                for i in cutlass.range(ctx.n_unmasked_start - ctx.n_start, unroll=1):
                    self.mainloop_step(ctx, num_right + num_full + i, ctx.n_unmasked_start - 1 - i, masked=True)

        self.finish(ctx, mSink, head, sO, out)

    @cute.jit
    def packed_row(self, ctx: FwdTileState, tile_row):
        """(query row, query head) of tile row ``tile_row`` when GQA rows are packed: packed row p is
        query row p // group of head head_kv * group + p % group."""
        p = ctx.m_block * self.tile_m + tile_row
        return p // ctx.group, ctx.head_kv * ctx.group + p % ctx.group

    @cute.jit
    def row_head(self, ctx: FwdTileState, head, tile_row):
        """The query head of tile row ``tile_row`` (``head`` itself unless GQA rows are packed)."""
        if const_expr(self.spec.pack_gqa):
            return self.packed_row(ctx, tile_row)[1]
        return head

    @cute.jit
    def load_q(self, ctx: FwdTileState):
        """cp.async this CTA's Q tile (rows past seqlen_q skipped), one commit group. Packed GQA
        rows are gathered one copy row at a time (row p: query p // group, head p % group)."""
        col_pred = column_predicate(ctx.tQcQ, self.spec.head_dim) if const_expr(self.pad_qk) else None
        if const_expr(self.spec.pack_gqa):
            tQsQ, tile_rows = ctx.tQsQ, ctx.tile_rows
            for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
                p = ctx.m_block * self.tile_m + ctx.tQcQ[0, m, 0][0]
                q_row, q_head = self.packed_row(ctx, ctx.tQcQ[0, m, 0][0])
                # (addresses only: rows past the end are formed but not read)
                src = ctx.thr_qk.partition_S(row_tile(ctx.mQ_h, q_row, q_head, self.tile_m, self.head_dim))[None, m, None]
                if p < tile_rows:
                    cute.copy(self.g2s_qk, src, tQsQ[None, m, None],
                              pred=col_pred[None, m, None] if const_expr(self.pad_qk) else None)
        else:
            copy_rows(self.g2s_qk, ctx.tQgQ, ctx.tQsQ, ctx.t0QcQ, ctx.seqlen_q - ctx.m_block * self.tile_m - ctx.tQcQ[0][0],
                      False, col_pred)

    @cute.jit
    def compute_block(self, ctx: FwdTileState, n_block: Int32, stage: Int32, masked: cutlass.Constexpr[bool],
                      mask_mod: cutlass.Constexpr[bool] = True):
        """S = Q K^T, mask, online softmax, O += P V for one key block in smem ``stage``."""
        acc_S = self.scores(ctx, n_block, stage, masked, mask_mod)
        ctx.softmax.step(acc_rows_cols(acc_S), ctx.acc_O_rc)
        # e. O += P V, P reinterpreted as the A operand in 16-bit
        self.pv(ctx, self.dropped_p(ctx, acc_S, n_block), stage)

    @cute.jit
    def scores(self, ctx: FwdTileState, n_block: Int32, k_stage: Int32, masked: cutlass.Constexpr[bool],
               mask_mod: cutlass.Constexpr[bool] = True):
        """b./c. S = Q K^T for key block ``n_block`` (K in smem stage ``k_stage``), through the tile's
        score step (softcap, element mask where the block needs it; the mask_mod unless ``mask_mod`` is off):
        the (MMA, MMA_M, MMA_N) fp32 accumulator."""
        acc_S = cute.make_rmem_tensor(ctx.thr_mma.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        acc_S.fill(0.0)
        tSsK = ctx.tSsK[None, None, None, k_stage]
        if const_expr(self.config.q_in_regs):
            self.gemm_rA_smemB(acc_S, ctx.tSrQ, ctx.tSrK, tSsK, ctx.tSrK_v, ctx.s2r_k)
        else:
            self.gemm_smem(acc_S, ctx.tSrQ, ctx.tSrK, ctx.tSsQ, ctx.tSrQ_v, tSsK, ctx.tSrK_v, ctx.s2r_q, ctx.s2r_k)
        ctx.score.apply(acc_S, n_block, masked, mask_mod)
        return acc_S

    @cute.jit
    def pv(self, ctx: FwdTileState, rP: cute.Tensor, v_stage: Int32):
        """e. O += P V: ``rP`` (16-bit, laid out like S's accumulator) as the A operand, V^T of smem
        stage ``v_stage`` read by ldmatrix.trans."""
        self.gemm_rA_smemB(ctx.acc_O, acc_as_operand_a(rP), ctx.tOrVt, ctx.tOsVt[None, None, None, v_stage],
                           ctx.tOrVt_v, ctx.s2r_v, self.pv_mma)

    @cute.jit
    def dropped_p(self, ctx: FwdTileState, acc_S: cute.Tensor, n_block: Int32, rP: cute.Tensor = None):
        """This block's P (``acc_S``, after the softmax: the row sums keep every element) in 16 bits, into ``rP``
        (a new register tensor when None), with dropout: dropped elements become 0, a pair of them per
        PRMT / compare / AND after the conversion (``KeepFlags.apply_pair``), or, on the tiles whose registers do not
        hold the pairs (``config.dropout_on_pairs``), element by element on the fp32 scores before it from half
        calls (a byte compare and a select each). The kept ones are scaled by 1 / (1 - p) once, on O in
        ``finish``."""
        if const_expr(rP is None):
            rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
        pairs = self.spec.dropout and dropout_on_pairs(self.spec, self.config)
        if const_expr(self.spec.dropout):
            flags = ctx.dropout.keep_flags(ctx.batch, ctx.head, ctx.num_heads, ctx.m_block * self.tile_m,
                                           n_block * self.tile_n)
            if const_expr(pairs):
                rP.store(acc_S.load().to(self.dtype))
                apply_keep_pairs(flags, rP)
            else:
                convert_keep_pairs(flags, acc_S, rP, self.dtype == cutlass.Float16)
        else:
            rP.store(acc_S.load().to(self.dtype))
        return rP

    @cute.jit
    def gemm_smem(self, acc, tCrA, tCrB, tCsA, tCrA_v, tCsB, tCrB_v, s2r_a, s2r_b):
        """acc += A B^T with both operands read from smem by ldmatrix, one k16 step ahead
        (``frag_prefetch``) or at the step that uses them."""
        num_k = cute.size(tCsA, mode=[2])
        ahead = 1 if const_expr(self.config.frag_prefetch) else 0
        for k in cutlass.range_constexpr(ahead):
            cute.copy(s2r_a, tCsA[None, None, k], tCrA_v[None, None, k])
            cute.copy(s2r_b, tCsB[None, None, k], tCrB_v[None, None, k])
        for k in cutlass.range_constexpr(num_k):
            if const_expr(k + ahead < num_k):
                cute.copy(s2r_a, tCsA[None, None, k + ahead], tCrA_v[None, None, k + ahead])
                cute.copy(s2r_b, tCsB[None, None, k + ahead], tCrB_v[None, None, k + ahead])
            cute.gemm(self.tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)

    @cute.jit
    def gemm_rA_smemB(self, acc, tCrA, tCrB, tCsB, tCrB_v, s2r_b, tiled_mma=None):
        """acc += A B^T with A already in registers and B read from smem by ldmatrix, by ``tiled_mma`` (the
        kernel's by default)."""
        mma = self.tiled_mma if const_expr(tiled_mma is None) else tiled_mma
        num_k = cute.size(tCrA, mode=[2])
        ahead = 1 if const_expr(self.config.frag_prefetch) else 0
        for k in cutlass.range_constexpr(ahead):
            cute.copy(s2r_b, tCsB[None, None, k], tCrB_v[None, None, k])
        for k in cutlass.range_constexpr(num_k):
            if const_expr(k + ahead < num_k):
                cute.copy(s2r_b, tCsB[None, None, k + ahead], tCrB_v[None, None, k + ahead])
            cute.gemm(mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
