"""Host-side description of a forward call: validation of user tensors and the frozen spec.

``FwdSpec`` holds exactly the facts that change generated code (dtype, head dims, causal). Sizes
(batch, sequence lengths, head counts) are runtime values: one compiled kernel serves them all.
Pure host code: no CUDA calls, no allocation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
#: head dims the forward kernel is built and verified for (the manifest's envelope).
SUPPORTED_HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class FwdSpec:
    dtype: str  # "bf16" | "fp16"
    head_dim: int
    head_dim_v: int
    causal: bool


@dataclass(frozen=True)
class FwdShape:
    """Runtime sizes of one call (not part of any compile key)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    num_heads: int
    num_heads_kv: int


def _check_tensor(name: str, t, expected_rank: int = 4) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != expected_rank:
        raise ValueError(
            f"{name} must have rank {expected_rank} (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}"
        )
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; flash_attn_4_sm120 supports torch.bfloat16 and torch.float16")
    if t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension (stride {t.stride(-1)}); call .contiguous() first"
        )
    # 16-byte vector loads: the base address and every row stride must be multiples of 16 bytes.
    elem = t.element_size()
    if t.data_ptr() % 16 != 0:
        raise ValueError(
            f"{name} data pointer is not 16-byte aligned (address % 16 = {t.data_ptr() % 16}); "
            "pass a tensor that starts on a 16-byte boundary (e.g. .clone())"
        )
    for d in range(t.dim() - 1):
        if (t.stride(d) * elem) % 16 != 0 and t.shape[d] > 1:
            raise ValueError(
                f"{name} stride {t.stride(d)} of dim {d} is not a multiple of 16 bytes; call .contiguous() first"
            )


def validate_fwd(q, k, v, softmax_scale: Optional[float], causal: bool) -> tuple[FwdSpec, FwdShape, float]:
    """Check user inputs; return the compile spec, runtime shape and the resolved softmax scale."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    batch, seqlen_q, num_heads, head_dim = q.shape
    bk, seqlen_k, num_heads_kv, head_dim_k = k.shape
    if tuple(v.shape[:3]) != (bk, seqlen_k, num_heads_kv):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in (batch, seqlen_k, heads_kv)")
    if bk != batch:
        raise ValueError(f"q has batch {batch} but k/v have batch {bk}")
    if head_dim_k != head_dim:
        raise ValueError(f"q head_dim {head_dim} != k head_dim {head_dim_k}")
    head_dim_v = v.shape[3]
    from . import manifest

    if num_heads_kv == 0 or num_heads % num_heads_kv != 0:
        raise ValueError(
            f"num_heads_q ({num_heads}) must be a multiple of num_heads_kv ({num_heads_kv}) for MHA/GQA/MQA"
        )
    if head_dim_v != head_dim:
        manifest.require("head_dim_v_differs")
    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d % 8 != 0 or not 8 <= d <= 256:
            raise ValueError(f"{name}={d}: head dims must be multiples of 8 between 8 and 256")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        manifest.require("head_dim_256" if head_dim > 128 else "head_dim_any")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    softmax_scale = float(softmax_scale)
    if not math.isfinite(softmax_scale) or softmax_scale <= 0.0:
        raise ValueError(f"softmax_scale must be a finite positive number, got {softmax_scale}")
    if q.device.type != "cuda":
        raise ValueError(f"flash_attn_4_sm120 runs on CUDA tensors; got tensors on {q.device}")
    spec = FwdSpec(dtype=_DTYPES[q.dtype], head_dim=head_dim, head_dim_v=head_dim_v, causal=bool(causal))
    shape = FwdShape(batch, seqlen_q, seqlen_k, num_heads, num_heads_kv)
    return spec, shape, softmax_scale
