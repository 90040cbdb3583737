"""Global <-> shared tile movement with row and column predication (arch-free building blocks).

Tiles are partitioned by a tiled copy into ``(CPY, CPY_ROWS, CPY_COLS)``. Rows past the end of the
sequence are skipped (and, where the consumer would multiply them, zero-filled). As in the masks,
thread 0's coordinate partition (``t0XcX``) is compile-time, and each thread's own row offset is
folded into the limit once.

Shared-memory tiles are built from swizzled 8-row atoms (``smem_layout_atom``) and filled by tiled copies of
16-byte vectors (``g2s_tiled_copy``), shared by the forward and backward kernels.

Head dims that are not a multiple of the MMA k-extent (16) are padded in shared memory: columns past
the real head dim are never loaded (a column predicate, built once per CTA) and, for Q and K, zeroed
once so the padded part of every dot product is exactly 0.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from ..config import atom_cols


_COPY_BITS = 128  # 16-byte cp.async / st.global vectors
#: swizzle bits of an 8-row atom of 64 / 32 / 16 16-bit columns (128 / 64 / 32-byte rows)
SWIZZLE_BITS = {64: 3, 32: 2, 16: 1}


def smem_layout_atom(dtype, width: int) -> cute.ComposedLayout:
    """A swizzled 8-row atom, ``width`` columns wide (16, 32 or 64 elements), bank-conflict free
    for both cp.async writes and ldmatrix reads."""
    cols = atom_cols(width)
    return cute.make_composed_layout(
        cute.make_swizzle(SWIZZLE_BITS[cols], 3, 3), 0, cute.make_layout((8, cols), stride=(cols, 1))
    )


def g2s_tiled_copy(dtype, atom_cols: int, num_threads: int, op, elems: int = 0, bits: int = 0) -> cute.TiledCopy:
    """Threads tile rows of 16-byte vectors: ``atom_cols / 8`` threads per row. ``elems``: elements per thread
    instead, ``bits`` per copy instruction (FP8 K/V's staging copies and their 16-bit side; ``kv_dequant``)."""
    elems = elems or _COPY_BITS // dtype.width
    threads_per_row = atom_cols // elems
    atom = cute.make_copy_atom(op, dtype, num_bits_per_copy=bits or elems * dtype.width)
    thr_layout = cute.make_ordered_layout((num_threads // threads_per_row, threads_per_row), order=(1, 0))
    return cute.make_tiled_copy_tv(atom, thr_layout, cute.make_layout((1, elems)))


@cute.jit
def copy_rows(
    tiled_copy: cute.TiledCopy,
    src: cute.Tensor,
    dst: cute.Tensor,
    t0XcX: cute.Tensor,
    row_limit: Int32,
    zero_fill: cutlass.Constexpr[bool],
    col_pred: cute.Tensor = None,
):
    """Copy rows whose (thread-relative) index is below ``row_limit``; zero the others if asked.
    ``col_pred`` (from ``column_predicate``) restricts the columns, when the tile is padded."""
    for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
        if t0XcX[0, m, 0][0] < row_limit:
            if cutlass.const_expr(col_pred is None):
                cute.copy(tiled_copy, src[None, m, None], dst[None, m, None])
            else:
                cute.copy(tiled_copy, src[None, m, None], dst[None, m, None], pred=col_pred[None, m, None])
        else:
            if cutlass.const_expr(zero_fill):
                dst[None, m, None].fill(0)


@cute.jit
def column_predicate(tXcX: cute.Tensor, limit: cutlass.Constexpr[int]) -> cute.Tensor:
    """(vectors, CPY_ROWS (broadcast), CPY_COLS) booleans: this thread's vector lies below ``limit``."""
    pred = cute.make_rmem_tensor(
        cute.make_layout(
            (tXcX.shape[0][1], cute.size(tXcX, mode=[1]), cute.size(tXcX, mode=[2])),
            stride=(cute.size(tXcX, mode=[2]), 0, 1),
        ),
        cutlass.Boolean,
    )
    for v in cutlass.range_constexpr(cute.size(pred, mode=[0])):
        for k in cutlass.range_constexpr(cute.size(pred, mode=[2])):
            pred[v, 0, k] = tXcX[(0, v), 0, k][1] < limit
    return pred


@cute.jit
def zero_masked_cols(dst: cute.Tensor, col_pred: cute.Tensor):
    """Zero this thread's vectors of ``dst`` (CPY, CPY_ROWS, CPY_COLS) that ``col_pred`` excludes."""
    for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
        for k in cutlass.range_constexpr(cute.size(dst, mode=[2])):
            if not col_pred[0, 0, k]:
                dst[None, m, k].fill(0)


@cute.jit
def store_rows(
    s2g: cute.TiledCopy,
    tidx,
    sX: cute.Tensor,
    gX: cute.Tensor,
    tile_shape: cutlass.Constexpr,
    real_cols: cutlass.Constexpr[int],
    row_limit: Int32,
):
    """The smem tile ``sX`` to ``gX`` (both ``tile_shape``) as 16-byte row vectors through registers:
    rows at or past ``row_limit`` (tile-relative) are skipped, columns at or past ``real_cols`` (a
    padded head dim) are not written."""
    thr = s2g.get_slice(tidx)
    tS = thr.partition_S(sX)
    tR = cute.make_rmem_tensor_like(tS, sX.element_type)
    cute.autovec_copy(tS, tR)
    c = cute.make_identity_tensor(tile_shape)
    tc, t0c = thr.partition_S(c), s2g.get_slice(0).partition_S(c)
    padded = tile_shape[1] != real_cols
    col_pred = column_predicate(tc, real_cols) if cutlass.const_expr(padded) else None
    tG = thr.partition_D(gX)
    limit = row_limit - tc[0][0]
    for r in cutlass.range_constexpr(cute.size(tR, mode=[1])):
        if t0c[0, r, 0][0] < limit:
            if cutlass.const_expr(padded):
                cute.copy(s2g, tR[None, r, None], tG[None, r, None], pred=col_pred[None, r, None])
            else:
                cute.copy(s2g, tR[None, r, None], tG[None, r, None])


@cute.jit
def load_rows(
    tiled_copy: cute.TiledCopy,
    tidx,
    gX: cute.Tensor,
    sX: cute.Tensor,
    tile_shape: cutlass.Constexpr,
    real_cols: cutlass.Constexpr[int],
    row_limit: Int32,
    zero_padding: cutlass.Constexpr[bool] = False,
):
    """Copy the (``tile_shape``) global tile ``gX`` into the smem tile ``sX`` (cp.async or any copy
    ``tiled_copy`` holds): rows at or past ``row_limit`` (tile-relative) are zero-filled, columns at or past
    ``real_cols`` (a padded head dim) are not read, and with ``zero_padding`` are zeroed first."""
    thr = tiled_copy.get_slice(tidx)
    c = cute.make_identity_tensor(tile_shape)
    tc = thr.partition_S(c)
    padded = tile_shape[1] != real_cols
    col_pred = column_predicate(tc, real_cols) if cutlass.const_expr(padded) else None
    tdst = thr.partition_D(sX)
    if cutlass.const_expr(padded and zero_padding):
        zero_masked_cols(tdst, col_pred)
    copy_rows(tiled_copy, thr.partition_S(gX), tdst, tiled_copy.get_slice(0).partition_S(c), row_limit - tc[0][0],
              True, col_pred)
