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

Two jobs are pieces of their own, which every mainloop (here and in the loader variants) calls:
locating a key block's K/V and copying it to a stage (``kv_source``; ``kv_loader`` builds the CTA's
loader, a loader variant overrides it), and step c., what S goes through between the QK^T MMA and
the softmax (``score_step``).

Split-KV (``spec.split_kv``): the grid's z dimension also enumerates ``num_splits`` ranges of each
tile's key blocks (``block_info.split_range``); a split writes its normalized fp32 partial O straight
from the accumulators and its LSE into (num_splits, ...) workspaces, merged by ``fwd_combine``.

One stage (``num_stages == 1``): one K and one V buffer; step 2 waits for V after the S MMAs, then
refills K during the softmax and P V, and V after them (``single_stage_step``).

Constraints: tile_m a multiple of 16 * num_warps, tile_n a multiple of 16, 1-3 stages, shared memory
within the model's per-CTA limit (see ``config.fwd_config_problems``).
"""

from types import SimpleNamespace
from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp

from ..config import (FwdConfig, atom_cols, banded_tile_order, dropout_on_pairs, fwd_config_problems,
                      fwd_min_ctas_per_sm, fwd_smem_bytes, padded_head_dim)
from .. import flex
from ..execution_model import CopyKind, ExecutionModel
from ..problem import LOG2_E, FwdSpec
from . import CUTLASS_DTYPES, block_info
from .grid_dependency import enter_grid
from .fragments import acc_as_operand_a, acc_rows_cols, convert
from .block_walk import sparse_walk
from .dropout_mask import DropoutMask, apply_keep_pairs, check_cells, convert_keep_pairs
from .flex_mods import FlexMods, SeqlenInfo, aux_list
from .kv_source import CpAsyncKV, DenseKV, PagedKV
from .score_step import ScoreStep
from .softmax import OnlineSoftmax, softmax_step
from .tile_io import column_predicate, copy_rows, zero_masked_cols
from .seqlen_info import lse_row, num_batches, num_heads, row_tile, sequence_heads, split_view
from .tile_scheduler import PersistentTileScheduler, SingleTileScheduler

_COPY_BITS = 128  # 16-byte cp.async / st.global vectors
_BAR_TURN = 2  # named barriers 2 and 3: the ping-pong turns of the two warp groups (0: CTA, 1: MMA warps)


def smem_layout_atom(dtype, width: int) -> cute.ComposedLayout:
    """A swizzled 8-row atom, ``width`` columns wide (16, 32 or 64 elements), bank-conflict free
    for both cp.async writes and ldmatrix reads."""
    cols = atom_cols(width)
    swizzle_bits = {64: 3, 32: 2, 16: 1}[cols]
    return cute.make_composed_layout(
        cute.make_swizzle(swizzle_bits, 3, 3), 0, cute.make_layout((8, cols), stride=(cols, 1))
    )


def g2s_tiled_copy(dtype, atom_cols: int, num_threads: int, op) -> cute.TiledCopy:
    """Threads tile rows of 16-byte vectors: ``atom_cols / 8`` threads per row."""
    elems = _COPY_BITS // dtype.width
    threads_per_row = atom_cols // elems
    atom = cute.make_copy_atom(op, dtype, num_bits_per_copy=_COPY_BITS)
    thr_layout = cute.make_ordered_layout((num_threads // threads_per_row, threads_per_row), order=(1, 0))
    return cute.make_tiled_copy_tv(atom, thr_layout, cute.make_layout((1, elems)))


class FlashFwdMultistage:
    """cp.async + mma.sync forward kernel. Build with a spec, a config and an execution model."""

    def __init__(self, spec: FwdSpec, config: FwdConfig, model: ExecutionModel):
        self.spec = spec
        self.config = config
        self.model = model
        self.dtype = CUTLASS_DTYPES[spec.dtype]
        self.head_dim = padded_head_dim(spec.head_dim, config)
        self.head_dim_v = padded_head_dim(spec.head_dim_v, config)
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

    def kv_loader(self, kv_src, tidx, sm: SimpleNamespace) -> CpAsyncKV:
        """This thread's K/V loader (``kv_source``; ``kv_src`` narrowed to one KV head and cut into key
        blocks): cp.async into the stages of sK / sV."""
        return kv_src.cp_async(tidx, sm.sK, sm.sV, self.g2s_qk, self.g2s_v)

    @cute.jit
    def mma_barrier(self):
        """Barrier over the MMA warps (the whole CTA here)."""
        cute.arch.sync_threads()

    # ------------------------------------------------------------------------------------------
    # Host-side (trace-time) setup
    # ------------------------------------------------------------------------------------------
    def _setup(self):
        dt, stages = self.dtype, self.config.num_stages
        atom_qk = smem_layout_atom(dt, self.head_dim)
        atom_v = smem_layout_atom(dt, self.head_dim_v)
        self.sQ_layout = cute.tile_to_shape(atom_qk, (self.tile_m, self.head_dim), (0, 1))
        self.sK_layout = cute.tile_to_shape(atom_qk, (self.tile_n, self.head_dim, stages), (0, 1, 2))
        self.sV_layout = cute.tile_to_shape(atom_v, (self.tile_n, self.head_dim_v, stages), (0, 1, 2))
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
        q_o_elems = max(cute.cosize(self.sQ_layout), cute.cosize(self.sO_layout))

        num_bars = self.num_mbarriers()

        @cute.struct
        class Tiles:
            sQ: cute.struct.Align[cute.struct.MemRange[dt, q_o_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sV_layout)], 1024]

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

        # Trace-time invariant: the host formula (used by the predicate and the gate) is exact.
        if SharedStorage.size_in_bytes() != fwd_smem_bytes(self.spec, self.config):
            raise RuntimeError(
                f"smem accounting mismatch: struct {SharedStorage.size_in_bytes()} B vs "
                f"predicate {fwd_smem_bytes(self.spec, self.config)} B"
            )
        self.SharedStorage = SharedStorage

    @cute.jit
    def shared_tiles(self, tidx, softmax_scale_log2, sQ_layout, sK_layout, sV_layout, sO_layout) -> SimpleNamespace:
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
        sV = storage.tiles.sV.get_tensor(sV_layout)
        sVt = cute.composition(
            sV, cute.make_layout((self.head_dim_v, self.tile_n, self.config.num_stages),
                                 stride=(self.tile_n, 1, self.tile_n * self.head_dim_v))
        )
        return SimpleNamespace(bars=bars, sScale=sScale, sQ=sQ, sK=storage.tiles.sK.get_tensor(sK_layout), sV=sV,
                               sO=cute.make_tensor(sQ.iterator, sO_layout), sVt=sVt)

    @cute.jit
    def mma_context(self, tidx, sm: SimpleNamespace, softmax_scale_log2) -> SimpleNamespace:
        """What a thread's MMAs need, independent of the tile: fragments, ldmatrix copies and their
        smem partitions (with the stage mode), the O accumulator (zeroed), the softmax state and the
        S coordinates for masking (this thread's and thread 0's compile-time partition)."""
        thr_mma = self.tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sm.sQ))  # (MMA, MMA_M, MMA_K)
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sm.sK[None, None, 0]))  # (MMA, MMA_N, MMA_K)
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sm.sVt[None, None, 0]))  # (MMA, MMA_N, MMA_K)
        s2r_q = cute.make_tiled_copy_A(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), self.tiled_mma
        )
        s2r_k = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), self.tiled_mma
        )
        s2r_v = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype), self.tiled_mma
        )
        thr_s2r_q, thr_s2r_k, thr_s2r_v = s2r_q.get_slice(tidx), s2r_k.get_slice(tidx), s2r_v.get_slice(tidx)
        # (MMA, MMA_M, MMA_N) accumulator of O and its (rows, cols) view
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.tile_m, self.head_dim_v)), Float32)
        acc_O.fill(0.0)
        acc_O_rc = acc_rows_cols(acc_O)
        cS = cute.make_identity_tensor((self.tile_m, self.tile_n))
        return SimpleNamespace(
            tidx=tidx, bars=sm.bars, sScale=sm.sScale,
            tSrQ=tSrQ, tSrK=tSrK, tOrVt=tOrVt, acc_O=acc_O, acc_O_rc=acc_O_rc,
            tSsQ=thr_s2r_q.partition_S(sm.sQ), tSrQ_v=thr_s2r_q.retile(tSrQ),
            tSsK=thr_s2r_k.partition_S(sm.sK), tSrK_v=thr_s2r_k.retile(tSrK),
            tOsVt=thr_s2r_v.partition_S(sm.sVt), tOrVt_v=thr_s2r_v.retile(tOrVt),
            s2r_q=s2r_q, s2r_k=s2r_k, s2r_v=s2r_v, thr_mma=thr_mma,
            tScS_rc=acc_rows_cols(thr_mma.partition_C(cS)),
            t0ScS_rc=acc_rows_cols(self.tiled_mma.get_slice(0).partition_C(cS)),
            softmax=OnlineSoftmax(softmax_scale_log2, cute.size(acc_O_rc, mode=[0])),
        )

    def score_step(self, ctx: SimpleNamespace, softcap_scale, window_left, window_right, batch=None, head=None,
                   mCuSeqlensQ=None, mCuSeqlensK=None) -> ScoreStep:
        """What S goes through between the QK^T MMA and the softmax in this tile (``score_step``): the
        spec's features with the tile's runtime values and ``ctx``'s S coordinates; with mods (issue 20) also
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
            mods=mods, batch=batch, head=head, seqlen_info=seqlen_info, aux_tensors=self.aux_tensors,
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
        mBlockCnt: Optional[cute.Tensor],
        mBlockIdx: Optional[cute.Tensor],
        mFullCnt: Optional[cute.Tensor],
        mFullIdx: Optional[cute.Tensor],
        mRng: Optional[cute.Tensor],
        stream: cuda.CUstream,
    ):
        out_dtype = Float32 if const_expr(self.spec.split_kv) else self.dtype
        if const_expr(not (mQ.element_type == mK.element_type == mV.element_type == self.dtype
                           and mO.element_type == out_dtype)):
            raise TypeError("Q, K, V must have the spec's dtype, O too (fp32 partials with split-KV)")
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
            mBlockCnt, mBlockIdx, mFullCnt, mFullIdx, mRng,
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
        mBlockCnt: Optional[cute.Tensor],
        mBlockIdx: Optional[cute.Tensor],
        mFullCnt: Optional[cute.Tensor],
        mFullIdx: Optional[cute.Tensor],
        mRng: Optional[cute.Tensor],
    ):
        # Layouts and tiled copies built at trace time on the host arrive as kernel parameters.
        self.g2s_qk, self.g2s_v, self.s2g_o, self.tiled_mma = g2s_qk, g2s_v, s2g_o, tiled_mma
        self.aux_tensors = aux_list(mAux0, mAux1, mAux2, mAux3)  # the mods' aux tensors (None without)
        enter_grid(self.model.has_pdl)  # the append's rows, a user kernel's Q: visible from here on
        if const_expr(self.config.persistent):  # one CTA per SM walks the tiles (fwd_persistent)
            self.persistent_tiles(SimpleNamespace(
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
                if const_expr(self.spec.split_kv):
                    ranges = block_info.split_range(ranges, split, num_splits)
                n_start, n_unmasked_start, n_unmasked_end, n_end = ranges
                walk = None  # block sparsity (issue 20): the listed key blocks instead of [n_start, n_end)
                if const_expr(self.spec.block_sparse is not None):
                    q_block, k_block, _ = self.spec.block_sparse
                    walk = sparse_walk(mBlockCnt, mBlockIdx, mFullCnt, mFullIdx, batch, head, m_block,
                                       q_block // self.tile_m, k_block // self.tile_n, seqlen_k, self.tile_n)

                # (tile_m, d) (unpacked; packed rows are gathered one by one); K/V's key blocks
                gQ = cute.local_tile(mQ_h[None, 0 if const_expr(pack) else head, None], (self.tile_m, self.head_dim),
                                     (m_block, 0))
                kv_blocks = kv_src.blocks(self.tile_n, self.head_dim, self.head_dim_v)

                sm = self.shared_tiles(tidx, softmax_scale_log2, sQ_layout, sK_layout, sV_layout, sO_layout)

                # Global -> shared partitions of Q: (CPY, CPY_ROWS, CPY_COLS); K/V's are the loader's
                thr_qk = self.g2s_qk.get_slice(tidx)
                tQgQ, tQsQ = thr_qk.partition_S(gQ), thr_qk.partition_D(sm.sQ)
                cQ = cute.make_identity_tensor((self.tile_m, self.head_dim))
                tQcQ, t0QcQ = thr_qk.partition_S(cQ), self.g2s_qk.get_slice(0).partition_S(cQ)
                kv = self.kv_loader(kv_blocks, tidx, sm)

                ctx = self.mma_context(tidx, sm, softmax_scale_log2)
                ctx.__dict__.update(
                    m_block=m_block, seqlen_q=seqlen_q, seqlen_k=seqlen_k, n_start=n_start, n_end=n_end,
                    group=group if const_expr(pack) else None, tile_rows=tile_rows, head_kv=head_kv, mQ_h=mQ_h,
                    thr_qk=thr_qk, n_unmasked_start=n_unmasked_start, n_unmasked_end=n_unmasked_end,
                    tQgQ=tQgQ, tQsQ=tQsQ, tQcQ=tQcQ, t0QcQ=t0QcQ, kv=kv, slot_base=0, walk=walk,
                )
                ctx.score = self.score_step(ctx, softcap_scale, window_left, window_right, batch, head,
                                            mCuSeqlensQ, mCuSeqlensK)
                ctx.dropout = None  # issue 20: the keep mask of P (``dropout_mask``), drawn after the softmax
                if const_expr(self.spec.dropout):
                    check_cells(self.tiled_mma, self.tile_m, self.tile_n)
                    ctx.dropout = DropoutMask.of(mRng, ctx.tScS_rc, ctx.t0ScS_rc)
                    ctx.batch, ctx.head, ctx.num_heads = batch, head, heads_q

                out = SimpleNamespace(mO=mO, mLSE=mLSE, mCuSeqlensQ=mCuSeqlensQ, mSeqUsedQ=mSeqUsedQ, batch=batch, head=head,
                                      split=split)
                if const_expr(self.warp_specialized):
                    # A producer warp feeds the stages; the MMA warps only consume them.
                    if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == self.num_threads // 32:
                        self.producer(ctx)
                    else:
                        self.consume(ctx, mSink, head, sm.sO, out)
                else:
                    self.consume(ctx, mSink, head, sm.sO, out)

    @cute.jit
    def consume(self, ctx: SimpleNamespace, mSink, head, sO, out: SimpleNamespace):
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
    def sparse_mainloop(self, ctx: SimpleNamespace, walk):
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

    @cute.jit
    def finish(self, ctx: SimpleNamespace, mSink, head, sO, out: SimpleNamespace):
        """Epilogue: O /= row sums (with the sink), LSE, and the store of O (and LSE) for this tile."""
        num_rows = cute.size(ctx.acc_O_rc, mode=[0])
        lse = cute.make_rmem_tensor(num_rows, Float32)
        sink_log2 = None
        if const_expr(self.spec.has_sink):
            # per accumulator row: packed GQA rows belong to different query heads
            sink_log2 = cute.make_rmem_tensor(num_rows, Float32)
            for r in cutlass.range_constexpr(num_rows):
                sink_log2[r] = Float32(mSink[self.row_head(ctx, head, ctx.tScS_rc[r, 0][0])]) * Float32(LOG2_E)
        ctx.softmax.finalize(ctx.acc_O_rc, lse, sink_log2,
                             ctx.dropout.scale if const_expr(self.spec.dropout) else None)
        if const_expr(self.spec.split_kv):
            self.epilogue_partial(ctx, lse, out)
        elif const_expr(self.config.persistent):
            self.epilogue_rows(ctx, lse, out)
        else:
            self.epilogue(ctx, lse, sO, out)

    @cute.jit
    def prologue(self, ctx: SimpleNamespace, walk=None):
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
        cute.arch.sync_threads()

    @cute.jit
    def packed_row(self, ctx: SimpleNamespace, tile_row):
        """(query row, query head) of tile row ``tile_row`` when GQA rows are packed: packed row p is
        query row p // group of head head_kv * group + p % group."""
        p = ctx.m_block * self.tile_m + tile_row
        return p // ctx.group, ctx.head_kv * ctx.group + p % ctx.group

    @cute.jit
    def row_head(self, ctx: SimpleNamespace, head, tile_row):
        """The query head of tile row ``tile_row`` (``head`` itself unless GQA rows are packed)."""
        if const_expr(self.spec.pack_gqa):
            return self.packed_row(ctx, tile_row)[1]
        return head

    @cute.jit
    def load_q(self, ctx: SimpleNamespace):
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
    def mainloop_step(self, ctx: SimpleNamespace, it: Int32, n_block: Int32, masked: cutlass.Constexpr[bool],
                      walk=None, mask_mod: cutlass.Constexpr[bool] = True):
        """Step ``it``: key block ``n_block``, whose K/V tile sits complete in stage it % stages (one
        stage: K complete, V in flight). ``walk``: the block-sparse walk the next tiles come from (None: the
        dense range); ``mask_mod``: a masked step also applies the mask_mod (not on a full-list tile)."""
        if const_expr(self.single_stage):
            self.single_stage_step(ctx, n_block, masked, walk, it, mask_mod)
        else:
            self.multistage_step(ctx, it, n_block, masked, walk, mask_mod)

    @cute.jit
    def multistage_step(self, ctx: SimpleNamespace, it: Int32, n_block: Int32, masked: cutlass.Constexpr[bool],
                        walk=None, mask_mod: cutlass.Constexpr[bool] = True):
        stages, kv = self.config.num_stages, ctx.kv
        stage = it % stages
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
        self.compute_block(ctx, n_block, stage, masked, mask_mod)
        # f. The next tile has landed (all but the newest stages - 2 groups) and this stage is free.
        cute.arch.cp_async_wait_group(stages - 2)
        cute.arch.sync_threads()

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
    def single_stage_prologue(self, ctx: SimpleNamespace, walk=None):
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
    def single_stage_step(self, ctx: SimpleNamespace, n_block: Int32, masked: cutlass.Constexpr[bool], walk=None,
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
    def compute_block(self, ctx: SimpleNamespace, n_block: Int32, stage: Int32, masked: cutlass.Constexpr[bool],
                      mask_mod: cutlass.Constexpr[bool] = True):
        """S = Q K^T, mask, online softmax, O += P V for one key block in smem ``stage``."""
        acc_S = self.scores(ctx, n_block, stage, masked, mask_mod)
        ctx.softmax.step(acc_rows_cols(acc_S), ctx.acc_O_rc)
        # e. O += P V, P reinterpreted as the A operand in 16-bit
        self.pv(ctx, self.dropped_p(ctx, acc_S, n_block), stage)

    @cute.jit
    def scores(self, ctx: SimpleNamespace, n_block: Int32, k_stage: Int32, masked: cutlass.Constexpr[bool],
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
    def pv(self, ctx: SimpleNamespace, rP: cute.Tensor, v_stage: Int32):
        """e. O += P V: ``rP`` (16-bit, laid out like S's accumulator) as the A operand, V^T of smem
        stage ``v_stage`` read by ldmatrix.trans."""
        self.gemm_rA_smemB(ctx.acc_O, acc_as_operand_a(rP), ctx.tOrVt, ctx.tOsVt[None, None, None, v_stage],
                           ctx.tOrVt_v, ctx.s2r_v)

    # ------------------------------------------------------------------------------------------
    # Overlapped mainloop (``config.overlap``): step ``it`` issues the S MMAs of block it, then the
    # P V MMAs of block it - 1, then the softmax of block it, so each warp's exp2/max/sum work has
    # tensor-pipe work beside it. K runs one block ahead of V: load slot s brings K of block s
    # (buffer s % 2) and V of block s - 1 (buffer (s - 1) % 2); the prologue loads slot 0 (K only),
    # step it loads slot it + 1 (the buffers step it - 1 read) and the tail PV waits for slot n.
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def overlap_prologue(self, ctx: SimpleNamespace, walk=None):
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
    def first_block(self, ctx: SimpleNamespace, walk=None):
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
    def next_k(self, ctx: SimpleNamespace, it: Int32, v_block: Int32, walk=None, k_next=None):
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
    def issue_slot(self, ctx: SimpleNamespace, slot: Int32, v_block: Int32, first: cutlass.Constexpr[bool], it: Int32,
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
    def wait_slot(self, ctx: SimpleNamespace, slot: Int32):
        """Before reading K of block ``slot`` / V of block slot - 1 (cp.async: already waited at the end
        of the previous step)."""
        pass

    @cute.jit
    def end_step(self, ctx: SimpleNamespace, slot: Int32):
        """After a step: slot ``slot`` has landed (cp.async) and every warp is done with the buffers
        the next step refills."""
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()

    @cute.jit
    def overlap_step(self, ctx: SimpleNamespace, rP: cute.Tensor, it: Int32, n_block: Int32,
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
                     ctx: SimpleNamespace = None, n_block: Int32 = None):
        """The overlapped step's softmax of this block (key block ``n_block``), its P kept in 16 bits for the next
        step's P V."""
        softmax_step(row_max, row_sum, acc_rows_cols(acc_S), acc_O_rc, scale)
        self.dropped_p(ctx, acc_S, n_block, rP)

    @cute.jit
    def dropped_p(self, ctx: SimpleNamespace, acc_S: cute.Tensor, n_block: Int32, rP: cute.Tensor = None):
        """This block's P (``acc_S``, after the softmax: the row sums keep every element) in 16 bits, into ``rP``
        (a new register tensor when None), with dropout (issue 20): dropped elements become 0, a pair of them per
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
    def overlap_mainloop(self, ctx: SimpleNamespace, num_right: Int32, num_full: Int32):
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
    def overlap_tail(self, ctx: SimpleNamespace, rP: cute.Tensor, n_total: Int32):
        """After ``n_total`` overlapped steps: the last block's P V, in its turn."""
        self.wait_slot(ctx, n_total + ctx.slot_base)
        self.take_turn(ctx)
        self.tail_hook(ctx)
        self.pv(ctx, rP, (n_total + ctx.slot_base + 1) % 2)
        self.pass_turn(ctx, last=True)

    @cute.jit
    def overlap_sparse_mainloop(self, ctx: SimpleNamespace, walk):
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
    def tail_hook(self, ctx: SimpleNamespace):
        """At the start of the tail P V turn (the K buffers are free): nothing here; persistent tiles
        start the next tile's first K load."""
        pass

    # Ping-pong (``config.pingpong``): group g waits on named barrier _BAR_TURN + g before its MMAs
    # and, after issuing them, arrives on the other group's. Every group has n_total + 1 MMA turns
    # (n_total steps and the tail P V); group 1 opens group 0's first turn and skips its last arrive,
    # so both barriers end balanced.
    def turn_group(self, ctx: SimpleNamespace):
        return cute.arch.make_warp_uniform(cute.arch.warp_idx()) // (self.config.num_warps // 2)

    @cute.jit
    def first_turn(self, ctx: SimpleNamespace):
        if const_expr(self.config.pingpong and not self.config.persistent):  # persistent: once per CTA
            self.open_turns()

    @cute.jit
    def open_turns(self):
        """Group 1 opens group 0's first turn."""
        if const_expr(self.config.pingpong):
            if self.turn_group(None) == 1:
                cute.arch.barrier_arrive(barrier_id=_BAR_TURN, number_of_threads=self.num_threads)

    @cute.jit
    def take_turn(self, ctx: SimpleNamespace):
        if const_expr(self.config.pingpong):
            cute.arch.barrier(barrier_id=_BAR_TURN + self.turn_group(ctx), number_of_threads=self.num_threads)

    @cute.jit
    def pass_turn(self, ctx: SimpleNamespace, last: cutlass.Constexpr[bool]):
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
    def gemm_rA_smemB(self, acc, tCrA, tCrB, tCsB, tCrB_v, s2r_b):
        """acc += A B^T with A already in registers and B read from smem by ldmatrix."""
        num_k = cute.size(tCrA, mode=[2])
        ahead = 1 if const_expr(self.config.frag_prefetch) else 0
        for k in cutlass.range_constexpr(ahead):
            cute.copy(s2r_b, tCsB[None, None, k], tCrB_v[None, None, k])
        for k in cutlass.range_constexpr(num_k):
            if const_expr(k + ahead < num_k):
                cute.copy(s2r_b, tCsB[None, None, k + ahead], tCrB_v[None, None, k + ahead])
            cute.gemm(self.tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)

    @cute.jit
    def out_row(self, ctx: SimpleNamespace, out: SimpleNamespace, tile_row):
        """(valid, query row, query head) of tile row ``tile_row``: packed GQA rows scatter to (query
        p // group, head p % group), unpacked ones are rows of ``out.head``."""
        p = ctx.m_block * self.tile_m + tile_row
        q_row, q_head = self.packed_row(ctx, tile_row) if const_expr(self.spec.pack_gqa) else (p, out.head)
        return p < ctx.tile_rows, q_row, q_head

    @cute.jit
    def store_lse(self, ctx: SimpleNamespace, out: SimpleNamespace, mLSE: cute.Tensor, lse, tOcO_rc):
        """LSE per accumulator row, written by the lane that holds column 0 of the row."""
        lse_col0 = tOcO_rc[0, 0][1] == 0
        for r in cutlass.range_constexpr(cute.size(lse)):
            valid, q_row, q_head = self.out_row(ctx, out, tOcO_rc[r, 0][0])
            gLSE = lse_row(mLSE, out.batch, q_head, out.mCuSeqlensQ)
            if lse_col0 and valid:
                gLSE[q_row] = lse[r]

    @cute.jit
    def store_rows(self, ctx: SimpleNamespace, out: SimpleNamespace, lse, acc_rc: cute.Tensor,
                   partial: cutlass.Constexpr[bool]):
        """O from the accumulator layout (``acc_rc``: rows x cols view, O's or a converted copy) straight to
        global memory, each element once, rows past the tile's end skipped; then LSE. No smem, no barrier.
        ``partial``: into split ``out.split`` of the split-KV workspaces (each view formed where it is
        used: a gmem pointer live across the store loop costs registers)."""
        mO = split_view(out.mO, out.split) if const_expr(partial) else out.mO
        mO_h, _ = sequence_heads(mO, out.batch, out.mCuSeqlensQ, out.mSeqUsedQ)
        cO = cute.make_identity_tensor((self.tile_m, self.head_dim_v))
        tOcO_rc = acc_rows_cols(self.tiled_mma.get_slice(ctx.tidx).partition_C(cO))
        for r in cutlass.range_constexpr(cute.size(acc_rc, mode=[0])):
            valid, q_row, q_head = self.out_row(ctx, out, tOcO_rc[r, 0][0])
            gO_row = mO_h[q_row, q_head, None]
            if valid:
                for c in cutlass.range_constexpr(cute.size(acc_rc, mode=[1])):
                    if const_expr(self.pad_v):
                        if tOcO_rc[r, c][1] < self.spec.head_dim_v:
                            gO_row[tOcO_rc[r, c][1]] = acc_rc[r, c]
                    else:
                        gO_row[tOcO_rc[r, c][1]] = acc_rc[r, c]
        self.store_lse(ctx, out, split_view(out.mLSE, out.split) if const_expr(partial) else out.mLSE, lse, tOcO_rc)

    @cute.jit
    def epilogue_partial(self, ctx: SimpleNamespace, lse, out: SimpleNamespace):
        """Split-KV: this split's normalized fp32 O goes from the accumulators straight to its
        workspace (each row once; the combine reads it once, so no smem round trip), and its LSE
        (-inf for a split that saw no key of the row: weight 0 in the combine)."""
        cute.arch.cp_async_wait_group(0)  # nothing in flight at exit
        self.store_rows(ctx, out, lse, ctx.acc_O_rc, partial=True)

    @cute.jit
    def epilogue_rows(self, ctx: SimpleNamespace, lse, out: SimpleNamespace):
        """Persistent tiles: normalized 16-bit O straight from registers (a warp group's own rows; the Q
        buffer is already loading the next tile), then LSE."""
        rO = convert(ctx.acc_O, self.dtype)
        self.store_rows(ctx, out, lse, acc_rows_cols(rO), partial=False)

    @cute.jit
    def epilogue(self, ctx: SimpleNamespace, lse, sO, out: SimpleNamespace):
        """Normalized O -> smem (reusing Q's buffer) -> 16-byte global stores; LSE per row. The O and
        LSE views are formed here, not at kernel start: no gmem pointer stays live across the mainloop.
        Packed GQA rows scatter to (query p // group, head p % group) one row at a time."""
        tidx, m_block = ctx.tidx, ctx.m_block
        pack = self.spec.pack_gqa
        mO_h, _ = sequence_heads(out.mO, out.batch, out.mCuSeqlensQ, out.mSeqUsedQ)
        # Every cp.async (Q when no key block ran) has landed and every warp is done reading sQ.
        cute.arch.cp_async_wait_group(0)
        self.mma_barrier()
        rO = convert(ctx.acc_O, self.dtype)
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype), self.tiled_mma)
        thr_r2s = r2s.get_slice(tidx)
        cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sO))

        cO = cute.make_identity_tensor((self.tile_m, self.head_dim_v))
        self.store_lse(ctx, out, out.mLSE, lse, acc_rows_cols(self.tiled_mma.get_slice(tidx).partition_C(cO)))

        self.mma_barrier()
        thr_s2g = self.s2g_o.get_slice(tidx)
        tOsO = thr_s2g.partition_S(sO)
        tOrO = cute.make_rmem_tensor_like(tOsO, self.dtype)
        cute.autovec_copy(tOsO, tOrO)
        tOcO = thr_s2g.partition_S(cO)
        t0OcO = self.s2g_o.get_slice(0).partition_S(cO)
        tOp = column_predicate(tOcO, self.spec.head_dim_v) if const_expr(self.pad_v) else None
        if const_expr(pack):
            for m in cutlass.range_constexpr(cute.size(tOrO, mode=[1])):
                valid, q_row, q_head = self.out_row(ctx, out, tOcO[0, m, 0][0])
                dst = thr_s2g.partition_D(row_tile(mO_h, q_row, q_head, self.tile_m, self.head_dim_v))[None, m, None]
                if valid:
                    cute.copy(self.s2g_o, tOrO[None, m, None], dst,
                              pred=tOp[None, m, None] if const_expr(self.pad_v) else None)
        else:
            gO = cute.local_tile(mO_h[None, out.head, None], (self.tile_m, self.head_dim_v), (m_block, 0))
            tOgO = thr_s2g.partition_D(gO)
            row_limit = ctx.tile_rows - m_block * self.tile_m - tOcO[0][0]
            for m in cutlass.range_constexpr(cute.size(tOrO, mode=[1])):
                if t0OcO[0, m, 0][0] < row_limit:
                    cute.copy(self.s2g_o, tOrO[None, m, None], tOgO[None, m, None],
                              pred=tOp[None, m, None] if const_expr(self.pad_v) else None)
