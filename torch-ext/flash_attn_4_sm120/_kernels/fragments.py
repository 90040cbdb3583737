"""Register-fragment views for the m16n8k16 warp MMA (arch-free building blocks).

The accumulator of ``mma.sync.m16n8k16`` holds, per thread, 4 fp32 values laid out as
``((2 cols, 2 row-halves), MMA_M, MMA_N)``: row ``lane//4`` and ``lane//4 + 8`` of the 16x8 tile,
columns ``2*(lane%4) + {0,1}``. Softmax works on rows, so we view it as ``(rows, cols)``; the P@V
product feeds the same registers (converted to 16-bit) back in as the A operand.
"""

import cutlass.cute as cute
from cutlass import Float32


def acc_rows_cols_layout(acc_layout: cute.Layout) -> cute.Layout:
    """((2, 2), MMA_M, MMA_N) -> ((2, MMA_M), (2, MMA_N)): one mode per row, one per column."""
    flat = cute.make_layout(acc_layout.shape)
    rows_cols = cute.make_layout(
        ((flat.shape[0][1], flat.shape[1]), (flat.shape[0][0], flat.shape[2])),
        stride=((flat.stride[0][1], flat.stride[1]), (flat.stride[0][0], flat.stride[2])),
    )
    return cute.composition(acc_layout, rows_cols)


def acc_rows_cols(acc: cute.Tensor) -> cute.Tensor:
    """The accumulator (or anything partitioned like it) viewed as (rows, cols) of this thread."""
    return cute.make_tensor(acc.iterator, acc_rows_cols_layout(acc.layout))


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """((2, 2), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, MMA_N / 2): S=QK^T's C fragment reused as P's A fragment.

    One 16x16 A tile (k = 16) spans two adjacent 16x8 C tiles of S, so pairs of N-modes merge.
    """
    split = cute.logical_divide(acc.layout, (None, None, 2))
    layout = cute.make_layout(
        ((split.shape[0], split.shape[2][0]), split.shape[1], split.shape[2][1]),
        stride=((split.stride[0], split.stride[2][0]), split.stride[1], split.stride[2][1]),
    )
    return cute.make_tensor(acc.iterator, layout)


@cute.jit
def quad_allreduce_max(x: Float32) -> Float32:
    """Max over the 4 lanes that share an accumulator row."""
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))
    return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))


@cute.jit
def quad_allreduce_sum(x: Float32) -> Float32:
    """Sum over the 4 lanes that share an accumulator row."""
    x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
    return x + cute.arch.shuffle_sync_bfly(x, offset=1)


def convert(src: cute.Tensor, dtype) -> cute.Tensor:
    """A register copy of ``src`` with elements converted to ``dtype``."""
    dst = cute.make_rmem_tensor_like(src, dtype)
    dst.store(src.load().to(dtype))
    return dst
