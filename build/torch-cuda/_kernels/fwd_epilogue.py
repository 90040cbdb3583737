"""The forward kernel's epilogue (a part of ``FlashFwdMultistage``): normalize O, write O and the LSE.

``finish`` divides O by the row sums (with the learnable sink in the denominator, and dropout's 1 / (1 - p)),
computes the LSE and picks the store: through shared memory for 16-byte global stores (``epilogue``, reusing
Q's buffer), straight from the accumulators for split-KV's fp32 partials (``epilogue_partial``) and for
persistent tiles (``epilogue_rows``: the Q buffer is already loading the next tile). The LSE is written by the
lane that holds column 0 of each row. Packed GQA rows scatter to (query row p // group, head p % group).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from ..problem import LOG2_E
from .fragments import acc_rows_cols, convert
from .fwd_state import EpilogueTarget, FwdTileState
from .seqlen_info import lse_row, row_tile, sequence_heads, split_view
from .tile_io import column_predicate


class FwdEpilogue:
    """The epilogue of ``FlashFwdMultistage``."""

    @cute.jit
    def finish(self, ctx: FwdTileState, mSink, head, sO, out: EpilogueTarget):
        """Epilogue: O /= row sums (with the sink), LSE, and the store of O (and LSE) for this tile."""
        num_rows = cute.size(ctx.acc_O_rc, mode=[0])
        lse = cute.make_rmem_tensor(num_rows, Float32)
        sink_log2 = None
        if const_expr(self.spec.has_sink):
            # per accumulator row: packed GQA rows belong to different query heads
            sink_log2 = cute.make_rmem_tensor(num_rows, Float32)
            for r in cutlass.range_constexpr(num_rows):
                sink_log2[r] = Float32(mSink[self.row_head(ctx, head, ctx.tScS_rc[r, 0][0])]) * Float32(LOG2_E)
        o_scale = None  # dropout's 1 / (1 - p), or FP8 V's descale (the two never meet: config.fp8_kv_problems)
        if const_expr(self.spec.dropout):
            o_scale = ctx.dropout.scale
        elif const_expr(self.spec.kv_dtype is not None):
            o_scale = ctx.v_descale
        ctx.softmax.finalize(ctx.acc_O_rc, lse, sink_log2, o_scale)
        if const_expr(self.spec.split_kv):
            self.epilogue_partial(ctx, lse, out)
        elif const_expr(self.config.persistent):
            self.epilogue_rows(ctx, lse, out)
        else:
            self.epilogue(ctx, lse, sO, out)

    @cute.jit
    def out_row(self, ctx: FwdTileState, out: EpilogueTarget, tile_row):
        """(valid, query row, query head) of tile row ``tile_row``: packed GQA rows scatter to (query
        p // group, head p % group), unpacked ones are rows of ``out.head``."""
        p = ctx.m_block * self.tile_m + tile_row
        q_row, q_head = self.packed_row(ctx, tile_row) if const_expr(self.spec.pack_gqa) else (p, out.head)
        return p < ctx.tile_rows, q_row, q_head

    @cute.jit
    def store_lse(self, ctx: FwdTileState, out: EpilogueTarget, mLSE: cute.Tensor, lse, tOcO_rc):
        """LSE per accumulator row, written by the lane that holds column 0 of the row."""
        lse_col0 = tOcO_rc[0, 0][1] == 0
        for r in cutlass.range_constexpr(cute.size(lse)):
            valid, q_row, q_head = self.out_row(ctx, out, tOcO_rc[r, 0][0])
            gLSE = lse_row(mLSE, out.batch, q_head, out.mCuSeqlensQ)
            if lse_col0 and valid:
                gLSE[q_row] = lse[r]

    @cute.jit
    def store_rows(self, ctx: FwdTileState, out: EpilogueTarget, lse, acc_rc: cute.Tensor,
                   partial: cutlass.Constexpr[bool]):
        """O from the accumulator layout (``acc_rc``: rows x cols view, O's or a converted copy) straight to
        global memory, each element once, rows past the tile's end skipped; then LSE. No smem, no barrier.
        ``partial``: into split ``out.split`` of the split-KV workspaces (each view formed where it is
        used: a gmem pointer live across the store loop costs registers)."""
        mO = split_view(out.mO, out.split) if const_expr(partial) else out.mO
        mO_h, _ = sequence_heads(mO, out.batch, out.mCuSeqlensQ, out.mSeqUsedQ)
        cO = cute.make_identity_tensor((self.tile_m, self.head_dim_v))
        tOcO_rc = acc_rows_cols(self.o_mma.get_slice(ctx.tidx).partition_C(cO))
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
    def epilogue_partial(self, ctx: FwdTileState, lse, out: EpilogueTarget):
        """Split-KV: this split's normalized fp32 O goes from the accumulators straight to its
        workspace (each row once; the combine reads it once, so no smem round trip), and its LSE
        (-inf for a split that saw no key of the row: weight 0 in the combine)."""
        cute.arch.cp_async_wait_group(0)  # nothing in flight at exit
        self.store_rows(ctx, out, lse, ctx.acc_O_rc, partial=True)

    @cute.jit
    def epilogue_rows(self, ctx: FwdTileState, lse, out: EpilogueTarget):
        """Persistent tiles: normalized 16-bit O straight from registers (a warp group's own rows; the Q
        buffer is already loading the next tile), then LSE."""
        rO = convert(ctx.acc_O, self.dtype)
        self.store_rows(ctx, out, lse, acc_rows_cols(rO), partial=False)

    @cute.jit
    def epilogue(self, ctx: FwdTileState, lse, sO, out: EpilogueTarget):
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
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype), self.o_mma)
        thr_r2s = r2s.get_slice(tidx)
        cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sO))

        cO = cute.make_identity_tensor((self.tile_m, self.head_dim_v))
        self.store_lse(ctx, out, out.mLSE, lse, acc_rows_cols(self.o_mma.get_slice(tidx).partition_C(cO)))

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
