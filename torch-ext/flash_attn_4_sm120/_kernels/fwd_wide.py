"""Forward attention at head dims past 256: the warps of each 16-row block split S's keys and O's columns.

The rows-split tiles give each warp whole 16-row blocks of S and O. At dv = 512 a 16-row block of O is 256 fp32
registers per thread, more than a thread has. Here (``FwdConfig.dv_warps`` = W > 1) the CTA's warps form a grid of
num_warps / W row blocks by W, and one tiled MMA with that atom grid serves both GEMMs:

  * S = Q K^T: warp (m, w) computes row block m's scores for its share of the block's keys (the tiled MMA's N
    interleave: 8 keys of every 8 W), reading Q and K from shared memory by ldmatrix at each k16 step (a 512-wide Q
    fragment would take 128 registers);
  * the row block's warps agree on each row's block max (``RowBlockSoftmax``): each writes its quad-reduced max
    to shared memory, and after a barrier all read the W values, so every warp runs the online softmax
    (``softmax_step`` with ``block_max``) with the same reference max and rescales its own columns of O by the
    same factor;
  * P goes to shared memory in 16 bits (the S accumulator's partition) and, after a second barrier, every warp
    reads its row block's whole P by ldmatrix as the A operand of O += P V over its own dv / W columns (the same
    tiled MMA's partition of O);
  * each warp's row sums cover its own keys; after the last block the W partial sums of a row are added in warp
    order in shared memory (the same bits on every run), and the usual epilogue normalizes and stores O.

MLA (``spec.latent_v``): each key's [latent | rope] row lands in one K tile (``kv_loader``: the latent through the V
copy, zero-filled past the keys, the rope through the K copy), and P V reads the latent columns of that tile (the base
kernel's ``v_in_k`` view), so the latent crosses shared memory once for both GEMMs.

Loads, masks, KV addressing, the schedule and the epilogue are the multistage kernel's; K/V stages are 16-bit. The
table's tiles (``fwd_table.json``): rows that fit 16 run 16 rows on 4 warps (W = 4) with one 32-key K/V stage at d512,
two for MLA; more rows run 32 rows on 4 warps (W = 2) with 16-key stages (one at d512, three for MLA, two over paged
K/V).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import warp

from ..config import FwdConfig
from ..execution_model import ExecutionModel
from ..problem import FwdSpec
from .fragments import quad_allreduce_sum
from .fwd_multistage import FlashFwdMultistage
from .fwd_state import FwdSmem, FwdTileState
from .softmax import OnlineSoftmax, row_block_max, softmax_step
from .tile_io import smem_layout_atom


class FlashFwdWide(FlashFwdMultistage):
    """``FlashFwdMultistage`` with ``dv_warps`` warps per 16-row block; see the module docstring."""

    def __init__(self, spec: FwdSpec, config: FwdConfig, model: ExecutionModel):
        super().__init__(spec, config, model)
        self.dv_warps = config.dv_warps
        self.row_warps = config.num_warps // config.dv_warps

    def grid_mma(self) -> cute.TiledMma:
        """The (row blocks, dv_warps) warp grid: S's keys and O's columns interleave over a row block's warps."""
        return cute.make_tiled_mma(warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)),
                                   (self.row_warps, self.dv_warps, 1),
                                   permutation_mnk=(16 * self.row_warps, 8 * self.dv_warps, 16))

    @property
    def pv_mma(self) -> cute.TiledMma:
        return self.grid_mma()

    @property
    def o_mma(self) -> cute.TiledMma:
        return self.grid_mma()

    def _setup(self):
        super()._setup()
        self.tiled_mma = self.grid_mma()

    def kv_loader(self, kv_src, tidx, sm: FwdSmem):
        """cp.async into the stages; with MLA (``v_in_k``) both sources land in the K tile: the latent (V, zero-filled
        past the keys, since P V reads it) in its first head_dim_v columns, the rope keys (K) in the rest."""
        if const_expr(not self.v_in_k):
            return FlashFwdMultistage.kv_loader(self, kv_src, tidx, sm)
        dv, rope, stages = self.head_dim_v, self.head_dim - self.head_dim_v, self.config.num_stages
        s_latent = cute.local_tile(sm.sK, (self.tile_n, dv, stages), (0, 0, 0))
        s_rope = cute.local_tile(sm.sK, (self.tile_n, rope, stages), (0, dv // rope, 0))
        return kv_src.cp_async(tidx, s_rope, s_latent, self.g2s_v, self.g2s_v)

    def extra_smem_fields(self) -> dict:
        """P (tile_m, tile_n) and one fp32 statistic per (warp of a row block, row)."""
        return {"sP": cute.struct.Align[cute.struct.MemRange[self.dtype, self.tile_m * self.tile_n], 1024],
                "sStat": cute.struct.Align[cute.struct.MemRange[Float32, self.dv_warps * self.tile_m], 16]}

    def extra_smem_views(self, tiles):
        """(sP (tile_m, tile_n) in swizzled atoms, sStat (dv_warps, tile_m)); the layouts are built here, in the
        kernel (a layout built on the host is a value of the host function)."""
        sP_layout = cute.tile_to_shape(smem_layout_atom(self.dtype, self.tile_n), (self.tile_m, self.tile_n), (0, 1))
        return (tiles.sP.get_tensor(sP_layout),
                tiles.sStat.get_tensor(cute.make_layout((self.dv_warps, self.tile_m), stride=(self.tile_m, 1))))

    @cute.jit
    def mma_context(self, tidx, sm: FwdSmem, softmax_scale_log2) -> FwdTileState:
        """The multistage kernel's context (Q read from shared memory) with the row block's shared softmax
        (``RowBlockSoftmax``) and the exchange: P's smem view with the S partition that writes it, and the
        ldmatrix copy that reads it as P V's A operand."""
        ctx = FlashFwdMultistage.mma_context(self, tidx, sm, softmax_scale_log2)
        sP, sStat = sm.extra
        thr_mma = self.tiled_mma.get_slice(tidx)
        r2s_p = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype), self.tiled_mma)
        s2r_p = cute.make_tiled_copy_A(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), self.tiled_mma)
        thr_r2s, thr_s2r = r2s_p.get_slice(tidx), s2r_p.get_slice(tidx)
        tOrP = thr_mma.make_fragment_A(thr_mma.partition_A(sP))
        rows = cute.size(ctx.acc_O_rc, mode=[0])
        ctx.update(softmax=RowBlockSoftmax(softmax_scale_log2, rows, sStat, self.warp_column(), ctx.tScS_rc,
                                           self.dv_warps, tidx),
                   exchange=(thr_r2s, r2s_p, thr_r2s.partition_D(sP), s2r_p, thr_s2r.partition_S(sP),
                             thr_s2r.retile(tOrP), tOrP))
        return ctx

    @cute.jit
    def warp_column(self):
        """This warp's place among its row block's warps (the tiled MMA's atom grid: row blocks first)."""
        return cute.arch.make_warp_uniform(cute.arch.warp_idx()) // self.row_warps

    @cute.jit
    def pv(self, ctx: FwdTileState, rP: cute.Tensor, v_stage):
        """O += P V over this warp's columns: this warp's P to shared memory, a barrier, then the row block's whole
        P read by ldmatrix as the A operand and V^T of stage ``v_stage`` as the B operand."""
        thr_r2s, r2s_p, tPsP, s2r_p, tOsP, tOrP_v, tOrP = ctx.exchange
        cute.copy(r2s_p, thr_r2s.retile(rP), tPsP)
        cute.arch.sync_threads()  # the row block's whole P is written; every warp has read the block maxima
        self.gemm_smem(ctx.acc_O, tOrP, ctx.tOrVt, tOsP, tOrP_v, ctx.tOsVt[None, None, None, v_stage], ctx.tOrVt_v,
                       s2r_p, ctx.s2r_v)

    @cute.jit
    def finish(self, ctx: FwdTileState, mSink, head, sO, out):
        """The row block's partial row sums added in warp order (whole-row sums), then the multistage epilogue."""
        ctx.softmax.sum_rows()
        FlashFwdMultistage.finish(self, ctx, mSink, head, sO, out)  # (the DSL rewrites super() per class)


class RowBlockSoftmax(OnlineSoftmax):
    """The online softmax of a warp that holds some of its row block's keys: each block's row maxima are taken over
    the whole row block through shared memory (``sStat`` (dv_warps, tile_m)), so the row block's warps keep the same
    reference max and rescale their columns of O alike; ``sum_rows`` adds their row sums at the end."""

    def __init__(self, scale_log2, num_rows: int, sStat, column, tScS_rc, dv_warps: int, tidx):
        super().__init__(scale_log2, num_rows)
        self.sStat, self.column, self.tScS_rc, self.dv_warps, self.tidx = sStat, column, tScS_rc, dv_warps, tidx

    @cute.jit
    def exchange(self, values: cute.Tensor, op: cutlass.Constexpr[str]):
        """Each row's ``op`` ("max" or "sum") over the row block's warps, in warp order, into ``values`` (one per
        accumulator row: this warp's share, quad-reduced), through one CTA barrier. The previous exchange's reads
        all come before the barrier in ``pv`` that every warp passes before its next write here."""
        sStat, column, tScS_rc, lead = self.sStat, self.column, self.tScS_rc, self.tidx % 4 == 0
        for r in cutlass.range_constexpr(self.num_rows):
            if lead:
                sStat[column, tScS_rc[r, 0][0]] = values[r]
        cute.arch.sync_threads()
        for r in cutlass.range_constexpr(self.num_rows):
            row = tScS_rc[r, 0][0]
            v = sStat[0, row]
            for w in cutlass.range_constexpr(1, self.dv_warps):
                v = cute.arch.fmax(v, sStat[w, row]) if const_expr(op == "max") else v + sStat[w, row]
            values[r] = v

    @cute.jit
    def step(self, acc_S_rc: cute.Tensor, acc_O_rc: cute.Tensor):
        block_max = cute.make_rmem_tensor(self.num_rows, Float32)
        for r in cutlass.range_constexpr(self.num_rows):
            block_max[r] = row_block_max(acc_S_rc, r)
        self.exchange(block_max, "max")
        softmax_step(self.row_max, self.row_sum, acc_S_rc, acc_O_rc, self.scale_log2, self.rescale_log2, block_max)

    @cute.jit
    def sum_rows(self):
        """Whole-row sums (``rows_summed``): this warp's quad sums, added over the row block's warps."""
        for r in cutlass.range_constexpr(self.num_rows):
            self.row_sum[r] = quad_allreduce_sum(self.row_sum[r])
        self.exchange(self.row_sum, "sum")
        self.rows_summed = True
