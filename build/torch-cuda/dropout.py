"""Attention dropout's random numbers (issue 20): the definition, and a torch implementation of it.

The keep mask of element (batch b, query head h, query row q, key column k) of a call is a function of the
call's (seed, offset) and of those four coordinates only: not of the kernel's tile, warp layout, packed-GQA
folding or forward/backward direction, so the backward regenerates exactly the forward's mask with its own
tiles, and ``dropout_keep_mask`` below reproduces it on any device (tests, and users who want the mask).

* One Philox4x32-10 call (Salmon et al., SC'11; the Random123 constants) per logical row and group of 8
  key columns: counter ``(q, k // 8, b * heads + h, offset mod 2^32)``, key ``(seed mod 2^32, seed >> 32)``.
* Its four 32-bit outputs are eight 16-bit values, the value of column ``8 g + j`` being half ``j % 2``
  (low half first) of word ``j // 2``.
* An element is kept iff its 16-bit value is >= ``threshold = round(p * 65536)`` (clamped to 65535), so the
  keep probability is ``1 - threshold / 65536``; kept values of P are scaled by its inverse (unbiased for the
  quantized p, which differs from p by at most 2^-17).

``q`` and ``k`` are positions within the sequence (varlen: from each sequence's start), ``h`` the query head.
In a kernel the four threads of an MMA quad hold rows (r, r + 8) and two columns of each 8-column atom: each
computes one Philox call and the quad exchanges the halves (one call per 8 elements, as cheap as FA2's
layout-tied scheme, without its tie to the layout).
"""

from __future__ import annotations

import torch

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
COLS_PER_CALL = 8
_U32 = 0xFFFFFFFF


def _mulhilo(a: int, x: torch.Tensor) -> tuple:
    lo = (x * a) & _U32  # the product wraps in int64; its low 32 bits are exact
    hi = ((x >> 16) * a + ((x & 0xFFFF) * a >> 16)) >> 16  # floor(x * a / 2^32) from two 48-bit products
    return hi & _U32, lo


def philox4x32_10(ctr: tuple, key: tuple) -> tuple:
    """Philox4x32-10 of counters ``ctr`` (four int64 tensors or ints holding unsigned 32-bit values,
    broadcast together) under ``key`` (two ints or tensors); returns four int64 tensors of 32-bit words."""
    c0, c1, c2, c3 = (torch.as_tensor(c, dtype=torch.int64) for c in ctr)
    k0, k1 = (torch.as_tensor(k, dtype=torch.int64) for k in key)
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & _U32, (k1 + PHILOX_W1) & _U32
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def keep_threshold(p: float) -> int:
    """The 16-bit threshold of dropout probability ``p`` (an element is kept iff its value >= it)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p={p} must be in [0, 1)")
    return min(65535, round(p * 65536))


def keep_scale(p: float) -> float:
    """The factor applied to kept probabilities: the inverse of the quantized keep probability."""
    return 65536.0 / (65536 - keep_threshold(p))


def dropout_keep_mask(seed: int, offset: int, batch: int, heads: int, seqlen_q: int, seqlen_k: int, p: float,
                      device=None) -> torch.Tensor:
    """The keep mask (bool, (batch, heads, seqlen_q, seqlen_k)) the kernels use for a call with this seed,
    offset and dropout probability (see the module docstring)."""
    threshold = keep_threshold(p)
    groups = -(-seqlen_k // COLS_PER_CALL)
    q = torch.arange(seqlen_q, device=device, dtype=torch.int64).view(1, 1, -1, 1)
    g = torch.arange(groups, device=device, dtype=torch.int64).view(1, 1, 1, -1)
    bh = (torch.arange(batch, device=device, dtype=torch.int64).view(-1, 1, 1, 1) * heads
          + torch.arange(heads, device=device, dtype=torch.int64).view(1, -1, 1, 1))
    words = philox4x32_10((q, g, bh, offset & _U32), (seed & _U32, (seed >> 32) & _U32))
    halves = []
    for w in words:
        w = w.expand(batch, heads, seqlen_q, groups)
        halves += [w & 0xFFFF, w >> 16]
    values = torch.stack(halves, dim=-1).view(batch, heads, seqlen_q, groups * COLS_PER_CALL)[..., :seqlen_k]
    return values >= threshold
