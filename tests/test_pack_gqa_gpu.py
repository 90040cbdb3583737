"""Packed GQA on a GPU: query heads of a KV group folded into the M tile, forced on and off, against
the fp32 reference (NaN-poisoned outputs): decode and short queries, ratios that do not divide the
tile (7-way, 3-way), MQA, MHA (a group of one: short queries take the 64-row short-query tile), causal with seqlen_q != seqlen_k, windows, softcap, sinks, fp16, and varlen."""

import pytest
import torch

from reference import attention_ref, check_fwd, varlen_batch

pytestmark = pytest.mark.gpu


def _check(q, k, v, pack_gqa, causal=False, **features):
    check_fwd(q, k, v, causal, {"pack_gqa": pack_gqa}, **features)


HEADS = [(32, 8), (28, 4), (6, 2), (32, 1), (8, 8)]  # 4-way, 7-way, 3-way, MQA, MHA
SHAPES = [(2, 1, 1000), (3, 5, 300), (1, 37, 37), (2, 113, 239), (1, 130, 64)]  # (b, sq, sk)


@pytest.mark.parametrize("pack_gqa", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}-{h[1]}")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_pack_gqa_matches_reference(head_dim, heads, shape, causal, pack_gqa):
    torch.manual_seed(hash((head_dim, heads, shape, causal)) % 2**31)
    (b, sq, sk), (hq, hkv) = shape, heads
    q = torch.randn(b, sq, hq, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    _check(q, k, v, pack_gqa, causal)


@pytest.mark.parametrize("features", [
    pytest.param({"window_size": (50, 7)}, id="window"),
    pytest.param({"window_size": (20, 0), "softcap": 15.0, "learnable_sink": "sink"}, id="window-softcap-sink"),
    pytest.param({"softcap": 30.0, "causal": True}, id="causal-softcap"),
    pytest.param({"learnable_sink": "sink", "causal": True}, id="causal-sink"),
])
@pytest.mark.parametrize("head_dim, dtype", [(128, torch.bfloat16), (96, torch.float16), (256, torch.bfloat16),
                                             (192, torch.bfloat16)])
def test_pack_gqa_with_masks_and_features(head_dim, dtype, features):
    torch.manual_seed(head_dim)
    features = dict(features)
    hq, hkv = 14, 2
    if features.get("learnable_sink") == "sink":
        features["learnable_sink"] = torch.randn(hq, device="cuda")
    causal = features.pop("causal", False)
    q = torch.randn(2, 9, hq, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(2, 333, hkv, head_dim, dtype=dtype, device="cuda")
    v = torch.randn(2, 333, hkv, head_dim, dtype=dtype, device="cuda")
    _check(q, k, v, True, causal, **features)


@pytest.mark.parametrize("features", [
    pytest.param({}, id="plain"),
    pytest.param({"softcap": 30.0, "learnable_sink": "sink"}, id="softcap-sink"),
    pytest.param({"window_size": (100, 0)}, id="window"),
    pytest.param({"num_splits": 3}, id="split3"),  # a kernel option, not a feature of the reference
])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_mha_decode_takes_the_short_query_entry(head_dim, features):
    """MHA decode under the automatic choice (no pack_gqa argument): the packed spec with a group of one
    and the 64-row short-query entry, with the features a serving call combines."""
    from flash_attn_4_sm120.config import select_fwd_config
    from flash_attn_4_sm120.execution_model import SM120
    from flash_attn_4_sm120.problem import FwdSpec

    assert select_fwd_config(FwdSpec("bf16", head_dim, head_dim, False, pack_gqa=True), SM120).tile_m == 64
    torch.manual_seed(head_dim)
    features = dict(features)
    options = {"num_splits": features.pop("num_splits")} if "num_splits" in features else {}
    if features.get("learnable_sink") == "sink":
        features["learnable_sink"] = torch.randn(12, device="cuda")
    q = torch.randn(3, 1, 12, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(3, 1500, 12, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(3, 1500, 12, head_dim, dtype=torch.bfloat16, device="cuda")
    check_fwd(q, k, v, False, options, **features)


def test_pack_gqa_varlen_decode_batch():
    """Packed GQA over packed Q/K with a zero-length and one-token sequences (serving decode)."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(7)
    lens_q, lens_k = [1, 0, 3, 1], [700, 5, 0, 64]
    hq, hkv, d = 16, 2, 128
    q, k, v, cu_q, cu_k = varlen_batch(lens_q, lens_k, hq, hkv, d)
    out, lse = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                         max_seqlen_k=max(lens_k), causal=True,
                                         pack_gqa=True, return_lse=True)
    torch.cuda.synchronize()
    for i in range(len(lens_q)):
        qs, ks = slice(cu_q[i].item(), cu_q[i + 1].item()), slice(cu_k[i].item(), cu_k[i + 1].item())
        if lens_q[i] == 0:
            continue
        ref, ref_lse = attention_ref(q[qs][None], k[ks][None], v[ks][None], causal=True)
        pt, _ = attention_ref(q[qs][None], k[ks][None], v[ks][None], causal=True, upcast=False)
        o = out[qs].float()
        assert not o.isnan().any()
        assert (o - ref[0].float()).abs().max().item() <= 2 * (pt[0].float() - ref[0].float()).abs().max().item() + 1e-5
        neg = torch.isneginf(ref_lse[0])
        assert torch.equal(torch.isneginf(lse[:, qs]), neg)


def test_pack_gqa_decode_is_one_compile_for_all_batch_sizes():
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.compile_cache import default_cache

    def call(b, sq, sk, hq, hkv):
        q = torch.randn(b, sq, hq, 128, dtype=torch.bfloat16, device="cuda")
        kv = torch.randn(b, sk, hkv, 128, dtype=torch.bfloat16, device="cuda")
        fa.flash_attn_func(q, kv, kv)

    call(1, 1, 100, 32, 8)
    call(1, 1, 4096, 32, 8)  # the split-KV variant (a small decode grid over many keys) + the combine
    before = default_cache().stats.compiles
    for shape in ((7, 1, 4097, 32, 8), (16, 1, 8192, 28, 4), (2, 3, 50, 32, 1), (1, 100, 900, 12, 4)):
        call(*shape)
    assert default_cache().stats.compiles == before
