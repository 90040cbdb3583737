"""Public API: the attention entries. No architecture branches here.

``flash_attn_func`` and ``flash_attn_varlen_func`` take upstream flash-attn-4's parameters in its order (this
bundle's own after them), its ``(batch, seqlen, heads, head_dim)`` layout and ``(out, lse)`` return convention, so
code written for flash-attn-4 runs unchanged where the features it uses are implemented; features not implemented
in this version raise ``NotImplementedError`` with the manifest's message (see CONFLICTS_LOG.md).

Each entry validates its arguments (``validation``, ``problem``), plans the launch (``launch``) and runs it
(``autograd``: through an autograd function when a gradient is required); under ``torch.compile`` it calls the
namespaced custom ops instead (``custom_ops``). A repeated call replays its remembered launch plan.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import invariance
from .autograd import dtype_of, gradients, needs_grad, plan_key, replay, run_call
from .custom_ops import CompiledFwd, CompiledVarlenFwd, distinct, fp8_call
from .launch import dispatch_model, plan_for, remember, remembered, varlen_rememberable, with_packing
from .problem import kernel_layout
from .fp8 import fp8_args, is_fp8
from .latent import latent_call
from .validation import (check_options, has_mods, mods_of, named_options, plain_sink, refuse_unimplemented, rng_of,
                         upstream_options, validate_varlen_call, validated, validated_call, window_entries,
                         with_block_sparse, with_mods)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qv: Optional[torch.Tensor] = None,
    gather_kv_indices: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple = (None, None),
    learnable_sink: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    num_splits: Optional[int] = None,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    score_mod=None,
    score_mod_bwd=None,
    mask_mod=None,
    aux_tensors=None,
    aux_scalars=None,
    block_sparse_tensors=None,
    block_sparse_tensors_bwd=None,
    return_lse: bool = False,
    gather_bwd_recompute_p: bool = False,
    gather_bwd_token_chunk: Optional[int] = None,
    batch_invariant: Optional[bool] = None,
    **kwargs,
):
    """Attention forward. q: (batch, seqlen_q, heads, d); k, v: (batch, seqlen_k, heads_kv, d).

    Returns ``(out, lse)``: out (batch, seqlen_q, heads, d) in q's dtype; lse (batch, heads, seqlen_q)
    fp32 natural-log sum-exp of the scaled scores when ``return_lse`` is set or a gradient is
    required, else None. ``softmax_scale`` defaults to 1/sqrt(d). ``causal`` aligns the diagonal to
    the bottom-right corner when seqlen_q != seqlen_k. ``window_size=(left, right)`` restricts query i
    to keys [i + off - left, i + off + right] (off = seqlen_k - seqlen_q; None = that side unbounded;
    with ``causal`` right is 0); bounds may be negative (``(None, -w)`` ends the keys w before the
    diagonal); a pair with left + right < 0, such as FA2's (-1, -1), means no window
    (``problem.resolve_window``). Key blocks outside the window are skipped. A row that sees no key
    gets out = 0 and lse = -inf (or the sink). q/k/v that the kernels cannot read in place (a
    non-contiguous last dim, 16-byte misalignment) are copied first. ``softcap > 0`` caps the
    logits as softcap * tanh(logit / softcap). ``learnable_sink`` (num_heads,) adds exp(sink_h) to
    every row's softmax denominator (gpt-oss) and to the LSE. ``num_splits``: split each query
    tile's key range over this many CTAs and merge the fp32 partials in a combine kernel (flash
    decoding); None or 0 chooses automatically (splits only grids too small to fill the GPU, e.g.
    decode), 1 never splits. ``page_table=`` (batch, max_pages) int32 reads k / v as paged caches
    (num_pages, page_size, heads_kv, d), every sequence max_pages * page_size keys long (for per-sequence
    lengths use ``flash_attn_varlen_func(..., seqused_k=...)`` or ``flash_attn_with_kvcache``).
    ``batch_invariant=True`` (None: ``FA4_SM120_BATCH_INVARIANT``) makes each row's output and LSE, and its
    gradients, bitwise independent of the rest of the call (``invariance.py``).
    """
    kwargs = named_options(kwargs, qv=qv, gather_kv_indices=gather_kv_indices, score_mod_bwd=score_mod_bwd,
                           aux_tensors=aux_tensors, aux_scalars=aux_scalars, block_sparse_tensors=block_sparse_tensors,
                           block_sparse_tensors_bwd=block_sparse_tensors_bwd,
                           gather_bwd_recompute_p=gather_bwd_recompute_p, gather_bwd_token_chunk=gather_bwd_token_chunk)
    if kwargs:  # (most calls pass none)
        upstream_options(kwargs, varlen=False)
    page_table = kwargs.pop("page_table", None)
    if page_table is not None:
        return flash_attn_varlen_func(q, k, v, page_table=page_table, softmax_scale=softmax_scale, causal=causal,
                                      window_size=window_size, learnable_sink=learnable_sink, softcap=softcap,
                                      num_splits=num_splits, pack_gqa=pack_gqa, deterministic=deterministic,
                                      score_mod=score_mod, mask_mod=mask_mod, return_lse=return_lse,
                                      batch_invariant=batch_invariant, **kwargs)
    mods = mods_of(score_mod, mask_mod, kwargs)
    descales = fp8_args(kwargs)
    qv = kwargs.pop("qv", None)
    refuse_unimplemented(num_splits, pack_gqa, score_mod, mask_mod, kwargs)
    fp8 = descales is not None or is_fp8(k) or is_fp8(q)
    invariant, num_splits, deterministic = invariance.settle(batch_invariant, num_splits, deterministic, mods, fp8,
                                                             qv is not None)
    if qv is not None:  # MLA's absorbed attention (latent.py)
        return latent_call(q, k, v, qv, None, mods, fp8,
                           softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                           learnable_sink=learnable_sink, softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa,
                           return_lse=return_lse)
    if fp8:
        return fp8_call(q, k, v, None, descales, mods, softmax_scale=softmax_scale, causal=causal,
                         window_size=window_size, learnable_sink=learnable_sink, softcap=softcap, num_splits=num_splits,
                         pack_gqa=pack_gqa, return_lse=return_lse)
    if has_mods(mods):
        return _flex_call(q, k, v, None, mods, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                          learnable_sink=learnable_sink, softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa,
                          deterministic=deterministic, return_lse=return_lse)
    rng = rng_of(mods["dropout"], q)  # device-side: traced and CUDA-graph capturable
    if invariant and torch.compiler.is_compiling():  # eager: the custom ops carry the default dispatch
        return _eager(flash_attn_func, q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                      learnable_sink=learnable_sink, softcap=softcap, pack_gqa=pack_gqa, return_lse=return_lse,
                      batch_invariant=True)
    if torch.compiler.is_compiling():
        # Graphs see the namespaced custom op (fake impl while tracing); its real implementation
        # validates the concrete tensors when the graph runs (pointers do not exist while tracing).
        q, k, v, learnable_sink = distinct(q, k, v, learnable_sink)
        out, lse = CompiledFwd.apply(q, k, v, softmax_scale, bool(causal), *window_entries(window_size),
                                     float(softcap or 0.0), learnable_sink, num_splits or 0, pack_gqa,
                                     bool(deterministic), rng)
        return out, (lse if (return_lse or needs_grad(q, k, v, learnable_sink)) else None)
    key = None
    if rng is None:
        key, result = replay((q, k, v, learnable_sink), (softmax_scale, softcap), window_size,
                             ("dense", bool(causal), num_splits, pack_gqa, invariant), q, k, v, learnable_sink, None,
                             return_lse, bool(deterministic), invariant=invariant)
        if result is not None:
            return result
    q, k, v, spec, shape, params = validated(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink,
                                             rng)
    return run_call(q, k, v, with_packing(spec, shape, pack_gqa), shape, params, None, num_splits, return_lse, key,
                    learnable_sink, bool(deterministic), invariant=invariant)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qv: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    min_seqlen_k: Optional[int] = None,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    gather_kv_indices: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple = (None, None),
    learnable_sink: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    num_splits: Optional[int] = None,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    score_mod=None,
    score_mod_bwd=None,
    mask_mod=None,
    block_sparse_tensors=None,
    aux_tensors=None,
    aux_scalars=None,
    return_lse: bool = False,
    scheduler_metadata=None,
    seqlen_k_per_split: Optional[int] = None,
    disable_scheduler_metadata: bool = False,
    gather_bwd_recompute_p: bool = False,
    gather_bwd_token_chunk: Optional[int] = None,
    check_metadata: Optional[bool] = None,
    batch_invariant: Optional[bool] = None,
    **kwargs,
):
    """Attention over a batch of sequences of different lengths, flash-attn-4's varlen convention.

    Each side is packed or dense: q (total_q, heads, d) with ``cu_seqlens_q`` (batch + 1,) int32 offsets,
    or (batch, seqlen_q, heads, d); likewise k/v with ``cu_seqlens_k``. ``seqused_q``/``seqused_k``
    (batch,) int32 cap each sequence's length (rows past it are ignored; packed output rows past it are
    zero). Pass ``max_seqlen_q``/``max_seqlen_k`` to avoid a device sync. Zero-length sequences are
    allowed. Returns ``(out, lse)``; out has q's layout, lse is (heads, total_q) when q is packed,
    else (batch, heads, seqlen_q); lse is None unless ``return_lse`` or a gradient is required.
    Masks, windows, softcap and sinks are as in ``flash_attn_func``, per sequence.

    Paged K/V: ``page_table`` (batch, max_pages) int32 with k / v as caches (num_pages, page_size,
    heads_kv, d), any page size; key j of sequence b is row j % page_size of page
    ``page_table[b, j // page_size]``, for the first ``seqused_k[b]`` keys (without ``seqused_k``, all
    max_pages * page_size). Pages may be shared and in any order. Not with ``cu_seqlens_k``.

    The kernels clamp every sequence to the tensors' extents, so no metadata reaches memory outside
    them (page indices into the caches' pages). ``check_metadata=True`` (or ``FA4_SM120_CHECK_METADATA=1``)
    also checks ``cu_seqlens``, ``seqused``, ``max_seqlen_*`` and the page table on the host (one sync) and
    raises ``ValueError`` naming the first bad entry (``metadata.py``).

    Upstream's ``scheduler_metadata`` (``get_scheduler_metadata``'s), ``disable_scheduler_metadata``,
    ``min_seqlen_k`` and ``block_sparse_tensors_bwd`` are accepted (the call plans from shapes, the backward derives
    its block lists from the forward's); ``gather_kv_indices`` and ``seqlen_k_per_split`` raise
    ``NotImplementedError`` naming the alternatives (``validation.upstream_options``).
    """
    if isinstance(qv, torch.Tensor) and qv.dim() == 1 and not qv.is_floating_point():
        raise TypeError("flash_attn_varlen_func takes upstream FlashAttention-4's order (q, k, v, qv, cu_seqlens_q, "
                        "cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...): an integer vector came as qv; pass "
                        "cu_seqlens_q / cu_seqlens_k (and the rest) by name")
    kwargs = named_options(kwargs, qv=qv, gather_kv_indices=gather_kv_indices, min_seqlen_k=min_seqlen_k,
                           score_mod_bwd=score_mod_bwd, aux_tensors=aux_tensors, aux_scalars=aux_scalars,
                           block_sparse_tensors=block_sparse_tensors, scheduler_metadata=scheduler_metadata,
                           seqlen_k_per_split=seqlen_k_per_split,
                           disable_scheduler_metadata=disable_scheduler_metadata,
                           gather_bwd_recompute_p=gather_bwd_recompute_p, gather_bwd_token_chunk=gather_bwd_token_chunk)
    if kwargs:  # (most calls pass none)
        upstream_options(kwargs, varlen=True)
    mods = mods_of(score_mod, mask_mod, kwargs)
    descales = fp8_args(kwargs)
    qv = kwargs.pop("qv", None)
    refuse_unimplemented(num_splits, pack_gqa, score_mod, mask_mod, kwargs)
    fp8 = descales is not None or is_fp8(k) or is_fp8(q)
    invariant, num_splits, deterministic = invariance.settle(batch_invariant, num_splits, deterministic, mods, fp8,
                                                             qv is not None)
    if fp8 or has_mods(mods) or qv is not None:
        varlen = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, seqused_q=seqused_q, seqused_k=seqused_k, page_table=page_table,
                      check_metadata=check_metadata)
    if qv is not None:  # MLA's absorbed attention (latent.py)
        return latent_call(q, k, v, qv, varlen, mods, fp8, softmax_scale=softmax_scale, causal=causal,
                           window_size=window_size, learnable_sink=learnable_sink, softcap=softcap,
                           num_splits=num_splits, pack_gqa=pack_gqa, return_lse=return_lse)
    if fp8:
        return fp8_call(q, k, v, varlen, descales, mods, softmax_scale=softmax_scale, causal=causal,
                         window_size=window_size, learnable_sink=learnable_sink, softcap=softcap, num_splits=num_splits,
                         pack_gqa=pack_gqa, return_lse=return_lse)
    if has_mods(mods):
        return _flex_call(q, k, v, varlen, mods, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                          learnable_sink=learnable_sink, softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa,
                          deterministic=deterministic, return_lse=return_lse)
    rng = rng_of(mods["dropout"], q)
    if invariant and torch.compiler.is_compiling():  # eager: the custom ops carry the default dispatch
        return _eager(flash_attn_varlen_func, q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, seqused_q=seqused_q, seqused_k=seqused_k,
                      page_table=page_table, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                      learnable_sink=learnable_sink, softcap=softcap, pack_gqa=pack_gqa, return_lse=return_lse,
                      check_metadata=check_metadata, batch_invariant=True)
    if torch.compiler.is_compiling():
        # Like flash_attn_func: graphs see the namespaced custom op; validation runs inside it.
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table, learnable_sink = distinct(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table, learnable_sink)
        out, lse = CompiledVarlenFwd.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                                           max_seqlen_k, softmax_scale, bool(causal), *window_entries(window_size),
                                           float(softcap or 0.0), learnable_sink, num_splits or 0, pack_gqa,
                                           check_metadata, page_table, bool(deterministic), rng)
        return out, (lse if (return_lse or needs_grad(q, k, v, learnable_sink)) else None)
    key = None
    if varlen_rememberable(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_metadata, rng):
        varlen = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table)
        key, result = replay((q, k, v, learnable_sink, *varlen), (max_seqlen_q, max_seqlen_k, softmax_scale, softcap),
                             window_size, ("varlen", bool(causal), num_splits, pack_gqa, invariant), q, k, v,
                             learnable_sink, varlen, return_lse, bool(deterministic), invariant=invariant)
        if result is not None:
            return result
    q, k, v = (kernel_layout(t) for t in (q, k, v))
    spec, shape, params, varlen = validate_varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, softmax_scale, causal,
        window_size, softcap, learnable_sink, check_metadata, page_table, rng)
    return run_call(q, k, v, with_packing(spec, shape, pack_gqa), shape, params, varlen, num_splits, return_lse, key,
                    learnable_sink, bool(deterministic), invariant=invariant)


@torch.compiler.disable
def _eager(entry, *args, **kwargs):
    """``entry(*args, **kwargs)`` outside the graph under torch.compile (Dynamo breaks the graph here)."""
    return entry(*args, **kwargs)


@torch.compiler.disable
def _flex_call(q, k, v, varlen: Optional[dict], mods: dict, softmax_scale, causal, window_size, learnable_sink,
               softcap, num_splits, pack_gqa, deterministic, return_lse):
    """A forward with score_mod / mask_mod, dense (``varlen`` None) or varlen (its keyword arguments):
    eager even under torch.compile (the callables are traced into the kernel, which a graph's custom op cannot
    carry: Dynamo breaks the graph here), never remembered as a launch plan (the mods are part of the spec)."""
    mods = dict(mods)
    sparse = mods.pop("block_sparse_tensors", None)
    rng = rng_of(mods.pop("dropout", None), q)
    q, k, v, spec, shape, params, tensors = validated_call(q, k, v, varlen, softmax_scale, causal, window_size, softcap,
                                                          learnable_sink, rng)
    grad = needs_grad(q, k, v, learnable_sink)
    spec, params = with_mods(spec, params, mods, grad, q.device)
    if sparse is not None:
        spec, params = with_block_sparse(spec, shape, params, sparse, grad, num_splits, pack_gqa, q.device,
                                         bool(deterministic))
        pack_gqa, num_splits = False, 1  # the lists are per query head and walked whole (config.block_sparse_problems)
    return run_call(q, k, v, with_packing(spec, shape, pack_gqa), shape, params, tensors, num_splits, return_lse, None,
                    learnable_sink, bool(deterministic))


def flash_attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple = (None, None),
    softcap: float = 0.0,
    learnable_sink: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    pack_gqa: Optional[bool] = None,
    num_splits: Optional[int] = None,
    batch_invariant: Optional[bool] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Low-level forward without autograd: writes into ``out``/``lse`` when given, returns both.
    ``num_splits``: KV splits (None or 0 automatic, 1 off); ``batch_invariant`` as in ``flash_attn_func``."""
    return _fwd_launch(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink, out, lse, pack_gqa,
                       num_splits, invariant=invariance.requested(batch_invariant))


def _fwd_launch(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink, out, lse, pack_gqa, num_splits,
                rng=None, invariant=False):
    """``flash_attn_fwd``, with the dropout slot ``rng`` (the forward custom op's path). A repeated call without
    dropout runs its remembered launch plan (``launch.call_key``), into ``out`` / ``lse`` when given."""
    check_options(num_splits, pack_gqa)
    if invariant:
        num_splits = invariance.invariant_splits(num_splits)
    key = None
    if rng is None:
        key = plan_key((q, k, v, learnable_sink), (softmax_scale, softcap), window_size,
                       ("fwd", bool(causal), num_splits, pack_gqa, invariant))
        plan = remembered(key)
        if plan is not None:
            return plan.run(q, k, v, plain_sink(learnable_sink), None, out, lse)
    q, k, v, spec, shape, params = validated(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink,
                                             rng)
    spec = with_packing(spec, shape, pack_gqa)
    plan = remember(key, plan_for(q, v, spec, shape, params, None, num_splits, None, invariant))
    return plan.run(q, k, v, params.sink, None, out, lse, params.aux, params.sparse, params.rng, params.descale)


def flash_attn_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple = (None, None),
    softcap: float = 0.0,
    learnable_sink: Optional[torch.Tensor] = None,
    dlse: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    dq: Optional[torch.Tensor] = None,
    dk: Optional[torch.Tensor] = None,
    dv: Optional[torch.Tensor] = None,
    batch_invariant: Optional[bool] = None,
) -> tuple:
    """Low-level backward without autograd, of a ``flash_attn_fwd`` call with the same arguments: returns
    ``(dq, dk, dv, dsink)`` (dsink None without a sink), written into ``dq``/``dk``/``dv`` when all three
    are given (contiguous, q's / k's / v's shape and dtype). ``batch_invariant`` as in ``flash_attn_func``
    (deterministic, in a fixed order)."""
    invariant = invariance.requested(batch_invariant)
    q, k, v, spec, shape, params = validated(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink)
    given = (dq, dk, dv)
    if any(t is not None for t in given):
        if any(t is None for t in given):
            raise ValueError("dq, dk and dv are given together or not at all")
        for name, g, ref in zip(("dq", "dk", "dv"), given, (q, k, v)):
            if g.shape != ref.shape or g.dtype != ref.dtype or g.device != ref.device or not g.is_contiguous():
                raise ValueError(f"{name} must be a contiguous {ref.dtype} tensor of shape {tuple(ref.shape)} on "
                                 f"{ref.device}")
    return gradients(q, k, v, out, lse, dout, dlse, spec, shape, params, None, dtype_of(learnable_sink), deterministic,
                     grads=given if dq is not None else None, invariant=invariant)


__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_fwd", "dispatch_model"]
