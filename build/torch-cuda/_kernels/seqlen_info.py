"""One sequence of a batch, dense or packed (varlen), as a (rows, heads, cols) view (arch-free).

Dense tensors are (batch, seqlen, heads, d); packed ones are (total, heads, d) with ``cu_seqlens``
(batch + 1,) holding each sequence's first row. ``seqused`` (batch,) caps a sequence's length (e.g. the
filled part of a preallocated KV cache). Everything downstream sees a view starting at the
sequence's first row and a runtime length: the mainloop is the same for both layouts.

Bounds safety: metadata is never trusted. A packed sequence's start is clamped into ``[0, total]``,
its end into ``[start, total]``, and ``seqused`` into ``[0, rows left]`` (dense: ``[0, seqlen]``), so
every row a kernel derives lies inside the tensor it indexes, whatever the metadata holds (corrupt
entries give wrong rows, never out-of-bounds accesses; ``metadata.py`` checks them on request).
"""

import cutlass
import cutlass.cute as cute

from ..bwd_config import ROW_PAD


@cute.jit
def clamp(x, lo, hi):
    """``x`` limited to ``[lo, hi]`` (``hi >= lo``)."""
    return cutlass.min(cutlass.max(x, lo), hi)


@cute.jit
def packed_start(mCuSeqlens: cute.Tensor, batch, total):
    """``cu_seqlens[batch]`` clamped into the ``total`` rows of the packed tensor."""
    return clamp(mCuSeqlens[batch], 0, total)


@cute.jit
def sequence_heads(mX: cute.Tensor, batch, mCuSeqlens, mSeqUsed):
    """(view (rows, heads, d), length) of sequence ``batch``; the length never runs past the tensor."""
    if cutlass.const_expr(mCuSeqlens is None):
        view = mX[batch, None, None, None]
        length = mX.shape[1]
    else:
        total = mX.shape[0]
        start = packed_start(mCuSeqlens, batch, total)
        view = cute.domain_offset((start, 0, 0), mX)
        length = clamp(mCuSeqlens[batch + 1], start, total) - start
    if cutlass.const_expr(mSeqUsed is not None):
        room = mX.shape[1] if cutlass.const_expr(mCuSeqlens is None) else mX.shape[0] - start
        length = clamp(mSeqUsed[batch], 0, room)
    return view, length


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
        row = cute.domain_offset((packed_start(mCuSeqlensQ, batch, mLSE.shape[1]),), mLSE[head, None])
    return row


@cute.jit
def workspace_row(mX: cute.Tensor, batch, head, mCuSeqlensQ, total_q):
    """The LSE2 / D' (or dQ accumulator) rows of one (sequence, head): dense (batch, heads, seqlen_pad[, d]),
    packed (heads, total_q + batch * ROW_PAD[, d]) from ``cu_seqlens_q[batch] + batch * ROW_PAD`` (the start
    clamped into the ``total_q`` rows of Q, as ``sequence_heads`` clamps it)."""
    if cutlass.const_expr(mCuSeqlensQ is None):
        if cutlass.const_expr(cute.rank(mX) == 3):
            return mX[batch, head, None]
        return mX[batch, head, None, None]
    start = packed_start(mCuSeqlensQ, batch, total_q) + batch * ROW_PAD
    if cutlass.const_expr(cute.rank(mX) == 2):
        return cute.domain_offset((start,), mX[head, None])
    return cute.domain_offset((start, 0), mX[head, None, None])


def num_heads(mX: cute.Tensor, packed: bool):
    return mX.shape[1] if packed else mX.shape[2]


def num_batches(mX: cute.Tensor, mCuSeqlens):
    return mCuSeqlens.shape[0] - 1 if mCuSeqlens is not None else mX.shape[0]


def split_view(mX: cute.Tensor, split):
    """Split ``split`` of a split-KV partial tensor (num_splits, *shape of O or LSE): a tensor shaped
    like the final O / LSE, so the sequence and row helpers above apply unchanged."""
    return mX[(split,) + (None,) * (cute.rank(mX) - 1)]
