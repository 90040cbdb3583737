"""``get_scheduler_metadata`` on the CPU: upstream's signature (the recorded copy in ``support/upstream_api``), its
checks, and the varlen and KV-cache calls taking its result (advisory) where they used to refuse it."""

import inspect

import pytest
import torch

import flash_attn_4_sm120 as fa
from support.upstream_api import DEFAULT_DEVIATIONS, REQUIRED, SIGNATURES


def _lengths(batch=3):
    return torch.zeros(batch + 1, dtype=torch.int32)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_is_upstreams(name):
    """Upstream's public names take upstream's parameters first, in its order (a positional call binds as upstream's
    does), with its defaults (``DEFAULT_DEVIATIONS`` apart); the bundle's own parameters come after."""
    params = list(inspect.signature(getattr(fa, name)).parameters.values())
    recorded = SIGNATURES[name]
    assert [p.name for p in params[:len(recorded)]] == [n for n, _ in recorded]
    for p, (param, default) in zip(params, recorded):
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, param
        if default is REQUIRED:
            assert p.default is inspect.Parameter.empty, param
        else:
            assert p.default == DEFAULT_DEVIATIONS.get(param, default), param
    assert all(p.kind is not inspect.Parameter.VAR_POSITIONAL for p in params)


def test_a_varlen_call_in_fa2s_order_is_told_the_order():
    """FA2's varlen order (q, k, v, cu_seqlens_q, ...) puts cu_seqlens_q where upstream FlashAttention-4 has qv."""
    q = torch.zeros(10, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="pass cu_seqlens_q / cu_seqlens_k"):
        fa.flash_attn_varlen_func(q, q, q, _lengths(), _lengths(), 5, 5)


def test_returns_upstreams_fields_empty():
    meta = fa.get_scheduler_metadata(1, 4096, 32, 8, 128, 0, cu_seqlens_q=_lengths(), seqused_k=torch.zeros(
        3, dtype=torch.int32), causal=True, headdim_v=128)
    assert isinstance(meta, fa.SchedulerMetadata)
    assert meta._fields[:5] == ("num_m_blocks_ptr", "num_splits_dynamic_ptr", "virtual_batch_idx_ptr",
                                "num_nheads_in_l2_ptr", "tile_count_semaphore")
    assert all(t is None for t in meta)


@pytest.mark.parametrize("kw,error,words", [
    (dict(), ValueError, "at least one of"),
    (dict(cu_seqlens_q=_lengths(3), seqused_k=torch.zeros(2, dtype=torch.int32)), ValueError, "batch size"),
    (dict(cu_seqlens_q=_lengths().long()), TypeError, "int32"),
    (dict(cu_seqlens_q=_lengths(), nheads=30), ValueError, "multiple of nheads_kv"),
    (dict(cu_seqlens_q=_lengths(), headdim=100), ValueError, "multiples of 8"),
    (dict(cu_seqlens_q=_lengths(), headdim_v=520), ValueError, "between 8 and 512"),
    (dict(cu_seqlens_q=_lengths(), num_splits=-1), TypeError, "non-negative"),
], ids=["no_lengths", "batches", "dtype", "heads", "headdim", "headdim_v", "splits"])
def test_checks(kw, error, words):
    args = dict(max_seqlen_q=1, max_seqlen_k=512, nheads=32, nheads_kv=8, headdim=128, num_splits=0)
    args.update(kw)
    with pytest.raises(error, match=words):
        fa.get_scheduler_metadata(**args)


def test_varlen_and_kvcache_take_it_and_refuse_other_types():
    """The calls get past the argument (the CPU tensors then fail the device check, as any CPU call does)."""
    meta = fa.get_scheduler_metadata(1, 64, 4, 2, 64, 0, seqused_k=torch.zeros(2, dtype=torch.int32))
    q = torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16)
    cache = torch.zeros(2, 32, 2, 64, dtype=torch.bfloat16)
    lens = torch.zeros(2, dtype=torch.int32)
    for metadata in (meta, torch.zeros(8, dtype=torch.int32)):
        with pytest.raises(ValueError, match="CUDA"):
            fa.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lens, scheduler_metadata=metadata)
    with pytest.raises(ValueError, match="CUDA"):
        fa.flash_attn_varlen_func(q, cache, cache.clone(), seqused_k=lens, scheduler_metadata=meta,
                                  disable_scheduler_metadata=False)
    with pytest.raises(TypeError, match="scheduler_metadata must be"):
        fa.flash_attn_varlen_func(q, cache, cache.clone(), seqused_k=lens, scheduler_metadata=torch.zeros(8))
    with pytest.raises(TypeError, match="scheduler_metadata must be"):
        fa.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lens, scheduler_metadata={})


def _qkv():
    q = torch.zeros(2, 8, 4, 64, dtype=torch.bfloat16)
    return q, q.clone(), q.clone()


@pytest.mark.parametrize("entry", ["dense", "varlen"])
@pytest.mark.parametrize("kw,error,words", [
    (dict(block_sparse_tensors_bwd=object()), ValueError, "CUDA"),  # accepted: the call reaches the device check
    (dict(gather_kv_indices=torch.zeros(2, 8, 16, dtype=torch.int32)), NotImplementedError, "qv over dense or paged"),
    (dict(gather_bwd_recompute_p=True), ValueError, "only apply to sparse top-k"),
    (dict(gather_bwd_token_chunk=64), ValueError, "only apply to sparse top-k"),
], ids=["sparse_bwd", "gather", "recompute", "chunk"])
def test_upstreams_other_keywords(entry, kw, error, words):
    """Upstream's keyword arguments are taken, or refused by name, before anything else is checked."""
    q, k, v = _qkv()
    call = fa.flash_attn_func if entry == "dense" else fa.flash_attn_varlen_func
    with pytest.raises(error, match=words):
        call(q, k, v, **kw)


@pytest.mark.parametrize("kw,error,words", [
    (dict(min_seqlen_k=4, disable_scheduler_metadata=True), ValueError, "CUDA"),
    (dict(min_seqlen_k=-1), TypeError, "min_seqlen_k"),
    (dict(seqlen_k_per_split=256), NotImplementedError, "num_splits=1"),
], ids=["min_seqlen_k", "bad_min_seqlen_k", "seqlen_k_per_split"])
def test_upstreams_varlen_keywords(kw, error, words):
    q, k, v = _qkv()
    with pytest.raises(error, match=words):
        fa.flash_attn_varlen_func(q, k, v, **kw)
    if error is ValueError:  # the dense entry has no such arguments, as upstream's
        with pytest.raises(TypeError, match="unexpected"):
            fa.flash_attn_func(q, k, v, **kw)
