"""Forward attention for decode rows: the CTA's warps share one 16-row tile of Q and split every key block.

A decode call packs seqlen_q x group query rows (``pack_gqa``) per KV head, 1-16 rows: one m16 MMA row block. The
rows-split tiles give each warp its own 16 rows, so a 64-row tile over 4 packed rows runs 16 times the MMAs the
rows need, and every warp reads every key of the block from shared memory. Here (``FwdConfig.warps_on_keys``)
warp w owns keys [16 w, 16 w + 16) of each 16 x num_warps keys of the block instead:

  * S = Q K^T: a tiled MMA with the warps along N whose N permutation gives each warp 16 consecutive keys
    (``key_mma``), so a warp's S accumulator covers exactly its keys; every warp reads all 16 rows of Q;
  * online softmax per warp over its own keys (``OnlineSoftmax`` works per warp: its row reductions are quad
    shuffles), so no warp waits on another inside the loop;
  * O += P V: a tiled MMA with the warps along K (``pv_mma``): warp w's k-slices are its keys, P comes straight
    from its S accumulator, and each warp accumulates a partial O over all 16 rows x dv;
  * after the last block (``merge_warps``): each warp writes its row max, row sum and partial O to shared memory
    (over the K/V tiles and Q's, free by then); each thread then sums, in warp order (the same bits on every run),
    the partials of its elements in the epilogue's layout (``o_mma``: warps along dv), each rescaled by
    exp2((m_w - m) * scale) against the rows' overall max m. The merged state goes through the usual epilogue
    (sink, descale, split-KV partials, packed-row scatter).

The loads, masks, KV addressing and the schedule are the multistage kernel's. FP8 K/V run the subclass
``fwd_keysplit_fp8.FlashFwdKeySplitFP8``, which widens them in registers.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.nvgpu import warp

from ..config import KEYSPLIT_ROW_PAD
from .fragments import acc_rows_cols, quad_allreduce_sum
from .fwd_multistage import FlashFwdMultistage
from .fwd_state import FwdSmem, FwdTileState
from .softmax import OnlineSoftmax

#: keys of a block each warp owns per 16 x num_warps keys (one k16 step of P V)
KEYS_PER_WARP = 16


class FlashFwdKeySplit(FlashFwdMultistage):
    """``FlashFwdMultistage`` with the warps on keys; see the module docstring."""

    @property
    def num_warps(self) -> int:
        return self.num_threads // 32

    def mma_atom(self):
        return warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16))

    @property
    def key_mma(self) -> cute.TiledMma:
        """S = Q K^T over (16, tile_n): warp w's atoms at keys 16 w + (0..7, 8..15) of every 16 x num_warps."""
        w = self.num_warps
        return cute.make_tiled_mma(self.mma_atom(), (1, w, 1), permutation_mnk=(
            16, cute.make_layout((8, w, 2), stride=(1, KEYS_PER_WARP, 8)), 16))

    @property
    def pv_mma(self) -> cute.TiledMma:
        """O += P V with the warps along K: warp w's k16 slices are its keys; each warp's C covers all of O."""
        w = self.num_warps
        return cute.make_tiled_mma(self.mma_atom(), (1, 1, w), permutation_mnk=(16, 16, KEYS_PER_WARP * w))

    @property
    def o_mma(self) -> cute.TiledMma:
        """The merged O's layout (the epilogue's partitions): the warps along dv, each element held once."""
        w = self.num_warps
        return cute.make_tiled_mma(self.mma_atom(), (1, w, 1), permutation_mnk=(16, 8 * w, 16))

    def _setup(self):
        super()._setup()
        self.tiled_mma = self.key_mma

    @cute.jit
    def mma_context(self, tidx, sm: FwdSmem, softmax_scale_log2) -> FwdTileState:
        """The multistage kernel's context plus the merge's views: (num_warps, 16, dv) fp32 partials over the K/V
        tiles (rows ``KEYSPLIT_ROW_PAD`` words apart), (2, num_warps, 16) row max / row sum over Q's tile
        (``config.keysplit_problems`` checks that both fit)."""
        ctx = FlashFwdMultistage.mma_context(self, tidx, sm, softmax_scale_log2)
        ctx.update(merge=self.merge_views(sm))
        return ctx

    def merge_views(self, sm: FwdSmem):
        """(partial O, row statistics) views of the merge (``mma_context``)."""
        w, dv = self.num_warps, self.head_dim_v
        row = dv + KEYSPLIT_ROW_PAD
        s_part = cute.make_tensor(cute.recast_ptr(sm.sK.iterator, dtype=Float32),
                                  cute.make_layout((w, 16, dv), stride=(16 * row, row, 1)))
        s_stats = cute.make_tensor(self.merge_stats_ptr(sm, w * 16 * row),
                                   cute.make_layout((2, w, 16), stride=(16 * w, 16, 1)))
        return s_part, s_stats

    def merge_stats_ptr(self, sm: FwdSmem, part_elems: int):
        """Where the merge's row statistics go (fp32): over Q's tile, free once Q is in registers or read."""
        return cute.recast_ptr(sm.sQ.iterator, dtype=Float32)

    @cute.jit
    def finish(self, ctx: FwdTileState, mSink, head, sO, out):
        self.merge_warps(ctx)
        FlashFwdMultistage.finish(self, ctx, mSink, head, sO, out)  # (the DSL rewrites super() per class)

    @cute.jit
    def merge_warps(self, ctx: FwdTileState):
        """The warps' partial O and row statistics merged into ``o_mma``'s layout (``ctx.acc_O``, ``ctx.softmax``
        with whole-row sums); see the module docstring."""
        s_part, s_stats = ctx.merge
        w, dv = self.num_warps, self.head_dim_v
        warp_i = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        soft = ctx.softmax
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()  # every warp is done with the K/V and Q tiles
        cO = cute.make_identity_tensor((16, dv))
        tPcP = acc_rows_cols(self.pv_mma.get_slice(ctx.tidx).partition_C(cO))
        for r in cutlass.range_constexpr(cute.size(ctx.acc_O_rc, mode=[0])):
            row = tPcP[r, 0][0]
            total = quad_allreduce_sum(soft.row_sum[r])
            if ctx.tidx % 4 == 0:
                s_stats[0, warp_i, row] = soft.row_max[r]
                s_stats[1, warp_i, row] = total
            for c in cutlass.range_constexpr(cute.size(ctx.acc_O_rc, mode=[1])):
                s_part[warp_i, row, tPcP[r, c][1]] = ctx.acc_O_rc[r, c]
        cute.arch.sync_threads()
        thr_o = self.o_mma.get_slice(ctx.tidx)
        acc_O = cute.make_rmem_tensor(thr_o.partition_shape_C((16, dv)), Float32)
        acc_O.fill(0.0)
        acc_rc = acc_rows_cols(acc_O)
        tOcO = acc_rows_cols(thr_o.partition_C(cO))
        merged = OnlineSoftmax(soft.scale_log2, cute.size(acc_rc, mode=[0]), soft.rescale_log2)
        merged.rows_summed = True
        for r in cutlass.range_constexpr(cute.size(acc_rc, mode=[0])):
            row = tOcO[r, 0][0]
            m = s_stats[0, 0, row]
            for v in cutlass.range_constexpr(1, w):
                m = cute.arch.fmax(m, s_stats[0, v, row])
            total = Float32(0.0)
            for v in cutlass.range_constexpr(w):
                # exactly 1 for the warps that hold the max; 0 for a warp that saw no key of the row
                weight = cute.math.exp2((s_stats[0, v, row] - m) * soft.scale_log2, fastmath=True)
                total = total + weight * s_stats[1, v, row]
                for c in cutlass.range_constexpr(cute.size(acc_rc, mode=[1])):
                    acc_rc[r, c] = acc_rc[r, c] + weight * s_part[v, row, tOcO[r, c][1]]
            merged.row_max[r] = m
            merged.row_sum[r] = total
        ctx.update(acc_O=acc_O, acc_O_rc=acc_rc, softmax=merged)
