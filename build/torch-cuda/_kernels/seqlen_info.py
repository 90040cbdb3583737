"""One sequence of a batch, dense or packed (varlen), as a (rows, cols) view (arch-free).

Dense tensors are (batch, seqlen, heads, d); packed ones are (total, heads, d) with ``cu_seqlens``
(batch + 1,) holding each sequence's first row. ``seqused`` (batch,) caps a sequence's length (e.g. the
filled part of a preallocated KV cache). Everything downstream sees a 2-D view starting at the
sequence's first row and a runtime length: the mainloop is the same for both layouts.
"""

import cutlass
import cutlass.cute as cute


@cute.jit
def sequence_heads(mX: cute.Tensor, batch, mCuSeqlens, mSeqUsed):
    """(view (rows, heads, d), length) of sequence ``batch``."""
    if cutlass.const_expr(mCuSeqlens is None):
        view = mX[batch, None, None, None]
        length = mX.shape[1]
    else:
        start = mCuSeqlens[batch]
        view = cute.domain_offset((start, 0, 0), mX)
        length = mCuSeqlens[batch + 1] - start
    if cutlass.const_expr(mSeqUsed is not None):
        length = mSeqUsed[batch]
    return view, length


@cute.jit
def sequence(mX: cute.Tensor, batch, head, mCuSeqlens, mSeqUsed):
    """(view (rows, d), length) of sequence ``batch`` for head ``head``."""
    view, length = sequence_heads(mX, batch, mCuSeqlens, mSeqUsed)
    return view[None, head, None], length


@cute.jit
def row_tile(view: cute.Tensor, row, head, tile_rows: cutlass.Constexpr[int], cols: cutlass.Constexpr[int]):
    """A (tile_rows, cols) tensor whose every row is row ``row`` of head ``head`` of a
    (rows, heads, d) view (row stride 0). Partitioned like a whole tile, its mode-1 slice at a
    thread's copy row gives that row's addresses: how packed-GQA tiles gather rows that are not
    evenly spaced in memory."""
    return cute.make_tensor(view[row, head, None].iterator, cute.make_layout((tile_rows, cols), stride=(0, 1)))


@cute.jit
def lse_row(mLSE: cute.Tensor, batch, head, mCuSeqlensQ):
    """The LSE vector of one (sequence, head): dense LSE is (batch, heads, seqlen), packed (heads, total)."""
    if cutlass.const_expr(mCuSeqlensQ is None):
        row = mLSE[batch, head, None]
    else:
        row = cute.domain_offset((mCuSeqlensQ[batch],), mLSE[head, None])
    return row


def num_heads(mX: cute.Tensor, packed: bool):
    return mX.shape[1] if packed else mX.shape[2]


def num_batches(mX: cute.Tensor, mCuSeqlens):
    return mCuSeqlens.shape[0] - 1 if mCuSeqlens is not None else mX.shape[0]


def split_view(mX: cute.Tensor, split):
    """Split ``split`` of a split-KV partial tensor (num_splits, *shape of O or LSE): a tensor shaped
    like the final O / LSE, so the sequence and row helpers above apply unchanged."""
    return mX[(split,) + (None,) * (cute.rank(mX) - 1)]
