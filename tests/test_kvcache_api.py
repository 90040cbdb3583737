"""``flash_attn_with_kvcache`` on the host: the signature clients inspect, and the arguments refused
before any CUDA work (runs without a GPU)."""

import inspect

import pytest
import torch

import flash_attn_4_sm120 as fa


def test_signature_has_what_clients_pass():
    """transformers 5.20 inspects the signature and passes only what it finds: block_table (FA2) or
    page_table (FA3), cache_seqlens, max_seqlen_q / max_seqlen_k, window_size, softcap, learnable_sink;
    FA2/FA3 callers also pass k / v, rotary_*, cache_batch_idx, cache_leftpad, num_splits, return_softmax_lse."""
    params = inspect.signature(fa.flash_attn_with_kvcache).parameters
    for name in ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
                 "cache_leftpad", "block_table", "page_table", "cu_seqlens_q", "cu_seqlens_k_new", "max_seqlen_q",
                 "max_seqlen_k", "rotary_seqlens", "softmax_scale", "causal", "window_size", "softcap",
                 "rotary_interleaved", "learnable_sink", "num_splits", "pack_gqa", "return_softmax_lse", "out"):
        assert name in params, name
    assert list(params)[:5] == ["q", "k_cache", "v_cache", "k", "v"]  # FA2's positional order
    assert params["rotary_interleaved"].default is True and params["num_splits"].default == 0
    assert "dropout_p" not in params  # transformers then passes no dropout


def _tensors():
    q = torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16)
    cache = torch.zeros(2, 32, 2, 64, dtype=torch.bfloat16)
    return q, cache, cache.clone()


@pytest.mark.parametrize("name,value,words", [
    ("alibi_slopes", torch.zeros(4), "ALiBi"),
    ("attention_chunk", 128, "window_size"),
    ("sm_margin", 4, "num_splits"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_unsupported_arguments_raise(name, value, words):
    q, kc, vc = _tensors()
    with pytest.raises(NotImplementedError, match=words):
        fa.flash_attn_with_kvcache(q, kc, vc, **{name: value})


def test_unknown_keyword_and_both_tables():
    q, kc, vc = _tensors()
    with pytest.raises(TypeError, match="dropout_p"):
        fa.flash_attn_with_kvcache(q, kc, vc, dropout_p=0.1)
    table = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="not both"):
        fa.flash_attn_with_kvcache(q, kc, vc, page_table=table, block_table=table)


@pytest.mark.parametrize("case,error,words", [
    ("k_without_v", ValueError, "together"),
    ("leftpad_paged", NotImplementedError, "paged"),
    ("rotary_odd", ValueError, "multiple of 16"),
    ("rotary_dtype", TypeError, "dtype"),
    ("cache_batch", ValueError, "cache_batch_idx"),
    ("seqlens_dtype", TypeError, "int32"),
    ("cpu", ValueError, "CUDA"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_validation(case, error, words):
    q, kc, vc = _tensors()
    lens = torch.zeros(2, dtype=torch.int32)
    kw = dict(cache_seqlens=lens)
    if case == "k_without_v":
        kw["k"] = torch.zeros(2, 1, 2, 64, dtype=torch.bfloat16)
    elif case == "leftpad_paged":
        kw.update(cache_leftpad=lens, page_table=torch.zeros(2, 1, dtype=torch.int32))
    elif case == "rotary_odd":
        kw.update(rotary_cos=torch.zeros(8, 12, dtype=torch.bfloat16), rotary_sin=torch.zeros(8, 12, dtype=torch.bfloat16))
    elif case == "rotary_dtype":
        kw.update(rotary_cos=torch.zeros(8, 16), rotary_sin=torch.zeros(8, 16))
    elif case == "cache_batch":
        kc, vc = kc[:1], vc[:1]
    elif case == "seqlens_dtype":
        kw["cache_seqlens"] = lens.long()
    with pytest.raises(error, match=words):
        fa.flash_attn_with_kvcache(q, kc, vc, **kw)


@pytest.mark.parametrize("case", ["mla", "d320"])
def test_fp8_caches_past_256_refused_before_appending(case):
    """FP8 caches with qv (MLA) or head dims past 256 raise the manifest's message before anything is written."""
    d, dv = (64, 512) if case == "mla" else (320, 320)
    q = torch.zeros(2, 1, 16, d, dtype=torch.bfloat16)
    kc = torch.zeros(2, 32, 1, d, dtype=torch.float8_e4m3fn)
    vc = torch.zeros(2, 32, 1, dv, dtype=torch.float8_e4m3fn)
    qv = torch.zeros(2, 1, 16, dv, dtype=torch.bfloat16) if case == "mla" else None
    with pytest.raises(NotImplementedError, match="head_dim > 256 with FP8"):
        fa.flash_attn_with_kvcache(q, kc, vc, k=torch.ones(2, 1, 1, d, dtype=torch.bfloat16),
                                   v=torch.ones(2, 1, 1, dv, dtype=torch.bfloat16), qv=qv)
    assert not kc.float().any() and not vc.float().any()
