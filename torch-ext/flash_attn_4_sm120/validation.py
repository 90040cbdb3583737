"""Argument validation of the public entries: from a user's call to a validated (spec, shape, params).

The tensors' own checks live in ``problem`` (``validate_fwd`` / ``validate_varlen``) and ``metadata``; here are the
entries' options (``num_splits``, ``pack_gqa``, windows), the manifest's refusals of combinations this version does
not implement (``refusal``), the feature arguments that extend the spec and params (mods, dropout, block sparsity)
and the checks of caller-provided outputs. Errors name the combination and, where there is one, the alternative.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import block_sparse, compiler, dropout, flex, manifest
from .metadata import check_requested, check_varlen_metadata
from .problem import LOG2_E, kernel_layout, misaligned_row_dim, validate_fwd, validate_varlen
from .scheduler_metadata import check_scheduler_metadata


def check_options(num_splits, pack_gqa) -> None:
    """Type checks of the dispatch options every entry point takes."""
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0):
        raise TypeError(f"num_splits must be None or 0 (automatic), 1 (no split) or a positive split count, "
                        f"got {num_splits!r}")
    if pack_gqa not in (None, True, False):
        raise TypeError(f"pack_gqa must be True, False or None (automatic), got {pack_gqa!r}")


def validated(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink, rng=None, descales=None,
              fp8_q=False):
    """``(q, k, v, spec, shape, params)`` of a dense call: q / k / v in the kernels' layout, validated, with the
    dropout slot ``rng`` (None: no dropout) and, for FP8 K/V, the descale slots of the call's ``descales``
    (``_with_scales``)."""
    q, k, v = (kernel_layout(t) for t in (q, k, v))
    spec, shape, params = validate_fwd(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink)
    spec, params = _with_dropout(spec, _with_scales(spec, shape, params, q.device, descales, fp8_q), rng)
    return q, k, v, spec, shape, params


def validate_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                         softmax_scale, causal, window_size, softcap, learnable_sink, check_metadata, page_table=None,
                         rng=None, descales=None, fp8_q=False):
    """``validate_varlen`` plus the opt-in metadata check, the dropout slot ``rng`` (None: no dropout) and FP8
    K/V's descale slots (``_with_scales``); returns (spec, shape, params, varlen tensors)."""
    spec, shape, params = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                          seqused_q, seqused_k, softmax_scale, causal, window_size, softcap,
                                          learnable_sink, page_table)
    if check_requested(check_metadata):
        check_varlen_metadata(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                              page_table)
    spec, params = _with_dropout(spec, _with_scales(spec, shape, params, q.device, descales, fp8_q), rng)
    return spec, shape, params, (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table)


def validated_call(q, k, v, varlen: Optional[dict], softmax_scale, causal, window_size, softcap, learnable_sink,
                   rng=None, descales=None, fp8_q=False):
    """``(q, k, v, spec, shape, params, varlen tensors or None)`` of a dense call (``varlen`` None: ``validated``) or
    a varlen one (``varlen``: the entry's keyword arguments, ``validate_varlen_call``)."""
    if varlen is None:
        return (*validated(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink, rng, descales,
                           fp8_q), None)
    q, k, v = (kernel_layout(t) for t in (q, k, v))
    spec, shape, params, tensors = validate_varlen_call(
        q, k, v, varlen["cu_seqlens_q"], varlen["cu_seqlens_k"], varlen["max_seqlen_q"], varlen["max_seqlen_k"],
        varlen["seqused_q"], varlen["seqused_k"], softmax_scale, causal, window_size, softcap, learnable_sink,
        varlen["check_metadata"], varlen["page_table"], rng, descales, fp8_q)
    return q, k, v, spec, shape, params, tensors


def _with_scales(spec, shape, params, device, descales, fp8_q):
    """``params`` with FP8 K/V's descale slots (``fp8_scales`` of the call's ``descales``, 1 where none is given:
    every path that validates an FP8 call launches with them, the low-level ``flash_attn_fwd`` too)."""
    if spec.kv_dtype is None:
        return params
    return dataclasses.replace(params, descale=fp8_scales(descales, fp8_q, shape.batch, shape.num_heads_kv, device))


def _with_dropout(spec, params, rng: Optional[torch.Tensor]):
    """(spec, params) of a call with dropout (``rng``: the kernels' slot, None: no dropout): the flag in
    the spec, the slot in the params (a dropout spec runs unpacked: ``with_packing``)."""
    if rng is None:
        return spec, params
    return dataclasses.replace(spec, dropout=True), dataclasses.replace(params, rng=rng)


def rng_of(drop: Optional[tuple], q) -> Optional[torch.Tensor]:
    """The kernels' dropout slot of a call's ``(p, seed)`` (``_dropout_of``) on q's device, or None without
    dropout (built before validation, which reports a q that is not a tensor)."""
    if drop is None:
        return None
    return dropout.rng_tensor(drop[1], 0, drop[0], getattr(q, "device", None))


def check_output(name, t, shape, dtype, device) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device:
        raise ValueError(f"{name} must be a {dtype} tensor of shape {tuple(shape)} on {device}; "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if t.stride(-1) != 1 or (name == "out" and t.data_ptr() % 16):
        raise ValueError(f"{name} must be contiguous in its last dimension and 16-byte aligned")
    if name == "out" and misaligned_row_dim(t) is not None:  # 16-byte vector stores, as for the inputs
        raise ValueError(f"out strides {tuple(t.stride())} are not multiples of 16 bytes; pass a contiguous out")


def window_entries(window_size) -> tuple:
    """The user's (left, right) as the custom ops take them (resolved inside the op, at run time)."""
    window = tuple(window_size) if window_size is not None else (None, None)
    if len(window) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    return window


def named_options(kwargs: dict, **named) -> dict:
    """``kwargs`` with each of upstream's named parameters that a call set (``named``: its value differs from upstream's
    default, None / False) added, so that every entry's options are read from one dict (``mods_of``,
    ``upstream_options``, ``fp8_args``); a plain call passes none and gets ``kwargs`` back."""
    given = {name: value for name, value in named.items() if value is not None and value is not False}
    return {**kwargs, **given} if given else kwargs


def upstream_options(kwargs: dict, varlen: bool) -> None:
    """Take upstream flash-attn-4's keyword arguments that need no kernel here out of ``kwargs``, checked:

    * ``block_sparse_tensors_bwd``: accepted; the backward derives its per-key-tile lists from the forward's
      ``block_sparse_tensors`` on the device (manifest: block_sparsity+backward), which describe the same mask.
    * ``gather_kv_indices`` (top-k sparse MLA) raises ``NotImplementedError`` naming the alternatives;
      ``gather_bwd_recompute_p`` / ``gather_bwd_token_chunk`` without it raise upstream's ``ValueError``.
    * varlen only: ``scheduler_metadata`` / ``disable_scheduler_metadata`` (advisory, ``scheduler_metadata.py``),
      ``min_seqlen_k`` (a lower bound upstream's gather path reads; an int or None, unused here), and
      ``seqlen_k_per_split``, which raises ``NotImplementedError``: ``num_splits=1`` keeps one reduction order.
    """
    kwargs.pop("block_sparse_tensors_bwd", None)
    gather = kwargs.pop("gather_kv_indices", None)
    recompute, chunk = kwargs.pop("gather_bwd_recompute_p", False), kwargs.pop("gather_bwd_token_chunk", None)
    if gather is not None:
        raise NotImplementedError("gather_kv_indices (top-k sparse MLA) is not supported by flash-attn-4-sm120: "
                                  "use qv over dense or paged latent caches, or block_sparse_tensors for block-level "
                                  "sparsity")
    if recompute or chunk is not None:
        raise ValueError("gather_bwd_recompute_p / gather_bwd_token_chunk only apply to sparse top-k MLA attention "
                         "(gather_kv_indices is not set on this call, so they would be silently ignored)")
    if not varlen:
        return
    check_scheduler_metadata(kwargs.pop("scheduler_metadata", None))
    kwargs.pop("disable_scheduler_metadata", None)
    min_k = kwargs.pop("min_seqlen_k", None)
    if min_k is not None and (isinstance(min_k, bool) or not isinstance(min_k, int) or min_k < 0):
        raise TypeError(f"min_seqlen_k must be a non-negative int or None, got {min_k!r}")
    if kwargs.pop("seqlen_k_per_split", None) is not None:
        raise NotImplementedError("seqlen_k_per_split (a fixed key range per split) is not supported by "
                                  "flash-attn-4-sm120: num_splits=1 keeps one key reduction order for every call")


def refuse_beside(feature: str, mods: dict, needs_grad: bool = False) -> None:
    """Raise the manifest's message for what ``feature`` (``fp8``, ``head_dim_512``) cannot combine with among a
    call's mods (``mods_of``), block sparsity, dropout and, with ``needs_grad``, a gradient."""
    flags = (("score_mod", mods.get("score_mod") is not None or mods.get("mask_mod") is not None),
             ("block_sparsity", mods.get("block_sparse_tensors") is not None),
             ("dropout", mods.get("dropout") is not None), ("backward", needs_grad))
    message = refusal((feature, *(name for name, on in flags if on)))
    if message is not None:
        raise NotImplementedError(message)


def refuse_unimplemented(num_splits, pack_gqa, score_mod, mask_mod, extra) -> None:
    """Check the options, then raise the manifest's message for each requested feature this version
    does not implement."""
    if extra:
        raise TypeError(f"flash_attn_func got unexpected arguments: {sorted(extra)}")
    check_options(num_splits, pack_gqa)
    requested = []
    if num_splits not in (None, 1, 0):
        requested.append("split_kv")
    if score_mod is not None or mask_mod is not None:
        requested.append("score_mod")
    if requested:
        message = refusal(tuple(requested))
        if message is not None:
            raise NotImplementedError(message)


_REFUSALS: dict = {}


@torch.compiler.assume_constant_result
def refusal(requested: tuple) -> Optional[str]:
    """The manifest's refusal message for this combination, or None (``manifest.check_combination``).
    Memoized, and a constant to Dynamo (a plain function: Dynamo traces into an lru_cache wrapper):
    the manifest does not change at run time, and reading it inside a traced region breaks the graph."""
    if requested not in _REFUSALS:
        try:
            manifest.check_combination(list(requested))
            _REFUSALS[requested] = None
        except NotImplementedError as e:
            _REFUSALS[requested] = str(e)
    return _REFUSALS[requested]


def mods_of(score_mod, mask_mod, kwargs: dict) -> dict:
    """The call's mods (upstream's keyword arguments), taken out of ``kwargs``; ``dropout``: (p, seed) when
    ``dropout_p`` > 0 (``_dropout_of``), else None."""
    return dict(score_mod=score_mod, mask_mod=mask_mod, score_mod_bwd=kwargs.pop("score_mod_bwd", None),
                aux_tensors=kwargs.pop("aux_tensors", None), aux_scalars=kwargs.pop("aux_scalars", None),
                block_sparse_tensors=kwargs.pop("block_sparse_tensors", None), dropout=_dropout_of(kwargs))


def _dropout_of(kwargs: dict) -> Optional[tuple]:
    """``(p, seed)`` of a call's ``dropout_p`` / ``dropout_seed`` (taken out of ``kwargs``), None when p is 0 (the
    plain call: exactly the kernels without dropout). ``seed`` None: the kernels' slot draws one on the device
    (``dropout.rng_tensor``); the mask is ``dropout.dropout_keep_mask`` of (seed, offset 0)."""
    if "dropout_p" not in kwargs and "dropout_seed" not in kwargs:  # every plain call: nothing to check
        return None
    p, seed = kwargs.pop("dropout_p", 0.0), kwargs.pop("dropout_seed", None)
    if isinstance(p, torch.Tensor) or not isinstance(p, (int, float)) or isinstance(p, bool):
        raise TypeError(f"dropout_p must be a Python float, got {p!r}")
    dropout.keep_threshold(p)  # raises ValueError outside [0, 1)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise TypeError(f"dropout_seed must be a non-negative int or None, got {seed!r}")
    if p == 0:
        return None
    return float(p), None if seed is None else seed % (1 << 64)


def has_mods(mods: dict) -> bool:
    """Whether the call has mods that the kernels trace (score_mod, mask_mod, aux tensors, block-sparse lists):
    such a call runs eagerly (``interface._flex_call``); dropout alone runs through the custom ops."""
    return any(v is not None for name, v in mods.items() if name != "dropout")


def with_mods(spec, params, mods: dict, needs_grad: bool, device=None):
    """(spec, params) of a call with ``mods`` (score_mod, mask_mod, score_mod_bwd, aux_tensors, aux_scalars): the
    spec keyed on the mods (``flex.ModKey``, callables registered for the compiler); with a score_mod the kernel
    scales S by softmax_scale before it (the softcap slot) and exponentiates with log2(e). Raises the manifest's
    message for the combinations it refuses (mask_mod with causal / a window, softcap)."""
    key = flex.ModKey.of(**mods)
    if key is None:
        return spec, params
    aux = _aux_tensors(mods.get("aux_tensors"), mods.get("aux_scalars"), device)
    if needs_grad and mods.get("score_mod") is not None and mods.get("score_mod_bwd") is None:
        raise ValueError("a gradient through score_mod needs score_mod_bwd (its derivative rule: "
                         "score_mod_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors) returns "
                         "grad * d score_mod / d score), as upstream")
    flags = (("mask_mod", mods.get("mask_mod") is not None), ("causal", spec.causal),
             ("sliding_window", spec.local), ("softcap", spec.softcap), ("backward", needs_grad))
    message = refusal(("score_mod", *(name for name, on in flags if on)))
    if message is not None:
        raise NotImplementedError(message)
    flex.register(key, mods.get("score_mod"), mods.get("score_mod_bwd"), mods.get("mask_mod"))
    spec = dataclasses.replace(spec, mods=key)
    if mods.get("score_mod") is not None:
        params = dataclasses.replace(params, scale_log2=LOG2_E, softcap_scale=params.softmax_scale)
    return spec, (dataclasses.replace(params, aux=aux) if aux else params)


def _aux_scalar(i, s):
    """Aux scalar ``i`` as the Python number its kernel parameter takes (``compiler.AUX_SCALAR_TYPES``)."""
    kind = compiler.AUX_SCALAR_TYPES[type(s).__name__]  # (the ModKey checked the type)
    if kind == "Float32":
        return float(s.value if hasattr(s, "value") else s)
    value = int(s.value if hasattr(s, "value") else s)
    if kind == "Boolean":
        return bool(value)
    if not -2 ** 31 <= value < 2 ** 31:
        raise ValueError(f"aux_scalars[{i}] = {value} does not fit an Int32 (the mods' integer scalars are Int32)")
    return value


def _aux_tensors(tensors, scalars, device) -> tuple:
    """The call's aux inputs for the kernels' aux slots: its aux tensors (their last dimension made contiguous),
    then its aux scalars as Python numbers (``compiler.aux_args``), checked."""
    scalars = tuple(scalars or ())
    if len(scalars) > compiler.MAX_AUX_SCALARS:
        raise ValueError(f"at most {compiler.MAX_AUX_SCALARS} aux_scalars, got {len(scalars)}")
    scalars = tuple(_aux_scalar(i, s) for i, s in enumerate(scalars))
    if not tensors:
        return scalars
    tensors = tuple(tensors)
    if len(tensors) > compiler.MAX_AUX_TENSORS:
        raise ValueError(f"at most {compiler.MAX_AUX_TENSORS} aux_tensors, got {len(tensors)}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.dim() < 1 or (device is not None and t.device != device):
            raise ValueError(f"aux_tensors[{i}] must be a tensor of at least one dimension on {device}")
        if flex.dtype_name(t) not in compiler.AUX_DTYPES:
            raise ValueError(f"aux_tensors[{i}] has dtype {t.dtype}; supported: {', '.join(compiler.AUX_DTYPES)}")
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors) + scalars


def with_block_sparse(spec, shape, params, sparse, needs_grad: bool, num_splits, pack_gqa, device,
                      deterministic: bool = False):
    """(spec, params) of a call with ``block_sparse_tensors``: the block size in the spec, the tensors
    in the kernels' sparse slots. Raises the manifest's message for the combinations it refuses and
    ``ValueError`` for tensors that do not fit the call (``block_sparse.check_block_sparse``)."""
    flags = (("backward", needs_grad), ("deterministic_backward", needs_grad and deterministic),
             ("varlen", spec.varlen_q or spec.varlen_k or spec.seqused_q or spec.seqused_k),
             ("paged_kv", bool(spec.page_size)), ("split_kv", num_splits not in (None, 0, 1)),
             ("pack_gqa", pack_gqa is True))
    message = refusal(("block_sparsity", *(name for name, on in flags if on)))
    if message is not None:
        raise NotImplementedError(message)
    bq, bk = block_sparse.check_block_sparse(sparse, shape.batch, shape.num_heads, shape.seqlen_q, shape.seqlen_k,
                                             device)
    full = sparse.full_block_cnt is not None
    spec = dataclasses.replace(spec, block_sparse=(bq, bk, full))
    tensors = (sparse.mask_block_cnt, sparse.mask_block_idx, sparse.full_block_cnt, sparse.full_block_idx)
    return spec, dataclasses.replace(params, sparse=tensors)


def plain_sink(learnable_sink):
    """The sink as the kernels read it (``problem._runtime_params`` does the same on the first call)."""
    return None if learnable_sink is None else learnable_sink.detach().to(torch.float32).contiguous()


def fp8_scales(descales: Optional[tuple], fp8_q: bool, batch: int, heads_kv: int, device) -> tuple:
    """The kernels' descale slots ``(k, v)``: fp32 (batch, heads_kv) views (``expand``: a per-tensor scale of one
    element broadcasts, strides 0), 1 where a scale is not given; an FP8 q's scale multiplies K's (both scale
    every score)."""
    q_descale, k_descale, v_descale = descales or (None, None, None)
    out = []
    for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if d is None:
            out.append(None)
            continue
        if not isinstance(d, torch.Tensor) or not d.is_floating_point() or d.device != device:
            raise TypeError(f"{name} must be a floating-point tensor on {device} of shape (batch, heads_kv) = "
                            f"({batch}, {heads_kv}) (FlashAttention-3's convention), got {getattr(d, 'dtype', d)!r}")
        try:
            out.append(d.to(torch.float32).expand(batch, heads_kv))
        except RuntimeError:
            raise ValueError(f"{name} of shape {tuple(d.shape)} does not broadcast to (batch, heads_kv) = "
                             f"({batch}, {heads_kv})") from None
    q_scale, k_scale, v_scale = out
    if fp8_q and q_scale is not None:
        k_scale = q_scale * k_scale if k_scale is not None else q_scale
    one = _one(device).expand(batch, heads_kv)
    return (one if k_scale is None else k_scale), (one if v_scale is None else v_scale)


_ONES: dict = {}


def _one(device) -> torch.Tensor:
    """A 1.0 fp32 scale on ``device``, made once (the default descale of FP8 K/V)."""
    if device not in _ONES:
        _ONES[device] = torch.ones((1, 1), dtype=torch.float32, device=device)
    return _ONES[device]
