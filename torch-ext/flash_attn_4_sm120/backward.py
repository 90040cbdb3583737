"""The backward pass on the host: workspaces, the three kernels, the sink gradient. No architecture
branches (the execution model arrives as an argument, the tile from ``bwd_config``).

``run_bwd`` takes a call the forward already validated (its ``FwdSpec``, shape and parameters) and
returns ``(dq, dk, dv, dsink)``:
  1. preprocess (``_kernels/bwd_preprocess``): LSE2 and D' = rowsum(dO * O) - dLSE into fp32 workspaces
     of ``bwd_config.ROW_PAD``-row blocks per sequence;
  2. main kernel (``_kernels/bwd_multistage``): dK, dV, and dQ's fp32 partial sums (a small GQA grid: each
     KV head's query-head group split over ``bwd_schedule.bwd_group_split`` CTAs, their partial dK / dV summed
     here in fp32);
  3. postprocess (``_kernels/bwd_postprocess``): dQ = scale * accumulator, in q's dtype.
The sink's gradient, ``dsink_h = -sum_rows exp(sink_h - LSE) * D'`` over the rows of head h, is a torch
reduction over the workspaces (a fixed-order sum: deterministic). Workspaces are sized from shapes
only, so the whole backward can be captured in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import torch

from . import block_sparse, compiler, flex
from .bwd_config import (ROW_PAD, bwd_banded, bwd_config_problems, bwd_invariant_config, bwd_lowest_first_open,
                          bwd_padded_head_dim, bwd_smem_bytes, select_bwd_config)
from .bwd_schedule import bwd_det_order, bwd_group_split, bwd_tile_band
from .config import STATIC_SMEM_BYTES
from .problem import LOG2_E, BwdSpec, FwdShape, FwdSpec, RefineSpec

@functools.lru_cache(maxsize=None)
def _main_kernel(spec: BwdSpec, model, target: str, device_smem: Optional[tuple[int, int]], cfg=None):
    """The main kernel of ``spec`` (on ``cfg``, default the table's), launched with the model's CTAs per SM on a larger
    part (``ExecutionModel.occupancy_launch_smem``)."""
    cfg = cfg or select_bwd_config(spec, model)
    launch_smem = 0
    if device_smem is not None:
        launch_smem = model.occupancy_launch_smem(bwd_smem_bytes(spec, cfg) + STATIC_SMEM_BYTES, STATIC_SMEM_BYTES,
                                                  *device_smem)
    return compiler.get_bwd_kernel(spec, cfg, model, target, launch_smem)


@functools.lru_cache(maxsize=None)
def _side_kernels(spec: BwdSpec, model, target: str, cfg=None):
    """(preprocess, postprocess, config) for ``spec`` (on ``cfg``, default the table's)."""
    cfg = cfg or select_bwd_config(spec, model)
    return (compiler.get_bwd_side_kernel("preprocess", spec, cfg, model, target),
            compiler.get_bwd_side_kernel("postprocess", spec, cfg, model, target), cfg)


def clear_caches() -> None:
    """Forget the chosen configs and kernels (tests and the tuner patch the tables)."""
    for cached in (select_bwd_config, _main_kernel, _side_kernels, _slots, _bwd_spec, _main_spec, bwd_launch,
                   _mask_refine):
        cached.cache_clear()


def _grad_like(t: torch.Tensor, zero: bool) -> torch.Tensor:
    return torch.zeros_like(t, memory_format=torch.contiguous_format) if zero else \
        torch.empty_like(t, memory_format=torch.contiguous_format)


@functools.lru_cache(maxsize=256)
def _slots(bspec: BwdSpec, cfg, model, num_sms: int) -> int:
    """CTA slots of the main kernel on ``num_sms`` SMs at the model's CTAs per SM (the schedule models' input)."""
    return num_sms * model.ctas_per_sm(bwd_smem_bytes(bspec, cfg) + STATIC_SMEM_BYTES)


def _group_split(bspec: BwdSpec, cfg, shape: FwdShape, model, num_sms: int, l2_bytes: int) -> int:
    """``bwd_schedule.bwd_group_split`` for this call: the model's CTAs per SM of the main kernel on ``num_sms``
    SMs, in the key-block order the kernel runs (banded for causal masks: ``l2_bytes`` bounds the band); a
    window counts as unmasked (every query block visited: the even case, which splits least)."""
    causal = bspec.causal and not bspec.local
    split = bwd_group_split(shape.seqlen_q, shape.seqlen_k, cfg.tile_m, cfg.tile_n, shape.num_heads_kv,
                            shape.num_heads // shape.num_heads_kv, shape.batch, causal,
                            _slots(bspec, cfg, model, num_sms), banded=bwd_banded(bspec, cfg) and causal,
                            l2_bytes=l2_bytes, head_dim=bspec.head_dim, head_dim_v=bspec.head_dim_v)
    return split


def _tile_band(bspec: BwdSpec, cfg, shape: FwdShape, model, num_sms: int, l2_bytes: int, split: int) -> int:
    """``bwd_schedule.bwd_tile_band`` for this call (the main kernel's CTAs per SM of the model on ``num_sms``
    SMs; ``split``: the group split the call runs)."""
    return bwd_tile_band(l2_bytes, shape.seqlen_q, shape.seqlen_k, bspec.head_dim, bspec.head_dim_v, cfg.tile_m,
                         cfg.tile_n, shape.num_heads // shape.num_heads_kv // split,
                         shape.num_heads_kv * split * shape.batch, _slots(bspec, cfg, model, num_sms))


def _det_order(bspec: BwdSpec, cfg, shape: FwdShape, model, num_sms: int, l2_bytes: int, lowest_open: bool) -> tuple:
    """``bwd_schedule.bwd_det_order`` for this call: (lowest first, group split, band)."""
    return bwd_det_order(shape.seqlen_q, shape.seqlen_k, cfg.tile_m, cfg.tile_n, shape.num_heads_kv,
                         shape.num_heads // shape.num_heads_kv, shape.batch, _slots(bspec, cfg, model, num_sms),
                         l2_bytes, bspec.head_dim, bspec.head_dim_v, bwd_banded(_main_spec(bspec, True, 1), cfg),
                         lowest_open)


@functools.lru_cache(maxsize=None)
def _main_spec(bspec: BwdSpec, lowest_first: bool, split: int, rotated: bool = False) -> BwdSpec:
    return dataclasses.replace(bspec, lowest_first=lowest_first, group_split=split, rotated_turns=rotated)


#: The rotated order's bound on the CTA slots a pair straddling two waves holds idle, as a share of the slots: its
#: CTAs launched in the earlier wave wait on those of the next (H200 at SM120 occupancy, 132 slots: 86 key blocks a
#: pair, 46 slots idle, cost 1.25-1.64x the default's time rotated and 1.18-1.25x highest first; 128 key blocks, 4
#: idle, 1.02-1.05x rotated; 0.95-1.24x where the pairs fill the slots evenly: bwd_det_rotated_h200_2026-11-29.json).
ROTATED_MAX_IDLE_SHARE = 1 / 16


def _rotated_turns(bspec: BwdSpec, cfg, shape: FwdShape, model, num_sms: int) -> bool:
    """Whether a deterministic call without a mask, a window or lists runs the rotated order
    (``BwdSpec.rotated_turns``): its key blocks add into each query block in the order they arrive, with no
    chain of waits along the pair. A key block there may wait on any key block of its pair, so every CTA of a
    pair must be able to run at once (at most one CTA slot per key block, ``_slots``), and the pairs must fill a
    wave of slots nearly evenly: the slots a pair straddling two waves holds idle stay under
    ``ROTATED_MAX_IDLE_SHARE``."""
    if not bspec.deterministic or bspec.causal or bspec.local or bspec.block_sparse is not None:
        return False
    slots, num_n = _slots(bspec, cfg, model, num_sms), -(-shape.seqlen_k // cfg.tile_n)
    return num_n <= slots and slots % num_n <= ROTATED_MAX_IDLE_SHARE * slots


@functools.lru_cache(maxsize=1024)
def _bwd_spec(spec: FwdSpec, has_dlse: bool, deterministic: bool) -> BwdSpec:
    return BwdSpec.of(spec, has_dlse=has_dlse, deterministic=deterministic)


@dataclasses.dataclass(frozen=True)
class BwdLaunch:
    """Every host decision of one backward call that depends only on its spec, shape and device: the kernels,
    the tile, the group split and the key blocks' band, so that a training step's repeated shapes only
    allocate and launch (``bwd_launch``)."""

    pre: object
    main: object
    post: object
    cfg: object
    split: int  # the group split the main kernel runs (1: none)
    band: int  # (batch, KV head) pairs per band of the longest-first key-block order (1: per pair)
    dq_dim: int  # the fp32 dQ accumulator's padded head dim


@functools.lru_cache(maxsize=4096)
def bwd_launch(bspec: BwdSpec, shape: FwdShape, model, target: str, device_smem: Optional[tuple[int, int]],
               num_sms: int, l2_bytes: int, invariant: bool = False) -> BwdLaunch:
    """The ``BwdLaunch`` of ``bspec`` at ``shape`` (``run_bwd``'s arguments of the same names). Memoized (a
    training step repeats its shapes; host time counts at small ones). ``invariant``: batch-invariant, the order
    and split fixed (highest first, unsplit) rather than chosen by shape, which would reorder dQ's and dK / dV's
    additions between batch sizes."""
    # a batch-invariant call runs one tile for every layout of its spec (bwd_invariant_config)
    fixed = bwd_invariant_config(bspec, model) if invariant else None
    pre, post, cfg = _side_kernels(bspec, model, target, fixed)
    # A small grid splits each KV head's query-head group over `split` CTAs (the main kernel's spec), each
    # writing a partial dK / dV head (KV head h's are heads h * split .. h * split + split - 1), summed in
    # run_bwd in fp32 in a fixed order (deterministic mode holds). Block sparsity walks per-KV-head lists: never split.
    # A causal deterministic call takes its order, split and band together (bwd_schedule.bwd_det_order).
    # A batch-invariant call keeps highest first, unsplit, one (batch, KV head) pair per band.
    lowest, split, band = False, 1, 1
    order_by_shape = bool(num_sms) and not invariant
    if order_by_shape and bspec.deterministic and bspec.causal and not bspec.local:
        lowest_open = bwd_lowest_first_open(_main_spec(bspec, True, 1), model)
        lowest, split, band = _det_order(bspec, cfg, shape, model, num_sms, l2_bytes, lowest_open)
        if lowest and not lowest_open:
            lowest, band = False, 1  # (a forced order the config does not admit)
    elif order_by_shape and bspec.block_sparse is None:
        split = _group_split(bspec, cfg, shape, model, num_sms, l2_bytes)
    # a deterministic call without a mask takes its dQ additions in the order its key blocks arrive (not batch-
    # invariant: the choice depends on the call's longest sequence)
    rotated = order_by_shape and _rotated_turns(bspec, cfg, shape, model, num_sms)
    if rotated and bwd_config_problems(_main_spec(bspec, lowest, 1, True), cfg, model):
        rotated = False  # the predicate keeps this config in the highest-first order
    if split > 1 and bwd_config_problems(_main_spec(bspec, lowest, split, rotated), cfg, model):
        split = 1  # the predicate keeps this spec unsplit
    mspec = _main_spec(bspec, lowest, split, rotated)
    main = _main_kernel(mspec, model, target, device_smem, fixed)
    # causal / block-sparse key blocks run longest first in bands of (batch, KV head) pairs (bwd_tile_band)
    if bwd_banded(mspec, cfg) and num_sms and not bspec.deterministic:
        band = _tile_band(bspec, cfg, shape, model, num_sms, l2_bytes, split)
    return BwdLaunch(pre, main, post, cfg, split, band, bwd_padded_head_dim(bspec.head_dim, cfg))


@functools.lru_cache(maxsize=64)
def _mask_refine(mods) -> tuple:
    """(the mask_mod's own key, registered; whether it reads b; whether it reads h) of a call's mods."""
    mask_mod = flex.callables(mods)[2]
    key = flex.register(flex.ModKey(mask_mod=mods.mask_mod, aux_tensors=mods.aux_tensors), mask_mod=mask_mod)
    return (key, *flex.reads_batch_head(mask_mod))


def _tile_refine(bspec: BwdSpec, cfg, shape: FwdShape, aux: tuple, model, target: str):
    """The ``block_sparse.TileRefine`` of a block-sparse call with a mask_mod (None without one): the tiles of
    its partial blocks classified on the device (``_kernels/sparse_refine``), per batch and query head only where
    the mask_mod reads them."""
    if bspec.mods is None or bspec.mods.mask_mod is None:
        return None
    key, reads_b, reads_h = _mask_refine(bspec.mods)

    def run(tiles):
        kernel = compiler.get_refine_kernel(RefineSpec(key, cfg.tile_m, cfg.tile_n), model, target)
        grid = tiles.expand(shape.batch if reads_b else tiles.shape[0], shape.num_heads if reads_h else tiles.shape[1],
                            *tiles.shape[2:]).contiguous()
        kernel(grid, shape.seqlen_q, shape.seqlen_k, *compiler.aux_args(aux))
        return grid
    try:
        versions = block_sparse.versions_of(aux)
    except RuntimeError:  # inference-mode aux tensors: no version to key on, so never a cache hit
        versions = object()
    return block_sparse.TileRefine(run, (key, tuple(map(id, aux)), versions, shape.batch if reads_b else None), aux)


def run_bwd(q, k, v, out, dout, lse, dlse, spec: FwdSpec, shape: FwdShape, params, varlen, sink_dtype,
            model, target: str, device_smem, deterministic: bool = False, grads=None, num_sms: int = 0,
            l2_bytes: int = 0, invariant: bool = False) -> tuple:
    """Gradients of a validated forward call (see the module docstring). ``varlen`` is the forward's
    (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table) or None; ``sink_dtype`` the learnable
    sink's dtype (None without a sink); ``deterministic``: bitwise-reproducible dQ (a zeroed int32
    counter per query block orders its key blocks' additions); ``grads``: (dq, dk, dv) to write into (contiguous,
    shaped like q, k, v), else fresh ones; ``num_sms``: the device's, for the group split (0: never split);
    ``l2_bytes``: the device's L2, for the longest-first key-block order's bands (0: one pair per band);
    ``invariant``: batch-invariant (``bwd_launch``; ``deterministic`` is then set)."""
    cu_q, cu_k, used_q, used_k, _ = varlen or (None, None, None, None, None)
    bspec = _bwd_spec(spec, dlse is not None, deterministic)
    if grads is None:
        dq, dk, dv = _grad_like(q, spec.seqused_q), _grad_like(k, spec.seqused_k), _grad_like(v, spec.seqused_k)
    else:
        dq, dk, dv = grads
        for g, zero in ((dq, spec.seqused_q), (dk, spec.seqused_k), (dv, spec.seqused_k)):
            if zero:  # rows past a used length are not written by the kernels
                g.zero_()
    dsink = None
    if params.sink is not None:
        dsink = torch.zeros(params.sink.shape, dtype=sink_dtype, device=q.device)
    if q.numel() == 0 or k.numel() == 0 or shape.batch == 0:
        # no rows or no keys: out = 0 (or empty), every gradient 0; the sink still sees dLSE of rows with
        # no key (P_sink = 1 there), which the general path below handles only with keys present
        for t in (dq, dk, dv):
            t.zero_()
        if dsink is not None and dlse is not None and dlse.numel():
            heads_dim = 0 if spec.varlen_q else 1
            dsink.copy_(dlse.float().sum(dim=[i for i in range(dlse.dim()) if i != heads_dim]).to(sink_dtype))
        return dq, dk, dv, dsink
    launch = bwd_launch(bspec, shape, model, target, device_smem, num_sms, l2_bytes, invariant)
    cfg, split = launch.cfg, launch.split
    dout = dout if dout.is_contiguous() else dout.contiguous()
    heads = shape.num_heads
    if spec.varlen_q:
        ws_rows = (heads, q.shape[0] + shape.batch * ROW_PAD)
    else:
        ws_rows = (shape.batch, heads, -(-shape.seqlen_q // ROW_PAD) * ROW_PAD)
    dev = q.device
    # Rows the preprocess does not reach (past each sequence's last started block) are read only by the
    # sink reduction: fill them so they contribute 0 there.
    has_sink = params.sink is not None
    lse2 = (torch.full(ws_rows, math.inf, dtype=torch.float32, device=dev) if has_sink
            else torch.empty(ws_rows, dtype=torch.float32, device=dev))
    dsum = (torch.zeros if has_sink else torch.empty)(ws_rows, dtype=torch.float32, device=dev)
    dq_acc = torch.zeros((*ws_rows, launch.dq_dim), dtype=torch.float32, device=dev)
    # one counter per query block (packed: per tile_m workspace rows, dq_accum.semaphore_ptr)
    sem = (torch.zeros((*ws_rows[:-1], ws_rows[-1] // cfg.tile_m + 1), dtype=torch.int32, device=dev)
           if deterministic else None)
    max_q = shape.seqlen_q
    dk_part, dv_part = dk, dv
    if split > 1:  # the group split's partial dK / dV heads (bwd_launch)
        alloc = torch.zeros if spec.seqused_k else torch.empty  # rows past a used length are not written
        dk_part, dv_part = (alloc((*t.shape[:-2], t.shape[-2] * split, t.shape[-1]), dtype=t.dtype, device=dev)
                            for t in (dk, dv))
    lists = ()
    if bspec.block_sparse is not None:  # the forward's lists, transposed into (query head, query tile) steps
        refine = _tile_refine(bspec, cfg, shape, tuple(params.aux), model, target)
        lists = block_sparse.cached_backward_lists(params.sparse, bspec.block_sparse, shape.num_heads,
                                                   shape.num_heads_kv, shape.seqlen_q, shape.seqlen_k, cfg.tile_m,
                                                   cfg.tile_n, refine)
    pre, main, post = launch.pre, launch.main, launch.post
    pre(out, dout, lse, dlse, lse2, dsum, cu_q, used_q, max_q)
    main(q, k, v, dout, lse2, dsum, dq_acc, sem, dk_part, dv_part, params.softmax_scale, params.scale_log2,
         params.softcap_scale, params.window_left, params.window_right, cu_q, cu_k, used_q, used_k, shape.seqlen_k,
         launch.band, *compiler.aux_args(params.aux), *compiler.sparse_args(lists), params.rng)
    post(dq_acc, dq, params.softmax_scale, cu_q, used_q, max_q)
    if split > 1:
        for part, full in ((dk_part, dk), (dv_part, dv)):  # one reduction kernel each, fp32 accumulation
            torch.sum(part.unflatten(-2, (full.shape[-2], split)), dim=-2, out=full)
    if has_sink:
        view = (-1, 1) if spec.varlen_q else (1, -1, 1)
        p_sink = torch.exp2(params.sink.view(view) * LOG2_E - lse2)
        reduce_dims = [1] if spec.varlen_q else [0, 2]
        dsink.copy_((-(p_sink * dsum).sum(dim=reduce_dims)).to(sink_dtype))
    return dq, dk, dv, dsink
