"""Launch planning: every host decision of a validated forward call that depends only on its shapes and options.

``plan_launch`` turns (spec, shape, params) into a ``LaunchPlan``: the config (``config.choose_fwd_config``), the
KV splits (``config.num_splits_for``), the compiled kernels (``compiler``), the scalars and the output shapes, from
the execution model of the call's device (``model_and_target``) and the part's facts (SMs, L2, shared memory).
``LaunchPlan.run`` then only allocates (or checks) the outputs and launches. A repeated call skips validation and
planning: its plan is remembered under ``call_key``, a key of everything validation and dispatch read.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Optional

import torch

from . import compiler
from .config import (
    choose_fwd_config,
    chunked_spec,
    invariant_chunks,
    invariant_config,
    decode_entry,
    tile_band,
    uncut_window,
    fwd_ctas_per_sm,
    num_splits_for,
    occupancy_launch_smem,
    select_fwd_config,
    use_pack_gqa,
    wide_features,
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
from .invariance import chunk_keys
from .metadata import check_requested
from .problem import CombineSpec, misaligned_row_dim
from .validation import check_output, refusal


@functools.lru_cache(maxsize=None)
def model_and_target(device_index: Optional[int], dispatch_override: Optional[str],
                     target_override: Optional[str]) -> tuple[ExecutionModel, str]:
    cap = torch.cuda.get_device_capability(device_index) if torch.cuda.is_available() else None
    model = resolve_dispatch_model(cap, dispatch_override)
    return model, resolve_compile_target(model, target_override)


@functools.lru_cache(maxsize=None)
def num_sms(device_index: Optional[int]) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def l2_bytes(device_index: Optional[int]) -> int:
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
    return model_and_target(device.index, os.environ.get(DISPATCH_ENV), os.environ.get(COMPILE_TARGET_ENV))[0]


def with_packing(spec, shape, pack_gqa: Optional[bool]):
    """The spec with GQA packing decided for this call (``config.use_pack_gqa``: the caller's
    choice, or automatic for short queries). A dropout call runs unpacked, even with ``pack_gqa=True``: its mask
    is drawn per query head of an unpacked tile (``config.dropout_problems``; the manifest's dropout+pack_gqa)."""
    if not spec.dropout and use_pack_gqa(pack_gqa, shape.num_heads, shape.num_heads_kv, shape.seqlen_q):
        return _packed_spec(spec)
    return spec


@functools.lru_cache(maxsize=None)
def _packed_spec(spec):
    return dataclasses.replace(spec, pack_gqa=True)  # memoized: decode calls pack every time


def launch_fwd(q, k, v, spec, shape, params, out=None, lse=None, varlen=None, config=None, num_splits=None,
               max_ctas=None):
    """Allocate (or check) outputs and launch; inputs are already validated. ``varlen`` is
    (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table) for packed/varlen/paged calls. ``config`` overrides
    the table's choice (tests and tuning only). ``num_splits`` > 1 (or automatic, see ``_splits``)
    runs the split-KV forward into fp32 workspaces and the combine kernel into out/lse. ``max_ctas``
    caps a persistent config's grid (default: one CTA per SM; tests pass fewer so that every CTA
    walks several tiles)."""
    return plan_for(q, v, spec, shape, params, config, num_splits, max_ctas).run(q, k, v, params.sink, varlen,
                                                                                    out, lse, params.aux,
                                                                                    params.sparse, params.rng,
                                                                                    params.descale)


def plan_for(q, v, spec, shape, params, config, num_splits, max_ctas, invariant=False) -> "LaunchPlan":
    """``plan_launch`` for a validated call's q / v under the current environment."""
    # FP8 MMAs (an e4m3 q) write bf16 O
    return plan_launch(spec, shape, params, q.device, torch.bfloat16 if spec.fp8_mma else q.dtype,
                       tuple(q.shape[:-1]), v.shape[-1], config,
                       num_splits, max_ctas, *launch_env(), invariant=invariant)


def launch_env() -> tuple:
    """The environment a launch plan depends on: dispatch model, compile target, occupancy mode."""
    get = os.environ.get
    return get(DISPATCH_ENV), get(COMPILE_TARGET_ENV), get(OCCUPANCY_ENV)


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
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

    def run(self, q, k, v, sink, varlen, out=None, lse=None, aux=(), sparse=(), rng=None, descale=()):
        device = q.device
        if out is None:
            out = (torch.zeros if self.zero_fill else torch.empty)(self.out_shape, dtype=self.dtype, device=device)
        else:
            check_output("out", out, self.out_shape, self.dtype, device)
        if lse is None:
            lse = (torch.full(self.lse_shape, -math.inf, dtype=torch.float32, device=device) if self.zero_fill
                   else torch.empty(self.lse_shape, dtype=torch.float32, device=device))
        else:
            check_output("lse", lse, self.lse_shape, torch.float32, device)
        if self.kind == "empty":
            return out, lse
        if self.kind == "no_keys":
            out.zero_()
            if sink is not None:
                return out, lse.copy_(sink.view(self.sink_view).expand(self.lse_shape))
            return out, lse.fill_(-math.inf)
        cu_q, cu_k, used_q, used_k, pages = varlen or (None, None, None, None, None)
        if len(self.launches) == 1:
            kernel, = self.launches
            calls = ((kernel, (q, k, v, out, lse, *self.scalars, sink, cu_q, cu_k, used_q, used_k, pages,
                               self.seqlen_q, 1, self.max_ctas, self.band, *compiler.aux_args(aux),
                               *compiler.sparse_args(sparse), rng, *(descale or (None, None)))),)
        else:
            # Every split writes all its rows (a split without keys: O = 0, LSE = -inf): no fill needed.
            o_part = torch.empty((self.splits, *self.out_shape), dtype=torch.float32, device=device)
            lse_part = torch.empty((self.splits, *self.lse_shape), dtype=torch.float32, device=device)
            split_kernel, combine_kernel = self.launches
            calls = ((split_kernel, (q, k, v, o_part, lse_part, *self.scalars, None, cu_q, cu_k, used_q, used_k, pages,
                                     self.seqlen_q, self.splits, 0, self.band, *compiler.aux_args(aux),
                                     *compiler.sparse_args(sparse), rng, *(descale or (None, None)))),
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


def plan_launch(spec, shape, params, device, dtype, rows_shape, head_dim_v, config, num_splits, max_ctas,
                dispatch_env, target_env, mode, invariant=False) -> LaunchPlan:
    """The launch plan of a validated call (see ``LaunchPlan``); ``rows_shape`` is q's shape without
    its head dim; ``invariant``: batch-invariant (a tile of ``invariant_family``; the caller passes one split, and
    a call longer than a chunk runs in fixed chunks of keys, ``config.invariant_chunks``)."""
    wide = wide_features(spec)
    if wide:
        raise NotImplementedError(refusal(("head_dim_512", *wide)))
    model, target = model_and_target(device.index, dispatch_env, target_env)
    out_shape = (*rows_shape, head_dim_v)
    lse_shape = (shape.num_heads, rows_shape[0]) if spec.varlen_q else (shape.batch, shape.num_heads, shape.seqlen_q)
    base = dict(out_shape=out_shape, lse_shape=lse_shape, dtype=dtype, zero_fill=spec.seqused_q,
                sink_view=(-1, 1) if spec.varlen_q else (1, -1, 1))
    if math.prod(out_shape) == 0:
        return LaunchPlan(kind="empty", **base)
    if shape.seqlen_k == 0 or shape.batch == 0:  # no keys anywhere: zero output, LSE of the empty set (or the sink)
        return LaunchPlan(kind="no_keys", **base)
    rows = shape.seqlen_q * (shape.num_heads // shape.num_heads_kv if spec.pack_gqa else 1)
    shared_kv = spec.pack_gqa or shape.num_heads != shape.num_heads_kv  # several query heads read each K/V head
    choose = invariant_config if invariant else choose_fwd_config
    cfg = config or choose(spec, model, rows, shape.seqlen_q, shape.seqlen_k, shared_kv)
    # The split-KV forward is its own spec with its own table entry (an exact-dims entry can differ)
    split_spec, combine_spec = _split_specs(spec, params.sink is not None)
    splits = 1
    chunks = 0
    if invariant:  # fixed chunks of keys, merged in chunk order (``config.INVARIANT_CHUNK_KEYS``)
        span, keys = params.window_left + params.window_right + 1 if spec.local else None, chunk_keys()
        chunks = invariant_chunks(cfg, shape.seqlen_k, params.sink is not None, span, keys)
    if chunks:
        split_spec = chunked_spec(spec, cfg, uncut_window(span, keys), keys)
        splits = chunks
        split_cfg = config or invariant_config(split_spec, model, rows, shape.seqlen_q, shape.seqlen_k, shared_kv)
    elif num_splits != 1:  # (block-sparse calls always pass 1: their specs have no split entry)
        # the decode tile splits too (decode_entry), else the split spec's own entry
        split_cfg = (config or (decode_entry(split_spec, model) if cfg == decode_entry(spec, model) else None)
                     or select_fwd_config(split_spec, model))
        splits = _splits(num_splits, spec, shape, cfg, split_spec, split_cfg, model, device)
    band = 1  # masked tiles run longest first in bands of (batch, head) pairs sized to the L2
    if spec.longest_first:
        band = tile_band(l2_bytes(device.index), shape.seqlen_k, spec.head_dim, spec.head_dim_v,
                         1 if spec.pack_gqa else shape.num_heads // shape.num_heads_kv)
    if splits == 1 and not chunks:
        launches = (_fwd_kernel(spec, cfg, model, target, device.index, mode),)
    else:
        launches = (_fwd_kernel(split_spec, split_cfg, model, target, device.index, mode),
                    compiler.get_combine_kernel(combine_spec, model, target))
    return LaunchPlan(kind="launch", launches=launches,
                      scalars=(params.scale_log2, params.softcap_scale, params.window_left, params.window_right),
                      seqlen_q=shape.seqlen_q, splits=splits, max_ctas=max_ctas or num_sms(device.index),
                      band=band, **base)


def _splits(requested, spec, shape, cfg, split_spec, split_cfg, model, device) -> int:
    """KV splits for this call (``config.num_splits_for``), from the grid the unsplit launch (``cfg``)
    would have, the key blocks of the split kernel's tiles and its CTAs per SM under the model."""
    if requested == 1:
        return 1
    group = shape.num_heads // shape.num_heads_kv
    rows = shape.seqlen_q * group if spec.pack_gqa else shape.seqlen_q
    heads = shape.num_heads_kv if spec.pack_gqa else shape.num_heads
    num_ctas = -(-rows // cfg.tile_m) * heads * shape.batch
    return num_splits_for(requested, num_ctas, -(-shape.seqlen_k // split_cfg.tile_n), num_sms(device.index),
                          shape.batch, fwd_ctas_per_sm(split_spec, split_cfg, model), one_m_block=rows <= cfg.tile_m)


@functools.lru_cache(maxsize=None)
def _split_specs(spec, has_sink: bool):
    """(forward spec of the splits, combine spec): the splits run without the sink, which enters once
    in the combine. Memoized: it is on every split call."""
    return dataclasses.replace(spec, split_kv=True, has_sink=False), CombineSpec.of(spec, has_sink)


#: Launch plans of calls seen before, by ``call_key``: a repeated call (every layer of a model, every
#: decode step at a fixed shape, every training step) skips validation and dispatch and only allocates and
#: launches. The backward ops' entries are their validated calls (``custom_ops._validated_once``).
_PLANS: dict = {}


#: Cleared when full (a decode loop over a growing dense K/V makes a new key per step).
MAX_CACHED_PLANS = 1024


_PLAIN = (int, float, type(None))


def remember(key: Optional[tuple], plan):
    """``plan``, stored in ``_PLANS`` under ``key`` (``call_key``; None: not stored), the table cleared when
    full. Every entry point's plans share the table: their keys carry the entry's name."""
    if key is not None:
        if len(_PLANS) >= MAX_CACHED_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def remembered(key: Optional[tuple]):
    """The plan stored under ``key``, or None."""
    return _PLANS.get(key) if key is not None else None


def call_key(tensors, scalars, options) -> Optional[tuple]:
    """What validation and dispatch of a call read, as a hashable key, or None when the call cannot be
    remembered: ``tensors`` (q, k, v, the sink, the metadata tensors; or None) must be 16-byte aligned tensors
    the kernels read in place (contiguous, or strided with a contiguous last dimension and 16-byte row strides,
    such as a transposed (batch, heads, seqlen, d) view; others are copied first: ``kernel_layout``);
    ``scalars`` must be plain Python numbers or None (a tensor-valued scale or window is re-read every call). A
    key covers every fact the checks look at (shape, dtype, device, strides, alignment), so a call with a
    remembered key passes validation exactly as the call that stored it did."""
    key = [*options, launch_env()]
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


def varlen_rememberable(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_metadata, rng) -> bool:
    """Whether a varlen call can be remembered: nothing is read from the device (the maxima given where a side
    is packed), no host metadata check, no dropout (its slot is drawn per call)."""
    return (rng is None and (cu_seqlens_q is None or max_seqlen_q is not None)
            and (cu_seqlens_k is None or max_seqlen_k is not None) and not check_requested(check_metadata))
