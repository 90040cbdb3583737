"""Public split-KV combine: merge attention results that the caller computed over separate key ranges.

``flash_attn_combine`` has upstream FlashAttention-4's signature and semantics. It serves callers who
split the keys of one attention themselves (over calls, devices or caches: context parallelism, cascade
or prefix-cache attention) and merge the pieces. Split ``s`` brings, for every (query row, head), its
normalized output ``O_s`` and its natural-log sum-exp ``lse_s``; the merged row is
    lse = log(sum_s exp(lse_s)),        O = sum_s exp(lse_s - lse) O_s
computed in fp32. A split with ``lse_s = -inf`` (it saw no key of the row) has weight 0; a row that every
split left at -inf gets O = 0 and lse = -inf. The kernel is the forward's own combine
(``_kernels/fwd_combine.py``, one warp per row); there is no learnable sink here.

Layouts (upstream's):
  * dense: ``out_partial`` (num_splits, batch, seqlen, heads, head_dim), ``lse_partial`` (num_splits,
    batch, seqlen, heads); returns out (batch, seqlen, heads, head_dim) and lse (batch, seqlen, heads).
  * packed: ``out_partial`` (num_splits, total, heads, head_dim), ``lse_partial`` (num_splits, total,
    heads); returns out (total, heads, head_dim) and lse (total, heads). ``cu_seqlens`` (batch + 1,)
    marks the sequences; without it the rows are one sequence.
  * ``seqused`` (batch,) caps each sequence's rows (one entry when packed without ``cu_seqlens``).
The returned lse is a transposed view of a (batch, heads, seqlen) / (heads, total) fp32 buffer, as
upstream's. ``return_lse=False`` returns None in its place.

Features and constraints:
  * ``out_partial``: float32 (read in place), bfloat16 or float16 (converted to an fp32 copy first);
    ``lse_partial``: float32. Any number of splits >= 0 (zero splits: out = 0, lse = -inf).
  * ``out_dtype`` (default: ``out_partial``'s dtype, as upstream): float32, bfloat16 or float16. With a
    preallocated ``out`` its dtype decides; an ``out_dtype`` that disagrees is an error.
  * head_dim: any multiple of 8 in [8, 512] (``problem.check_head_dim``, as upstream's).
  * ``cu_seqlens`` / ``seqused``: 1-D contiguous int32 on the partials' device. Metadata is clamped as
    in the forward (``_kernels/seqlen_info.py``): sequence b covers rows [start, start + length) with
    start = clamp(cu_seqlens[b], 0, total) and length = clamp(cu_seqlens[b + 1], start, total) - start,
    or clamp(seqused[b], 0, total - start) when ``seqused`` is given (dense: clamp(seqused[b], 0, seqlen)).
  * Every row of out and lse is written. Rows no sequence covers (past ``seqused``, outside every
    ``cu_seqlens`` range) get out = 0 and lse = -inf; upstream leaves them unwritten.
  * dense batch <= 65535 (the kernel's grid z); the packed layout has no such limit.
  * ``virtual_batch_idx`` (a persistent scheduler's batch order) is refused (NotImplementedError).
  * No device sync, so the call can be captured in a CUDA graph.

Algorithm:
  1. Validate types, ranks, dtypes, shapes and metadata (all before touching CUDA), then devices.
  2. View every layout as dense: packed rows are one sequence of a batch of 1 (the merge is row-wise,
     so sequence boundaries only decide which rows are covered).
  3. Make the O partials readable in place: fp32, unit last stride, 16-byte aligned rows; anything
     else is copied once (``maybe_contiguous`` in upstream), costing a pass over num_splits x rows x
     heads x head_dim x 4 bytes.
  4. Give the kernel its LSE layout (num_splits, batch, heads, seqlen) with a unit last stride. The
     caller's (..., seqlen, heads) tensor transposed has stride ``heads`` there, so the LSE partials are
     copied once: num_splits x rows x heads x 4 bytes read and written, 1/head_dim of the O partials'
     traffic. No copy when the transposed view is already readable (seqlen 1, as in decode; one head;
     partials that were a transposed (..., heads, seqlen) buffer) and no row needs masking.
  5. Rows that no sequence covers have every split's LSE set to -inf in that copy, so the kernel
     writes out = 0 and lse = -inf there without per-sequence bounds (a packed grid sized by the
     longest sequence would need a device sync to learn it).
  6. Launch the combine kernel ``CombineSpec(out dtype, head_dim)`` (dense, no seqused, no sink) on
     the execution model of the partials' device.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch

from . import compiler
from .execution_model import COMPILE_TARGET_ENV, DISPATCH_ENV
from .launch import launch_on, model_and_target
from .problem import CombineSpec, check_head_dim, misaligned_row_dim

#: output dtype -> ``CombineSpec.dtype``
_OUT_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_PARTIAL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: the kernel's grid z extent enumerates the dense batch
_MAX_GRID_Z = 65535


def flash_attn_combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    seqused: Optional[torch.Tensor] = None,
    virtual_batch_idx: Optional[torch.Tensor] = None,
    return_lse: bool = True,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Merge ``num_splits`` partial attention results: ``lse = logsumexp_s(lse_s)``,
    ``out = sum_s exp(lse_s - lse) * out_s`` (module docstring: layouts, dtypes, costs).

    ``out_partial`` (num_splits, batch, seqlen, heads, head_dim) or (num_splits, total, heads, head_dim);
    ``lse_partial`` the same without head_dim, fp32. Returns ``(out, lse)``: out (batch, seqlen, heads,
    head_dim) / (total, heads, head_dim) in ``out_dtype`` (default out_partial's dtype) or ``out`` itself
    when given; lse (batch, seqlen, heads) / (total, heads) fp32, None unless ``return_lse``."""
    if virtual_batch_idx is not None:
        raise NotImplementedError("flash_attn_combine: virtual_batch_idx (a persistent scheduler's batch order) is "
                                  "not supported by flash_attn_4_sm120; pass the partials in batch order and "
                                  "virtual_batch_idx=None")
    packed, out_dtype = _validate(out_partial, lse_partial, out, out_dtype, cu_seqlens, seqused)
    _check_devices(out_partial, lse_partial=lse_partial, out=out, cu_seqlens=cu_seqlens, seqused=seqused)
    device = out_partial.device
    num_splits, heads = out_partial.shape[0], out_partial.shape[-2]
    if out is None:
        out = torch.empty(out_partial.shape[1:], dtype=out_dtype, device=device)
    # 2. every layout as dense (batch, seqlen, ...)
    o5, lse5, out4 = (out_partial.unsqueeze(1), lse_partial.unsqueeze(1), out.unsqueeze(0)) if packed else (
        out_partial, lse_partial, out)
    rows = o5.shape[2]
    lse_buf = torch.empty((o5.shape[1], heads, rows), dtype=torch.float32, device=device)
    if out.numel() and num_splits == 0:  # the merge of nothing: attention over no keys
        out.zero_()
        lse_buf.fill_(-math.inf)
    elif out.numel():
        model, target = model_and_target(device.index, os.environ.get(DISPATCH_ENV),
                                         os.environ.get(COMPILE_TARGET_ENV))
        kernel = compiler.get_combine_kernel(CombineSpec(dtype=_OUT_DTYPES[out_dtype], head_dim_v=o5.shape[-1]),
                                             model, target)
        uncovered = _uncovered_rows(rows, cu_seqlens, seqused, device)
        args = (_readable_partials(o5), _kernel_lse(lse5, uncovered), out4, lse_buf, None, None, None, rows)
        launch_on(device, ((kernel, args),))
    if not return_lse:
        return out, None
    return out, (lse_buf[0] if packed else lse_buf).transpose(-1, -2)


def _validate(out_partial, lse_partial, out, out_dtype, cu_seqlens, seqused):
    """Step 1: every check on types, sizes, dtypes and metadata (CPU tensors get these errors too; devices
    come after, in ``_check_devices``). Returns (packed, output dtype)."""
    for name, t in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if out_partial.dtype not in _PARTIAL_DTYPES:
        raise TypeError(f"out_partial has dtype {out_partial.dtype}; flash_attn_combine takes torch.float32 "
                        "(or torch.bfloat16 / torch.float16, converted to float32 first)")
    if lse_partial.dtype != torch.float32:
        raise TypeError(f"lse_partial has dtype {lse_partial.dtype}; flash_attn_combine takes torch.float32")
    if out_partial.dim() not in (4, 5):
        raise ValueError("out_partial must be (num_splits, batch, seqlen, heads, head_dim) or (num_splits, total, "
                         f"heads, head_dim) (packed), got rank {out_partial.dim()} shape {tuple(out_partial.shape)}")
    if tuple(lse_partial.shape) != tuple(out_partial.shape[:-1]):
        raise ValueError(f"lse_partial must have shape {tuple(out_partial.shape[:-1])} (out_partial's without "
                         f"head_dim), got {tuple(lse_partial.shape)}")
    check_head_dim("out_partial head dim", out_partial.shape[-1])
    packed = out_partial.dim() == 4
    out_shape = tuple(out_partial.shape[1:])
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
        if out_dtype is not None and out_dtype != out.dtype:
            raise ValueError(f"out has dtype {out.dtype} but out_dtype is {out_dtype}; pass one of them")
        out_dtype = out.dtype
    elif out_dtype is None:
        out_dtype = out_partial.dtype  # upstream's default
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"output dtype {out_dtype} is not supported; flash_attn_combine writes torch.float32, "
                        "torch.bfloat16 or torch.float16")
    if out is not None:
        if tuple(out.shape) != out_shape:
            raise ValueError(f"out must have shape {out_shape} (out_partial's without num_splits), "
                             f"got {tuple(out.shape)}")
        if out.numel() and (out.stride(-1) != 1 or out.data_ptr() % 16 or misaligned_row_dim(out) is not None):
            raise ValueError(f"out (strides {tuple(out.stride())}) must be contiguous in its last dimension with "
                             "16-byte aligned rows (the kernel stores 16-byte vectors); pass a contiguous out")
    if cu_seqlens is not None and not packed:
        raise ValueError("cu_seqlens goes with packed partials (num_splits, total, heads, head_dim); dense "
                         "(num_splits, batch, seqlen, heads, head_dim) partials take seqused only")
    batch = out_partial.shape[1] if not packed else 1
    if cu_seqlens is not None:
        _check_index_vector("cu_seqlens", cu_seqlens, None)
        if cu_seqlens.shape[0] < 1:
            raise ValueError("cu_seqlens must have batch + 1 >= 1 entries, got 0")
        batch = cu_seqlens.shape[0] - 1
    if seqused is not None:
        _check_index_vector("seqused", seqused, batch)
    if not packed and batch > _MAX_GRID_Z:
        raise ValueError(f"dense batch {batch} exceeds {_MAX_GRID_Z} (the combine grid's z extent); pass the "
                         "partials packed as (num_splits, batch * seqlen, heads, head_dim) (with seqused: "
                         "cu_seqlens = arange(batch + 1) * seqlen)")
    return packed, out_dtype


def _check_devices(out_partial, **tensors) -> None:
    """Step 1, last: everything on out_partial's CUDA device."""
    device = out_partial.device
    if device.type != "cuda":
        raise ValueError(f"out_partial must be a CUDA tensor, got device {device}")
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device}; it must be on out_partial's device {device}")


def _check_index_vector(name: str, t, length: Optional[int]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} has dtype {t.dtype}; it must be torch.int32")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries (one per sequence), got {t.shape[0]}")
    if t.shape[0] > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (stride {t.stride(0)}); call .contiguous() first")


def _readable_partials(o5: torch.Tensor) -> torch.Tensor:
    """Step 3: the O partials as the kernel reads them (fp32, unit last stride, 16-byte aligned rows),
    copied only when they are not."""
    if o5.dtype != torch.float32:
        return o5.to(torch.float32, memory_format=torch.contiguous_format)
    if o5.stride(-1) != 1 or o5.data_ptr() % 16 or misaligned_row_dim(o5) is not None:
        return o5.clone(memory_format=torch.contiguous_format)
    return o5


def _kernel_lse(lse5: torch.Tensor, uncovered: Optional[torch.Tensor]) -> torch.Tensor:
    """Steps 4-5: the LSE partials (num_splits, batch, seqlen, heads) as the kernel's (num_splits, batch,
    heads, seqlen) with a unit last stride, -inf on ``uncovered`` (batch, seqlen) rows."""
    view = lse5.transpose(-1, -2)
    if uncovered is None and (view.stride(-1) == 1 or view.shape[-1] == 1):
        return view
    lse = torch.empty(view.shape, dtype=torch.float32, device=view.device)
    lse.transpose(-1, -2).copy_(lse5)
    if uncovered is not None:
        lse.masked_fill_(uncovered[None, :, None, :], -math.inf)
    return lse


def _uncovered_rows(rows: int, cu_seqlens, seqused, device) -> Optional[torch.Tensor]:
    """(batch, rows) bool of the dense view (batch 1 when packed): True where no sequence covers the
    row, with the forward's clamping of the metadata (module docstring). None when every row is covered.
    Built from a few small device ops, without a sync."""
    if cu_seqlens is None and seqused is None:
        return None
    index = torch.arange(rows, device=device)
    if cu_seqlens is None:  # dense, or packed as one sequence: row r of sequence b is used iff r < seqused[b]
        return index[None, :] >= seqused[:, None]
    # packed: mark [start, end) of every sequence in a difference array; a row is covered where its
    # running sum is positive (ranges may overlap or be empty when the metadata says so)
    cu = cu_seqlens.long()
    start = cu[:-1].clamp(0, rows)
    end = (start + seqused.long().clamp(min=0) if seqused is not None else cu[1:]).clamp(max=rows)
    end = torch.maximum(end, start)
    delta = torch.zeros(rows + 1, dtype=torch.long, device=device)
    delta.index_add_(0, start, torch.ones_like(start))
    delta.index_add_(0, end, -torch.ones_like(end))
    return (delta.cumsum(0)[:rows] <= 0)[None, :]
