"""MLA's absorbed attention on the host: upstream's ``qv`` argument (FlashAttention-3's convention).

DeepSeek-V2 / V3-style models cache one latent row per token (``v``: (…, heads_kv, head_dim_v), usually 512 wide) and
a rope key (``k``: (…, heads_kv, 64)); with the key up-projection absorbed into the query, each head's score is
``q k^T + qv v^T`` (``q`` the rope query, ``qv`` (…, heads, head_dim_v) the absorbed one) and its output ``P v``.
That is attention with 576-wide queries [qv | q] and keys [v | k] whose values are the keys' first 512 columns
(``FwdSpec.latent_v``): the kernel (``_kernels/fwd_wide``) loads both halves of a key block into one shared-memory tile
and reads it for both GEMMs. The softmax scale defaults to ``1 / sqrt(head_dim + head_dim_v)``, as FlashAttention-3's.

The call is validated as the rope attention (q against k, v as the values), then runs with q widened to [qv | q]
(one copy of q: a decode step's few rows). The LSE comes back in upstream FlashAttention-4's layout for ``qv``: heads
last, (batch, seqlen_q, heads) or (total_q, heads) (a transposed view of the kernel's). Forward only: a gradient, FP8,
mods, block sparsity and dropout raise the manifest's messages (``head_dim_512``). ``flash_attn_with_kvcache`` builds
its attention with the same pieces (``latent_scale``, ``latent_spec``, ``joined_query``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .autograd import needs_grad, run_call
from .launch import with_packing
from .problem import LATENT_ROPE_DIM, MAX_HEAD_DIM, kernel_layout
from .validation import refusal, refuse_beside, validated_call


@torch.compiler.disable
def latent_call(q, k, v, qv, varlen: Optional[dict], mods: dict, fp8: bool, softmax_scale, causal, window_size,
                learnable_sink, softcap, num_splits, pack_gqa, return_lse):
    """An entry's forward with ``qv``, dense (``varlen`` None) or varlen / paged (its keyword arguments). Eager even
    under ``torch.compile``: the graph breaks here."""
    if needs_grad(q, k, v, learnable_sink) or (isinstance(qv, torch.Tensor) and qv.requires_grad):
        raise NotImplementedError(refusal(("head_dim_512", "backward")))
    if fp8:
        raise NotImplementedError(refusal(("head_dim_512", "fp8")))
    refuse_beside("head_dim_512", mods)  # (the gradient is refused above, on its own)
    softmax_scale = latent_scale(q, k, v, qv, softmax_scale)
    q, k, v, spec, shape, params, tensors = validated_call(q, k, v, varlen, softmax_scale, causal, window_size, softcap,
                                                          learnable_sink)
    spec = latent_spec(spec, q, qv)
    out, lse = run_call(joined_query(qv, q), k, v, with_packing(spec, shape, pack_gqa), shape, params, tensors,
                        num_splits, return_lse, None, learnable_sink, False, grad=False)
    # upstream's LSE layout with qv: heads last, (batch, seqlen_q, heads) or (total_q, heads)
    return out, (lse.transpose(-1, -2) if lse is not None else None)


def latent_scale(q, k, v, qv, softmax_scale) -> float:
    """``check_latent``, then the call's softmax scale: the caller's, else ``1 / sqrt(head_dim + head_dim_v)``."""
    check_latent(q, k, v, qv)
    return (q.shape[-1] + qv.shape[-1]) ** -0.5 if softmax_scale is None else softmax_scale


def latent_spec(spec, q, qv):
    """The rope attention's validated spec as the kernel runs it: queries [qv | q] wide, V read from the K tile."""
    return dataclasses.replace(spec, head_dim=q.shape[-1] + qv.shape[-1], latent_v=True)


def joined_query(qv, q) -> torch.Tensor:
    """The kernel's query rows [qv | q] (one copy: a decode step's few rows)."""
    return torch.cat([kernel_layout(qv), q], dim=-1)


def check_latent(q, k, v, qv) -> None:
    """``qv`` beside q, k, v: a tensor of q's dtype and device with q's rows and heads and v's head dim, and k the
    rope keys (``LATENT_ROPE_DIM`` wide)."""
    if not isinstance(qv, torch.Tensor):
        raise TypeError(f"qv must be a torch.Tensor, got {type(qv).__name__}")
    if qv.dtype != q.dtype or qv.device != q.device:
        raise TypeError(f"qv must have q's dtype and device ({q.dtype} on {q.device}), got {qv.dtype} on {qv.device}")
    expected = (*q.shape[:-1], v.shape[-1])
    if tuple(qv.shape) != expected:
        raise ValueError(f"qv must have shape {expected} (q's rows and heads, v's head dim), got {tuple(qv.shape)}")
    if v.shape[-1] % LATENT_ROPE_DIM or not LATENT_ROPE_DIM <= v.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"with qv, v holds the latent: a head dim that is a multiple of {LATENT_ROPE_DIM} up to "
                         f"{MAX_HEAD_DIM}, got {v.shape[-1]}")
    if k.shape[-1] != LATENT_ROPE_DIM:
        raise ValueError(f"with qv, k holds the rope keys: head dim {LATENT_ROPE_DIM} (DeepSeek-V2 / V3's), got "
                         f"{k.shape[-1]}; v holds the latent (head_dim_v)")
