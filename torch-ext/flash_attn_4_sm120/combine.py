"""Public split-KV combine: merge partial attention results that callers split themselves.

``flash_attn_combine`` keeps upstream FlashAttention-4's signature and semantics, for users who split the
keys of one attention over calls, devices or caches (context parallelism, cascade attention) and merge
the pieces: each split ``s`` brings its normalized output ``O_s`` and log-sum-exp ``lse_s`` per (query
row, head), and the merged row is
    lse = log(sum_s exp(lse_s)),        O = sum_s exp(lse_s - lse) O_s
A split with ``lse_s = -inf`` (it saw no key of the row) has weight 0; a row that every split left at
-inf gets O = 0 and lse = -inf. It runs the forward's own combine kernel (``_kernels/fwd_combine.py``).

Layouts (upstream's):
  * dense: ``out_partial`` (num_splits, batch, seqlen, heads, head_dim), ``lse_partial`` (num_splits,
    batch, seqlen, heads); returns out (batch, seqlen, heads, head_dim) and lse (batch, seqlen, heads).
  * packed: ``out_partial`` (num_splits, total, heads, head_dim), ``lse_partial`` (num_splits, total,
    heads), optional ``cu_seqlens`` (batch + 1,) / ``seqused`` (batch,) int32; returns (total, heads,
    head_dim) and (total, heads). Without ``cu_seqlens`` the rows are one sequence.
The returned lse is a transposed view of a (batch, heads, seqlen) / (heads, total) buffer, as upstream's.
``out_dtype`` (default: out_partial's dtype) may be float32, bfloat16 or float16. Partials that are not
fp32 are converted, and the LSE partials are copied once into the kernel's (splits, ..., heads, rows)
layout (num_splits x rows x heads x 4 bytes: small next to the O partials, which are read in place when
their rows are 16-byte aligned). Rows past ``seqused`` are zero in an allocated output.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from . import compiler
from .execution_model import COMPILE_TARGET_ENV, DISPATCH_ENV
from .problem import CombineSpec, misaligned_row_dim

_OUT_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _check_vector(name: str, t, length: int, device) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"{name} must be a 1-D torch.int32 tensor of {length} entries, got "
                         f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")


def _fp32_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` in fp32 with a unit last stride and 16-byte rows (converted or copied only when needed)."""
    t = t if t.dtype == torch.float32 else t.float()
    if t.stride(-1) != 1 or t.data_ptr() % 16 or misaligned_row_dim(t) is not None:
        t = t.contiguous() if not t.is_contiguous() else t.clone()
    return t


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
    """Merge ``num_splits`` partial attention outputs (see the module docstring for the layouts).
    Returns ``(out, lse)``, lse None unless ``return_lse``."""
    from .interface import _model_and_target  # the dispatch model of this device (cached)

    if virtual_batch_idx is not None:
        raise NotImplementedError("flash_attn_combine: virtual_batch_idx (a persistent scheduler's batch order) is "
                                  "not supported; pass the partials in batch order")
    for name, t in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if out_partial.dim() not in (4, 5):
        raise ValueError("out_partial must be (num_splits, batch, seqlen, heads, head_dim) or (num_splits, total, "
                         f"heads, head_dim), got shape {tuple(out_partial.shape)}")
    packed = out_partial.dim() == 4
    if tuple(lse_partial.shape) != tuple(out_partial.shape[:-1]):
        raise ValueError(f"lse_partial must have shape {tuple(out_partial.shape[:-1])} (out_partial without head_dim), "
                         f"got {tuple(lse_partial.shape)}")
    if out_partial.shape[0] < 1:
        raise ValueError("out_partial needs at least one split")
    if not packed and cu_seqlens is not None:
        raise ValueError("cu_seqlens goes with packed partials (num_splits, total, heads, head_dim)")
    device = out_partial.device
    if device.type != "cuda" or lse_partial.device != device:
        raise ValueError(f"out_partial and lse_partial must be CUDA tensors on one device, got {device} and "
                         f"{lse_partial.device}")
    out_dtype = out_dtype or out_partial.dtype
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.float32, bfloat16 or float16, got {out_dtype}")
    head_dim = out_partial.shape[-1]
    if head_dim % 8 or not 8 <= head_dim <= 256:
        raise ValueError(f"head_dim {head_dim} must be a multiple of 8 in [8, 256]")
    num_splits, heads = out_partial.shape[0], out_partial.shape[-2]
    if packed:
        total = out_partial.shape[1]
        batch = cu_seqlens.shape[0] - 1 if isinstance(cu_seqlens, torch.Tensor) else 1
        if cu_seqlens is not None:
            _check_vector("cu_seqlens", cu_seqlens, batch + 1, device)
    else:
        batch, seqlen = out_partial.shape[1:3]
    if seqused is not None:
        _check_vector("seqused", seqused, batch, device)
    out_shape = tuple(out_partial.shape[1:])
    if out is None:
        out = (torch.zeros if seqused is not None else torch.empty)(out_shape, dtype=out_dtype, device=device)
    elif tuple(out.shape) != out_shape or out.dtype != out_dtype or out.device != device:
        raise ValueError(f"out must be a {out_dtype} tensor of shape {out_shape} on {device}; got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    elif out.stride(-1) != 1 or out.data_ptr() % 16 or misaligned_row_dim(out) is not None:
        raise ValueError("out must be contiguous in its last dimension with 16-byte aligned rows")

    o_part = _fp32_rows(out_partial)
    if packed and cu_seqlens is None:  # one sequence: the dense layout with batch 1
        o_part, out_k = o_part.unsqueeze(1), out.unsqueeze(0)
        lse_k = torch.empty((1, heads, total), dtype=torch.float32, device=device)
        lse_part = lse_partial.float().unsqueeze(1).permute(0, 1, 3, 2).contiguous()
        spec_packed, seqlen_arg = False, total
    elif packed:
        out_k, lse_k = out, torch.empty((heads, total), dtype=torch.float32, device=device)
        lse_part = lse_partial.float().permute(0, 2, 1).contiguous()
        spec_packed, seqlen_arg = True, total
    else:
        out_k, lse_k = out, torch.empty((batch, heads, seqlen), dtype=torch.float32, device=device)
        lse_part = lse_partial.float().permute(0, 1, 3, 2).contiguous()
        spec_packed, seqlen_arg = False, seqlen
    if seqused is not None:
        lse_k.fill_(-float("inf"))
    if out.numel() and num_splits:
        model, target = _model_and_target(device.index, os.environ.get(DISPATCH_ENV), os.environ.get(COMPILE_TARGET_ENV))
        spec = CombineSpec(dtype=_OUT_DTYPES[out_dtype], head_dim_v=head_dim, varlen_q=spec_packed,
                           seqused_q=seqused is not None, has_sink=False)
        kernel = compiler.get_combine_kernel(spec, model, target)
        with torch.cuda.device(device):
            kernel(o_part, lse_part, out_k, lse_k, None, cu_seqlens if spec_packed else None, seqused, seqlen_arg)
    if not return_lse:
        return out, None
    lse = lse_k[0] if packed and cu_seqlens is None else lse_k
    return out, lse.transpose(-1, -2)
