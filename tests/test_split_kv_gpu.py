"""Split-KV (flash decoding) on a GPU: key ranges split over CTAs, fp32 partials merged by the
combine kernel, against the fp32 reference with NaN-poisoned outputs. Split counts that do not
divide the key blocks, more splits than blocks (clamped), splits that see no key of a row (causal,
windows), packed GQA, softcap, the learnable sink (entered once, in the combine), fp16, padded and
unequal head dims, varlen with empty sequences, the automatic choice, and one compile for every
split count and length."""

import pytest
import torch

from reference import attention_ref, check_fwd, varlen_batch

pytestmark = pytest.mark.gpu


def _check(q, k, v, num_splits, causal=False, pack_gqa=None, **features):
    check_fwd(q, k, v, causal, {"num_splits": num_splits, "pack_gqa": pack_gqa}, **features)


SHAPES = [(2, 1, 1000), (3, 5, 300), (1, 113, 239), (2, 130, 1023), (1, 1, 64)]  # (b, sq, sk)


@pytest.mark.parametrize("num_splits", [2, 3, 7, 500])
@pytest.mark.parametrize("mask", ["full", "causal", "window"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)], ids=lambda h: f"{h[0]}-{h[1]}")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_split_kv_matches_reference(head_dim, heads, shape, mask, num_splits):
    torch.manual_seed(hash((head_dim, heads, shape, mask, num_splits)) % 2**31)
    (b, sq, sk), (hq, hkv) = shape, heads
    q = torch.randn(b, sq, hq, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    features = {"window_size": (90, 3)} if mask == "window" else {}
    _check(q, k, v, num_splits, causal=mask == "causal", **features)


@pytest.mark.parametrize("pack_gqa", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("features", [
    pytest.param({"learnable_sink": "sink"}, id="sink"),
    pytest.param({"learnable_sink": "sink", "causal": True, "window_size": (40, 0)}, id="window-sink"),
    pytest.param({"softcap": 20.0, "causal": True}, id="causal-softcap"),
    pytest.param({"softcap": 10.0, "learnable_sink": "sink", "window_size": (200, 10)}, id="window-softcap-sink"),
])
@pytest.mark.parametrize("head_dim, head_dim_v, dtype", [(128, 128, torch.bfloat16), (96, 96, torch.float16),
                                                         (72, 72, torch.bfloat16), (192, 128, torch.bfloat16),
                                                         (256, 256, torch.bfloat16)])
def test_split_kv_with_features(head_dim, head_dim_v, dtype, features, pack_gqa):
    torch.manual_seed(head_dim)
    features = dict(features)
    hq, hkv = 12, 3
    if features.get("learnable_sink") == "sink":
        features["learnable_sink"] = torch.randn(hq, device="cuda") * 3
    causal = features.pop("causal", False)
    q = torch.randn(2, 7, hq, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(2, 777, hkv, head_dim, dtype=dtype, device="cuda")
    v = torch.randn(2, 777, hkv, head_dim_v, dtype=dtype, device="cuda")
    _check(q, k, v, 5, causal, pack_gqa=pack_gqa, **features)


def test_split_kv_rows_without_keys_in_any_split():
    """seqlen_q > seqlen_k, causal: the first rows see no key at all (O = 0, LSE = -inf), and with a
    sink they see only the sink (O = 0, LSE = sink)."""
    torch.manual_seed(3)
    q = torch.randn(2, 300, 4, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 200, 4, 64, dtype=torch.bfloat16, device="cuda")
    _check(q, k, k, 4, causal=True)
    _check(q, k, k, 4, causal=True, learnable_sink=torch.randn(4, device="cuda"))


def test_split_kv_varlen_with_empty_sequences():
    """Packed Q/K and seqused_k with zero-length sequences, split and packed GQA (serving decode)."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(11)
    lens_q, lens_k = [1, 0, 3, 1, 2], [2000, 5, 0, 640, 1]
    used_k = [1500, 5, 0, 1, 1]
    hq, hkv, d = 16, 2, 128
    q, k, v, cu_q, cu_k = varlen_batch(lens_q, lens_k, hq, hkv, d)
    seqused_k = torch.tensor(used_k, dtype=torch.int32, device="cuda")
    sink = torch.randn(hq, device="cuda")
    for num_splits in (3, 16):
        out, lse = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                             max_seqlen_k=max(lens_k), seqused_k=seqused_k,
                                             causal=True, learnable_sink=sink, num_splits=num_splits, return_lse=True)
        torch.cuda.synchronize()
        for i in range(len(lens_q)):
            qs = slice(cu_q[i].item(), cu_q[i + 1].item())
            ks = slice(cu_k[i].item(), cu_k[i].item() + used_k[i])
            if lens_q[i] == 0:
                continue
            ref, ref_lse = attention_ref(q[qs][None], k[ks][None], v[ks][None], causal=True, learnable_sink=sink)
            pt, _ = attention_ref(q[qs][None], k[ks][None], v[ks][None], causal=True, learnable_sink=sink,
                                  upcast=False)
            o = out[qs].float()
            assert not o.isnan().any()
            assert (o - ref[0].float()).abs().max().item() <= 2 * (pt[0].float() - ref[0].float()).abs().max().item() + 1e-5
            assert (lse[:, qs] - ref_lse[0]).abs().max().item() <= 1e-3


def test_automatic_split_for_decode_and_off_switch():
    """Decode grids too small for the GPU split by themselves; num_splits=1 never splits; both agree
    with the reference (and each other within the tolerance)."""
    from flash_attn_4_sm120.compile_cache import default_cache

    torch.manual_seed(5)
    q = torch.randn(2, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 8192, 8, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(2, 8192, 8, 128, dtype=torch.bfloat16, device="cuda")
    _check(q, k, v, None)
    _check(q, k, v, 1)
    keys = {key[1].split_kv for key in default_cache().keys() if key[0] == "fwd"}
    assert keys == {True, False}


def test_one_compile_serves_all_split_counts_and_lengths():
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.compile_cache import default_cache

    def call(b, sq, sk, hq, hkv, splits):
        q = torch.randn(b, sq, hq, 128, dtype=torch.bfloat16, device="cuda")
        kv = torch.randn(b, sk, hkv, 128, dtype=torch.bfloat16, device="cuda")
        fa.flash_attn_func(q, kv, kv, num_splits=splits)

    call(1, 1, 1000, 8, 2, 2)
    before = default_cache().stats.compiles
    for shape in ((3, 1, 4097, 32, 8, 3), (16, 1, 8192, 28, 4, None), (2, 3, 500, 32, 1, 9), (1, 100, 9000, 12, 4, 64)):
        call(*shape)
    assert default_cache().stats.compiles == before
