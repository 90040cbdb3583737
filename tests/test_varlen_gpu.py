"""Varlen forward on a GPU: each sequence of a packed batch against the fp32 reference of that sequence.

Covers packed Q and K/V (cu_seqlens), zero- and one-token sequences, seqused caps, a dense Q over
packed K/V, causal / window / softcap / sink per sequence, GQA, and one compile serving every batch layout.
"""

import pytest
import torch

from reference import attention_ref

pytestmark = pytest.mark.gpu


def _cu(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")


def _check_seq(out, lse, ref, ref_lse, pt):
    assert not out.isnan().any() and not lse.isnan().any()
    err = (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0
    pt_err = (pt.float() - ref.float()).abs().max().item() if out.numel() else 0.0
    assert err <= 2 * pt_err + 1e-5, f"max|out-ref|={err:.3e} > 2*{pt_err:.3e}"
    neg = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), neg)
    if (~neg).any():
        assert (lse[~neg] - ref_lse[~neg]).abs().max().item() <= 1e-3


CASES = [
    pytest.param([5, 0, 113, 1, 300], [7, 3, 250, 0, 300], {}, id="mixed-with-empty"),
    pytest.param([128, 64, 1000], [128, 64, 1000], {"causal": True}, id="causal"),
    pytest.param([1, 1, 1, 1], [900, 10, 0, 4000], {"causal": True}, id="decode-like"),
    pytest.param([500, 37], [700, 37], {"window_size": (64, 16)}, id="window"),
    pytest.param([200, 99], [333, 99], {"softcap": 10.0, "causal": True}, id="softcap"),
    pytest.param([200, 0, 99], [250, 0, 99], {"learnable_sink": "sink", "window_size": (32, 0)}, id="sink-window"),
]


@pytest.mark.parametrize("lens_q, lens_k, features", CASES)
@pytest.mark.parametrize("head_dim", [64, 128, 96], ids=["d64", "d128", "d96"])
def test_varlen_packed(lens_q, lens_k, features, head_dim):
    import flash_attn_4_sm120 as fa

    torch.manual_seed(len(lens_q) * 100 + head_dim)
    hq, hkv = 6, 2
    features = dict(features)
    if features.get("learnable_sink") == "sink":
        features["learnable_sink"] = torch.randn(hq, device="cuda")
    q = torch.randn(sum(lens_q), hq, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(sum(lens_k), hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(sum(lens_k), hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    out, lse = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                         max_seqlen_k=max(lens_k), return_lse=True, **features)
    torch.cuda.synchronize()
    assert out.shape == q.shape and lse.shape == (hq, q.shape[0])
    causal = features.pop("causal", False)
    for b in range(len(lens_q)):
        qs, ks = slice(cu_q[b].item(), cu_q[b + 1].item()), slice(cu_k[b].item(), cu_k[b + 1].item())
        if lens_q[b] == 0:
            continue
        args = (q[qs][None], k[ks][None], v[ks][None])
        ref, ref_lse = attention_ref(*args, causal=causal, **features)
        pt, _ = attention_ref(*args, causal=causal, upcast=False, **features)
        _check_seq(out[qs], lse[:, qs], ref[0], ref_lse[0], pt[0])


def test_dense_q_over_kv_cache_with_seqused_k():
    """Decode-style: dense q (batch, 3, heads, d) against a preallocated dense cache filled to seqused_k."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(3)
    used = [17, 0, 513, 64]
    q = torch.randn(4, 3, 8, 128, dtype=torch.float16, device="cuda")
    k = torch.randn(4, 600, 2, 128, dtype=torch.float16, device="cuda")
    v = torch.randn(4, 600, 2, 128, dtype=torch.float16, device="cuda")
    seqused_k = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, lse = fa.flash_attn_varlen_func(q, k, v, seqused_k=seqused_k, causal=True, return_lse=True)
    torch.cuda.synchronize()
    for b, n in enumerate(used):
        args = (q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n])
        ref, ref_lse = attention_ref(*args, causal=True)
        pt, _ = attention_ref(*args, causal=True, upcast=False)
        _check_seq(out[b], lse[b], ref[0], ref_lse[0], pt[0])


def test_packed_with_seqused_q_leaves_unused_rows_zero():
    import flash_attn_4_sm120 as fa

    lens = [10, 20]
    q = torch.randn(30, 2, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(30, 2, 64, dtype=torch.bfloat16, device="cuda")
    cu = _cu(lens)
    used = torch.tensor([4, 20], dtype=torch.int32, device="cuda")
    out, lse = fa.flash_attn_varlen_func(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=20, max_seqlen_k=20,
                                         seqused_q=used, seqused_k=used, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(out[4:10], torch.zeros_like(out[4:10])) and torch.isneginf(lse[:, 4:10]).all()
    ref, _ = attention_ref(q[None, :4], k[None, :4], k[None, :4])
    assert (out[:4].float() - ref[0].float()).abs().max().item() < 2e-2


def test_one_compile_serves_every_batch_layout():
    """Lengths never add compilations: once the unsplit forward and the split-KV forward + combine
    are compiled, for prefill and for short queries (max_seqlen_q < 128 packs, MHA included), no batch
    layout compiles anything, whatever split count it is given."""
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.compile_cache import default_cache

    def call(lens, num_splits=None):
        q = torch.randn(sum(lens), 4, 64, dtype=torch.bfloat16, device="cuda")
        cu = _cu(lens)
        fa.flash_attn_varlen_func(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens),
                                  max_seqlen_k=max(lens), causal=True, num_splits=num_splits)

    for warm in ([1000], [5]):
        call(warm, num_splits=1)
        call(warm, num_splits=2)
    before = default_cache().stats.compiles
    for lens in ([3, 5], [1000], [1, 2, 3, 4, 5, 6, 7], [0, 4097, 12], [333] * 9, [8191, 1]):
        for num_splits in (None, 1, 7):
            call(lens, num_splits)
    assert default_cache().stats.compiles == before
