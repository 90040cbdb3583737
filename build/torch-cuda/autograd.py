"""How a validated call runs: its launch plan, through autograd when a gradient is required, and the backward.

``run_call`` plans a call (``launch.plan_for``) and remembers the plan; ``replay`` runs a remembered one;
``run_plan`` goes through ``_FlashAttnFunc`` (the eager autograd path) when the inputs require a gradient.
``gradients`` is where every backward ends (the autograd function, the backward custom ops, ``flash_attn_bwd``):
it hands the call to ``backward.run_bwd`` with the device's execution model and facts.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import backward
from .launch import (call_key, device_smem, l2_bytes, launch_env, model_and_target, num_sms, plan_for,
                     remember, remembered)
from .validation import plain_sink, refusal


def needs_grad(q, k, v, sink=None) -> bool:
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v, sink))


def dtype_of(sink: Optional[torch.Tensor]):
    return sink.dtype if sink is not None else None


def run_call(q, k, v, spec, shape, params, varlen, num_splits, return_lse, key=None, sink=None, deterministic=False,
             grad=None, invariant=False):
    """The forward of a validated call (``run_plan``) through its launch plan, the plan remembered under the
    call's ``key`` (``call_key``) when it has one. ``sink``: the caller's learnable sink (its gradient goes
    there); ``invariant``: batch-invariant (``invariance``: the invariant tiles, in fixed key chunks past one chunk)."""
    plan = plan_for(q, v, spec, shape, params, None, num_splits, None, invariant)
    if key is not None:
        remember(key, dataclasses.replace(plan, call=(spec, shape, dataclasses.replace(params, sink=None))))
    return run_plan(plan, q, k, v, spec, shape, params, varlen, return_lse, sink, deterministic, grad, invariant)


def run_plan(plan, q, k, v, spec, shape, params, varlen, return_lse, sink, deterministic, grad=None, invariant=False):
    """``plan`` run on the call's tensors, through autograd when a gradient is required (``grad``; None: when
    the inputs require one; a custom op's implementation passes False, its autograd is the op's); returns
    ``(out, lse or None)`` (the LSE when asked for or needed by the backward). ``invariant``: the backward runs
    batch-invariant (``invariance``)."""
    if needs_grad(q, k, v, sink) if grad is None else grad:
        if spec.page_size:
            raise NotImplementedError(refusal(("paged_kv", "backward")))
        if spec.kv_dtype:
            raise NotImplementedError(refusal(("fp8", "backward")))
        return _FlashAttnFunc.apply(q, k, v, sink, spec, shape, params, varlen, plan, deterministic, invariant)
    out, lse = plan.run(q, k, v, params.sink, varlen, aux=params.aux, sparse=params.sparse, rng=params.rng,
                        descale=params.descale)
    return out, (lse if return_lse else None)


def replay(tensors, scalars, window_size, options, q, k, v, learnable_sink, varlen, return_lse, deterministic,
           grad=None, invariant=False):
    """``(key, result)``: the call's ``call_key`` (window bounds appended to ``scalars``), and the
    remembered plan's ``(out, lse or None)`` (``run_plan``: through autograd when a gradient is required) when
    there is one, else None."""
    key = plan_key(tensors, scalars, window_size, options)
    plan = remembered(key)
    if plan is None:
        return key, None
    spec, shape, params = plan.call
    return key, run_plan(plan, q, k, v, spec, shape, per_call(params, learnable_sink), varlen, return_lse,
                         learnable_sink, deterministic, grad, invariant)


def plan_key(tensors, scalars, window_size, options):
    """``call_key`` of a call with its window bounds appended to ``scalars``."""
    window = tuple(window_size) if isinstance(window_size, (tuple, list)) else (None, None, window_size)
    return call_key(tensors, (*scalars, *window), options)


def per_call(params, learnable_sink, rng=None):
    """A remembered call's parameters with this call's learnable sink (as the kernels read it) and dropout slot."""
    if learnable_sink is None and rng is None:
        return params
    return dataclasses.replace(params, sink=plain_sink(learnable_sink), rng=rng)


def gradients(q, k, v, out, lse, dout, dlse, spec, shape, params, varlen, sink_dtype, deterministic, grads=None,
              invariant=False):
    """(dq, dk, dv, dsink) of a validated forward call: the eager autograd.Function, the backward custom ops and
    ``flash_attn_bwd`` all end here (``grads``: (dq, dk, dv) to write into; ``invariant``: batch-invariant, which
    runs deterministically in a fixed order, ``backward.bwd_launch``)."""
    if dout is None:
        dout = torch.zeros_like(out)
    index = q.device.index
    dispatch_env, target_env, mode = launch_env()
    model, target = model_and_target(index, dispatch_env, target_env)
    return backward.run_bwd(q, k, v, out, dout, lse, dlse, spec, shape, params, varlen, sink_dtype, model, target,
                            device_smem(index, mode), deterministic or invariant, grads=grads, num_sms=num_sms(index),
                            l2_bytes=l2_bytes(index), invariant=invariant)


class _FlashAttnFunc(torch.autograd.Function):
    """Eager path: a plain autograd.Function costs microseconds where the custom op's Python
    dispatch costs hundreds (measured ~600 us per call on CPU, 2026-11-22). The learnable sink is an
    input of its own (``sink``, the caller's tensor) so that its gradient reaches it; the kernels read
    the fp32 copy in ``params``."""

    @staticmethod
    def forward(ctx, q, k, v, sink, spec, shape, params, varlen, plan, deterministic=False, invariant=False):
        out, lse = plan.run(q, k, v, params.sink, varlen, aux=params.aux, sparse=params.sparse, rng=params.rng)
        ctx.save_for_backward(q, k, v, out, lse, *(varlen or (None,) * 5))
        ctx.spec, ctx.shape, ctx.params, ctx.deterministic, ctx.invariant = spec, shape, params, deterministic, invariant
        ctx.sink_dtype = dtype_of(sink)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *varlen = ctx.saved_tensors
        dq, dk, dv, dsink = gradients(q, k, v, out, lse, dout, dlse, ctx.spec, ctx.shape, ctx.params,
                                      tuple(varlen) if any(t is not None for t in varlen) else None, ctx.sink_dtype,
                                      ctx.deterministic, invariant=ctx.invariant)
        return dq, dk, dv, dsink, None, None, None, None, None, None, None
