"""Batch invariance on request (``batch_invariant=True`` or ``FA4_SM120_BATCH_INVARIANT=1``): a row's output and LSE
are bitwise the same whatever else the call holds.

What changes with it, and why each piece is enough:
  * the forward walks a row's keys in blocks of one width per head-dim class, each row's block on one warp
    (``config.invariant_family``): every tile of that width gives a row the same bits whatever its mainloop, rows or
    warps, so the call picks among them by shape (``config.invariant_config``) and never runs the decode tile,
    which splits a row's keys over warps;
  * a call's keys are split over CTAs only in fixed chunks (``config.INVARIANT_CHUNK_KEYS`` keys from key 0, each
    chunk a split, ``FwdSpec.split_chunk``) merged by the combine in chunk order: a row gets the same chunks, and so
    the same partials, in every call that holds it, and chunks past its last key add exact zeros. A row of one chunk
    gets the unsplit tile's bits (the combine of one partial is exact), so calls up to one chunk long run unsplit,
    and the decode of a few long sequences gets a CTA per chunk. An explicit ``num_splits`` above 1 is refused: its
    pieces would move with the call's length;
  * the backward runs deterministically (``deterministic=True``: dQ's additions in a fixed key-block order) in the
    highest-first order without the group split, both of which the default deterministic mode picks by shape, and on
    one tile for every layout of the call's options (``bwd_config.bwd_invariant_config``).
Rows a call does not compute (padding, fully masked key blocks before a row's first visible key) add exact zeros, so a
decode step's row matches the same row inside a prefill.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

from .config import INVARIANT_CHUNK_KEYS
from .validation import refusal

#: Environment switch: ``1`` makes every call batch-invariant unless it passes ``batch_invariant=False``.
BATCH_INVARIANT_ENV = "FA4_SM120_BATCH_INVARIANT"
#: Keys per chunk of the batch-invariant calls (``config.INVARIANT_CHUNK_KEYS`` by default), read on first use: rows
#: are bitwise comparable between calls of one chunk size
CHUNK_KEYS_ENV = "FA4_SM120_INVARIANT_CHUNK_KEYS"


@functools.cache
def chunk_keys() -> int:
    """Keys per chunk of a batch-invariant call (``config.invariant_chunks``): ``CHUNK_KEYS_ENV`` or the default."""
    raw = os.environ.get(CHUNK_KEYS_ENV, "")
    if not raw:
        return INVARIANT_CHUNK_KEYS
    try:
        keys = int(raw)
    except ValueError:
        keys = 0
    if keys < 64 or keys % 64:
        raise ValueError(f"{CHUNK_KEYS_ENV}={raw!r}: a multiple of 64 keys (every batch-invariant key block width "
                         f"divides it), e.g. {INVARIANT_CHUNK_KEYS}")
    return keys


def requested(batch_invariant: Optional[bool]) -> bool:
    """The call's choice, or the environment's when it passes None."""
    if batch_invariant is None:
        return os.environ.get(BATCH_INVARIANT_ENV, "0") not in ("", "0")
    if not isinstance(batch_invariant, bool):
        raise TypeError(f"batch_invariant must be True, False or None, got {batch_invariant!r}")
    return batch_invariant


def invariant_splits(num_splits: Optional[int]) -> int:
    """The KV splits a batch-invariant call asks for: 1 (its fixed chunks are the plan's, ``config.invariant_chunks``);
    an explicit count above 1 is refused (even pieces move with the call's length)."""
    if num_splits not in (None, 0, 1):
        raise NotImplementedError(refusal(("batch_invariant", "split_kv")))
    return 1


def refuse_features(mods: Optional[dict] = None, fp8: bool = False, latent: bool = False) -> None:
    """Raise the manifest's message for what a batch-invariant call cannot combine with: mods / block sparsity
    (their tiles are their own), dropout, FP8 and MLA (``qv``: the wide kernels' tiles)."""
    mods = mods or {}
    flags = (("score_mod", mods.get("score_mod") is not None or mods.get("mask_mod") is not None),
             ("block_sparsity", mods.get("block_sparse_tensors") is not None),
             ("dropout", mods.get("dropout") is not None), ("fp8", fp8), ("head_dim_512", latent))
    wanted = tuple(name for name, on in flags if on)
    if wanted:
        message = refusal(("batch_invariant", *wanted))
        if message is not None:
            raise NotImplementedError(message)


def settle(batch_invariant: Optional[bool], num_splits: Optional[int], deterministic: bool,
           mods: Optional[dict] = None, fp8: bool = False, latent: bool = False) -> tuple:
    """(invariant, num_splits, deterministic) of a ``flash_attn_func`` / ``flash_attn_varlen_func`` call: a
    batch-invariant one refuses what it cannot combine with (``refuse_features``), runs one split
    (``invariant_splits``) and the deterministic backward; any other keeps its own."""
    invariant = requested(batch_invariant)
    if invariant:
        refuse_features(mods, fp8, latent)
        return True, invariant_splits(num_splits), True
    return False, num_splits, deterministic
