"""FP8 K/V on the host: FlashAttention-3's scale arguments, the widening of an FP8 q, the kernels' descale slots,
the refusals, and the forward every FP8 entry runs (eager, and inside the FP8 custom op under ``torch.compile``).

The kernels read FP8 K/V as stored and widen them on chip (``_kernels/kv_dequant``); the scales are per-call tensors,
so an FP8 call is never replayed from a remembered plan.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .autograd import needs_grad, run_call
from .config import decode_entry
from .launch import dispatch_model, with_packing
from .problem import FP8_DTYPES
from .validation import refuse_beside, validated_call


#: FlashAttention-3's FP8 scale arguments, taken out of an entry's keyword arguments (``fp8_args``)
DESCALE_ARGS = ("q_descale", "k_descale", "v_descale")


def fp8_args(kwargs: dict) -> Optional[tuple]:
    """``(q_descale, k_descale, v_descale)`` taken out of ``kwargs``, or None when the call passes none."""
    if not any(name in kwargs for name in DESCALE_ARGS):
        return None
    return tuple(kwargs.pop(name, None) for name in DESCALE_ARGS)


def is_fp8(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES


def widened_q(q, k, v, descales: Optional[tuple], fp8_mma: bool = True):
    """An FP8 q as the kernels take it (the output is bf16 either way, as FlashAttention-3 returns for FP8 inputs;
    q's scale joins K's, ``fp8_scales``): beside e4m3 K/V an e4m3 q stays FP8 and both GEMMs run FP8 MMAs
    (``FwdSpec.fp8_mma``: twice the bf16 MMA rate on an SM120, and no widening pass), P rounded to e4m3 as in
    FlashAttention-3; any other FP8 q is widened to bf16 (exact: every e4m3 / e5m2 value is a bf16 value) for the
    FP8 K/V kernel, where P stays 16-bit (always with ``fp8_mma`` False: ``flash_attn_with_kvcache``, whose
    appended rows are 16-bit). Raises for an FP8 q beside 16-bit K/V, and for scales given with 16-bit
    inputs."""
    if is_fp8(q):
        if not is_fp8(k):
            raise TypeError(f"q is {q.dtype} but k is {getattr(k, 'dtype', type(k).__name__)}: an FP8 q needs FP8 "
                            "K/V (FlashAttention-3's convention); pass q in bfloat16 / float16 beside 16-bit K/V")
        if fp8_mma and q.dtype == k.dtype == getattr(v, "dtype", None) == torch.float8_e4m3fn:
            return q
        return q.to(torch.bfloat16)
    if descales is not None and any(d is not None for d in descales) and not is_fp8(k):
        raise ValueError("q_descale / k_descale / v_descale scale FP8 inputs, but k and v are "
                         f"{getattr(k, 'dtype', type(k).__name__)}: drop the scales or pass FP8 K/V")
    if descales is not None and descales[0] is not None:
        raise ValueError(f"q_descale scales an FP8 q, but q is {q.dtype}: drop q_descale (a 16-bit q holds its values)")
    return q


def fp8_forward(q, k, v, varlen: Optional[dict], descales: Optional[tuple], mods: dict, softmax_scale, causal,
                window_size, learnable_sink, softcap, num_splits, pack_gqa, return_lse):
    """A forward over FP8 K/V (``FwdSpec.kv_dtype``), dense (``varlen`` None) or varlen (its keyword arguments), with
    FlashAttention-3's ``descales`` (q, k, v; ``fp8_scales``); an FP8 q is widened first (``widened_q``). Returns
    ``(out, lse or None)``."""
    refuse_beside("fp8", mods, needs_grad(q, k, v, learnable_sink))
    fp8_q = is_fp8(q)
    q = widened_q(q, k, v, descales)
    q, k, v, spec, shape, params, tensors = validated_call(q, k, v, varlen, softmax_scale, causal, window_size, softcap,
                                                          learnable_sink, descales=descales, fp8_q=fp8_q)
    q, spec = decode_widened(q, with_packing(spec, shape, pack_gqa), shape)
    return run_call(q, k, v, spec, shape, params, tensors, num_splits, return_lse, None, learnable_sink, False,
                    grad=False)


def decode_widened(q, spec, shape):
    """``(q, spec)`` for the kernel that serves an all-e4m3 call fastest: packed decode rows (seqlen_q x group within
    the FP8 K/V decode tile's 16) run that tile with q widened to bf16 (exact; P stays 16-bit, so the result is as
    accurate as the FP8 MMA tile's or more), since the FP8 MMA tile's 128 rows would be mostly padding and both read
    the same K/V bytes (16 x 8192 d128 32/8 on an H200: 79 us against 305). Other calls keep q and the FP8 MMAs."""
    if not (spec.fp8_mma and spec.pack_gqa):
        return q, spec
    widened = dataclasses.replace(spec, fp8_mma=False)
    entry = decode_entry(widened, dispatch_model(q.device))
    if entry is None or shape.seqlen_q * (shape.num_heads // shape.num_heads_kv) > entry.tile_m:
        return q, spec
    return q.to(torch.bfloat16), widened
