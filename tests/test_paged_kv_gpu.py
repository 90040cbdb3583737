"""Paged K/V on a GPU: every sequence against the fp32 reference over its keys gathered from the pages.

Covers page sizes 1 to 256 (and sizes that are neither divisors nor multiples of the tile), pages in
random order and shared between sequences (a common prefix), head dims 64 to 256 and head_dim_v !=
head_dim, GQA packed and not, causal / window / softcap / sink, split-KV automatic and explicit,
varlen queries against paged K/V (chunked prefill), ``flash_attn_func(page_table=...)``, and page
tables with entries outside the cache (clamped: no fault, finite output; ``check_metadata`` names them).
"""

import pytest
import torch

from reference import attention_ref

pytestmark = pytest.mark.gpu


def paged_cache(lens_k, hkv, d, dv, page_size, dtype=torch.bfloat16, shared_prefix=0, spare_pages=3, seed=0):
    """(k_cache, v_cache, page_table, seqused_k, dense K/V per sequence): pages of every sequence in a
    shuffled pool with ``spare_pages`` unused pages; the first ``shared_prefix`` keys (whole pages) of
    every sequence are one set of pages shared by all."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    assert shared_prefix % page_size == 0
    n_shared = shared_prefix // page_size
    max_pages = max(-(-n // page_size) for n in lens_k) if lens_k else 0
    max_pages = max(max_pages, n_shared, 1)
    own = [max(0, -(-n // page_size) - n_shared) for n in lens_k]
    num_pages = n_shared + sum(own) + spare_pages
    order = torch.randperm(num_pages, generator=g).tolist()
    shared_ids, rest = order[:n_shared], order[n_shared:]
    table = torch.zeros(len(lens_k), max_pages, dtype=torch.int32)
    for b, n in enumerate(lens_k):
        ids = shared_ids + rest[:own[b]]
        rest = rest[own[b]:]
        table[b, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        table[b, len(ids):] = torch.randint(0, num_pages, (max_pages - len(ids),), generator=g, dtype=torch.int32)
    k_cache = torch.randn(num_pages, page_size, hkv, d, generator=g).to(dtype).cuda()
    v_cache = torch.randn(num_pages, page_size, hkv, dv, generator=g).to(dtype).cuda()
    dense = []
    for b, n in enumerate(lens_k):
        rows = [table[b, j // page_size].item() * page_size + j % page_size for j in range(n)]
        idx = torch.tensor(rows, dtype=torch.long, device="cuda")
        dense.append((k_cache.flatten(0, 1)[idx], v_cache.flatten(0, 1)[idx]))
    used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    return k_cache, v_cache, table.cuda(), used, dense


def check_sequence(out, lse, q, k, v, causal, features):
    """One sequence: out (sq, hq, dv), lse (hq, sq) against the reference of q (sq, hq, d) over k/v (sk, ...)."""
    ref, ref_lse = attention_ref(q[None], k[None], v[None], causal=causal, **features)
    pt, _ = attention_ref(q[None], k[None], v[None], causal=causal, upcast=False, **features)
    ref, ref_lse, pt = ref[0], ref_lse[0], pt[0]
    assert not out.isnan().any() and not lse.isnan().any(), "unwritten output rows"
    err = (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0
    pt_err = (pt.float() - ref.float()).abs().max().item() if out.numel() else 0.0
    assert err <= 2 * pt_err + 1e-5, f"max|out-ref|={err:.3e} > 2*{pt_err:.3e}"
    neg = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), neg)
    if (~neg).any():
        assert (lse[~neg] - ref_lse[~neg]).abs().max().item() <= 1e-3


def run_dense_q(lens_k, seqlen_q, hq, hkv, d, dv, page_size, causal=False, dtype=torch.bfloat16, options=None,
                shared_prefix=0, seed=0, **features):
    """Dense q (batch, seqlen_q, hq, d) over paged K/V filled to ``lens_k``; every sequence checked."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(seed)
    k_cache, v_cache, table, used, dense = paged_cache(lens_k, hkv, d, dv, page_size, dtype, shared_prefix,
                                                       seed=seed)
    q = torch.randn(len(lens_k), seqlen_q, hq, d, dtype=dtype, device="cuda")
    if features.get("learnable_sink") == "sink":
        features["learnable_sink"] = torch.randn(hq, device="cuda")
    out, lse = fa.flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=used, page_table=table, causal=causal,
                                         return_lse=True, **(options or {}), **features)
    torch.cuda.synchronize()
    assert out.shape == (len(lens_k), seqlen_q, hq, dv)
    for b in range(len(lens_k)):
        check_sequence(out[b], lse[b], q[b], *dense[b], causal, features)


PAGE_SIZES = [1, 8, 16, 32, 64, 128, 256, 48, 3]


@pytest.mark.parametrize("page_size", PAGE_SIZES, ids=[f"p{p}" for p in PAGE_SIZES])
@pytest.mark.parametrize("seqlen_q", [1, 37], ids=["decode", "q37"])
def test_page_sizes(page_size, seqlen_q):
    run_dense_q([700, 1, 0, 1500, 257], seqlen_q, 8, 2, 128, 128, page_size, causal=True, seed=page_size)


HEAD_DIMS = [(64, 64), (80, 80), (96, 96), (128, 64), (192, 128), (192, 192), (256, 256), (40, 40)]


@pytest.mark.parametrize("d, dv", HEAD_DIMS, ids=[f"d{d}x{dv}" for d, dv in HEAD_DIMS])
@pytest.mark.parametrize("seqlen_q", [1, 100], ids=["decode", "q100"])
def test_head_dims(d, dv, seqlen_q):
    run_dense_q([333, 1024, 64], seqlen_q, 4, 2, d, dv, 16, causal=seqlen_q > 1, seed=d + dv)


FEATURES = [
    pytest.param({"causal": True}, {}, id="causal"),
    pytest.param({}, {}, id="full"),
    pytest.param({"window_size": (100, 0)}, {}, id="window-left"),
    pytest.param({"window_size": (64, 16)}, {}, id="window-both"),
    pytest.param({"window_size": (None, -3)}, {}, id="window-negative"),
    pytest.param({"softcap": 15.0, "causal": True}, {}, id="softcap"),
    pytest.param({"learnable_sink": "sink", "window_size": (128, 0)}, {}, id="sink-window"),
    pytest.param({"causal": True}, {"num_splits": 1}, id="no-split"),
    pytest.param({"causal": True}, {"num_splits": 7}, id="split7"),
    pytest.param({"causal": True}, {"pack_gqa": False}, id="unpacked"),
    pytest.param({"causal": True, "learnable_sink": "sink"}, {"num_splits": 3}, id="split-sink"),
]


@pytest.mark.parametrize("features, options", FEATURES)
@pytest.mark.parametrize("seqlen_q", [1, 5, 200], ids=["q1", "q5", "q200"])
def test_features(features, options, seqlen_q):
    features = dict(features)
    causal = features.pop("causal", False)
    run_dense_q([900, 17, 2048], seqlen_q, 8, 2, 128, 128, 16, causal=causal, options=options, seed=seqlen_q,
                **features)


@pytest.mark.parametrize("hq, hkv", [(8, 8), (12, 4), (7, 1)], ids=["mha", "gqa3", "mqa7"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_heads_and_dtypes(hq, hkv, dtype):
    run_dense_q([513, 2000], 3, hq, hkv, 64, 64, 32, causal=True, dtype=dtype, seed=hq)


def test_shared_prefix_pages():
    """Prefix caching: every sequence's first 512 keys are the same pages."""
    run_dense_q([600, 512, 1000, 700], 9, 8, 2, 128, 128, 64, causal=True, shared_prefix=512, seed=5)


@pytest.mark.parametrize("page_size", [16, 64, 1], ids=["p16", "p64", "p1"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_chunked_prefill_varlen_q(page_size, causal):
    """Packed queries (cu_seqlens_q) of new tokens against paged K/V holding the cache plus those tokens."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(page_size)
    lens_q, lens_k = [512, 1, 37, 0, 200], [4096 + 512, 300, 37, 50, 200]
    hq, hkv, d = 8, 2, 128
    k_cache, v_cache, table, used, dense = paged_cache(lens_k, hkv, d, d, page_size, seed=page_size)
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), hq, d, dtype=torch.bfloat16, device="cuda")
    out, lse = fa.flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=cu_q, max_seqlen_q=max(lens_q),
                                         seqused_k=used, page_table=table, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    for b in range(len(lens_q)):
        s = slice(cu_q[b].item(), cu_q[b + 1].item())
        if lens_q[b]:
            check_sequence(out[s], lse[:, s], q[s], *dense[b], causal, {})


def test_flash_attn_func_page_table():
    """``flash_attn_func(page_table=...)``: every sequence is its table row's max_pages * page_size keys."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(11)
    k_cache, v_cache, table, _, dense = paged_cache([256, 256], 2, 64, 64, 32, seed=11)
    q = torch.randn(2, 40, 4, 64, dtype=torch.bfloat16, device="cuda")
    out, lse = fa.flash_attn_func(q, k_cache, v_cache, causal=True, page_table=table, return_lse=True)
    torch.cuda.synchronize()
    for b in range(2):
        check_sequence(out[b], lse[b], q[b], *dense[b], True, {})


def test_corrupt_page_table_is_clamped():
    """Entries outside [0, num_pages) (and a seqused_k past the row's capacity) read clamped pages: no fault,
    every row written and finite; the opt-in check names the first bad entry."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(2)
    k_cache, v_cache, table, used, _ = paged_cache([100, 300], 2, 128, 128, 16, seed=2)
    bad = table.clone()
    bad[0, 1] = 10**9
    bad[1, 3] = -5
    used_bad = torch.tensor([100, 10**6], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
    for num_splits in (1, 4):
        out, lse = fa.flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=used_bad, page_table=bad,
                                             num_splits=num_splits, return_lse=True)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    with pytest.raises(ValueError, match=r"page_table\[0, 1\] = 1000000000"):
        fa.flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=used, page_table=bad, check_metadata=True)
    with pytest.raises(ValueError, match=r"seqused_k\[1\] = 1000000"):
        fa.flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=used_bad, page_table=table, check_metadata=True)
