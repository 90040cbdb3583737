"""``flash_attn_with_kvcache``: attention against a KV cache that the call may extend first (FA2/FA3's API).

One call does what a decode or chunked-prefill step of a serving engine needs: optionally write new keys
and values into the cache at each sequence's end, optionally apply the rotary embedding to q and the new
keys, and attend q to the cache's keys. The signature and semantics are FlashAttention-2/3's
``flash_attn_with_kvcache`` (FA2's ``block_table`` and FA3's ``page_table`` name the same table), plus
upstream FlashAttention-4's ``learnable_sink`` and window convention, and ``out=``.

Caches:
  * dense: ``k_cache`` (batch_cache, seqlen_cache, heads_kv, d), ``v_cache`` (..., dv); sequence b uses row
    ``cache_batch_idx[b]`` (default b; batch_cache == batch then) and its keys start at ``cache_leftpad[b]``
    (default 0).
  * paged: ``page_table`` / ``block_table`` (batch, max_pages) int32 with caches (num_pages, page_size,
    heads_kv, d); any page size. ``cache_batch_idx`` / ``cache_leftpad`` are for dense caches (as FA2/FA3).

Algorithm (every step on the device, no host sync, so a step can be captured in a CUDA graph):
  1. Validate on the host: ranks, dtypes, devices, head dims, rotary shapes, metadata types.
  2. When the call appends, rotates or reads a dense cache from per-sequence starts: the append kernel
     (``_kernels/kv_append.py``) writes k / v at key positions ``cache_seqlens[b] + i``, rotates q
     (into a new tensor; the caller's q is not modified) and the new keys, and writes the attention's
     key lengths ``cache_seqlens[b] + new_len[b] - cache_leftpad[b]`` and starts.
  3. The forward kernel attends q to the first ``used_k[b]`` keys of each sequence: paged through the
     page table, dense through ``seqused_k``, or dense from per-sequence starts as packed rows
     (``cu_seqlens_k`` = the starts). Causal masks align bottom-right to those lengths.
A repeated call with the same shapes replays a launch plan (``_KVCachePlan``, kept in ``launch._PLANS``): no
validation or dispatch, only the output allocations and the launches.

Positions (FA2/FA3): ``cache_seqlens[b]`` is where sequence b's cache ends, counted from the cache row's
start (left padding included); new key i lands at position ``cache_seqlens[b] + i`` and is rotated
there (``rotary_seqlens[b] + i`` when given). q row i is rotated at ``cache_seqlens[b] + i`` with
``causal`` or a window, else every q row at ``cache_seqlens[b]``. Keys that would land past the cache's
end (or past a table row's pages) are not written: size the cache for the steps ahead.

FP8 caches (``torch.float8_e4m3fn`` / ``float8_e5m2``, FlashAttention-3's ``q_descale`` / ``k_descale`` /
``v_descale``, ``FwdSpec.kv_dtype``) are read in place; new keys / values (in q's 16-bit dtype) are quantized into
them with ``k_descale`` / ``v_descale`` (``AppendSpec.cache_dtype``: value / scale, rounded, saturating).

MLA (``qv``, ``latent.py``): ``k_cache`` holds the rope keys (64 wide), ``v_cache`` the latent and ``qv`` the
absorbed query; new ``k`` / ``v`` are appended into them (the rope keys rotated, the latent copied), q (the rope
query) is rotated, and the attention runs on [qv | q] against each key's [latent | rope] (``FwdSpec.latent_v``).

``scheduler_metadata`` (``get_scheduler_metadata``'s, or FA3's int32 tensor) is accepted and advisory: launch plans
come from shapes (``scheduler_metadata.py``).

Not supported (raise, naming the alternative): ``alibi_slopes``, ``attention_chunk``, ``sm_margin``, dropout;
gradients (a KV-cache call is inference: nothing is recorded for autograd).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import compiler, invariance
from .config import WIDE_HEAD_DIM
from .launch import (call_key, launch_env, launch_on, model_and_target, plan_for, remember, remembered,
                     with_packing)
from .problem import FP8_DTYPES, AppendSpec, _DTYPES, _check_index_vector, kernel_layout, validate_varlen
from .fp8 import is_fp8, widened_q
from .latent import joined_query, latent_scale, latent_spec
from .scheduler_metadata import check_scheduler_metadata
from .validation import check_options, fp8_scales, plain_sink, refusal


@dataclasses.dataclass(frozen=True)
class _KVCachePlan:
    """Every host decision of one ``flash_attn_with_kvcache`` call that depends only on its shapes and
    options: the append kernel (None when the call neither appends, rotates nor reads from starts), its
    grid extent, and the attention's launch plan over the cache."""

    append: object
    max_rows: int
    #: (k shape, v shape) of a dense cache read from per-sequence starts (cache_batch_idx / cache_leftpad) as
    #: packed rows; the append kernel then writes the starts
    packed_cache: Optional[tuple]
    attention: object
    batch: int
    return_lse: bool

    def run(self, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
            page_table, cu_seqlens_q, cu_seqlens_k_new, rotary_seqlens, sink, out, descale=(), cache_descale=(),
            qv=None):
        """The call on its tensors; ``qv``: MLA's absorbed query, joined to the (rotated) rope query as [qv | q]."""
        device = q.device
        used_k = cache_seqlens
        key_start = None
        q_att = q
        if self.append is not None:
            used_k = torch.empty((self.batch,), dtype=torch.int32, device=device)
            key_start = (torch.empty((self.batch + 1,), dtype=torch.int32, device=device)
                         if self.packed_cache is not None else None)
            q_out = torch.empty_like(q) if rotary_cos is not None else None
            args = (q if q_out is not None else None, q_out, k, v, k_cache, v_cache, page_table, cache_seqlens,
                    cache_batch_idx, cache_leftpad, rotary_seqlens, rotary_cos, rotary_sin,
                    cu_seqlens_q if q_out is not None else None, cu_seqlens_k_new if k is not None else None, used_k,
                    key_start, self.max_rows, *(cache_descale or (None, None)))
            launch_on(device, ((self.append, args),))
            if q_out is not None:
                q_att = q_out
        if qv is not None:
            q_att = joined_query(qv, q_att)
        if self.packed_cache is not None:
            k_cache, v_cache = k_cache.view(self.packed_cache[0]), v_cache.view(self.packed_cache[1])
        varlen = (cu_seqlens_q, key_start, None, used_k, page_table)
        o, lse = self.attention.run(q_att, k_cache, v_cache, sink, varlen, out, descale=descale)
        return (o, lse) if self.return_lse else o


_UNSUPPORTED = {
    "alibi_slopes": ("ALiBi slopes are not supported by flash_attn_with_kvcache; flash_attn_func and "
                     "flash_attn_varlen_func (paged K/V included) take ALiBi as a score_mod: flex_examples.alibi_slopes"),
}


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens=None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    rotary_seqlens: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple = (None, None),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    learnable_sink: Optional[torch.Tensor] = None,
    num_splits: Optional[int] = 0,
    pack_gqa: Optional[bool] = None,
    return_softmax_lse: bool = False,
    out: Optional[torch.Tensor] = None,
    alibi_slopes=None,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    attention_chunk: int = 0,
    scheduler_metadata=None,
    sm_margin: int = 0,
    batch_invariant: Optional[bool] = None,
    **kwargs,
):
    """Attention of q against a KV cache, after appending ``k`` / ``v`` to it (FA2/FA3 semantics).

    q: (batch, seqlen_q, heads, d), or (total_q, heads, d) with ``cu_seqlens_q`` (batch + 1,) int32 (and
    ``max_seqlen_q`` to avoid a sync). k_cache / v_cache: dense (batch_cache, seqlen_cache, heads_kv, d / dv)
    or paged (num_pages, page_size, heads_kv, d / dv) with ``page_table`` (FA3) or ``block_table`` (FA2),
    (batch, max_pages) int32. k / v (optional, together): new keys/values (batch, seqlen_new, heads_kv, d /
    dv), or (total_new, heads_kv, d / dv) with ``cu_seqlens_k_new``, written into the cache in place at
    positions ``cache_seqlens[b] + i``. cache_seqlens: (batch,) int32 or an int, each sequence's cache
    length before the append (default: the whole cache). cache_batch_idx / cache_leftpad: (batch,) int32,
    dense caches only. rotary_cos / rotary_sin: (seqlen_ro, rotary_dim / 2) in q's dtype, rotary_dim a
    multiple of 16 <= d; applied to q and the new k (``rotary_interleaved``: GPT-J pairs, else GPT-NeoX
    halves), positions as in the module docstring; ``rotary_seqlens`` (batch,) int32 overrides the rotary
    base position. ``causal``, ``window_size`` (FA4's convention; FA2's (-1, -1) means none),
    ``softcap``, ``learnable_sink``, ``num_splits`` (0 automatic), ``pack_gqa`` as in ``flash_attn_func``.
    ``max_seqlen_k`` is accepted and ignored: the keys come from ``cache_seqlens`` and the appended rows, and
    the split-KV choice from the cache's capacity (transformers' continuous batching passes ``max_seqlen_k=1``
    with a block table, so it cannot be a bound). ``out``: a preallocated output shaped like q with v's head dim.

    Returns ``out`` (q's layout, head dim dv), or ``(out, softmax_lse)`` with ``return_softmax_lse`` (lse
    fp32 (batch, heads, seqlen_q), or (heads, total_q) for packed q).

    MLA: ``qv`` (q's rows and heads, v_cache's head dim) is the absorbed query beside the rope query q; k_cache holds
    the rope keys (64 wide), v_cache the latent (new ``k`` / ``v`` alike); the score is ``q k^T + qv v^T``, the softmax
    scale ``1 / sqrt(64 + head_dim_v)`` by default, and the output ``P v`` (head dim dv).

    ``batch_invariant=True`` (None: ``FA4_SM120_BATCH_INVARIANT``): each row's output and LSE are bitwise those of the
    same row in any other call, a prefill through ``flash_attn_varlen_func`` included (``invariance.py``).
    """
    if kwargs:
        raise TypeError(f"flash_attn_with_kvcache got unexpected arguments: {sorted(kwargs)}")
    check_scheduler_metadata(scheduler_metadata, allow_tensor=True)  # advisory: plans come from shapes
    given = {"alibi_slopes": alibi_slopes}
    for name, value in given.items():
        if value is not None:
            raise NotImplementedError(f"flash_attn_with_kvcache({name}=...): {_UNSUPPORTED[name]}")
    if attention_chunk:
        raise NotImplementedError("flash_attn_with_kvcache(attention_chunk=...): chunked attention is not supported; "
                                  "a sliding window_size=(left, right) is")
    if sm_margin:
        raise NotImplementedError("flash_attn_with_kvcache(sm_margin=...) is not supported; the grid sizes itself "
                                  "to the GPU (num_splits=1 turns split-KV off)")
    if block_table is not None:
        if page_table is not None:
            raise ValueError("pass page_table or block_table (FA2's name for it), not both")
        page_table = block_table
    check_options(num_splits, pack_gqa)
    descales = (q_descale, k_descale, v_descale) if any(d is not None for d in (q_descale, k_descale, v_descale)) \
        else None
    fp8 = descales is not None or is_fp8(k_cache) or is_fp8(q)
    fp8_q = is_fp8(q)
    invariant = invariance.requested(batch_invariant)
    if invariant:  # before anything is appended
        invariance.refuse_features(fp8=fp8, latent=qv is not None)
        num_splits = invariance.invariant_splits(num_splits)
    if fp8 and (qv is not None or max(q.shape[-1], v_cache.shape[-1]) > WIDE_HEAD_DIM):  # before anything is appended
        raise NotImplementedError(refusal(("head_dim_512", "fp8")))
    if fp8:
        q = widened_q(q, k_cache, v_cache, descales, fp8_mma=False)
    tensors = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
               page_table, cu_seqlens_q, cu_seqlens_k_new, rotary_seqlens, learnable_sink, out, qv)
    if isinstance(cache_seqlens, int):  # FA2: one length for every sequence
        tensors = tensors[:7] + (None,) + tensors[8:]
    plain_max_q = max_seqlen_q if cu_seqlens_q is not None else None  # ignored for dense q (no sync)
    key = call_key(tensors, (plain_max_q, softmax_scale, softcap,
                             *(window_size if isinstance(window_size, (tuple, list)) else (None, window_size))),
                   ("kvcache", bool(causal), bool(rotary_interleaved), num_splits, pack_gqa,
                    bool(return_softmax_lse), isinstance(cache_seqlens, int), invariant))
    plan = remembered(key)
    if cache_seqlens is None or isinstance(cache_seqlens, int):
        cache_seqlens = _full_lengths(q, k_cache, page_table, cu_seqlens_q, cache_seqlens)
    if plan is None:
        plan = remember(key, _plan(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                                   cache_leftpad, page_table, cu_seqlens_q, cu_seqlens_k_new, plain_max_q,
                                   rotary_seqlens, softmax_scale, causal, window_size, softcap, rotary_interleaved,
                                   learnable_sink, num_splits, pack_gqa, return_softmax_lse, qv, invariant))
    descale = cache_descale = ()
    if fp8:  # the attention's scales (q's joined to K's), and the cache's own for the rows appended
        descale = fp8_scales(descales, fp8_q, plan.batch, k_cache.shape[-2], q.device)
        if k is not None:  # the same scales unless an FP8 q's joined K's
            cache_descale = fp8_scales(descales, False, plan.batch, k_cache.shape[-2], q.device) if fp8_q else descale
    return plan.run(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                    page_table, cu_seqlens_q, cu_seqlens_k_new, rotary_seqlens, plain_sink(learnable_sink), out,
                    descale, cache_descale, qv)


def _full_lengths(q, k_cache, page_table, cu_seqlens_q, length: Optional[int]) -> torch.Tensor:
    """``cache_seqlens`` as a (batch,) int32 tensor: ``length`` for every sequence, or the whole cache."""
    if not isinstance(q, torch.Tensor) or not isinstance(k_cache, torch.Tensor):
        raise TypeError("q and k_cache must be torch.Tensors")
    batch = (cu_seqlens_q.shape[0] - 1 if isinstance(cu_seqlens_q, torch.Tensor) else q.shape[0])
    if length is None:
        length = page_table.shape[1] * k_cache.shape[1] if isinstance(page_table, torch.Tensor) else k_cache.shape[1]
    return torch.full((batch,), length, dtype=torch.int32, device=q.device)


def _plan(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, page_table,
          cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_seqlens, softmax_scale, causal,
          window_size, softcap, rotary_interleaved, learnable_sink, num_splits, pack_gqa,
          return_lse, qv=None, invariant=False) -> _KVCachePlan:
    """Validate a call and build its ``_KVCachePlan`` (``qv``: MLA's absorbed query, ``latent.py``; ``invariant``:
    the batch-invariant tile, ``config.invariant_config``)."""
    paged = page_table is not None
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(f"k_cache / v_cache must have rank 4 ((batch_cache, seqlen_cache, heads_kv, d), or "
                         f"(num_pages, page_size, heads_kv, d) with a page table); got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if q.dim() != (3 if cu_seqlens_q is not None else 4):
        raise ValueError(f"q must be (batch, seqlen_q, heads, d), or (total_q, heads, d) with cu_seqlens_q; got "
                         f"{tuple(q.shape)}")
    batch = cu_seqlens_q.shape[0] - 1 if cu_seqlens_q is not None else q.shape[0]
    device = q.device
    _check_index_vector("cache_seqlens", cache_seqlens, batch, device)
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            if paged:
                raise NotImplementedError(f"{name} with a paged cache is not supported (as in FA2/FA3): it addresses "
                                          "rows of a dense (batch_cache, seqlen_cache, heads_kv, d) cache; a page "
                                          "table already maps each sequence to its pages")
            _check_index_vector(name, t, batch, device)
    if rotary_seqlens is not None:
        _check_index_vector("rotary_seqlens", rotary_seqlens, batch, device)
    if not paged and cache_batch_idx is None and k_cache.shape[0] != batch:
        raise ValueError(f"dense k_cache has batch {k_cache.shape[0]} but q has {batch} sequences; pass "
                         "cache_batch_idx to pick each sequence's cache row")
    new_kv = k is not None or v is not None
    if new_kv:
        if k is None or v is None:
            raise ValueError("pass k and v together (the new keys and values to append), or neither")
        if k.dim() != (3 if cu_seqlens_k_new is not None else 4) or v.dim() != k.dim():
            raise ValueError(f"k / v must be (batch, seqlen_new, heads_kv, d), or (total_new, heads_kv, d) with "
                             f"cu_seqlens_k_new; got {tuple(k.shape)} and {tuple(v.shape)}")
        if cu_seqlens_k_new is not None:
            _check_index_vector("cu_seqlens_k_new", cu_seqlens_k_new, batch + 1, device)
        elif k.shape[0] != batch:
            raise ValueError(f"k has batch {k.shape[0]} but q has {batch} sequences")
        if k.shape[-2:] != k_cache.shape[-2:] or v.shape[-2:] != v_cache.shape[-2:] or k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} must match the caches' (heads_kv, head_dim): "
                             f"{tuple(k_cache.shape[-2:])} / {tuple(v_cache.shape[-2:])}")
        fp8_cache = k_cache.dtype in FP8_DTYPES
        want = (q.dtype, q.dtype) if fp8_cache else (k_cache.dtype, v_cache.dtype)
        if (k.dtype, v.dtype) != want or k.device != device or v.device != device:
            raise TypeError(f"k / v must be {want[0]} on q's device (the caches' dtype, or q's beside FP8 caches, which "
                            f"they are quantized into), got {k.dtype} / {v.dtype}")
    elif cu_seqlens_k_new is not None:
        raise ValueError("cu_seqlens_k_new describes new k / v; pass them too")
    rotary_dim = 0
    if rotary_cos is not None or rotary_sin is not None:
        rotary_dim = _check_rotary(rotary_cos, rotary_sin, q)
    elif rotary_seqlens is not None:
        raise ValueError("rotary_seqlens without rotary_cos / rotary_sin")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is not None and kernel_layout(t) is not t:
            raise ValueError(f"{name} must be contiguous in its last dimension with 16-byte aligned rows")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if kernel_layout(t) is not t:
            raise ValueError(f"{name} must be contiguous in its last dimension with 16-byte aligned rows "
                             "(the cache is written in place, so it is never copied)")

    if qv is not None:
        softmax_scale = latent_scale(q, k_cache, v_cache, qv, softmax_scale)
    key_starts = cache_batch_idx is not None or cache_leftpad is not None
    spec = AppendSpec(dtype=_DTYPES.get(q.dtype, "bf16"), head_dim=q.shape[-1], head_dim_v=v_cache.shape[-1],
                      rotary_dim=rotary_dim, rotary_interleaved=bool(rotary_interleaved),
                      rotary_q_per_row=False, rotary_seqlens=rotary_seqlens is not None, new_kv=new_kv,
                      varlen_q=cu_seqlens_q is not None, varlen_new=cu_seqlens_k_new is not None,
                      page_size=k_cache.shape[1] if paged else 0, batch_idx=cache_batch_idx is not None,
                      leftpad=cache_leftpad is not None, cache_dtype=FP8_DTYPES.get(k_cache.dtype))
    # The attention over the cache, validated as a varlen call (the caches are its K/V).
    packed_cache = None
    att_k, att_v, starts = k_cache, v_cache, None
    if key_starts:
        if k_cache.stride(0) != k_cache.shape[1] * k_cache.stride(1) or \
                v_cache.stride(0) != v_cache.shape[1] * v_cache.stride(1):
            raise ValueError("cache_batch_idx / cache_leftpad read the dense cache as packed rows: k_cache / v_cache "
                             "must have stride(0) == seqlen_cache * stride(1)")
        packed_cache = ((-1, *k_cache.shape[2:]), (-1, *v_cache.shape[2:]))
        att_k, att_v = k_cache.view(packed_cache[0]), v_cache.view(packed_cache[1])
        starts = torch.zeros((batch + 1,), dtype=torch.int32, device=device)  # shapes only: never launched on
    capacity = k_cache.shape[1] * (page_table.shape[1] if paged else 1)
    max_k = capacity  # the split choice sees the cache's capacity (FA2 does the same); never tensor contents
    spec_att, shape, params = validate_varlen(q, att_k, att_v, cu_seqlens_q, starts, max_seqlen_q, max_k, None,
                                              cache_seqlens, softmax_scale, causal, window_size, softcap,
                                              learnable_sink, page_table)
    if rotary_dim:
        spec = dataclasses.replace(spec, rotary_q_per_row=spec_att.causal or spec_att.local)
    if qv is not None:  # the attention runs on [qv | q] against [latent | rope]
        spec_att = latent_spec(spec_att, q, qv)
    append = None
    max_rows = 0
    if new_kv or rotary_dim or key_starts:
        model, target = model_and_target(device.index, *launch_env()[:2])
        append = compiler.get_append_kernel(spec, model, target)
        new_rows = (k.shape[0] if cu_seqlens_k_new is not None else k.shape[1]) if new_kv else 0
        q_rows = shape.seqlen_q if rotary_dim else 0
        max_rows = max(q_rows * shape.num_heads, new_rows * shape.num_heads_kv, 1)
    spec_att = with_packing(spec_att, shape, pack_gqa)
    attention = plan_for(q, v_cache, spec_att, shape, params, None, num_splits or None, None, invariant)
    return _KVCachePlan(append=append, max_rows=max_rows, packed_cache=packed_cache,
                        attention=attention, batch=batch, return_lse=bool(return_lse))


def _check_rotary(rotary_cos, rotary_sin, q) -> int:
    """rotary_dim of a valid (seqlen_ro, rotary_dim / 2) cos / sin pair."""
    if rotary_cos is None or rotary_sin is None:
        raise ValueError("pass rotary_cos and rotary_sin together")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a (seqlen_ro, rotary_dim / 2) tensor, got "
                             f"{tuple(getattr(t, 'shape', ()))}")
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{name} must have q's dtype {q.dtype} and device {q.device}, got {t.dtype} on {t.device}")
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{name} must be contiguous and 16-byte aligned")
    if rotary_cos.shape != rotary_sin.shape:
        raise ValueError(f"rotary_cos {tuple(rotary_cos.shape)} and rotary_sin {tuple(rotary_sin.shape)} differ")
    rotary_dim = 2 * rotary_cos.shape[1]
    if rotary_cos.shape[0] == 0 or rotary_dim == 0 or rotary_dim % 16 or rotary_dim > q.shape[-1]:
        raise ValueError(f"rotary_cos / rotary_sin {tuple(rotary_cos.shape)}: rotary_dim = 2 * {rotary_cos.shape[1]} "
                         f"must be a multiple of 16 and at most head_dim {q.shape[-1]}, with at least one position")
    return rotary_dim


__all__ = ["flash_attn_with_kvcache"]
