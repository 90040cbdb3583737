"""Attention dropout's keep mask in the kernels (arch-free; the definition is ``dropout.py``'s).

Each thread draws one Philox4x32-7 call per 8 of its score elements: the m16n8 accumulator gives lane l rows
(l // 4, l // 4 + 8) and columns 2 (l % 4) + {0, 1} of every n8 atom, so the two atoms of a 16-column cell and
the two row halves of an m16 atom are exactly one call's 8 elements (``dropout.py``). The kernels call
``DropoutMask.keep_flags`` after the softmax (forward) or beside the recomputed P (backward) and select with
the flags; ``keep_flags`` checks at trace time that every warp's fragment starts on a 16 x 16 cell (the tiled
MMA's warp layout), so a tile that breaks the grouping fails to build instead of drawing a different mask.
"""

from dataclasses import dataclass
from typing import Any

import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32, Uint64

from ..dropout import CELL, PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, ROUNDS


def _mulhilo(a: int, x):
    p = Uint64(x) * Uint64(a)  # mul.wide.u32
    return Uint32(p >> 32), Uint32(p)


def philox(c0, c1, c2, c3, k0, k1) -> tuple:
    """Philox4x32-``ROUNDS`` of the counter (c0, c1, c2, c3) under the key (k0, k1), all Uint32."""
    for r in range(ROUNDS):
        if r:
            k0, k1 = k0 + Uint32(PHILOX_W0), k1 + Uint32(PHILOX_W1)
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def check_cells(tiled_mma, tile_m: int, tile_n: int) -> None:
    """Trace time: every warp's first accumulator element sits on a 16 x 16 cell corner (with ``keep_flags``'
    check of thread 0's fragment: a thread's 8 elements per Philox call are one call's of the definition)."""
    c = cute.make_identity_tensor((tile_m, tile_n))
    for w in range(cute.size(tiled_mma) // 32):
        row, col = tiled_mma.get_slice(w * 32).partition_C(c)[0]
        if row % CELL or col % CELL:
            raise ValueError(f"dropout needs warp fragments on 16 x 16 cells; warp {w} starts at ({row}, {col})")


@dataclass(frozen=True)
class DropoutMask:
    """A CTA's dropout: the call's key and offset, the 16-bit threshold (shifted to the high half) and the keep
    scale, and the S accumulator's (rows, cols) coordinates (``tScS_rc`` this thread's, ``t0ScS_rc`` thread 0's, compile-time)."""

    key0: Any
    key1: Any
    offset: Any
    threshold: Any
    scale: Any
    tScS_rc: cute.Tensor
    t0ScS_rc: cute.Tensor

    @staticmethod
    def of(mRng: cute.Tensor, tScS_rc, t0ScS_rc) -> "DropoutMask":
        """From the kernel's dropout slot (int32 seed low, seed high, offset, threshold)."""
        threshold = Uint32(mRng[3]) << 16  # in the high half (``keep_flags``)
        scale = Float32(65536.0) / Float32(Int32(65536) - mRng[3])
        return DropoutMask(key0=Uint32(mRng[0]), key1=Uint32(mRng[1]), offset=Uint32(mRng[2]), threshold=threshold,
                           scale=scale, tScS_rc=tScS_rc, t0ScS_rc=t0ScS_rc)

    def keep_flags(self, batch, head, num_heads, q_base, k_base) -> "KeepFlags":
        """The keep flags of this thread's elements of query head ``head`` of ``num_heads`` in sequence ``batch``, in
        the tile whose row 0 is query position ``q_base`` and column 0 key position ``k_base`` (multiples of 16)."""
        rows, cols = cute.size(self.tScS_rc, mode=[0]), cute.size(self.tScS_rc, mode=[1])
        if rows % 2 or cols % 4:
            raise ValueError(f"dropout needs whole m16 atoms and 16-column atom pairs per thread ({rows}x{cols})")
        for r in range(0, rows, 2):
            t_row = self.t0ScS_rc[r, 0][0]
            if t_row % CELL or self.t0ScS_rc[r + 1, 0][0] != t_row + 8:
                raise ValueError("dropout: accumulator rows are not m16 atom halves")
        for c in range(0, cols, 4):
            t_col = self.t0ScS_rc[0, c][1]
            if t_col % CELL or [self.t0ScS_rc[0, c + j][1] - t_col for j in range(4)] != [0, 1, 8, 9]:
                raise ValueError("dropout: accumulator columns are not 16-column atom pairs")
        return KeepFlags(self, Uint32(batch * num_heads + head), Uint32(q_base + self.tScS_rc[0, 0][0]),
                         Uint32(k_base + self.tScS_rc[0, 0][1]), rows, cols)


class KeepFlags:
    """Trace-time accessor of one tile's keep flags: ``flags(r, c)`` (the accumulator's (rows, cols) view) is a
    Boolean, kept. A Philox call is emitted when the first of its 8 elements is asked for, so a caller walking
    ``order`` (call by call) keeps each call's 4 words live for 8 elements only: drawing every call up front held
    the whole tile's words beside S and spilled (sm_120a gate, 2026-11-26)."""

    def __init__(self, mask: DropoutMask, head_word, q0, k0, rows: int, cols: int):
        self.mask, self.head_word, self.q0, self.k0 = mask, head_word, q0, k0
        #: (row, col) of every element, call-major: the 8 elements of a call one after another
        self.order = [(r + half, c + j) for r in range(0, rows, 2) for c in range(0, cols, 4)
                      for half in range(2) for j in range(4)]
        self._words, self._flags = {}, {}

    def draw_all(self) -> "KeepFlags":
        """Emit every Philox call and comparison now (the backward: drawn up front, ahead of the P / dS work, the
        d128 backward ran 10% faster than drawn as reached; H100 at SM120 occupancy, 2026-11-26)."""
        self._flags = {}
        for r, c in self.order:
            self._flags[(r, c)] = self(r, c)
        return self

    def __call__(self, r: int, c: int):
        if (r, c) in self._flags:
            return self._flags[(r, c)]
        call = (r - r % 2, c - c % 4)
        if call not in self._words:
            m = self.mask
            q = self.q0 + Uint32(m.t0ScS_rc[call[0], 0][0])
            k = self.k0 + Uint32(m.t0ScS_rc[0, call[1]][1])
            ctr0 = (q >> 4) * Uint32(32) + (q & Uint32(7)) * Uint32(4) + ((k & Uint32(7)) >> 1)
            self._words[call] = philox(ctr0, k >> 4, self.head_word, m.offset, m.key0, m.key1)
        w = self._words[call][2 * (r % 2) + (c % 4) // 2]  # word 2 * row half + atom
        # the even column in the low half, compared in the high half: (w mod 2^16) >= t iff (w << 16) >= (t << 16)
        return (w << 16) >= self.mask.threshold if c % 2 == 0 else w >= self.mask.threshold
