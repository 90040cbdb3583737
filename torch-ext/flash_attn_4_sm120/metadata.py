"""Opt-in host check of varlen metadata (``cu_seqlens``, ``seqused``, ``max_seqlen``).

The kernels never trust metadata for memory safety: every sequence start and length they derive from
``cu_seqlens`` / ``seqused`` is clamped to the extents of the tensor it indexes
(``_kernels/seqlen_info.py``), so corrupt entries can only give wrong rows, never reads or writes
outside the tensors. This check finds those entries before the launch and names them. It costs a
device-to-host copy and a sync per call, so it is off unless the caller passes
``check_metadata=True`` or sets ``FA4_SM120_CHECK_METADATA=1``.

Rules checked (``ValueError`` naming the first offending entry):
  1. ``cu_seqlens``: ``cu[0] >= 0``, non-decreasing, ``cu[-1] <=`` the packed tensor's rows.
  2. ``seqused``: ``0 <= used[b] <=`` the rows sequence b has (dense: the tensor's seqlen; packed:
     ``cu[b+1] - cu[b]``).
  3. ``max_seqlen_q`` / ``max_seqlen_k`` (when given): at least every sequence's length (the grid is
     sized from ``max_seqlen_q``: rows past it would be left unwritten).
  4. ``page_table`` (paged K/V): every page a sequence's used keys fall in is in ``[0, num_pages)``, and
     ``seqused_k`` is within the keys a table row reaches (max_pages * page_size).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

CHECK_ENV = "FA4_SM120_CHECK_METADATA"


def check_requested(check_metadata: Optional[bool]) -> bool:
    """The caller's choice, else the environment (``FA4_SM120_CHECK_METADATA`` = 1/true/yes)."""
    if check_metadata is not None:
        return bool(check_metadata)
    return os.environ.get(CHECK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _lengths(side: str, x: torch.Tensor, cu: Optional[torch.Tensor], used: Optional[torch.Tensor],
             page_table: Optional[torch.Tensor] = None) -> list[int]:
    """Each sequence's length on one side (q or k), after checking that side's entries."""
    rows = x.shape[0] if cu is not None else x.shape[1]
    batch = x.shape[0]
    if page_table is not None:  # paged K: a table row reaches max_pages * page_size keys
        rows, batch = page_table.shape[1] * x.shape[1], page_table.shape[0]
    if cu is not None:
        cu_h = cu.tolist()
        if cu_h[0] < 0:
            raise ValueError(f"cu_seqlens_{side}[0] = {cu_h[0]} is negative")
        for b in range(len(cu_h) - 1):
            if cu_h[b + 1] < cu_h[b]:
                raise ValueError(f"cu_seqlens_{side}[{b + 1}] = {cu_h[b + 1]} < cu_seqlens_{side}[{b}] = {cu_h[b]}: "
                                 "offsets must not decrease")
        if cu_h[-1] > rows:
            raise ValueError(f"cu_seqlens_{side}[{len(cu_h) - 1}] = {cu_h[-1]} exceeds the {rows} rows of packed "
                             f"{side} (shape {tuple(x.shape)})")
        lengths = [cu_h[b + 1] - cu_h[b] for b in range(len(cu_h) - 1)]
    else:
        lengths = [rows] * batch
    if used is not None:
        for b, n in enumerate(used.tolist()):
            if not 0 <= n <= lengths[b]:
                where = f"sequence {b} has {lengths[b]} rows" + (
                    f" (cu_seqlens_{side})" if cu is not None else
                    " (max_pages * page_size of page_table)" if page_table is not None else f" (dense {side} seqlen)")
                raise ValueError(f"seqused_{side}[{b}] = {n} is outside [0, {lengths[b]}]: {where}")
            lengths[b] = n
    return lengths


def check_varlen_metadata(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                          page_table: Optional[torch.Tensor] = None) -> None:
    """Raise ``ValueError`` naming the first metadata entry that breaks the module's rules."""
    for side, x, cu, used, given in (("q", q, cu_seqlens_q, seqused_q, max_seqlen_q),
                                     ("k", k, cu_seqlens_k, seqused_k, max_seqlen_k)):
        lengths = _lengths(side, x, cu, used, page_table if side == "k" else None)
        if side == "k" and page_table is not None:
            check_page_table_entries(page_table, k.shape[0], k.shape[1], lengths)
        if given is not None and lengths and max(lengths) > int(given):
            b = lengths.index(max(lengths))
            raise ValueError(f"max_seqlen_{side} = {int(given)} but sequence {b} has {lengths[b]} {side} rows")


def check_page_table_entries(page_table: torch.Tensor, num_pages: int, page_size: int, lengths: list[int]) -> None:
    """Every page holding one of sequence b's first ``lengths[b]`` keys lies in ``[0, num_pages)``."""
    table = page_table.tolist()
    for b, n in enumerate(lengths):
        for i in range(-(-n // page_size)):
            if not 0 <= table[b][i] < num_pages:
                raise ValueError(f"page_table[{b}, {i}] = {table[b][i]} is outside the {num_pages} pages of the paged "
                                 f"K/V cache (sequence {b} uses {n} keys, pages 0..{-(-n // page_size) - 1} of its row)")
