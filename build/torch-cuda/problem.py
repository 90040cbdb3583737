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


@dataclass(frozen=True)
class FwdSpec:
    dtype: str  # "bf16" | "fp16"
    head_dim: int
    head_dim_v: int
    causal: bool
    #: sliding window (left, right) bounds, runtime values; causal + window is local with right = 0
    local: bool = False
    #: logits = softcap * tanh(scores / softcap); the softcap value itself is a runtime value
    softcap: bool = False
    #: a learnable per-head sink logit in the softmax denominator (gpt-oss)
    has_sink: bool = False


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
    d = t.shape[-1]
    if d % 8 != 0 or not 8 <= d <= 256:
        raise ValueError(f"{name} head dim {d}: head dims must be multiples of 8 between 8 and 256 "
                         "(16-byte rows); pad the head dim with zeros to the next multiple of 8")
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


@dataclass(frozen=True)
class FwdParams:
    """Runtime scalars/tensors of one call, in the units the kernel takes."""

    softmax_scale: float
    #: exp2 scale of the stored scores: scale*log2(e), or softcap*log2(e) when the softcap is on
    scale_log2: float
    #: multiplier inside tanh (scale / softcap); 0 without softcap
    softcap_scale: float
    window_left: int
    window_right: int
    sink: Optional[torch.Tensor]


_LOG2_E = 1.0 / math.log(2.0)


def _window_bound(x) -> Optional[int]:
    """None or a negative value means unbounded (flash-attn's -1 convention)."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"window_size entries must be int or None, got {x!r}")
    return None if x < 0 else x


def validate_fwd(q, k, v, softmax_scale: Optional[float], causal: bool, window_size=(None, None),
                 softcap: float = 0.0, learnable_sink=None) -> tuple[FwdSpec, FwdShape, FwdParams]:
    """Check user inputs; return the compile spec, runtime shape and runtime parameters."""
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
    if num_heads_kv == 0 or num_heads % num_heads_kv != 0:
        raise ValueError(
            f"num_heads_q ({num_heads}) must be a multiple of num_heads_kv ({num_heads_kv}) for MHA/GQA/MQA"
        )
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    softmax_scale = float(softmax_scale)
    if not math.isfinite(softmax_scale) or softmax_scale <= 0.0:
        raise ValueError(f"softmax_scale must be a finite positive number, got {softmax_scale}")
    softcap = float(softcap or 0.0)
    if not math.isfinite(softcap) or softcap < 0.0:
        raise ValueError(f"softcap must be 0 (off) or a finite positive number, got {softcap}")
    if window_size is None:
        window_size = (None, None)
    if len(tuple(window_size)) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    left, right = (_window_bound(x) for x in window_size)
    if causal:
        right = 0  # causal + window = a local window ending on the diagonal
    local = left is not None or (right is not None and not causal)
    unbounded = seqlen_q + seqlen_k  # any bound this large changes nothing
    sink = None
    if learnable_sink is not None:
        if not isinstance(learnable_sink, torch.Tensor) or learnable_sink.shape != (num_heads,):
            raise ValueError(f"learnable_sink must be a tensor of shape (num_heads,) = ({num_heads},), "
                             f"got {getattr(learnable_sink, 'shape', type(learnable_sink))}")
        if not learnable_sink.is_floating_point() or learnable_sink.device != q.device:
            raise ValueError(f"learnable_sink must be a floating-point tensor on {q.device}")
        sink = learnable_sink.detach().to(torch.float32).contiguous()
    if q.device.type != "cuda":
        raise ValueError(f"flash_attn_4_sm120 runs on CUDA tensors; got tensors on {q.device}")
    spec = FwdSpec(dtype=_DTYPES[q.dtype], head_dim=head_dim, head_dim_v=head_dim_v,
                   causal=bool(causal) and not local, local=local, softcap=softcap > 0.0, has_sink=sink is not None)
    shape = FwdShape(batch, seqlen_q, seqlen_k, num_heads, num_heads_kv)
    params = FwdParams(
        softmax_scale=softmax_scale,
        scale_log2=(softcap if softcap > 0.0 else softmax_scale) * _LOG2_E,
        softcap_scale=softmax_scale / softcap if softcap > 0.0 else 0.0,
        window_left=min(left, unbounded) if left is not None else unbounded,
        window_right=min(right, unbounded) if right is not None else unbounded,
        sink=sink,
    )
    return spec, shape, params
