"""Attention dropout's random numbers: the definition, and a torch implementation of it.

The keep mask of element (batch b, query head h, query row q, key column k) of a call is a function of the
call's (seed, offset) and of those four coordinates only: not of the kernel's tile, warp layout or
forward/backward direction, so the backward regenerates exactly the forward's mask with its own tiles, and
``dropout_keep_mask`` below reproduces it on any device (tests, and users who want the mask).

* The scores split into 16 x 32 cells (query rows 16 i.., key columns 32 j..). Inside a cell, one
  Philox4x32-7 call covers the 16 elements of rows (r, r + 8) and columns 2 c + {0, 1} + {0, 8, 16, 24},
  r in 0..7, c in 0..3: counter ``(32 i + 4 r + c, j, b * heads + h, offset mod 2^32)``, key
  ``(seed mod 2^32, (seed >> 32) mod 2^32)``.
* Its four 32-bit outputs are sixteen 8-bit values: word ``2 * (row // 8) + (column // 16)`` (row, column
  within the cell) holds that row's two columns ``2 c, 2 c + 1`` of both 8-column atoms of its 16-column half,
  byte ``2 * ((column // 8) mod 2) + column mod 2`` (the even column of the first atom in the low byte).
* An element is kept iff its 8-bit value is >= ``threshold = round(p * 256)`` (clamped to 255), so the keep
  probability is ``1 - threshold / 256``; kept values of P are scaled by its inverse (unbiased for the
  quantized p, which differs from p by at most 2^-9; FlashAttention-2 also draws bytes, and p below 2^-9
  rounds to no dropout).

The grouping is the m16n8 MMA accumulator's: the thread of lane l holds rows (l // 4, l // 4 + 8) and columns
2 (l % 4) + {0, 1} of every n8 atom, so a thread whose warp covers 32 neighbouring key columns computes one
Philox call per 16 of its score elements and uses all of it, with no exchange between lanes (every SM120 kernel
computes S = Q K^T with query rows as the accumulator's rows, forward and backward; a warp that covers 16
neighbouring columns uses half of each call). The byte pair of one row and atom is one PRMT away from two 16-bit
lanes, compared with the threshold as two half-precision values in one instruction and applied to the pair of
16-bit probabilities with one AND (``_kernels/dropout_mask``). Seven rounds, as FlashAttention-2's dropout:
Philox4x32 passes BigCrush from 7 (Salmon et al., SC'11); the round function is the Random123 one, checked
against its 10-round known answers. ``q`` and ``k`` are positions within the sequence (varlen: from each
sequence's start), ``h`` the query head.

Byte values halve the Philox work per element against 16-bit values (16 x 16 cells per call, p quantized to
2^-16). The mask a seed draws is fixed by this definition: a build that draws cells differently, such as the
16-bit builds of this bundle dated before 2026-11-27, draws another mask for the same seed.
"""

from __future__ import annotations

from typing import Optional

import torch

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
#: rounds of the dropout mask's Philox calls (the kernels' and ``dropout_keep_mask``'s)
ROUNDS = 7
CELL = 16
#: key columns of one Philox call's cell (``CELL`` query rows by ``CELL_K`` key columns)
CELL_K = 32
#: bits of one element's random value, and the threshold's range
VALUE_BITS = 8
VALUE_RANGE = 1 << VALUE_BITS
_U32 = 0xFFFFFFFF


def _mulhilo(a: int, x: torch.Tensor) -> tuple:
    lo = (x * a) & _U32  # the product wraps in int64; its low 32 bits are exact
    hi = ((x >> 16) * a + ((x & 0xFFFF) * a >> 16)) >> 16  # floor(x * a / 2^32) from two 48-bit products
    return hi & _U32, lo


def philox4x32(ctr: tuple, key: tuple, rounds: int = ROUNDS) -> tuple:
    """Philox4x32-``rounds`` of counters ``ctr`` (four int64 tensors or ints holding unsigned 32-bit values,
    broadcast together) under ``key`` (two ints or tensors); returns four int64 tensors of 32-bit words."""
    c0, c1, c2, c3 = (torch.as_tensor(c, dtype=torch.int64) for c in ctr)
    k0, k1 = (torch.as_tensor(k, dtype=torch.int64) for k in key)
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & _U32, (k1 + PHILOX_W1) & _U32
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox4x32_10(ctr: tuple, key: tuple) -> tuple:
    """Philox4x32-10 (Random123's default; its known answers check the round function)."""
    return philox4x32(ctr, key, 10)


def keep_threshold(p: float) -> int:
    """The 8-bit threshold of dropout probability ``p`` (an element is kept iff its value >= it)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p={p} must be in [0, 1)")
    return min(VALUE_RANGE - 1, round(p * VALUE_RANGE))


def keep_scale(p: float) -> float:
    """The factor applied to kept probabilities: the inverse of the quantized keep probability."""
    return VALUE_RANGE / (VALUE_RANGE - keep_threshold(p))


def _signed32(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word


def rng_tensor(seed: Optional[int], offset: int, p: float, device=None) -> torch.Tensor:
    """The kernels' dropout slot: int32 (seed low word, seed high word, offset, threshold) (two's complement
    views of the unsigned words). ``seed`` None draws the two seed words from torch's generator of ``device``
    (``torch.manual_seed`` reproduces a run). Built by device-side fills and ``torch.randint`` only (no host
    copy, no sync), so a call is capturable in a CUDA graph (each replay draws a fresh seed, as torch's own
    random ops do) and traceable by torch.compile."""
    slot = torch.full((4,), keep_threshold(p), dtype=torch.int32, device=device)
    slot[2].fill_(_signed32(offset & _U32))
    if seed is None:
        slot[:2].copy_(torch.randint(-(1 << 31), 1 << 31, (2,), dtype=torch.int32, device=device))
    else:
        slot[0].fill_(_signed32(seed & _U32))
        slot[1].fill_(_signed32((seed >> 32) & _U32))
    return slot


def dropout_keep_mask(seed: int, offset: int, batch: int, heads: int, seqlen_q: int, seqlen_k: int, p: float,
                      device=None) -> torch.Tensor:
    """The keep mask (bool, (batch, heads, seqlen_q, seqlen_k)) the kernels use for a call with this seed,
    offset and dropout probability (see the module docstring)."""
    threshold = keep_threshold(p)
    q = torch.arange(seqlen_q, device=device, dtype=torch.int64).view(1, 1, -1, 1)
    k = torch.arange(seqlen_k, device=device, dtype=torch.int64).view(1, 1, 1, -1)
    bh = (torch.arange(batch, device=device, dtype=torch.int64).view(-1, 1, 1, 1) * heads
          + torch.arange(heads, device=device, dtype=torch.int64).view(1, -1, 1, 1))
    ctr0 = (q // CELL) * 32 + (q % 8) * 4 + (k % 8) // 2
    words = philox4x32((ctr0, k // CELL_K, bh, offset & _U32), (seed & _U32, (seed >> 32) & _U32))
    which = ((q % CELL) // 8) * 2 + (k % CELL_K) // CELL  # the word of each element
    word = torch.where(which == 0, words[0], torch.where(which == 1, words[1],
                                                         torch.where(which == 2, words[2], words[3])))
    byte = ((k % CELL) // 8) * 2 + k % 2
    value = (word >> (byte * VALUE_BITS)) & (VALUE_RANGE - 1)
    return (value >= threshold).expand(batch, heads, seqlen_q, seqlen_k)
