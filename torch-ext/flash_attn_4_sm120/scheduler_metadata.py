"""``get_scheduler_metadata``: upstream flash-attn-4's scheduler-metadata call, with this bundle's planning.

Upstream prepares per-sequence tile and split counts on the device ahead of a varlen call (its varlen tile schedulers
read them) and takes them back as ``scheduler_metadata=``. This bundle's kernels need no such tensors: a call plans
its grid and splits on the host from shapes alone (``config.num_splits_for``), never from tensor contents, and a
repeated call replays its plan (``launch``), so a CUDA-graph-captured step is planned once either way.

The metadata is therefore advisory. ``get_scheduler_metadata`` takes upstream's arguments, checks them as upstream
does (at least one of the length tensors, one batch size among them, a GQA head count) and returns a
``SchedulerMetadata`` with upstream's field names, each None (no device tensors). ``flash_attn_varlen_func`` and
``flash_attn_with_kvcache`` accept it (and ``disable_scheduler_metadata``) and plan as they do without it, so code
written against upstream runs unchanged with the same results; FlashAttention-3's int32 metadata tensor is accepted
by ``flash_attn_with_kvcache`` alike.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .problem import check_head_dim


class SchedulerMetadata(NamedTuple):
    """Upstream's ``SchedulerMetadataTensorsTorch`` fields; None here: this bundle's kernels read no scheduler
    tensors (see the module docstring)."""

    num_m_blocks_ptr: Optional[torch.Tensor] = None
    num_splits_dynamic_ptr: Optional[torch.Tensor] = None
    virtual_batch_idx_ptr: Optional[torch.Tensor] = None
    num_nheads_in_l2_ptr: Optional[torch.Tensor] = None
    tile_count_semaphore: Optional[torch.Tensor] = None
    cu_total_m_blocks: Optional[torch.Tensor] = None
    cu_total_splits_m_blocks: Optional[torch.Tensor] = None
    blocks_to_batch_idx: Optional[torch.Tensor] = None


def get_scheduler_metadata(
    max_seqlen_q: int,
    max_seqlen_k: int,
    nheads: int,
    nheads_kv: int,
    headdim: int,
    num_splits: int,
    headdim_v: Optional[int] = None,
    pack_gqa: Optional[int] = None,
    causal: bool = False,
    window_size_left: Optional[int] = None,
    window_size_right: Optional[int] = None,
    seqlen_k_new: int = 0,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    leftpad_k: Optional[torch.Tensor] = None,
    seqlen_k_per_split: Optional[int] = None,
    _arch: Optional[int] = None,
) -> SchedulerMetadata:
    """Upstream's signature; returns the advisory ``SchedulerMetadata`` the varlen and KV-cache calls accept as
    ``scheduler_metadata=`` (see the module docstring). Raises ``ValueError`` / ``TypeError`` where upstream's checks
    fail: no length tensor, batch sizes that disagree, tensors on different devices or not int32, query heads that are
    not a multiple of the KV heads, head dims outside [8, 512]."""
    lengths = {"cu_seqlens_q": (cu_seqlens_q, 1), "cu_seqlens_k": (cu_seqlens_k, 1), "seqused_q": (seqused_q, 0),
               "seqused_k": (seqused_k, 0)}
    batches = {}
    for name, (t, extra) in lengths.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.int32:
            raise TypeError(f"{name} must be a 1-D int32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        batches[name] = t.shape[0] - extra
    if not batches:
        raise ValueError("get_scheduler_metadata needs at least one of cu_seqlens_q, cu_seqlens_k, seqused_q, "
                         "seqused_k (they give the batch size)")
    if len(set(batches.values())) > 1:
        raise ValueError(f"the length tensors disagree on the batch size: {batches}")
    devices = {t.device for t in (cu_seqlens_q, cu_seqlens_k, cu_seqlens_k_new, seqused_q, seqused_k, leftpad_k)
               if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"the length tensors are on different devices: {sorted(map(str, devices))}")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k), ("nheads", nheads),
                        ("nheads_kv", nheads_kv), ("num_splits", num_splits), ("seqlen_k_new", seqlen_k_new)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"{name} must be a non-negative int, got {value!r}")
    if nheads_kv < 1 or nheads % nheads_kv:
        raise ValueError(f"nheads={nheads} must be a positive multiple of nheads_kv={nheads_kv}")
    check_head_dim("headdim", headdim)
    check_head_dim("headdim_v", headdim if headdim_v is None else headdim_v)
    return SchedulerMetadata()


def check_scheduler_metadata(metadata, allow_tensor: bool = False) -> None:
    """Raise ``TypeError`` unless ``metadata`` is None, a ``SchedulerMetadata`` or (``allow_tensor``:
    FlashAttention-3's ``flash_attn_with_kvcache``) its int32 metadata tensor. Accepted metadata is advisory."""
    if metadata is None or isinstance(metadata, SchedulerMetadata):
        return
    if allow_tensor and isinstance(metadata, torch.Tensor) and metadata.dtype == torch.int32:
        return
    what = "a SchedulerMetadata" + (" or an int32 tensor" if allow_tensor else "")
    raise TypeError(f"scheduler_metadata must be None or {what} (get_scheduler_metadata's), got "
                    f"{type(metadata).__name__}")


__all__ = ["SchedulerMetadata", "get_scheduler_metadata"]
