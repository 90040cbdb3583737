"""One sequence of a batch, dense or packed (varlen), as a (rows, cols) view (arch-free).

Dense tensors are (batch, seqlen, heads, d); packed ones are (total, heads, d) with ``cu_seqlens``
(batch + 1,) holding each sequence's first row. ``seqused`` (batch,) caps a sequence's length (e.g. the
filled part of a preallocated KV cache). Everything downstream sees a 2-D view starting at the
sequence's first row and a runtime length: the mainloop is the same for both layouts.
"""

import cutlass
import cutlass.cute as cute


@cute.jit
def sequence(mX: cute.Tensor, batch, head, mCuSeqlens, mSeqUsed):
    """(view (rows, d), length) of sequence ``batch`` for head ``head``."""
    if cutlass.const_expr(mCuSeqlens is None):
        view = mX[batch, None, head, None]
        length = mX.shape[1]
    else:
        start = mCuSeqlens[batch]
        view = cute.domain_offset((start, 0), mX[None, head, None])
        length = mCuSeqlens[batch + 1] - start
    if cutlass.const_expr(mSeqUsed is not None):
        length = mSeqUsed[batch]
    return view, length


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
