"""Forward attention with FP8 tensor-core MMAs: Q, K and V e4m3, both GEMMs ``mma.sync.m16n8k32`` (QMMA on
SM120, twice its bf16 rate), P rounded to e4m3 in registers (FlashAttention-3's FP8 forward), O in bf16.

The kernel is ``FlashFwdMultistage`` (its cp.async schedules, masks, softmax, epilogue, KV addressing: dense,
packed, paged; packed GQA, split-KV) with other operands. The m16n8k32 operand fragments are, register for
register, the m16n8k16 fragments of 16-bit elements whose bytes are two FP8 elements: a thread holds four
consecutive k bytes per register in both. So FP8 tiles are laid out and read as 16-bit tiles of byte pairs:

  * shared memory: Q (tile_m, d), K / V (tile_n, d | dv, stages) are allocated as 16-bit tiles half as wide, in the
    16-bit swizzled atoms; the cp.async copies write them through FP8 views of the same bytes (16-byte vectors,
    the swizzle moved to byte units), the ldmatrix copies read them through the 16-bit views;
  * Q K^T: ldmatrix (16-bit, not transposed) of Q and K fills 16-bit fragments of a bf16 "shadow" tiled MMA;
    their registers, reinterpreted as FP8, are the A and B operands of the FP8 tiled MMA, which produces S in the
    16x8 accumulator layout of the 16-bit kernel (masks, softmax unchanged);
  * P V: P's m16n8k32 A operand takes, per register, four keys of one row: a thread's S accumulators hold keys
    {2j, 2j+1} and {8+2j, 9+2j} of each 16 (j = lane % 4), and those four become the register, in that order, so
    the k slots 4j..4j+3 of the MMA stand for those keys (``p_operand``). V's B operand must use the same
    order: ldmatrix.trans of V as a 16-bit tile (rows = keys, elements = byte pairs of two head-dim columns)
    gives a thread, per register, columns (2g, 2g+1) of keys (2j, 2j+1), and the next register the same of keys
    (8+2j, 9+2j); one PRMT per register picks the even columns' bytes and one the odd ones'
    (``v_operand``): the four keys in P's order, for column 2g or 2g+1. So one 16-column block of O comes from
    two n8 MMAs, one over its even columns and one over its odd ones: the P V tiled MMA carries that column
    permutation (``o_mma``), and O's epilogue partitions through it.

The online softmax moves a row's reference max whenever a block exceeds it (``P_RESCALE_LOG2`` = 0, where the
16-bit kernels wait for a jump of 2^8): P <= 1, and a row's largest P is exactly 1, which e4m3 holds. With the
lazy reference the largest P of a peaked row is any value up to 256, rounded by up to 2^-4 (3 mantissa bits), and
that one rounding dominates O's error: a torch simulation of both orders, 128x256 keys d64 e4m3, measured a max
error of 0.093 lazy against 0.025 eager (0.035 for P rounded against the final row max; 2026-11-29). The row sums
stay fp32 sums of the unrounded P. ``k_descale`` (times ``q_descale``) folds into the
softmax scale and ``v_descale`` into O's normalization, as for FP8 K/V.
"""

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warp
from cutlass.cutlass_dsl import dsl_user_op

from ..config import FwdConfig
from ..execution_model import ExecutionModel
from ..problem import FwdSpec
from .fwd_multistage import FlashFwdMultistage
from .fwd_state import FwdSmem, FwdTileState
from .tile_io import SWIZZLE_BITS, g2s_tiled_copy, smem_layout_atom

#: FP8 MMA shape (m, n, k)
MMA_FP8 = (16, 8, 32)
#: The reference max moves on any increase (``OnlineSoftmax``): P <= 1, a row's largest exactly 1 in e4m3
P_RESCALE_LOG2 = 0.0
#: PRMT selectors taking bytes (0, 2) of two registers (a thread's even head-dim column of four keys), and (1, 3)
EVEN_BYTES, ODD_BYTES = 0x6420, 0x7531


@dsl_user_op
def e4m3x4(a, b, c, d, *, loc=None, ip=None) -> Uint32:
    """Four fp32 values rounded to e4m3 (saturating) in one register, ``a`` in the lowest byte."""
    return Uint32(llvm.inline_asm(
        Uint32.mlir_type,
        [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
        "{\n\t.reg .b16 lo, hi;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n\t"
        "mov.b32 $0, {lo, hi};\n\t}",
        "=r,f,f,f,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def byte_perm(lo, hi, selector: int, *, loc=None, ip=None) -> Uint32:
    """PRMT: four bytes of (``lo``, ``hi``) (bytes 0-3, 4-7) picked by ``selector``'s nibbles, lowest first."""
    return Uint32(llvm.inline_asm(
        Uint32.mlir_type,
        [Uint32(lo).ir_value(loc=loc, ip=ip), Uint32(hi).ir_value(loc=loc, ip=ip)],
        f"prmt.b32 $0, $1, $2, {selector:#x};",
        "=r,r,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


def words(t: cute.Tensor) -> cute.Tensor:
    """A register tensor's bytes as a flat tensor of 32-bit words."""
    return cute.make_tensor(cute.recast_ptr(t.iterator, dtype=Uint32),
                            cute.make_layout(cute.size(t) * t.element_type.width // 32))


def fp8_atom(atom16: cute.ComposedLayout) -> cute.ComposedLayout:
    """The FP8 view of a 16-bit swizzled atom (8 rows of ``cols`` 16-bit elements): the same bytes, 2 * cols
    elements a row, the swizzle on 16-byte units of bytes."""
    cols = atom16.outer.shape[1]
    return cute.make_composed_layout(cute.make_swizzle(SWIZZLE_BITS[cols], 4, 3), 0,
                                     cute.make_layout((8, 2 * cols), stride=(2 * cols, 1)))


def fp8_view(dtype16, width: int, shape: tuple) -> cute.ComposedLayout:
    """The FP8 view, ``shape`` = (rows, ``width``[, stages]) bytes, of a 16-bit tile of byte pairs ``width // 2`` wide in
    ``dtype16``'s swizzled atoms: what the cp.async copies write, where ldmatrix reads the 16-bit tile."""
    return cute.tile_to_shape(fp8_atom(smem_layout_atom(dtype16, width // 2)), shape, tuple(range(len(shape))))


def fp8_g2s_copy(fp8, dtype16, width: int, num_threads: int) -> cute.TiledCopy:
    """16-byte cp.async copies of FP8 rows ``width`` bytes wide into ``fp8_view`` tiles."""
    cp_async = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
    return g2s_tiled_copy(fp8, 2 * smem_layout_atom(dtype16, width // 2).outer.shape[1], num_threads, cp_async)


class FlashFwdFP8Mma(FlashFwdMultistage):
    """``FlashFwdMultistage`` with e4m3 Q / K / V and FP8 MMAs; see the module docstring."""

    def __init__(self, spec: FwdSpec, config: FwdConfig, model: ExecutionModel):
        super().__init__(spec, config, model)
        self.q_dtype = self.kv_dtype
        self.widens_kv = False
        self.mma_stages = config.num_stages

    # ------------------------------------------------------------------------------------------
    # Host-side (trace-time) setup
    # ------------------------------------------------------------------------------------------
    def _setup(self):
        b16, f8, stages = self.dtype, self.kv_dtype, self.config.num_stages
        d16, dv16 = self.head_dim // 2, self.head_dim_v // 2
        atom_qk, atom_v = smem_layout_atom(b16, d16), smem_layout_atom(b16, dv16)
        # 16-bit views (ldmatrix) and FP8 views (cp.async) of the same bytes
        self.sQ_layout = cute.tile_to_shape(atom_qk, (self.tile_m, d16), (0, 1))
        self.sK_layout = cute.tile_to_shape(atom_qk, (self.tile_n, d16, stages), (0, 1, 2))
        self.sV_layout = cute.tile_to_shape(atom_v, (self.tile_n, dv16, stages), (0, 1, 2))
        self.sO_layout = cute.tile_to_shape(smem_layout_atom(b16, self.head_dim_v), (self.tile_m, self.head_dim_v),
                                            (0, 1))
        self.g2s_qk = fp8_g2s_copy(f8, b16, self.head_dim, self.num_threads)
        self.g2s_v = fp8_g2s_copy(f8, b16, self.head_dim_v, self.num_threads)
        self.s2g_o = g2s_tiled_copy(b16, smem_layout_atom(b16, self.head_dim_v).outer.shape[1], self.num_threads,
                                    cute.nvgpu.CopyUniversalOp())
        num_warps = self.num_threads // 32
        self.tiled_mma = cute.make_tiled_mma(warp.MmaFP8Op(f8, Float32, MMA_FP8), (num_warps, 1, 1),
                                             permutation_mnk=(num_warps * 16, 8, 32))
        self.SharedStorage = self.shared_storage(max(cute.cosize(self.sQ_layout), cute.cosize(self.sO_layout)))

    @property
    def shadow_mma(self) -> cute.TiledMma:
        """The bf16 tiled MMA whose operand partitions the ldmatrix copies fill (16-bit views of the FP8 tiles)."""
        num_warps = self.num_threads // 32
        return cute.make_tiled_mma(warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)), (num_warps, 1, 1),
                                   permutation_mnk=(num_warps * 16, 16, 16))

    @property
    def o_mma(self) -> cute.TiledMma:
        """P V's FP8 tiled MMA: n8 MMA 2i covers the even columns of O's 16-column block i, 2i + 1 the odd ones."""
        num_warps = self.num_threads // 32
        return cute.make_tiled_mma(warp.MmaFP8Op(self.kv_dtype, Float32, MMA_FP8), (num_warps, 1, 1),
                                   permutation_mnk=(num_warps * 16, cute.make_layout((8, 2), stride=(2, 1)), 32))

    # ------------------------------------------------------------------------------------------
    # Device code
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def shared_tiles(self, tidx, softmax_scale_log2, sQ_layout, sK_layout, sV_layout, sO_layout) -> FwdSmem:
        """The tiles' FP8 views (sQ, sK, sV: what the copies write), sO (bf16, over Q's bytes), the 16-bit views the
        ldmatrix copies read (``views16``: Q, K) and V's as V^T (sVt: (dv / 2, tile_n, stages))."""
        storage = cutlass.memory.SmemAllocator().allocate(self.SharedStorage)
        tiles = storage.tiles
        f8 = self.kv_dtype
        sQ16 = tiles.sQ.get_tensor(sQ_layout)
        sK16 = tiles.sK.get_tensor(sK_layout)
        sV16 = tiles.sV.get_tensor(sV_layout)
        sQ8, sK8, sV8 = (cute.make_tensor(cute.recast_ptr(mem.data_ptr(), dtype=f8), layout)
                         for mem, layout in ((tiles.sQ, self.fp8_layout(self.head_dim, (self.tile_m,))),
                                             (tiles.sK, self.fp8_layout(self.head_dim, (self.tile_n,), True)),
                                             (tiles.sV, self.fp8_layout(self.head_dim_v, (self.tile_n,), True))))
        dv16 = self.head_dim_v // 2
        sVt = cute.composition(sV16, cute.make_layout((dv16, self.tile_n, self.mma_stages),
                                                      stride=(self.tile_n, 1, self.tile_n * dv16)))
        return FwdSmem(bars=None, sScale=None, sQ=sQ8, sK=sK8, sV=sV8,
                       sO=cute.make_tensor(cute.recast_ptr(tiles.sQ.data_ptr(), dtype=self.dtype), sO_layout),
                       sVt=sVt, views16=(sQ16, sK16))

    def fp8_layout(self, width: int, rows: tuple, staged: bool = False):
        """FP8 view of a 16-bit tile ``width // 2`` elements wide: (rows, width[, stages])."""
        return fp8_view(self.dtype, width, (*rows, width, self.config.num_stages) if staged else (*rows, width))

    @cute.jit
    def mma_context(self, tidx, sm: FwdSmem, softmax_scale_log2) -> FwdTileState:
        """The 16-bit partitions the ldmatrix copies fill and, over the same registers, the FP8 operands of Q K^T;
        V's 16-bit fragment (``v_operand`` builds the FP8 one from it), O's accumulator in ``o_mma``'s layout."""
        sQ16, sK16 = sm.views16
        shadow, thr_mma = self.shadow_mma, self.tiled_mma.get_slice(tidx)
        thr_shadow = shadow.get_slice(tidx)
        d16, dv16 = self.head_dim // 2, self.head_dim_v // 2
        tSrQ = cute.make_rmem_tensor(thr_mma.partition_shape_A((self.tile_m, self.head_dim)), self.kv_dtype)
        tSrK = cute.make_rmem_tensor(thr_mma.partition_shape_B((self.tile_n, self.head_dim)), self.kv_dtype)
        tSrQ16 = cute.make_tensor(cute.recast_ptr(tSrQ.iterator, dtype=self.dtype),
                                  cute.make_layout(thr_shadow.partition_shape_A((self.tile_m, d16))))
        tSrK16 = cute.make_tensor(cute.recast_ptr(tSrK.iterator, dtype=self.dtype),
                                  cute.make_layout(thr_shadow.partition_shape_B((self.tile_n, d16))))
        tOrVt16 = cute.make_rmem_tensor(thr_shadow.partition_shape_B((dv16, self.tile_n)), self.dtype)
        ldsm = warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4)
        s2r_q = cute.make_tiled_copy_A(cute.make_copy_atom(ldsm, self.dtype), shadow)
        s2r_k = cute.make_tiled_copy_B(cute.make_copy_atom(ldsm, self.dtype), shadow)
        s2r_v = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype), shadow)
        return self.tile_state(tidx, None, None, (tSrQ, tSrK, tOrVt16), (tSrQ16, tSrK16, tOrVt16),
                               (sQ16, sK16, sm.sVt), (s2r_q, s2r_k, s2r_v), self.o_mma.get_slice(tidx),
                               softmax_scale_log2, P_RESCALE_LOG2)

    @cute.jit
    def dropped_p(self, ctx: FwdTileState, acc_S: cute.Tensor, n_block, rP: Optional[cute.Tensor] = None):
        """This block's P as the A operand of P V's FP8 MMA (``p_operand``; dropout never meets FP8 MMAs)."""
        return self.p_operand(ctx, acc_S)

    @cute.jit
    def p_operand(self, ctx: FwdTileState, acc_S: cute.Tensor) -> cute.Tensor:
        """P (S's accumulator after the softmax) rounded to e4m3, as the (16 bytes, MMA_M, tile_n / 32) A operand:
        register w of 32-key step k, row block m: rows (g, g + 8) for w = 0, 1 (2, 3), keys {2j, 2j+1, 8+2j, 9+2j}
        of the step's first (second) 16, from S's n8 accumulators 4k, 4k + 1 (4k + 2, 4k + 3)."""
        rP = cute.make_rmem_tensor(self.o_mma.get_slice(ctx.tidx).partition_shape_A((self.tile_m, self.tile_n)),
                                   self.kv_dtype)
        num_m = cute.size(acc_S, mode=[1])
        s, p = acc_S, words(rP)
        for k in cutlass.range_constexpr(self.tile_n // 32):
            for m in cutlass.range_constexpr(num_m):
                for w in cutlass.range_constexpr(4):
                    n8, half = 4 * k + 2 * (w // 2), 2 * (w % 2)  # first n8 accumulator; row half (c2, c3)
                    p[4 * (m + num_m * k) + w] = e4m3x4(s[half, m, n8], s[half + 1, m, n8],
                                                        s[half, m, n8 + 1], s[half + 1, m, n8 + 1])
        return rP

    @cute.jit
    def v_operand(self, ctx: FwdTileState, k: cutlass.Constexpr[int]) -> cute.Tensor:
        """V's B operand of 32-key step ``k`` (its two 16-bit ldmatrix.trans steps landed in ``ctx.tOrVt``): n8 MMA
        (e, i) takes byte e of each column pair of 16-column block i, keys in P's order (``p_operand``)."""
        num_n16 = cute.size(ctx.tOrVt, mode=[1])  # 16-column blocks of O (8 column pairs each)
        rV = cute.make_rmem_tensor(self.o_mma.get_slice(ctx.tidx).partition_shape_B((self.head_dim_v, 32)),
                                   self.kv_dtype)
        src, dst = words(ctx.tOrVt), words(rV)
        for i in cutlass.range_constexpr(num_n16):
            for half in cutlass.range_constexpr(2):  # keys 0-15 / 16-31 of the step: 16-bit step 2k + half
                w16 = 2 * (i + num_n16 * (2 * k + half))
                for e, selector in ((0, EVEN_BYTES), (1, ODD_BYTES)):
                    dst[2 * (e + 2 * i) + half] = byte_perm(src[w16], src[w16 + 1], selector)
        return rV

    @cute.jit
    def pv(self, ctx: FwdTileState, rP: cute.Tensor, v_stage):
        """e. O += P V over 32-key steps: V^T's two 16-bit ldmatrix.trans steps, the byte permutes into the FP8
        operand (``v_operand``), the n8 FP8 MMAs."""
        tOsVt = ctx.tOsVt[None, None, None, v_stage]
        o_mma = self.o_mma
        for k in cutlass.range_constexpr(self.tile_n // 32):
            for half in cutlass.range_constexpr(2):
                cute.copy(ctx.s2r_v, tOsVt[None, None, 2 * k + half], ctx.tOrVt_v[None, None, 2 * k + half])
            rV = self.v_operand(ctx, k)
            cute.gemm(o_mma, ctx.acc_O, rP[None, None, k], rV[None, None, 0], ctx.acc_O)
