"""The decode tile (``fwd_keysplit``) over FP8 K/V, widened in registers: shared memory holds only the FP8 stages.

The staging kernel (``kv_dequant``) widens each FP8 tile into a 16-bit copy in shared memory that the MMAs read:
every key crosses shared memory three times, and the two 16-bit buffers take two thirds of an SM120 CTA's 99 KB at
d128. Here each warp reads its own keys' FP8 bytes with ldmatrix and widens them in registers (``cvt`` e4m3x2 /
e5m2x2 to f16x2, then to bf16x2 for a bf16 q), so each key is written once and read once, and the stages are FP8
only. The FP8 tiles are laid out as 16-bit tiles of byte pairs (``fwd_fp8_mma``'s layout: 16-bit swizzle atoms,
FP8 views for the cp.async copies) and read through a 16-bit "shadow" tiled MMA's ldmatrix partitions. Where the
bytes land fixes two orders:

  * Q K^T: an ldmatrix word of K holds head-dim columns 4j..4j+3 of one key (j = lane % 4) of a 16-column chunk;
    widened, its low half is the k16 B fragment's first register and its high half the second. The S tiled MMA
    therefore carries a K permutation ((2, 4, 2):(1, 4, 2) per 16 columns: logical k 2j, 2j+1, 2j+8, 2j+9 are
    columns 4j..4j+3), which Q's fragment takes too: Q is read into registers once by plain copies in that order;
  * P V: an ldmatrix.trans word of V holds keys (2j, 2j+1) of columns (2g, 2g+1); the even bytes are the B
    fragment of column 2g, the odd ones of 2g + 1 (one PRMT each). The P V tiled MMA carries that N permutation
    ((8, 2):(2, 1) per 16 columns, as ``fwd_fp8_mma.o_mma``); the merge reads each warp's partial O through its
    partition, so O's columns come out in order.

Scales, masks, the softmax, the merge and the epilogue are the decode tile's.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warp
from cutlass.cutlass_dsl import dsl_user_op

from ..config import FwdConfig, keysplit_q_offset
from ..execution_model import ExecutionModel
from ..problem import FwdSpec
from .fragments import acc_as_operand_a
from .fwd_fp8_mma import fp8_g2s_copy, fp8_view, words
from .fwd_keysplit import KEYS_PER_WARP, FlashFwdKeySplit
from .fwd_state import FwdSmem, FwdTileState
from .tile_io import smem_layout_atom

#: PRMT selectors: a word's bytes (0, 1), (2, 3) (K: columns 4j, 4j+1 / 4j+2, 4j+3) and (0, 2), (1, 3) (V: the even /
#: odd column of keys 2j, 2j+1), into the low half
LOW_PAIR, HIGH_PAIR, EVEN_PAIR, ODD_PAIR = 0x3210, 0x3232, 0x3220, 0x3231


@dsl_user_op
def widen_pair(word, selector: int, fp8: str, to_bf16: bool, *, loc=None, ip=None) -> Uint32:
    """Two FP8 values of ``word`` (the bytes ``selector`` picks into its low half) as two 16-bit values in one
    register, the first byte lowest: exact (every e4m3 / e5m2 value is an fp16 and a bf16 value)."""
    to16 = ("{\n\t.reg .b16 lo, hi;\n\t.reg .f32 flo, fhi;\n\tmov.b32 {lo, hi}, h;\n\t"
            "cvt.f32.f16 flo, lo;\n\tcvt.f32.f16 fhi, hi;\n\tcvt.rn.bf16x2.f32 $0, fhi, flo;\n\t}\n\t"
            if to_bf16 else "mov.b32 $0, h;\n\t")
    return Uint32(llvm.inline_asm(
        Uint32.mlir_type,
        [Uint32(word).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 t, h;\n\t.reg .b16 p, q;\n\t"
        f"prmt.b32 t, $1, 0, {selector:#x};\n\t"
        "mov.b32 {p, q}, t;\n\t"
        f"cvt.rn.f16x2.{fp8}x2 h, p;\n\t" + to16 + "}",
        "=r,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


class FlashFwdKeySplitFP8(FlashFwdKeySplit):
    """The decode tile over FP8 K/V widened in registers; see the module docstring."""

    def __init__(self, spec: FwdSpec, config: FwdConfig, model: ExecutionModel):
        super().__init__(spec, config, model)
        self.widens_kv = False  # no staging: the stages the copies fill are the ones the MMAs read
        self.mma_stages = config.num_stages
        self.fp8_name = "e4m3" if spec.kv_dtype == "e4m3" else "e5m2"
        self.q_over_stages = True  # Q / O at the end of V's last stage (``config.keysplit_q_offset``)

    # ------------------------------------------------------------------------------------------
    # Tiled MMAs: the 16-bit ones the MMAs run and the shadows whose partitions the ldmatrix copies fill
    # ------------------------------------------------------------------------------------------
    @property
    def key_mma(self) -> cute.TiledMma:
        """S = Q K^T with the warps on keys and K in the order one ldmatrix word of K widens to."""
        w = self.num_warps
        return cute.make_tiled_mma(self.mma_atom(), (1, w, 1), permutation_mnk=(
            16, cute.make_layout((8, w, 2), stride=(1, KEYS_PER_WARP, 8)), cute.make_layout((2, 4, 2), stride=(1, 4, 2))))

    @property
    def key_shadow(self) -> cute.TiledMma:
        """The ldmatrix partitions of K's 16-bit view (tile_n, d / 2): the keys as ``key_mma``'s."""
        return FlashFwdKeySplit.key_mma.fget(self)

    @property
    def pv_mma(self) -> cute.TiledMma:
        """O += P V with the warps along K; n8 MMA 2i covers the even columns of O's 16-column block i, 2i + 1 the
        odd ones."""
        w = self.num_warps
        return cute.make_tiled_mma(self.mma_atom(), (1, 1, w), permutation_mnk=(
            16, cute.make_layout((8, 2), stride=(2, 1)), KEYS_PER_WARP * w))

    @property
    def value_shadow(self) -> cute.TiledMma:
        """The ldmatrix.trans partitions of V^T's 16-bit view (dv / 2, tile_n): the keys as ``pv_mma``'s."""
        return FlashFwdKeySplit.pv_mma.fget(self)

    def kv_smem_layouts(self):
        """(sK, sV): 16-bit views of the FP8 stages (tile_n, d / 2 | dv / 2, stages) of byte pairs, which ldmatrix
        reads (``fp8_view``: the FP8 views the copies write)."""
        return tuple(cute.tile_to_shape(smem_layout_atom(self.dtype, width // 2),
                                        (self.tile_n, width // 2, self.config.num_stages), (0, 1, 2))
                     for width in (self.head_dim, self.head_dim_v))

    # ------------------------------------------------------------------------------------------
    # Device code
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def shared_tiles(self, tidx, softmax_scale_log2, sQ_layout, sK_layout, sV_layout, sO_layout) -> FwdSmem:
        """sQ / sO (16-bit, at the end of V's last stage), K / V's FP8 views (sK, sV: what the copies write), K's
        16-bit view (``views16``) and V^T's (sVt: (dv / 2, tile_n, stages)), which the ldmatrix copies read."""
        tiles = cutlass.memory.SmemAllocator().allocate(self.SharedStorage).tiles
        f8 = self.kv_dtype
        sQ = cute.make_tensor(tiles.sV.data_ptr() + keysplit_q_offset(self.spec, self.config) // 2, sQ_layout)
        sK16, sV16 = tiles.sK.get_tensor(sK_layout), tiles.sV.get_tensor(sV_layout)
        sK8, sV8 = (cute.make_tensor(cute.recast_ptr(mem.data_ptr(), dtype=f8),
                                     fp8_view(self.dtype, width, (self.tile_n, width, self.config.num_stages)))
                    for mem, width in ((tiles.sK, self.head_dim), (tiles.sV, self.head_dim_v)))
        dv16 = self.head_dim_v // 2
        sVt = cute.composition(sV16, cute.make_layout((dv16, self.tile_n, self.mma_stages),
                                                      stride=(self.tile_n, 1, self.tile_n * dv16)))
        return FwdSmem(bars=None, sScale=None, sQ=sQ, sK=sK8, sV=sV8, sO=cute.make_tensor(sQ.iterator, sO_layout),
                       sVt=sVt, views16=(sQ, sK16))

    def merge_stats_ptr(self, sm: FwdSmem, part_elems: int):
        """The row statistics right after the partial O (Q's tile, at the end of V's last stage, holds O by then)."""
        return cute.recast_ptr(sm.sK.iterator, dtype=Float32) + part_elems

    def kv_loader(self, kv_src, tidx, sm: FwdSmem):
        """cp.async of the FP8 stages through their FP8 views (16-byte vectors)."""
        g2s_k, g2s_v = (fp8_g2s_copy(self.kv_dtype, self.dtype, width, self.num_threads)
                        for width in (self.head_dim, self.head_dim_v))
        return kv_src.cp_async(tidx, sm.sK, sm.sV, g2s_k, g2s_v)

    @cute.jit
    def mma_context(self, tidx, sm: FwdSmem, softmax_scale_log2) -> FwdTileState:
        """Q's fragment in ``key_mma``'s order (read by plain copies), the shadows' fragments and ldmatrix partitions
        of K and V^T, the 16-bit operand fragments they widen into, O's accumulator in ``pv_mma``'s layout, the merge's
        views."""
        sQ, sK16 = sm.views16
        d16, dv16 = self.head_dim // 2, self.head_dim_v // 2
        thr_mma, thr_pv = self.tiled_mma.get_slice(tidx), self.pv_mma.get_slice(tidx)
        thr_ks, thr_vs = self.key_shadow.get_slice(tidx), self.value_shadow.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = cute.make_rmem_tensor(thr_mma.partition_shape_B((self.tile_n, self.head_dim)), self.dtype)
        tOrVt = cute.make_rmem_tensor(thr_pv.partition_shape_B((self.head_dim_v, self.tile_n)), self.dtype)
        tSrK16 = cute.make_rmem_tensor(thr_ks.partition_shape_B((self.tile_n, d16)), self.dtype)
        tOrVt16 = cute.make_rmem_tensor(thr_vs.partition_shape_B((dv16, self.tile_n)), self.dtype)
        s2r_q = cute.make_tiled_copy_A(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype), self.tiled_mma)
        s2r_k = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), self.key_shadow)
        s2r_v = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype), self.value_shadow)
        ctx = self.tile_state(tidx, None, None, (tSrQ, tSrK, tOrVt), (tSrQ, tSrK16, tOrVt16), (sQ, sK16, sm.sVt),
                              (s2r_q, s2r_k, s2r_v), thr_pv, softmax_scale_log2)
        ctx.update(merge=self.merge_views(sm), shadow=(tSrK16, tOrVt16))
        return ctx

    @cute.jit
    def scores(self, ctx: FwdTileState, n_block, k_stage, masked: cutlass.Constexpr[bool],
               mask_mod: cutlass.Constexpr[bool] = True):
        """S = Q K^T over this warp's keys: per 32 head-dim columns, one ldmatrix step of K's 16-bit view (the next
        one issued before this one's widening), widened into two k16 B fragments, two MMAs; then the score step."""
        acc_S = cute.make_rmem_tensor(ctx.thr_mma.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        acc_S.fill(0.0)
        tSsK = ctx.tSsK[None, None, None, k_stage]
        shadow = ctx.shadow[0]
        num_j = cute.size(shadow, mode=[2])
        cute.copy(ctx.s2r_k, tSsK[None, None, 0], ctx.tSrK_v[None, None, 0])
        for j in cutlass.range_constexpr(num_j):
            if const_expr(j + 1 < num_j):
                cute.copy(ctx.s2r_k, tSsK[None, None, j + 1], ctx.tSrK_v[None, None, j + 1])
            for n in cutlass.range_constexpr(cute.size(shadow, mode=[1])):
                src = words(shadow[None, n, j])
                for h in cutlass.range_constexpr(2):  # column chunk 2j + h of 16
                    dst = words(ctx.tSrK[None, n, 2 * j + h])
                    dst[0] = widen_pair(src[h], LOW_PAIR, self.fp8_name, self.dtype == cutlass.BFloat16)
                    dst[1] = widen_pair(src[h], HIGH_PAIR, self.fp8_name, self.dtype == cutlass.BFloat16)
            for h in cutlass.range_constexpr(2):
                cute.gemm(self.tiled_mma, acc_S, ctx.tSrQ[None, None, 2 * j + h], ctx.tSrK[None, None, 2 * j + h],
                          acc_S)
        ctx.score.apply(acc_S, n_block, masked, mask_mod)
        return acc_S

    @cute.jit
    def pv(self, ctx: FwdTileState, rP: cute.Tensor, v_stage):
        """O += P V over this warp's keys: per 16 keys, one ldmatrix.trans step of V^T's 16-bit view, its even and
        odd bytes widened into the B fragments of the two n8 MMAs of each 16-column block, the MMAs."""
        tOsVt = ctx.tOsVt[None, None, None, v_stage]
        shadow = ctx.shadow[1]
        rA = acc_as_operand_a(rP)
        for k in cutlass.range_constexpr(cute.size(shadow, mode=[2])):
            cute.copy(ctx.s2r_v, tOsVt[None, None, k], ctx.tOrVt_v[None, None, k])
            for i in cutlass.range_constexpr(cute.size(shadow, mode=[1])):
                src = words(shadow[None, i, k])
                for parity, selector in ((0, EVEN_PAIR), (1, ODD_PAIR)):
                    dst = words(ctx.tOrVt[None, 2 * i + parity, k])
                    for r in cutlass.range_constexpr(2):  # keys (2j, 2j+1), then (2j+8, 2j+9)
                        dst[r] = widen_pair(src[r], selector, self.fp8_name, self.dtype == cutlass.BFloat16)
            cute.gemm(self.pv_mma, ctx.acc_O, rA[None, None, k], ctx.tOrVt[None, None, k], ctx.acc_O)
