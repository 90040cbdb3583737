"""Attention dropout's keep mask in the kernels (arch-free; the definition is ``dropout.py``'s).

Each thread draws one Philox4x32-7 call per 16 of its score elements: the m16n8 accumulator gives lane l rows
(l // 4, l // 4 + 8) and columns 2 (l % 4) + {0, 1} of every n8 atom, so the four atoms of a 32-column cell and
the two row halves of an m16 atom are exactly one call's 16 elements (``dropout.py``); a warp whose atoms cover
16 neighbouring columns only uses half of each call. The kernels either ask ``KeepFlags`` for an element's
Boolean (``flags(r, c)``, a byte compare) or apply a call's bytes to a pair of 16-bit probabilities at once
(``flags.apply_pair``: PRMT the pair's two bytes into two 16-bit lanes, compare them with the threshold as two
half-precision denormals, AND the pair with the result). ``keep_flags`` checks at trace time that every
thread's fragment is made of whole 16-column atom pairs on m16 atoms (the tiled MMA's warp layout), so a tile
that breaks the grouping fails to build instead of drawing a different mask.
"""

from dataclasses import dataclass, replace
from typing import Any

import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32, Uint64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from ..dropout import CELL, CELL_K, PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, ROUNDS, VALUE_BITS, VALUE_RANGE
from .fragments import acc_rows_cols


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


def _keep_tail(low: bool, threshold: str, combine: str) -> str:
    """The inline-asm lines ``keep_pair`` and ``keep_pair_f32`` share: the pair's two bytes of the word as 16-bit
    lanes (PRMT, bytes 0 / 1 for the low pair), their compare with ``threshold`` (an operand), then ``combine``."""
    return (f"prmt.b32 v, $1, 0, {0x4140 if low else 0x4342:#x};\n\t"
            f"set.ge.u32.f16x2 m, v, {threshold};\n\t"
            f"{combine}\n\t}}")


@dsl_user_op
def keep_pair(word, pair, threshold_pair, low: bool, sign: bool = False, *, loc=None, ip=None) -> Uint32:
    """The 16-bit pair ``pair`` (a Uint32) with each lane zeroed where its byte of ``word`` (bytes 0 and 1 for the
    low pair, 2 and 3 otherwise; the pair's low lane takes the lower byte) is below the threshold. The bytes become
    16-bit lanes (PRMT) that compare as half-precision denormals, in order, against ``threshold_pair`` (the
    threshold in both lanes): ``set.ge.u32.f16x2`` gives each lane all ones or zero. With ``sign`` the dropped
    lanes get their sign bit set instead (one LOP3: pair | (~mask & sign bits)): a dropped probability travels as
    -P, so a reader gets P (its magnitude) and the keep flag (its sign) from one 16-bit value; P >= 0, so the sign
    is free (``signed_to_keep`` zeroes those lanes later)."""
    combine = "lop3.b32 $0, $2, m, 0x80008000, 0xf2;" if sign else "and.b32 $0, $2, m;"
    return Uint32(llvm.inline_asm(
        Uint32.mlir_type,
        [Uint32(word).ir_value(loc=loc, ip=ip), Uint32(pair).ir_value(loc=loc, ip=ip),
         Uint32(threshold_pair).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 v, m;\n\t" + _keep_tail(low, "$3", combine),
        "=r,r,r,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def keep_pair_f32(word, lo, hi, threshold_pair, low: bool, half: bool, *, loc=None, ip=None) -> Uint32:
    """``keep_pair`` of the fp32 elements ``lo`` (the pair's low lane) and ``hi`` rounded to a 16-bit pair first
    (``cvt.rn.bf16x2.f32``, or ``f16x2`` where ``half``): one call's conversion and mask in one step, so a tile
    converts and masks P call by call instead of holding all of it in both widths."""
    cvt = "cvt.rn.f16x2.f32" if half else "cvt.rn.bf16x2.f32"
    return Uint32(llvm.inline_asm(
        Uint32.mlir_type,
        [Uint32(word).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip),
         Float32(hi).ir_value(loc=loc, ip=ip), Uint32(threshold_pair).ir_value(loc=loc, ip=ip)],
        f"{{\n\t.reg .b32 v, m, p;\n\t{cvt} p, $3, $2;\n\t" + _keep_tail(low, "$4", "and.b32 $0, p, m;"),
        "=r,r,f,f,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def signed_to_keep(pair, *, loc=None, ip=None) -> Uint32:
    """A ``keep_pair(sign=True)`` result with its negative lanes zeroed (P keep): PRMT replicates each lane's sign
    bit over the lane, LOP3 clears the lanes it set (-0 too)."""
    return Uint32(llvm.inline_asm(
        Uint32.mlir_type,
        [Uint32(pair).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 m;\n\t"
        "prmt.b32 m, $1, 0, 0xbb99;\n\t"
        "lop3.b32 $0, $1, m, 0, 0x30;\n\t}",  # pair & ~m
        "=r,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


def call_counter(q, k):
    """The first counter word of the Philox call holding query row ``q`` and key column ``k`` (Uint32s): its
    16-row block, its row within the block's 8-row half and its column pair within the 8-column atom."""
    return (q >> 4) * Uint32(32) + (q & Uint32(7)) * Uint32(4) + ((k & Uint32(7)) >> 1)


def select_word(a, b, mask):
    """``b`` where ``mask`` is all ones, ``a`` where it is zero (Uint32s; branch-free)."""
    return a ^ ((a ^ b) & mask)


def warp_cell_columns(tile_n: int, warps_n: int) -> int:
    """The neighbouring key columns a warp of the S MMA should cover per step under dropout: 32 (whole Philox calls)
    where ``warps_n`` runs of 32 divide the tile, else 16 (half calls)."""
    return 32 if tile_n % (CELL_K * warps_n) == 0 else CELL


def check_cells(tiled_mma, tile_m: int, tile_n: int, col_unit: int = CELL) -> None:
    """Trace time: every warp's first accumulator element sits on a 16-row, ``col_unit``-column cell corner (with
    ``keep_flags``' check of thread 0's fragment: a thread's 8 elements per Philox call are one call's of the
    definition; ``col_unit`` 8: runs of n8 atoms, ``RunKeepFlags``)."""
    c = cute.make_identity_tensor((tile_m, tile_n))
    for w in range(cute.size(tiled_mma) // 32):
        row, col = tiled_mma.get_slice(w * 32).partition_C(c)[0]
        if row % CELL or col % col_unit:
            raise ValueError(f"dropout needs warp fragments on 16 x {col_unit} cells; warp {w} starts at "
                             f"({row}, {col})")


def atom_run(col_pos: list) -> bool:
    """Whether thread 0's columns (its (rows, cols) view, compile-time) are one run of neighbouring n8 atoms, at most
    32 columns: the layout ``RunKeepFlags`` draws (a warp share of the keys that is not whole 16-column atom pairs,
    d128's 24 keys per warp)."""
    return len(col_pos) <= CELL_K // 4 and col_pos == [8 * (c // 2) + c % 2 for c in range(len(col_pos))]


@dataclass(frozen=True)
class DropoutMask:
    """A CTA's dropout: the call's key and offset, the 8-bit threshold (shifted to the top byte, and in both 16-bit
    lanes) and the keep scale, and the S accumulator's (rows, cols) coordinates (``tScS_rc`` this thread's,
    ``t0ScS_rc`` thread 0's, compile-time)."""

    key0: Any
    key1: Any
    offset: Any
    threshold: Any
    threshold_pair: Any
    scale: Any
    #: 1 - p (the inverse of ``scale``)
    keep_prob: Any
    tScS_rc: cute.Tensor
    t0ScS_rc: cute.Tensor

    @staticmethod
    def of(mRng: cute.Tensor, tScS_rc, t0ScS_rc) -> "DropoutMask":
        """From the kernel's dropout slot (int32 seed low, seed high, offset, threshold)."""
        t = Uint32(mRng[3])
        scale = Float32(VALUE_RANGE) / Float32(Int32(VALUE_RANGE) - mRng[3])
        keep_prob = Float32(Int32(VALUE_RANGE) - mRng[3]) / Float32(VALUE_RANGE)
        return DropoutMask(key0=Uint32(mRng[0]), key1=Uint32(mRng[1]), offset=Uint32(mRng[2]),
                           threshold=t << (32 - VALUE_BITS), threshold_pair=t | (t << 16), scale=scale,
                           keep_prob=keep_prob, tScS_rc=tScS_rc, t0ScS_rc=t0ScS_rc)

    def reread(self, mRng: cute.Tensor) -> "DropoutMask":
        """This mask with its key, offset and threshold words read from the slot again where a kernel uses them,
        instead of held in registers from its start (``of``'s words); the scales (a division) kept."""
        t = Uint32(mRng[3])
        return replace(self, key0=Uint32(mRng[0]), key1=Uint32(mRng[1]), offset=Uint32(mRng[2]),
                       threshold=t << (32 - VALUE_BITS), threshold_pair=t | (t << 16))

    def keep_flags(self, batch, head, num_heads, q_base, k_base) -> "KeepFlags":
        """The keep flags of this thread's elements of query head ``head`` of ``num_heads`` in sequence ``batch``, in
        the tile whose row 0 is query position ``q_base`` and column 0 key position ``k_base`` (multiples of 16)."""
        rows, cols = cute.size(self.tScS_rc, mode=[0]), cute.size(self.tScS_rc, mode=[1])
        if rows % 2 or cols % 2:
            raise ValueError(f"dropout needs whole m16 atoms and n8 atoms per thread ({rows}x{cols})")
        for r in range(0, rows, 2):
            t_row = self.t0ScS_rc[r, 0][0]
            if t_row % CELL or self.t0ScS_rc[r + 1, 0][0] != t_row + 8:
                raise ValueError("dropout: accumulator rows are not m16 atom halves")
        col_pos = [self.t0ScS_rc[0, c][1] for c in range(cols)]
        args = (self, Uint32(batch * num_heads + head), Uint32(q_base + self.tScS_rc[0, 0][0]),
                Uint32(k_base + self.tScS_rc[0, 0][1]), rows, cols, col_pos)
        if cols % 4 and atom_run(col_pos):
            return RunKeepFlags(*args)
        for c in range(0, cols, 4):
            t_col = self.t0ScS_rc[0, c][1]
            if t_col % CELL or [self.t0ScS_rc[0, c + j][1] - t_col for j in range(4)] != [0, 1, 8, 9]:
                raise ValueError("dropout: accumulator columns are not 16-column atom pairs")
        return KeepFlags(*args)


def call_groups(cols: int, col_pos: list) -> list:
    """The thread's columns (its (rows, cols) view) grouped by Philox call: a group of 8 where two neighbouring
    16-column atom pairs make one 32-column cell (positions ``[0, 1, 8, 9, 16, 17, 24, 25]`` from a multiple of 32),
    else a group of 4 (half a call). ``col_pos``: thread 0's column of each (compile-time)."""
    groups, c = [], 0
    while c < cols:
        base = col_pos[c]
        if base % CELL_K == 0 and c + 8 <= cols and col_pos[c + 4] == base + CELL:
            groups.append(tuple(range(c, c + 8)))
            c += 8
        else:
            groups.append(tuple(range(c, c + 4)))
            c += 4
    return groups


class KeepFlags:
    """Trace-time accessor of one tile's keep flags: ``flags(r, c)`` (the accumulator's (rows, cols) view) is a
    Boolean, kept; ``apply_pair(r, c, pair)`` zeroes the dropped lanes of the 16-bit pair of elements (r, c) and
    (r, c + 1), c even. A Philox call is emitted when the first of its elements is asked for, so a caller walking
    ``order`` / ``pairs`` (call by call) keeps each call's 4 words live for its elements only: drawing every call up
    front held the whole tile's words beside S and spilled (sm_120a gate, 2026-11-26)."""

    def __init__(self, mask: DropoutMask, head_word, q0, k0, rows: int, cols: int, col_pos: list = None):
        self.mask, self.head_word, self.q0, self.k0 = mask, head_word, q0, k0
        if col_pos is None:  # a layout of neighbouring atoms (host tests)
            col_pos = [16 * (c // 4) + [0, 1, 8, 9][c % 4] for c in range(cols)]
        #: per column: (first column of its call group, byte index of the column within the call's word pair)
        self._col = {}
        #: per call group (its first column): a half call (8 scores: its word half picked at run time, ``_word``)
        self.half_call = {}
        groups = call_groups(cols, col_pos)
        for g in groups:
            self.half_call[g[0]] = len(g) == 4
            for c in g:
                at = col_pos[c] - col_pos[g[0]] + col_pos[g[0]] % CELL_K  # the column's offset in its 32-col cell
                self._col[c] = (g[0], at)
        #: (row, col) of every element, call-major: the elements of a call one after another
        self.order = [(r + half, c) for r in range(0, rows, 2) for g in groups for half in range(2) for c in g]
        #: the even columns' elements of ``order`` (the pairs ``apply_pair`` takes)
        self.pairs = [(r, c) for r, c in self.order if c % 2 == 0]
        self._words, self._flags = {}, {}

    def draw_all(self) -> "KeepFlags":
        """Emit every Philox call and comparison now (the backward: drawn up front, ahead of the P / dS work, the
        d128 backward ran 10% faster than drawn as reached; H100 at SM120 occupancy, 2026-11-26)."""
        self._flags = {}
        for r, c in self.order:
            self._flags[(r, c)] = self(r, c)
        return self

    def slot(self, r: int, c: int) -> tuple:
        """Element (r, c)'s call (its first row and column in the (rows, cols) view), word of that call (2 * row
        half + 16-column half of the 32-column cell) and byte in the word (2 * atom parity + column parity), as
        thread 0 of warp 0 has them. A half call's 16-column half is the warp's: ``_word`` takes it from the
        element's own column at run time (warps of a 16-column layout start at either half)."""
        first, at = self._col[c]
        return (r - r % 2, first), 2 * (r % 2) + at // CELL, 2 * ((at // 8) % 2) + at % 2

    def _word(self, r: int, c: int):
        """The Philox word holding element (r, c), and the element's byte in it."""
        call, word, byte = self.slot(r, c)
        first = call[1]
        if call not in self._words:
            m = self.mask
            q = self.q0 + Uint32(m.t0ScS_rc[call[0], 0][0])
            k = self.k0 + Uint32(m.t0ScS_rc[0, first][1])
            words = philox(call_counter(q, k), k >> 5, self.head_word, m.offset, m.key0, m.key1)
            if self.half_call[first]:  # the word pair of the row half, picked by the column's 16-column half
                upper = Uint32(0) - ((k >> 4) & Uint32(1))
                lo, hi = (select_word(words[2 * h], words[2 * h + 1], upper) for h in (0, 1))
                words = (lo, lo, hi, hi)
            self._words[call] = words
        return self._words[call][word], byte

    def __call__(self, r: int, c: int):
        if (r, c) in self._flags:
            return self._flags[(r, c)]
        word, byte = self._word(r, c)
        # byte b >= t iff (word << (24 - 8 b)) >= (t << 24): the bytes below it only add less than 2^24
        shifted = word << (32 - VALUE_BITS - VALUE_BITS * byte) if byte < 3 else word
        return shifted >= self.mask.threshold

    def apply_pair(self, r: int, c: int, pair):
        """The 16-bit pair (elements (r, c), (r, c + 1), c even) with its dropped lanes zeroed."""
        word, byte = self._word(r, c)
        return keep_pair(word, pair, self.mask.threshold_pair, byte == 0)

    def sign_pair(self, r: int, c: int, pair):
        """The 16-bit pair (elements (r, c), (r, c + 1), c even) with its dropped lanes negated (``keep_pair``'s
        ``sign``)."""
        word, byte = self._word(r, c)
        return keep_pair(word, pair, self.mask.threshold_pair, byte == 0, sign=True)

    def convert_pair(self, r: int, c: int, lo, hi, half: bool):
        """The fp32 elements (r, c) = ``lo`` and (r, c + 1) = ``hi`` (c even) as a 16-bit pair (fp16 where ``half``,
        else bf16) with its dropped lanes zeroed."""
        word, byte = self._word(r, c)
        return keep_pair_f32(word, lo, hi, self.mask.threshold_pair, byte == 0, half)


class RunKeepFlags(KeepFlags):
    """``KeepFlags`` of a warp whose fragment is one run of neighbouring n8 atoms (at most 32 columns) that starts
    at any multiple of 8 (``atom_run``; d128's ``kv_in_regs`` split: warp w's 24 keys start at 24 w). Its atoms
    fall in one or two 32-column cells, which only the run time knows, so each m16 atom draws both cells' calls
    (the second unused where the run stays in one cell) and each column takes its word and byte half from its own
    key position (``pick``): about 2.7x the draws of whole calls for 24 columns, for a split whose registers the
    other layouts do not fit."""

    def __init__(self, mask: DropoutMask, head_word, q0, k0, rows: int, cols: int, col_pos: list):
        self.mask, self.head_word, self.q0, self.k0 = mask, head_word, q0, k0
        self.col_pos = col_pos
        #: call-major: an m16 atom's two calls serve all of its elements
        self.order = [(r + half, c) for r in range(0, rows, 2) for c in range(cols) for half in range(2)]
        self.pairs = [(r, c) for r, c in self.order if c % 2 == 0]
        self._words, self._flags = {}, {}

    @staticmethod
    def pick(k, k_first):
        """For key column ``k`` of a run whose first column is ``k_first`` (Python ints or Uint32): (1 where its
        cell is the run's second, the 16-column half of the cell (its word within the row half), 16 where its byte
        pair is the word's upper one)."""
        return (k >> 5) - (k_first >> 5), (k >> 4) & 1, ((k >> 3) & 1) << 4

    def slot(self, r: int, c: int) -> tuple:
        raise NotImplementedError("RunKeepFlags picks words at run time (pick)")

    def _word(self, r: int, c: int):
        """The word holding element (r, c) shifted so that its byte pair is the low one, and the element's byte."""
        r0 = r - r % 2
        if r0 not in self._words:
            m = self.mask
            q = self.q0 + Uint32(m.t0ScS_rc[r0, 0][0])
            ctr0 = call_counter(q, self.k0)
            cell = self.k0 >> 5
            self._words[r0] = tuple(philox(ctr0, cell + Uint32(i), self.head_word, m.offset, m.key0, m.key1)
                                    for i in range(2))
        second_cell, upper, shift = self.pick(self.k0 + Uint32(self.col_pos[c]), self.k0)
        words = [select_word(call[2 * (r % 2)], call[2 * (r % 2) + 1], Uint32(0) - upper)
                 for call in self._words[r0]]
        word = select_word(words[0], words[1], Uint32(0) - second_cell)
        return word >> shift, c % 2


def _pair_slots(flags: KeepFlags, p16: cute.Tensor) -> list:
    """(r, c, index of the pair's 32-bit register in ``p16``) of every pair ``flags.pairs`` names, in its order
    (trace time; raises where a pair of S's columns is not one register)."""
    p_rc = acc_rows_cols(p16)
    out = []
    for r, c in flags.pairs:
        at = cute.crd2idx((r, c), p_rc.layout)
        if at % 2 or cute.crd2idx((r, c + 1), p_rc.layout) != at + 1:
            raise ValueError("dropout: a 16-bit pair of S's columns is not one 32-bit register")
        out.append((r, c, at // 2))
    return out


def _pair_words(p16: cute.Tensor) -> cute.Tensor:
    """A 16-bit register tensor as a flat tensor of its 32-bit words (neighbouring pairs)."""
    words = cute.recast_tensor(p16, Uint32)
    return cute.make_tensor(words.iterator, cute.make_layout(cute.size(words)))


def convert_keep_pairs(flags: KeepFlags, acc: cute.Tensor, p16: cute.Tensor, half: bool) -> None:
    """``p16`` (a 16-bit register tensor laid out like ``acc``, the fp32 S accumulator) = ``acc`` rounded, dropped
    elements zeroed, a pair of neighbouring columns per ``KeepFlags.convert_pair``, call by call: each call's
    elements leave fp32 as its words are used (the tiles whose registers cannot hold P in both widths beside the
    words: ``config.dropout_on_pairs``)."""
    flat = _pair_words(p16)
    src = cute.make_tensor(acc.iterator, cute.make_layout(cute.size(acc)))
    for r, c, w in _pair_slots(flags, p16):
        flat[w] = flags.convert_pair(r, c, src[2 * w], src[2 * w + 1], half)


def apply_keep_pairs(flags: KeepFlags, p16: cute.Tensor, sign: bool = False) -> None:
    """Zero the dropped elements of ``p16`` (a 16-bit register tensor laid out like the S accumulator), a pair of
    neighbouring columns per ``KeepFlags.apply_pair``, call by call; with ``sign``, negate them
    (``KeepFlags.sign_pair``)."""
    flat = _pair_words(p16)
    for r, c, w in _pair_slots(flags, p16):
        flat[w] = flags.sign_pair(r, c, flat[w]) if sign else flags.apply_pair(r, c, flat[w])


def signed_to_keep_pairs(p16: cute.Tensor) -> None:
    """``p16`` after ``apply_keep_pairs(sign=True)``, its negative elements zeroed: P keep, the 16-bit P V operand."""
    flat = _pair_words(p16)
    for w in range(cute.size(flat)):
        flat[w] = signed_to_keep(flat[w])
