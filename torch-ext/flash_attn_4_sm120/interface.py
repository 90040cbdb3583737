"""Public API: validation, feature refusal, custom-op registration. No architecture branches here.

``flash_attn_func`` keeps upstream flash-attn-4's argument names, ``(batch, seqlen, heads, head_dim)``
layout and ``(out, lse)`` return convention, so code written for flash-attn-4 runs unchanged where the
features it uses are implemented; features not yet in this version raise ``NotImplementedError``
with the manifest's message (see CONFLICTS_LOG.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Optional

import torch

from . import backward, block_sparse, compiler, dropout, flex, manifest
from .metadata import check_requested, check_varlen_metadata
from ._ops import add_op_namespace_prefix
from .config import (
    choose_fwd_config,
    tile_band,
    fwd_ctas_per_sm,
    num_splits_for,
    occupancy_launch_smem,
    select_fwd_config,
    use_pack_gqa,
)
from .execution_model import (
    COMPILE_TARGET_ENV,
    DISPATCH_ENV,
    OCCUPANCY_ENV,
    OCCUPANCY_MODES,
    ExecutionModel,
    resolve_compile_target,
    resolve_dispatch_model,
)
from .problem import LOG2_E, CombineSpec, kernel_layout, misaligned_row_dim, validate_fwd, validate_varlen

@functools.lru_cache(maxsize=None)
def _model_and_target(device_index: Optional[int], dispatch_override: Optional[str],
                      target_override: Optional[str]) -> tuple[ExecutionModel, str]:
    cap = torch.cuda.get_device_capability(device_index) if torch.cuda.is_available() else None
    model = resolve_dispatch_model(cap, dispatch_override)
    return model, resolve_compile_target(model, target_override)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: Optional[int]) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _l2_bytes(device_index: Optional[int]) -> int:
    return torch.cuda.get_device_properties(device_index).L2_cache_size


@functools.lru_cache(maxsize=None)
def device_smem(device_index: Optional[int], mode: Optional[str]) -> Optional[tuple[int, int]]:
    """(shared memory per SM, opt-in per CTA) of the part, the input of ``config.occupancy_launch_smem``;
    None under ``FA4_SM120_OCCUPANCY=device`` (launch as compiled: the part's own CTAs per SM)."""
    mode = mode or OCCUPANCY_MODES[0]
    if mode not in OCCUPANCY_MODES:
        raise ValueError(f"{OCCUPANCY_ENV}={mode!r}: expected one of {', '.join(OCCUPANCY_MODES)}")
    if mode == "device":
        return None
    props = torch.cuda.get_device_properties(device_index)
    return props.shared_memory_per_multiprocessor, props.shared_memory_per_block_optin


@functools.lru_cache(maxsize=None)
def _launch_smem(spec, cfg, model, device_index: Optional[int], mode: Optional[str]) -> int:
    return occupancy_launch_smem(spec, cfg, model, device_smem(device_index, mode))


def _fwd_kernel(spec, cfg, model, target, device_index: Optional[int], mode: Optional[str]):
    """The compiled forward kernel for this call, padded to the model's CTAs per SM on a larger part."""
    return compiler.get_fwd_kernel(spec, cfg, model, target, _launch_smem(spec, cfg, model, device_index, mode))


def dispatch_model(device: torch.device) -> ExecutionModel:
    """The execution model for ``device`` (``FA4_SM120_DISPATCH_ARCH`` overrides)."""
    return _model_and_target(device.index, os.environ.get(DISPATCH_ENV), os.environ.get(COMPILE_TARGET_ENV))[0]


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Low-level forward without autograd: writes into ``out``/``lse`` when given, returns both.
    ``num_splits``: KV splits (None or 0 automatic, 1 off)."""
    return _fwd_launch(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink, out, lse, pack_gqa,
                       num_splits)


def _fwd_launch(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink, out, lse, pack_gqa, num_splits,
                rng=None):
    """``flash_attn_fwd``, with the dropout slot ``rng`` (the forward custom op's path)."""
    _check_options(num_splits, pack_gqa)
    q, k, v, spec, shape, params = _validated(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink,
                                              rng)
    return _launch_fwd(q, k, v, _with_packing(spec, shape, pack_gqa), shape, params, out,
                       lse, num_splits=num_splits)


def _validated(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink, rng=None):
    """``(q, k, v, spec, shape, params)`` of a dense call: q / k / v in the kernels' layout, validated, with the
    dropout slot ``rng`` (None: no dropout)."""
    q, k, v = (kernel_layout(t) for t in (q, k, v))
    spec, shape, params = validate_fwd(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink)
    spec, params = _with_dropout(spec, params, rng)
    return q, k, v, spec, shape, params


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
) -> tuple:
    """Low-level backward without autograd, of a ``flash_attn_fwd`` call with the same arguments: returns
    ``(dq, dk, dv, dsink)`` (dsink None without a sink), written into ``dq``/``dk``/``dv`` when all three
    are given (contiguous, q's / k's / v's shape and dtype)."""
    q, k, v, spec, shape, params = _validated(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink)
    given = (dq, dk, dv)
    if any(t is not None for t in given):
        if any(t is None for t in given):
            raise ValueError("dq, dk and dv are given together or not at all")
        for name, g, ref in zip(("dq", "dk", "dv"), given, (q, k, v)):
            if g.shape != ref.shape or g.dtype != ref.dtype or g.device != ref.device or not g.is_contiguous():
                raise ValueError(f"{name} must be a contiguous {ref.dtype} tensor of shape {tuple(ref.shape)} on "
                                 f"{ref.device}")
    return _grads(q, k, v, out, lse, dout, dlse, spec, shape, params, None, _dtype_of(learnable_sink), deterministic,
                  grads=given if dq is not None else None)


def _check_options(num_splits, pack_gqa) -> None:
    """Type checks of the dispatch options every entry point takes."""
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0):
        raise TypeError(f"num_splits must be None or 0 (automatic), 1 (no split) or a positive split count, "
                        f"got {num_splits!r}")
    if pack_gqa not in (None, True, False):
        raise TypeError(f"pack_gqa must be True, False or None (automatic), got {pack_gqa!r}")


def _splits(requested, spec, shape, cfg, split_spec, split_cfg, model, device) -> int:
    """KV splits for this call (``config.num_splits_for``), from the grid the unsplit launch (``cfg``)
    would have, the key blocks of the split kernel's tiles and its CTAs per SM under the model."""
    if requested == 1:
        return 1
    group = shape.num_heads // shape.num_heads_kv
    rows = shape.seqlen_q * group if spec.pack_gqa else shape.seqlen_q
    heads = shape.num_heads_kv if spec.pack_gqa else shape.num_heads
    num_ctas = -(-rows // cfg.tile_m) * heads * shape.batch
    return num_splits_for(requested, num_ctas, -(-shape.seqlen_k // split_cfg.tile_n), _num_sms(device.index),
                          shape.batch, fwd_ctas_per_sm(split_spec, split_cfg, model), one_m_block=rows <= cfg.tile_m)


def _with_packing(spec, shape, pack_gqa: Optional[bool]):
    """The spec with GQA packing decided for this call (``config.use_pack_gqa``: the caller's
    choice, or automatic for short queries). A dropout call runs unpacked, even with ``pack_gqa=True``: its mask
    is drawn per query head of an unpacked tile (``config.dropout_problems``; the manifest's dropout+pack_gqa)."""
    if not spec.dropout and use_pack_gqa(pack_gqa, shape.num_heads, shape.num_heads_kv, shape.seqlen_q):
        return _packed_spec(spec)
    return spec


@functools.lru_cache(maxsize=None)
def _packed_spec(spec):
    return dataclasses.replace(spec, pack_gqa=True)  # memoized: decode calls pack every time


def _launch_fwd(q, k, v, spec, shape, params, out=None, lse=None, varlen=None, config=None, num_splits=None,
                max_ctas=None):
    """Allocate (or check) outputs and launch; inputs are already validated. ``varlen`` is
    (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table) for packed/varlen/paged calls. ``config`` overrides
    the table's choice (tests and tuning only). ``num_splits`` > 1 (or automatic, see ``_splits``)
    runs the split-KV forward into fp32 workspaces and the combine kernel into out/lse. ``max_ctas``
    caps a persistent config's grid (default: one CTA per SM; tests pass fewer so that every CTA
    walks several tiles)."""
    return _plan_for(q, v, spec, shape, params, config, num_splits, max_ctas).run(q, k, v, params.sink, varlen,
                                                                                    out, lse, params.aux,
                                                                                    params.sparse, params.rng)


def _plan_for(q, v, spec, shape, params, config, num_splits, max_ctas) -> "_LaunchPlan":
    """``_plan_launch`` for a validated call's q / v under the current environment."""
    return _plan_launch(spec, shape, params, q.device, q.dtype, tuple(q.shape[:-1]), v.shape[-1], config,
                        num_splits, max_ctas, *_env())


def _env() -> tuple:
    """The environment a launch plan depends on: dispatch model, compile target, occupancy mode."""
    get = os.environ.get
    return get(DISPATCH_ENV), get(COMPILE_TARGET_ENV), get(OCCUPANCY_ENV)


@dataclasses.dataclass(frozen=True)
class _LaunchPlan:
    """Every host decision of one forward call that depends only on its shapes and options (config,
    splits, kernels, scalars, output shapes), so that a repeated call only allocates and launches.
    ``kind``: "launch", "empty" (nothing to compute) or "no_keys" (zero output, LSE of the empty set)."""

    kind: str
    out_shape: tuple
    lse_shape: tuple
    dtype: torch.dtype
    zero_fill: bool  # seqused Q: packed rows past a sequence's used length are never written
    sink_view: Optional[tuple]  # how the sink broadcasts over the LSE on the "no_keys" path
    launches: tuple = ()  # (main kernel,) or (split kernel, combine kernel)
    scalars: tuple = ()
    seqlen_q: int = 0
    splits: int = 1
    max_ctas: int = 0
    band: int = 1
    #: (spec, shape, params without the sink) of the validated call the plan was made for: a remembered call
    #: replays them (its sink re-read), through autograd when a gradient is required
    call: Optional[tuple] = None

    def run(self, q, k, v, sink, varlen, out=None, lse=None, aux=(), sparse=(), rng=None):
        device = q.device
        if out is None:
            out = (torch.zeros if self.zero_fill else torch.empty)(self.out_shape, dtype=self.dtype, device=device)
        else:
            _check_output("out", out, self.out_shape, self.dtype, device)
        if lse is None:
            lse = (torch.full(self.lse_shape, -math.inf, dtype=torch.float32, device=device) if self.zero_fill
                   else torch.empty(self.lse_shape, dtype=torch.float32, device=device))
        else:
            _check_output("lse", lse, self.lse_shape, torch.float32, device)
        if self.kind == "empty":
            return out, lse
        if self.kind == "no_keys":
            out.zero_()
            if sink is not None:
                return out, lse.copy_(sink.view(self.sink_view).expand(self.lse_shape))
            return out, lse.fill_(-math.inf)
        cu_q, cu_k, used_q, used_k, pages = varlen or (None, None, None, None, None)
        if self.splits == 1:
            kernel, = self.launches
            calls = ((kernel, (q, k, v, out, lse, *self.scalars, sink, cu_q, cu_k, used_q, used_k, pages, self.seqlen_q, 1,
                               self.max_ctas, self.band, *compiler.aux_args(aux), *compiler.sparse_args(sparse),
                               rng)),)
        else:
            # Every split writes all its rows (a split without keys: O = 0, LSE = -inf): no fill needed.
            o_part = torch.empty((self.splits, *self.out_shape), dtype=torch.float32, device=device)
            lse_part = torch.empty((self.splits, *self.lse_shape), dtype=torch.float32, device=device)
            split_kernel, combine_kernel = self.launches
            calls = ((split_kernel, (q, k, v, o_part, lse_part, *self.scalars, None, cu_q, cu_k, used_q, used_k, pages,
                                     self.seqlen_q, self.splits, 0, self.band, *compiler.aux_args(aux),
                                     *compiler.sparse_args(sparse), rng)),
                     (combine_kernel, (o_part, lse_part, out, lse, sink, cu_q, used_q, self.seqlen_q)))
        launch_on(device, calls)
        return out, lse


def launch_on(device: torch.device, calls) -> None:
    """Run ``calls``, ``(kernel, args)`` pairs, on ``device`` (the kernels launch on the current device's
    current stream): switching the current device only when it differs, which costs host time per call."""
    if device.index == torch.cuda.current_device():
        for kernel, args in calls:
            kernel(*args)
    else:
        with torch.cuda.device(device):
            for kernel, args in calls:
                kernel(*args)


def _plan_launch(spec, shape, params, device, dtype, rows_shape, head_dim_v, config, num_splits, max_ctas,
                 dispatch_env, target_env, mode) -> _LaunchPlan:
    """The launch plan of a validated call (see ``_LaunchPlan``); ``rows_shape`` is q's shape without
    its head dim."""
    model, target = _model_and_target(device.index, dispatch_env, target_env)
    out_shape = (*rows_shape, head_dim_v)
    lse_shape = (shape.num_heads, rows_shape[0]) if spec.varlen_q else (shape.batch, shape.num_heads, shape.seqlen_q)
    base = dict(out_shape=out_shape, lse_shape=lse_shape, dtype=dtype, zero_fill=spec.seqused_q,
                sink_view=(-1, 1) if spec.varlen_q else (1, -1, 1))
    if math.prod(out_shape) == 0:
        return _LaunchPlan(kind="empty", **base)
    if shape.seqlen_k == 0 or shape.batch == 0:  # no keys anywhere: zero output, LSE of the empty set (or the sink)
        return _LaunchPlan(kind="no_keys", **base)
    rows = shape.seqlen_q * (shape.num_heads // shape.num_heads_kv if spec.pack_gqa else 1)
    shared_kv = spec.pack_gqa or shape.num_heads != shape.num_heads_kv  # several query heads read each K/V head
    cfg = config or choose_fwd_config(spec, model, rows, shape.seqlen_q, shape.seqlen_k, shared_kv)
    # The split-KV forward is its own spec with its own table entry (an exact-dims entry can differ)
    split_spec, combine_spec = _split_specs(spec, params.sink is not None)
    splits = 1
    if num_splits != 1:  # (block-sparse calls always pass 1: their specs have no split entry)
        split_cfg = config or select_fwd_config(split_spec, model)
        splits = _splits(num_splits, spec, shape, cfg, split_spec, split_cfg, model, device)
    band = 1  # masked tiles run longest first in bands of (batch, head) pairs sized to the L2
    if spec.longest_first:
        band = tile_band(_l2_bytes(device.index), shape.seqlen_k, spec.head_dim, spec.head_dim_v,
                         1 if spec.pack_gqa else shape.num_heads // shape.num_heads_kv)
    if splits == 1:
        launches = (_fwd_kernel(spec, cfg, model, target, device.index, mode),)
    else:
        launches = (_fwd_kernel(split_spec, split_cfg, model, target, device.index, mode),
                    compiler.get_combine_kernel(combine_spec, model, target))
    return _LaunchPlan(kind="launch", launches=launches,
                       scalars=(params.scale_log2, params.softcap_scale, params.window_left, params.window_right),
                       seqlen_q=shape.seqlen_q, splits=splits, max_ctas=max_ctas or _num_sms(device.index),
                       band=band, **base)


@functools.lru_cache(maxsize=None)
def _split_specs(spec, has_sink: bool):
    """(forward spec of the splits, combine spec): the splits run without the sink, which enters once
    in the combine. Memoized: it is on every split call."""
    return dataclasses.replace(spec, split_kv=True, has_sink=False), CombineSpec.of(spec, has_sink)


def _check_output(name, t, shape, dtype, device) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device:
        raise ValueError(f"{name} must be a {dtype} tensor of shape {tuple(shape)} on {device}; "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if t.stride(-1) != 1 or (name == "out" and t.data_ptr() % 16):
        raise ValueError(f"{name} must be contiguous in its last dimension and 16-byte aligned")
    if name == "out" and misaligned_row_dim(t) is not None:  # 16-byte vector stores, as for the inputs
        raise ValueError(f"out strides {tuple(t.stride())} are not multiples of 16 bytes; pass a contiguous out")


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float], causal: bool,
              window_left: Optional[int], window_right: Optional[int], softcap: float,
              learnable_sink: Optional[torch.Tensor], num_splits: int,
              pack_gqa: Optional[bool], deterministic: bool,
              rng: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward op (``torch.compile`` graphs; autograd is the op's, ``_fwd_backward``): a repeated call runs
    its remembered plan, as ``flash_attn_func`` does."""
    key = None
    if rng is None:
        key, result = _replay((q, k, v, learnable_sink), (softmax_scale, softcap), (window_left, window_right),
                              ("op", bool(causal), num_splits, pack_gqa), q, k, v, learnable_sink, None, True,
                              deterministic, grad=False)
        if result is not None:
            return result
    _check_options(num_splits, pack_gqa)
    q, k, v, spec, shape, params = _validated(q, k, v, softmax_scale, causal, (window_left, window_right), softcap,
                                              learnable_sink, rng)
    return _run(q, k, v, _with_packing(spec, shape, pack_gqa), shape, params, None, num_splits, True, key,
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
    if _varlen_rememberable(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_metadata, rng):
        varlen = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table)
        key, result = _replay((q, k, v, learnable_sink, *varlen), (max_seqlen_q, max_seqlen_k, softmax_scale, softcap),
                              (window_left, window_right), ("varlen op", bool(causal), num_splits, pack_gqa), q, k, v,
                              learnable_sink, varlen, True, deterministic, grad=False)
        if result is not None:
            return result
    _check_options(num_splits, pack_gqa)
    q, k, v = (kernel_layout(t) for t in (q, k, v))
    spec, shape, params, varlen = _validate_varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, softmax_scale,
        causal, (window_left, window_right), softcap, learnable_sink, check_metadata, page_table, rng)
    return _run(q, k, v, _with_packing(spec, shape, pack_gqa), shape, params, varlen, num_splits, True, key,
                grad=False)


def _varlen_rememberable(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_metadata, rng) -> bool:
    """Whether a varlen call can be remembered: nothing is read from the device (the maxima given where a side
    is packed), no host metadata check, no dropout (its slot is drawn per call)."""
    return (rng is None and (cu_seqlens_q is None or max_seqlen_q is not None)
            and (cu_seqlens_k is None or max_seqlen_k is not None) and not check_requested(check_metadata))


def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                 softmax_scale, causal, window_left, window_right, softcap, learnable_sink, num_splits, pack_gqa,
                 check_metadata, page_table, deterministic, rng):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    heads = q.shape[-2]
    lse_shape = (heads, q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], heads, q.shape[1])
    return out, q.new_empty(lse_shape, dtype=torch.float32)


def _grads(q, k, v, out, lse, dout, dlse, spec, shape, params, varlen, sink_dtype, deterministic, grads=None):
    """(dq, dk, dv, dsink) of a validated forward call: the eager autograd.Function, the backward custom ops and
    ``flash_attn_bwd`` all end here (``grads``: (dq, dk, dv) to write into)."""
    if dout is None:
        dout = torch.zeros_like(out)
    index = q.device.index
    dispatch_env, target_env, mode = _env()
    model, target = _model_and_target(index, dispatch_env, target_env)
    return backward.run_bwd(q, k, v, out, dout, lse, dlse, spec, shape, params, varlen, sink_dtype, model, target,
                            device_smem(index, mode), deterministic, grads=grads, num_sms=_num_sms(index),
                            l2_bytes=_l2_bytes(index))


def _dtype_of(sink: Optional[torch.Tensor]):
    return sink.dtype if sink is not None else None


def _dsink_out(dsink, q):
    """A custom op returns tensors only: no sink -> an empty fp32 tensor (mapped back to None)."""
    return dsink if dsink is not None else q.new_empty((0,), dtype=torch.float32)


def _bwd_impl(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, softmax_scale: Optional[float], causal: bool,
              window_left: Optional[int], window_right: Optional[int], softcap: float,
              learnable_sink: Optional[torch.Tensor], deterministic: bool,
              rng: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    key = _call_key((q, k, v, learnable_sink), (softmax_scale, softcap, window_left, window_right),
                    ("bwd op", bool(causal), rng is None))
    q, k, v, spec, shape, params = _validated_once(key, (q, k, v), learnable_sink, rng, lambda q, k, v: _validated(
        q, k, v, softmax_scale, causal, (window_left, window_right), softcap, learnable_sink, rng)[3:])
    dq, dk, dv, dsink = _grads(q, k, v, out, lse, dout, dlse, spec, shape, params, None, _dtype_of(learnable_sink),
                               deterministic)
    return dq, dk, dv, _dsink_out(dsink, q)


def _validated_once(key, qkv, learnable_sink, rng, validate) -> tuple:
    """``(q, k, v, spec, shape, params)`` of a backward op's call: on the first call with ``key`` (``_call_key``;
    None: every call) q / k / v in the kernels' layout (copied where they cannot be read in place) and
    ``validate(q, k, v)`` -> (spec, shape, params), remembered in the shared plans table (a training step repeats
    its calls); later calls put their own sink and dropout slot back (``_per_call``). A key's tensors are read
    in place, so a remembered call's q / k / v are the kernels'."""
    call = remembered(key)
    if call is None:
        qkv = tuple(kernel_layout(t) for t in qkv)
        call = validate(*qkv)
        if key is not None:
            remember(key, (*call[:2], dataclasses.replace(call[2], sink=None, rng=None)))
        return (*qkv, *call)
    spec, shape, params = call
    return (*qkv, spec, shape, _per_call(params, learnable_sink, rng))


def _per_call(params, learnable_sink, rng=None):
    """A remembered call's parameters with this call's learnable sink (as the kernels read it) and dropout slot."""
    if learnable_sink is None and rng is None:
        return params
    return dataclasses.replace(params, sink=_plain_sink(learnable_sink), rng=rng)


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
    if _varlen_rememberable(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, False, rng):
        key = _call_key((q, k, v, learnable_sink, *varlen[:4]),
                        (max_seqlen_q, max_seqlen_k, softmax_scale, softcap, window_left, window_right),
                        ("varlen bwd op", bool(causal)))

    def validate(q, k, v):
        return _validate_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                                     seqused_k, softmax_scale, causal, (window_left, window_right), softcap,
                                     learnable_sink, False, rng=rng)[:3]

    q, k, v, spec, shape, params = _validated_once(key, (q, k, v), learnable_sink, rng, validate)
    dq, dk, dv, dsink = _grads(q, k, v, out, lse, dout, dlse, spec, shape, params, varlen, _dtype_of(learnable_sink),
                               deterministic)
    return dq, dk, dv, _dsink_out(dsink, q)


def _varlen_bwd_fake(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, learnable_sink,
                     deterministic, rng):
    return _bwd_fake(dout, dlse, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
                     learnable_sink, deterministic, rng)


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
        raise NotImplementedError(_refusal(("paged_kv", "backward")))
    q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink, rng = ctx.saved_tensors
    dq, dk, dv, dsink = _varlen_bwd_op(dout, dlse, q, k, v, out, lse, cu_q, cu_k, used_q, used_k, *ctx.scalars,
                                       sink, ctx.deterministic, rng)
    return (dq, dk, dv) + (None,) * 11 + ((dsink if sink is not None else None),) + (None,) * 6


class _FlashAttnFunc(torch.autograd.Function):
    """Eager path: a plain autograd.Function costs microseconds where the custom op's Python
    dispatch costs hundreds (measured ~600 us per call on CPU, 2026-11-22). The learnable sink is an
    input of its own (``sink``, the caller's tensor) so that its gradient reaches it; the kernels read
    the fp32 copy in ``params``."""

    @staticmethod
    def forward(ctx, q, k, v, sink, spec, shape, params, varlen, plan, deterministic=False):
        out, lse = plan.run(q, k, v, params.sink, varlen, aux=params.aux, sparse=params.sparse, rng=params.rng)
        ctx.save_for_backward(q, k, v, out, lse, *(varlen or (None,) * 5))
        ctx.spec, ctx.shape, ctx.params, ctx.deterministic = spec, shape, params, deterministic
        ctx.sink_dtype = _dtype_of(sink)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *varlen = ctx.saved_tensors
        dq, dk, dv, dsink = _grads(q, k, v, out, lse, dout, dlse, ctx.spec, ctx.shape, ctx.params,
                                   tuple(varlen) if any(t is not None for t in varlen) else None, ctx.sink_dtype,
                                   ctx.deterministic)
        return dq, dk, dv, dsink, None, None, None, None, None, None


#: This build's op library, kept alive for the process (dropping it would remove the ops' registrations).
_OP_LIBRARIES: dict = {}


def _register_op(name: str, impl, fake):
    """Register this build's op ``name`` once per process. The name carries the build's namespace, so two builds
    never collide; the same build imported twice (clone import + get_kernel) reuses it. Defined through
    ``torch.library.Library`` with one CompositeExplicitAutograd kernel and a fake, not ``torch.library.custom_op``:
    the latter wraps every call in Python layers (an autograd kernel, an alias check, a dynamo guard) that cost a
    compiled training step ~40-80 us of host time per op call on the H100 device host (session 39,
    ``explore/op_host_probe.py``). The ops carry no autograd: ``torch.compile`` reaches them through
    ``_CompiledFwd`` / ``_CompiledVarlenFwd``, whose backward calls the backward ops."""
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


def _distinct(*tensors) -> tuple:
    """``tensors`` with any repeat of an earlier one replaced by a view of it: Dynamo does not trace an
    autograd.Function given one tensor as two inputs (self-attention's ``q is k is v``); gradients reach the
    tensor through the views."""
    out = []
    for t in tensors:
        repeat = t is not None and any(t is u for u in out)
        out.append(t.view(t.shape) if repeat else t)
    return tuple(out)


class _CompiledFwd(torch.autograd.Function):
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


class _CompiledVarlenFwd(torch.autograd.Function):
    """``_CompiledFwd`` for the varlen forward op."""

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


def _window_entries(window_size) -> tuple:
    """The user's (left, right) as the custom ops take them (resolved inside the op, at run time)."""
    window = tuple(window_size) if window_size is not None else (None, None)
    if len(window) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    return window


def _refuse_unimplemented(num_splits, pack_gqa, score_mod, mask_mod, extra) -> None:
    """Check the options, then raise the manifest's message for each requested feature this version
    does not implement."""
    if extra:
        raise TypeError(f"flash_attn_func got unexpected arguments: {sorted(extra)}")
    _check_options(num_splits, pack_gqa)
    requested = []
    if num_splits not in (None, 1, 0):
        requested.append("split_kv")
    if score_mod is not None or mask_mod is not None:
        requested.append("score_mod")
    if requested:
        refusal = _refusal(tuple(requested))
        if refusal is not None:
            raise NotImplementedError(refusal)


_REFUSALS: dict = {}


@torch.compiler.assume_constant_result
def _refusal(requested: tuple) -> Optional[str]:
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


def _with_mods(spec, params, mods: dict, needs_grad: bool, device=None):
    """(spec, params) of a call with ``mods`` (score_mod, mask_mod, score_mod_bwd, aux_tensors, aux_scalars;
    issue 20): the spec keyed on the mods (``flex.ModKey``, callables registered for the compiler); with a
    score_mod the kernel scales S by softmax_scale before it (the softcap slot) and exponentiates with log2(e).
    Raises the manifest's message for the combinations it refuses (mask_mod with causal / a window, softcap)."""
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
    refusal = _refusal(("score_mod", *(name for name, on in flags if on)))
    if refusal is not None:
        raise NotImplementedError(refusal)
    flex.register(key, mods.get("score_mod"), mods.get("score_mod_bwd"), mods.get("mask_mod"))
    spec = dataclasses.replace(spec, mods=key)
    if mods.get("score_mod") is not None:
        params = dataclasses.replace(params, scale_log2=LOG2_E, softcap_scale=params.softmax_scale)
    return spec, (dataclasses.replace(params, aux=aux) if aux else params)




def _aux_tensors(tensors, scalars, device) -> tuple:
    """The call's aux tensors for the kernels' aux slots (their last dimension made contiguous), checked."""
    if scalars:
        raise NotImplementedError("aux_scalars are not supported by flash-attn-4-sm120: capture numbers in the mod "
                                  "(its closure values are part of its compile key) or pass a 1-element aux tensor")
    if not tensors:
        return ()
    tensors = tuple(tensors)
    if len(tensors) > compiler.MAX_AUX_TENSORS:
        raise ValueError(f"at most {compiler.MAX_AUX_TENSORS} aux_tensors, got {len(tensors)}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.dim() < 1 or (device is not None and t.device != device):
            raise ValueError(f"aux_tensors[{i}] must be a tensor of at least one dimension on {device}")
        if flex.dtype_name(t) not in compiler.AUX_DTYPES:
            raise ValueError(f"aux_tensors[{i}] has dtype {t.dtype}; supported: {', '.join(compiler.AUX_DTYPES)}")
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def _mods_of(score_mod, mask_mod, kwargs: dict) -> dict:
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


def _has_mods(mods: dict) -> bool:
    """Whether the call has mods that the kernels trace (score_mod, mask_mod, aux tensors, block-sparse lists):
    such a call runs eagerly (``_flex_call``); dropout alone runs through the custom ops."""
    return any(v is not None for name, v in mods.items() if name != "dropout")


def _needs_grad(q, k, v, sink=None) -> bool:
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v, sink))


def _run(q, k, v, spec, shape, params, varlen, num_splits, return_lse, key=None, sink=None, deterministic=False,
         grad=None):
    """The forward of a validated call (``_run_plan``) through its launch plan, the plan remembered under the
    call's ``key`` (``_call_key``) when it has one. ``sink``: the caller's learnable sink (its gradient goes
    there)."""
    plan = _plan_for(q, v, spec, shape, params, None, num_splits, None)
    if key is not None:
        remember(key, dataclasses.replace(plan, call=(spec, shape, dataclasses.replace(params, sink=None))))
    return _run_plan(plan, q, k, v, spec, shape, params, varlen, return_lse, sink, deterministic, grad)


def _run_plan(plan, q, k, v, spec, shape, params, varlen, return_lse, sink, deterministic, grad=None):
    """``plan`` run on the call's tensors, through autograd when a gradient is required (``grad``; None: when
    the inputs require one; a custom op's implementation passes False, its autograd is the op's); returns
    ``(out, lse or None)`` (the LSE when asked for or needed by the backward)."""
    if _needs_grad(q, k, v, sink) if grad is None else grad:
        if spec.page_size:
            raise NotImplementedError(_refusal(("paged_kv", "backward")))
        return _FlashAttnFunc.apply(q, k, v, sink, spec, shape, params, varlen, plan, deterministic)
    out, lse = plan.run(q, k, v, params.sink, varlen, aux=params.aux, sparse=params.sparse, rng=params.rng)
    return out, (lse if return_lse else None)


#: Launch plans of calls seen before, by ``_call_key``: a repeated call (every layer of a model, every
#: decode step at a fixed shape, every training step) skips validation and dispatch and only allocates and
#: launches. The backward ops' entries are their validated calls (``_validated_once``).
_PLANS: dict = {}
#: Cleared when full (a decode loop over a growing dense K/V makes a new key per step).
MAX_CACHED_PLANS = 1024
_PLAIN = (int, float, type(None))


def remember(key: Optional[tuple], plan):
    """``plan``, stored in ``_PLANS`` under ``key`` (``_call_key``; None: not stored), the table cleared when
    full. Every entry point's plans share the table: their keys carry the entry's name."""
    if key is not None:
        if len(_PLANS) >= MAX_CACHED_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def remembered(key: Optional[tuple]):
    """The plan stored under ``key``, or None."""
    return _PLANS.get(key) if key is not None else None


def _call_key(tensors, scalars, options) -> Optional[tuple]:
    """What validation and dispatch of a call read, as a hashable key, or None when the call cannot be
    remembered: ``tensors`` (q, k, v, the sink, the metadata tensors; or None) must be 16-byte aligned tensors
    the kernels read in place (contiguous, or strided with a contiguous last dimension and 16-byte row strides,
    such as a transposed (batch, heads, seqlen, d) view; others are copied first: ``kernel_layout``);
    ``scalars`` must be plain Python numbers or None (a tensor-valued scale or window is re-read every call). A
    key covers every fact the checks look at (shape, dtype, device, strides, alignment), so a call with a
    remembered key passes validation exactly as the call that stored it did."""
    key = [*options, _env()]
    try:
        for t in tensors:
            if t is None:
                key.append(None)
            elif t.data_ptr() % 16:
                return None
            elif t.is_contiguous():
                key.append((t.shape, t.dtype, t.device))
            elif t.dim() and t.stride(-1) == 1 and misaligned_row_dim(t) is None:
                key.append((t.shape, t.dtype, t.device, t.stride()))
            else:
                return None
        for x in scalars:
            if type(x) not in _PLAIN:
                return None
            key.append(x)
    except (AttributeError, TypeError):  # not a tensor: validation reports it
        return None
    return tuple(key)


def _replay(tensors, scalars, window_size, options, q, k, v, learnable_sink, varlen, return_lse, deterministic,
            grad=None):
    """``(key, result)``: the call's ``_call_key`` (window bounds appended to ``scalars``), and the
    remembered plan's ``(out, lse or None)`` (``_run_plan``: through autograd when a gradient is required) when
    there is one, else None."""
    window = tuple(window_size) if isinstance(window_size, (tuple, list)) else (None, None, window_size)
    key = _call_key(tensors, (*scalars, *window), options)
    plan = remembered(key)
    if plan is None:
        return key, None
    spec, shape, params = plan.call
    return key, _run_plan(plan, q, k, v, spec, shape, _per_call(params, learnable_sink), varlen, return_lse,
                          learnable_sink, deterministic, grad)


def _plain_sink(learnable_sink):
    """The sink as the kernels read it (``problem._runtime_params`` does the same on the first call)."""
    return None if learnable_sink is None else learnable_sink.detach().to(torch.float32).contiguous()


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple = (None, None),
    learnable_sink: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    num_splits: Optional[int] = None,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    score_mod=None,
    mask_mod=None,
    return_lse: bool = False,
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
    """
    page_table = kwargs.pop("page_table", None)
    if page_table is not None:
        return flash_attn_varlen_func(q, k, v, page_table=page_table, softmax_scale=softmax_scale, causal=causal,
                                      window_size=window_size, learnable_sink=learnable_sink, softcap=softcap,
                                      num_splits=num_splits, pack_gqa=pack_gqa, deterministic=deterministic,
                                      score_mod=score_mod, mask_mod=mask_mod, return_lse=return_lse, **kwargs)
    mods = _mods_of(score_mod, mask_mod, kwargs)
    _refuse_unimplemented(num_splits, pack_gqa, score_mod, mask_mod, kwargs)
    if _has_mods(mods):
        return _flex_call(q, k, v, None, mods, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                          learnable_sink=learnable_sink, softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa,
                          deterministic=deterministic, return_lse=return_lse)
    rng = _rng_of(mods["dropout"], q)  # device-side: traced and CUDA-graph capturable
    if torch.compiler.is_compiling():
        # Graphs see the namespaced custom op (fake impl while tracing); its real implementation
        # validates the concrete tensors when the graph runs (pointers do not exist while tracing).
        q, k, v, learnable_sink = _distinct(q, k, v, learnable_sink)
        out, lse = _CompiledFwd.apply(q, k, v, softmax_scale, bool(causal), *_window_entries(window_size),
                                      float(softcap or 0.0), learnable_sink, num_splits or 0, pack_gqa,
                                      bool(deterministic), rng)
        return out, (lse if (return_lse or _needs_grad(q, k, v, learnable_sink)) else None)
    key = None
    if rng is None:
        key, result = _replay((q, k, v, learnable_sink), (softmax_scale, softcap), window_size,
                              ("dense", bool(causal), num_splits, pack_gqa), q, k, v, learnable_sink, None, return_lse,
                              bool(deterministic))
        if result is not None:
            return result
    q, k, v, spec, shape, params = _validated(q, k, v, softmax_scale, causal, window_size, softcap, learnable_sink,
                                              rng)
    return _run(q, k, v, _with_packing(spec, shape, pack_gqa), shape, params, None, num_splits, return_lse, key,
                learnable_sink, bool(deterministic))


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
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
    mask_mod=None,
    return_lse: bool = False,
    check_metadata: Optional[bool] = None,
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
    """
    mods = _mods_of(score_mod, mask_mod, kwargs)
    _refuse_unimplemented(num_splits, pack_gqa, score_mod, mask_mod, kwargs)
    if _has_mods(mods):
        varlen = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, seqused_q=seqused_q, seqused_k=seqused_k, page_table=page_table,
                      check_metadata=check_metadata)
        return _flex_call(q, k, v, varlen, mods, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                          learnable_sink=learnable_sink, softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa,
                          deterministic=deterministic, return_lse=return_lse)
    rng = _rng_of(mods["dropout"], q)
    if torch.compiler.is_compiling():
        # Like flash_attn_func: graphs see the namespaced custom op; validation runs inside it.
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table, learnable_sink = _distinct(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table, learnable_sink)
        out, lse = _CompiledVarlenFwd.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                                            max_seqlen_k, softmax_scale, bool(causal), *_window_entries(window_size),
                                            float(softcap or 0.0), learnable_sink, num_splits or 0, pack_gqa,
                                            check_metadata, page_table, bool(deterministic), rng)
        return out, (lse if (return_lse or _needs_grad(q, k, v, learnable_sink)) else None)
    key = None
    if _varlen_rememberable(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_metadata, rng):
        varlen = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table)
        key, result = _replay((q, k, v, learnable_sink, *varlen), (max_seqlen_q, max_seqlen_k, softmax_scale, softcap),
                              window_size, ("varlen", bool(causal), num_splits, pack_gqa), q, k, v, learnable_sink,
                              varlen, return_lse, bool(deterministic))
        if result is not None:
            return result
    q, k, v = (kernel_layout(t) for t in (q, k, v))
    spec, shape, params, varlen = _validate_varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, softmax_scale, causal,
        window_size, softcap, learnable_sink, check_metadata, page_table, rng)
    return _run(q, k, v, _with_packing(spec, shape, pack_gqa), shape, params, varlen, num_splits, return_lse, key,
                learnable_sink, bool(deterministic))


@torch.compiler.disable
def _flex_call(q, k, v, varlen: Optional[dict], mods: dict, softmax_scale, causal, window_size, learnable_sink,
               softcap, num_splits, pack_gqa, deterministic, return_lse):
    """A forward with score_mod / mask_mod (issue 20), dense (``varlen`` None) or varlen (its keyword arguments):
    eager even under torch.compile (the callables are traced into the kernel, which a graph's custom op cannot
    carry: Dynamo breaks the graph here), never remembered as a launch plan (the mods are part of the spec)."""
    mods = dict(mods)
    sparse = mods.pop("block_sparse_tensors", None)
    rng = _rng_of(mods.pop("dropout", None), q)
    if varlen is None:
        q, k, v, spec, shape, params = _validated(q, k, v, softmax_scale, causal, window_size, softcap,
                                                  learnable_sink, rng)
        tensors = None
    else:
        q, k, v = (kernel_layout(t) for t in (q, k, v))
        spec, shape, params, tensors = _validate_varlen_call(
            q, k, v, varlen["cu_seqlens_q"], varlen["cu_seqlens_k"], varlen["max_seqlen_q"], varlen["max_seqlen_k"],
            varlen["seqused_q"], varlen["seqused_k"], softmax_scale, causal, window_size, softcap, learnable_sink,
            varlen["check_metadata"], varlen["page_table"], rng)
    needs_grad = _needs_grad(q, k, v, learnable_sink)
    spec, params = _with_mods(spec, params, mods, needs_grad, q.device)
    if sparse is not None:
        spec, params = _with_block_sparse(spec, shape, params, sparse, needs_grad, num_splits, pack_gqa, q.device,
                                          bool(deterministic))
        pack_gqa, num_splits = False, 1  # the lists are per query head and walked whole (config.block_sparse_problems)
    return _run(q, k, v, _with_packing(spec, shape, pack_gqa), shape, params, tensors, num_splits, return_lse, None,
                learnable_sink, bool(deterministic))


def _rng_of(drop: Optional[tuple], q) -> Optional[torch.Tensor]:
    """The kernels' dropout slot of a call's ``(p, seed)`` (``_dropout_of``) on q's device, or None without
    dropout (built before validation, which reports a q that is not a tensor)."""
    if drop is None:
        return None
    return dropout.rng_tensor(drop[1], 0, drop[0], getattr(q, "device", None))


def _with_dropout(spec, params, rng: Optional[torch.Tensor]):
    """(spec, params) of a call with dropout (issue 20; ``rng``: the kernels' slot, None: no dropout): the flag in
    the spec, the slot in the params (a dropout spec runs unpacked: ``_with_packing``)."""
    if rng is None:
        return spec, params
    return dataclasses.replace(spec, dropout=True), dataclasses.replace(params, rng=rng)


def _with_block_sparse(spec, shape, params, sparse, needs_grad: bool, num_splits, pack_gqa, device,
                       deterministic: bool = False):
    """(spec, params) of a call with ``block_sparse_tensors`` (issue 20): the block size in the spec, the tensors
    in the kernels' sparse slots. Raises the manifest's message for the combinations it refuses and
    ``ValueError`` for tensors that do not fit the call (``block_sparse.check_block_sparse``)."""
    flags = (("backward", needs_grad), ("deterministic_backward", needs_grad and deterministic), ("varlen", spec.varlen_q or spec.varlen_k or spec.seqused_q or spec.seqused_k),
             ("paged_kv", bool(spec.page_size)), ("split_kv", num_splits not in (None, 0, 1)),
             ("pack_gqa", pack_gqa is True))
    refusal = _refusal(("block_sparsity", *(name for name, on in flags if on)))
    if refusal is not None:
        raise NotImplementedError(refusal)
    bq, bk = block_sparse.check_block_sparse(sparse, shape.batch, shape.num_heads, shape.seqlen_q, shape.seqlen_k,
                                             device)
    full = sparse.full_block_cnt is not None
    spec = dataclasses.replace(spec, block_sparse=(bq, bk, full))
    tensors = (sparse.mask_block_cnt, sparse.mask_block_idx, sparse.full_block_cnt, sparse.full_block_idx)
    return spec, dataclasses.replace(params, sparse=tensors)


def _validate_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                          softmax_scale, causal, window_size, softcap, learnable_sink, check_metadata, page_table=None,
                          rng=None):
    """``validate_varlen`` plus the opt-in metadata check and the dropout slot ``rng`` (None: no dropout);
    returns (spec, shape, params, varlen tensors)."""
    spec, shape, params = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                          seqused_q, seqused_k, softmax_scale, causal, window_size, softcap,
                                          learnable_sink, page_table)
    if check_requested(check_metadata):
        check_varlen_metadata(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                              page_table)
    spec, params = _with_dropout(spec, params, rng)
    return spec, shape, params, (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table)


__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_fwd", "dispatch_model"]
