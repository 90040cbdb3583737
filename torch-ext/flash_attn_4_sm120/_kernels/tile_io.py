"""Global <-> shared tile movement with row predication (arch-free building blocks).

Tiles are partitioned by a tiled copy into ``(CPY, CPY_ROWS, CPY_COLS)``. Rows past the end of the
sequence are skipped (and, where the consumer would multiply them, zero-filled). As in the masks,
thread 0's coordinate partition (``t0XcX``) is compile-time, and each thread's own row offset is
folded into the limit once.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def copy_rows(
    tiled_copy: cute.TiledCopy,
    src: cute.Tensor,
    dst: cute.Tensor,
    t0XcX: cute.Tensor,
    row_limit: Int32,
    zero_fill: cutlass.Constexpr[bool],
):
    """Copy rows whose (thread-relative) index is below ``row_limit``; zero the others if asked."""
    for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
        if t0XcX[0, m, 0][0] < row_limit:
            cute.copy(tiled_copy, src[None, m, None], dst[None, m, None])
        else:
            if cutlass.const_expr(zero_fill):
                dst[None, m, None].fill(0)
