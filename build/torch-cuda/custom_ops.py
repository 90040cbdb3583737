"""The namespaced custom ops that ``torch.compile`` graphs see, their fakes and their autograd.

Under ``torch.compile`` the public entries call ``CompiledFwd`` / ``CompiledVarlenFwd``: autograd functions whose
forward is the forward op and whose backward is the backward op, each traced by its fake (no graph break). The
ops' implementations validate the concrete tensors when the graph runs and replay remembered launch plans as
the eager entries do. Registration happens once per process and namespace (``_ops``), so several builds of this
kernel can be loaded side by side.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ._ops import add_op_namespace_prefix
from .autograd import dtype_of, gradients, needs_grad, per_call, replay, run_call
from .fp8 import fp8_forward, is_fp8
from .launch import call_key, remember, remembered, varlen_rememberable, with_packing
from .problem import kernel_layout
from .validation import check_options, refusal, refuse_beside, validate_varlen_call, validated, window_entries


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float], causal: bool,
              window_left: Optional[int], window_right: Optional[int], softcap: float,
              learnable_sink: Optional[torch.Tensor], num_splits: int,
              pack_gqa: Optional[bool], deterministic: bool,
              rng: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward op (``torch.compile`` graphs; autograd is the op's, ``_fwd_backward``): a repeated call runs
    its remembered plan, as ``flash_attn_func`` does."""
    key = None
    if rng is None:
        key, result = replay((q, k, v, learnable_sink), (softmax_scale, softcap), (window_left, window_right),
                             ("op", bool(causal), num_splits, pack_gqa), q, k, v, learnable_sink, None, True,
                             deterministic, grad=False)
        if result is not None:
            return result
    check_options(num_splits, pack_gqa)
    q, k, v, spec, shape, params = validated(q, k, v, softmax_scale, causal, (window_left, window_right), softcap,
                                             learnable_sink, rng)
    return run_call(q, k, v, with_packing(spec, shape, pack_gqa), shape, params, None, num_splits, True, key,
                    grad=False)


def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap, learnable_sink, num_splits,
              pack_gqa, deterministic, rng):
    out = q.new_empty((*q.shape[:3], v.shape[3]))
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse


def _varlen_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                 cu_seqlens_k: Optional[torch.Tensor], seqused_q: Optional[torch.Tensor],
                 seqused_k: Optional[torch.Tensor], max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
                 softmax_scale: Optional[float], causal: bool, window_left: Optional[int],
                 window_right: Optional[int], softcap: float, learnable_sink: Optional[torch.Tensor],
                 num_splits: int, pack_gqa: Optional[bool], check_metadata: Optional[bool],
                 page_table: Optional[torch.Tensor], deterministic: bool,
                 rng: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    key = None
    if varlen_rememberable(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_metadata, rng):
        varlen = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table)
        key, result = replay((q, k, v, learnable_sink, *varlen), (max_seqlen_q, max_seqlen_k, softmax_scale, softcap),
                             (window_left, window_right), ("varlen op", bool(causal), num_splits, pack_gqa), q, k, v,
                             learnable_sink, varlen, True, deterministic, grad=False)
        if result is not None:
            return result
    check_options(num_splits, pack_gqa)
    q, k, v = (kernel_layout(t) for t in (q, k, v))
    spec, shape, params, varlen = validate_varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, softmax_scale,
        causal, (window_left, window_right), softcap, learnable_sink, check_metadata, page_table, rng)
    return run_call(q, k, v, with_packing(spec, shape, pack_gqa), shape, params, varlen, num_splits, True, key,
                    grad=False)


def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                 softmax_scale, causal, window_left, window_right, softcap, learnable_sink, num_splits, pack_gqa,
                 check_metadata, page_table, deterministic, rng):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    heads = q.shape[-2]
    lse_shape = (heads, q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], heads, q.shape[1])
    return out, q.new_empty(lse_shape, dtype=torch.float32)


def _fp8_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
              cu_seqlens_k: Optional[torch.Tensor], seqused_q: Optional[torch.Tensor], seqused_k: Optional[torch.Tensor],
              max_seqlen_q: Optional[int], max_seqlen_k: Optional[int], softmax_scale: Optional[float], causal: bool,
              window_left: Optional[int], window_right: Optional[int], softcap: float,
              learnable_sink: Optional[torch.Tensor], num_splits: int, pack_gqa: Optional[bool],
              check_metadata: Optional[bool], page_table: Optional[torch.Tensor], q_descale: Optional[torch.Tensor],
              k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor],
              dense: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 K/V forward op (inference: no autograd; ``fp8.fp8_forward``), dense or varlen."""
    varlen = None if dense else dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                     max_seqlen_k=max_seqlen_k, seqused_q=seqused_q, seqused_k=seqused_k,
                                     page_table=page_table, check_metadata=check_metadata)
    return fp8_forward(q, k, v, varlen, (q_descale, k_descale, v_descale), {}, softmax_scale, causal,
                       (window_left, window_right), learnable_sink, softcap, num_splits or None, pack_gqa, True)


def _fp8_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
              causal, window_left, window_right, softcap, learnable_sink, num_splits, pack_gqa, check_metadata,
              page_table, q_descale, k_descale, v_descale, dense):
    out, lse = _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                            softmax_scale, causal, window_left, window_right, softcap, learnable_sink, num_splits,
                            pack_gqa, check_metadata, page_table, False, None)
    return (out.to(torch.bfloat16) if is_fp8(q) else out), lse


def _bwd_impl(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, softmax_scale: Optional[float], causal: bool,
              window_left: Optional[int], window_right: Optional[int], softcap: float,
              learnable_sink: Optional[torch.Tensor], deterministic: bool,
              rng: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    key = call_key((q, k, v, learnable_sink), (softmax_scale, softcap, window_left, window_right),
                   ("bwd op", bool(causal), rng is None))
    q, k, v, spec, shape, params = _validated_once(key, (q, k, v), learnable_sink, rng, lambda q, k, v: validated(
        q, k, v, softmax_scale, causal, (window_left, window_right), softcap, learnable_sink, rng)[3:])
    dq, dk, dv, dsink = gradients(q, k, v, out, lse, dout, dlse, spec, shape, params, None, dtype_of(learnable_sink),
                                  deterministic)
    return dq, dk, dv, _dsink_out(dsink, q)


def _validated_once(key, qkv, learnable_sink, rng, validate) -> tuple:
    """``(q, k, v, spec, shape, params)`` of a backward op's call: on the first call with ``key`` (``call_key``;
    None: every call) q / k / v in the kernels' layout (copied where they cannot be read in place) and
    ``validate(q, k, v)`` -> (spec, shape, params), remembered in the shared plans table (a training step repeats
    its calls); later calls put their own sink and dropout slot back (``per_call``). A key's tensors are read
    in place, so a remembered call's q / k / v are the kernels'."""
    call = remembered(key)
    if call is None:
        qkv = tuple(kernel_layout(t) for t in qkv)
        call = validate(*qkv)
        if key is not None:
            remember(key, (*call[:2], dataclasses.replace(call[2], sink=None, rng=None)))
        return (*qkv, *call)
    spec, shape, params = call
    return (*qkv, spec, shape, per_call(params, learnable_sink, rng))


def _bwd_fake(dout, dlse, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
              learnable_sink, deterministic, rng):
    grads = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v)]
    sink = learnable_sink.new_empty(learnable_sink.shape) if learnable_sink is not None else \
        q.new_empty((0,), dtype=torch.float32)
    return (*grads, sink)


def _varlen_bwd_impl(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                     cu_seqlens_k: Optional[torch.Tensor], seqused_q: Optional[torch.Tensor],
                     seqused_k: Optional[torch.Tensor], max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
                     softmax_scale: Optional[float], causal: bool, window_left: Optional[int],
                     window_right: Optional[int], softcap: float, learnable_sink: Optional[torch.Tensor],
                     deterministic: bool,
                     rng: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    varlen = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, None)
    key = None
    if varlen_rememberable(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, False, rng):
        key = call_key((q, k, v, learnable_sink, *varlen[:4]),
                       (max_seqlen_q, max_seqlen_k, softmax_scale, softcap, window_left, window_right),
                       ("varlen bwd op", bool(causal)))

    def validate(q, k, v):
        return validate_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                                    seqused_k, softmax_scale, causal, (window_left, window_right), softcap,
                                    learnable_sink, False, rng=rng)[:3]

    q, k, v, spec, shape, params = _validated_once(key, (q, k, v), learnable_sink, rng, validate)
    dq, dk, dv, dsink = gradients(q, k, v, out, lse, dout, dlse, spec, shape, params, varlen, dtype_of(learnable_sink),
                                  deterministic)
    return dq, dk, dv, _dsink_out(dsink, q)


def _varlen_bwd_fake(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, learnable_sink,
                     deterministic, rng):
    return _bwd_fake(dout, dlse, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
                     learnable_sink, deterministic, rng)


def _dsink_out(dsink, q):
    """A custom op returns tensors only: no sink -> an empty fp32 tensor (mapped back to None)."""
    return dsink if dsink is not None else q.new_empty((0,), dtype=torch.float32)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, window_left, window_right, softcap, sink, _, _, deterministic, rng = inputs
    ctx.save_for_backward(q, k, v, *output, sink, rng)
    ctx.scalars = (softmax_scale, causal, window_left, window_right, softcap)
    ctx.deterministic = deterministic


def _fwd_backward(ctx, dout, dlse):
    """Autograd of the dense forward op (``torch.compile`` graphs): the backward op, traced like the forward."""
    q, k, v, out, lse, sink, rng = ctx.saved_tensors
    dq, dk, dv, dsink = _bwd_op(dout, dlse, q, k, v, out, lse, *ctx.scalars, sink, ctx.deterministic, rng)
    return dq, dk, dv, None, None, None, None, None, (dsink if sink is not None else None), None, None, None, None


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k, softmax_scale, causal, window_left, window_right, softcap,
     sink, _, _, _, page_table, deterministic, rng) = inputs
    ctx.save_for_backward(q, k, v, *output, cu_q, cu_k, used_q, used_k, sink, rng)
    ctx.scalars = (max_q, max_k, softmax_scale, causal, window_left, window_right, softcap)
    ctx.paged = page_table is not None
    ctx.deterministic = deterministic


def _varlen_backward(ctx, dout, dlse):
    """Autograd of the varlen forward op; paged K/V (an inference layout) has no backward."""
    if ctx.paged:
        raise NotImplementedError(refusal(("paged_kv", "backward")))
    q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink, rng = ctx.saved_tensors
    dq, dk, dv, dsink = _varlen_bwd_op(dout, dlse, q, k, v, out, lse, cu_q, cu_k, used_q, used_k, *ctx.scalars,
                                       sink, ctx.deterministic, rng)
    return (dq, dk, dv) + (None,) * 11 + ((dsink if sink is not None else None),) + (None,) * 6


#: This build's op library, kept alive for the process (dropping it would remove the ops' registrations).
_OP_LIBRARIES: dict = {}


def _register_op(name: str, impl, fake):
    """Register this build's op ``name`` once per process. The name carries the build's namespace, so two builds
    never collide; the same build imported twice (clone import + get_kernel) reuses it. Defined through
    ``torch.library.Library`` with one CompositeExplicitAutograd kernel and a fake, not ``torch.library.custom_op``:
    the latter wraps every call in Python layers (an autograd kernel, an alias check, a dynamo guard) that cost a
    compiled training step ~40-80 us of host time per op call (measured on the H100 device host, 2026-11-27). The
    ops carry no autograd: ``torch.compile`` reaches them through
    ``CompiledFwd`` / ``CompiledVarlenFwd``, whose backward calls the backward ops."""
    qualname = add_op_namespace_prefix(name)
    namespace, short = qualname.split("::")
    if not hasattr(getattr(torch.ops, namespace), short):
        lib = _OP_LIBRARIES.get(namespace)
        if lib is None:  # one library per namespace, made at the first op
            lib = _OP_LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
        lib.define(short + torch.library.infer_schema(impl, mutates_args=()))
        lib.impl(short, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(qualname, fake, lib=lib)
    return getattr(getattr(torch.ops, namespace), short).default


_bwd_op = _register_op("bwd", _bwd_impl, _bwd_fake)


_varlen_bwd_op = _register_op("varlen_bwd", _varlen_bwd_impl, _varlen_bwd_fake)


_fwd_op = _register_op("fwd", _fwd_impl, _fwd_fake)


_varlen_op = _register_op("varlen_fwd", _varlen_impl, _varlen_fake)


_fp8_op = _register_op("fp8_fwd", _fp8_impl, _fp8_fake)


def fp8_call(q, k, v, varlen: Optional[dict], descales: Optional[tuple], mods: dict, softmax_scale, causal, window_size,
             learnable_sink, softcap, num_splits, pack_gqa, return_lse):
    """An entry's FP8 K/V forward (``fp8.fp8_forward``): eager, or under ``torch.compile`` the FP8 op (inference: the
    refusals, a gradient's included, are raised while tracing)."""
    if not torch.compiler.is_compiling():
        return fp8_forward(q, k, v, varlen, descales, mods, softmax_scale, causal, window_size, learnable_sink, softcap,
                           num_splits, pack_gqa, return_lse)
    refuse_beside("fp8", mods, needs_grad(q, k, v, learnable_sink))
    vl = varlen or {}
    out, lse = _fp8_op(q, k, v, vl.get("cu_seqlens_q"), vl.get("cu_seqlens_k"), vl.get("seqused_q"), vl.get("seqused_k"),
                       vl.get("max_seqlen_q"), vl.get("max_seqlen_k"), softmax_scale, bool(causal),
                       *window_entries(window_size), float(softcap or 0.0), learnable_sink, num_splits or 0, pack_gqa,
                       vl.get("check_metadata"), vl.get("page_table"), *(descales or (None, None, None)), varlen is None)
    return out, (lse if return_lse else None)


def distinct(*tensors) -> tuple:
    """``tensors`` with any repeat of an earlier one replaced by a view of it: Dynamo does not trace an
    autograd.Function given one tensor as two inputs (self-attention's ``q is k is v``); gradients reach the
    tensor through the views."""
    out = []
    for t in tensors:
        repeat = t is not None and any(t is u for u in out)
        out.append(t.view(t.shape) if repeat else t)
    return tuple(out)


class CompiledFwd(torch.autograd.Function):
    """The dense forward op as ``torch.compile`` traces it: forward and backward ops, each traced by its fake
    (the graph has no break; the arguments are the op's)."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, window_left, window_right, softcap, learnable_sink, num_splits,
                pack_gqa, deterministic, rng):
        inputs = (q, k, v, softmax_scale, causal, window_left, window_right, softcap, learnable_sink, num_splits,
                  pack_gqa, deterministic, rng)
        output = _fwd_op(*inputs)
        _fwd_setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_fwd_backward)


class CompiledVarlenFwd(torch.autograd.Function):
    """``CompiledFwd`` for the varlen forward op."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                softmax_scale, causal, window_left, window_right, softcap, learnable_sink, num_splits, pack_gqa,
                check_metadata, page_table, deterministic, rng):
        inputs = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                  causal, window_left, window_right, softcap, learnable_sink, num_splits, pack_gqa, check_metadata,
                  page_table, deterministic, rng)
        output = _varlen_op(*inputs)
        _varlen_setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_varlen_backward)
