"""The decode tile on a GPU (``_kernels/fwd_keysplit``: 16 packed rows, the warps split each key block and merge once):
every output and LSE against the fp32 reference, within twice the error of the same attention in the input dtype
plus atol (``max|out-ref| <= 2*max|pt-ref| + atol``).

Calls whose packed rows (seqlen_q x group) fit 16 take the tile (``config.decode_entry``; the d64 class): MHA, GQA and
a 16-row group, decode and speculative decode (causal), odd key counts around the 64-key block, head_dim_v != head_dim
and a padded head dim; windows, softcap, the learnable sink; split-KV (explicit and automatic counts) with the combine;
paged K/V at page sizes 1 and 16 with empty sequences; FP8 K/V (e4m3, e5m2) with per-(batch, KV head) descales; and
the same call twice giving the same bits (the merge sums the warps in a fixed order).
"""

import pytest
import torch

from reference import attention_ref, paged_cache
from test_fp8_gpu import E4M3, E5M2, check, dequantized, quantize

pytestmark = pytest.mark.gpu


def check_lse(lse, ref_lse):
    """Rows that saw keys match the reference LSE; rows that saw none are -inf (or the sink's) alike."""
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen)
    if seen.any():
        assert (lse[seen] - ref_lse[seen]).abs().max().item() <= 1e-3


def takes_decode_tile(q, k, d, dv, kv_dtype=None, paged=False, **kw):
    """Whether the dispatcher gives this call the decode tile (the test is about that tile)."""
    from flash_attn_4_sm120 import config
    from flash_attn_4_sm120.execution_model import SM120
    from flash_attn_4_sm120.problem import FwdSpec

    spec = FwdSpec("bf16", d, dv, causal=False, pack_gqa=True, kv_dtype=kv_dtype, seqused_k=paged,
                   page_size=16 if paged else 0)
    rows = q.shape[1] * (q.shape[2] // k.shape[2])
    decode = config.decode_entry(spec, SM120)
    return decode is not None and config.choose_fwd_config(spec, SM120, rows, q.shape[1], k.shape[1]) == decode


@pytest.mark.parametrize("d,dv", [(64, 64), (40, 40), (64, 32)])
@pytest.mark.parametrize("hq,hkv,sq", [(8, 8, 1), (32, 8, 1), (16, 1, 1), (32, 8, 4)])
@pytest.mark.parametrize("sk", [1, 63, 65, 1000, 4097])
def test_decode_tile_dense(d, dv, hq, hkv, sq, sk):
    torch.manual_seed(sk + hq + d)
    b = 3
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, dv, dtype=torch.bfloat16, device="cuda")
    assert takes_decode_tile(q, k, d, dv)
    import flash_attn_4_sm120 as fa

    causal = sq > 1
    out, lse = fa.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, causal=causal)
    pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
    check(out, ref, pt)
    check_lse(lse, ref_lse)
    again, _ = fa.flash_attn_func(q, k, v, causal=causal)
    assert torch.equal(again, out), "the merge is not deterministic"


@pytest.mark.parametrize("feature", ["window", "softcap", "sink", "all"])
@pytest.mark.parametrize("splits", [1, 3, None])
def test_decode_tile_features_and_splits(feature, splits):
    torch.manual_seed(7)
    b, sq, hq, hkv, d, sk = 2, 2, 16, 2, 64, 3001
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    assert takes_decode_tile(q, k, d, d)
    kw = {}
    if feature in ("window", "all"):
        kw["window_size"] = (700, 0)
    if feature in ("softcap", "all"):
        kw["softcap"] = 15.0
    if feature in ("sink", "all"):
        kw["learnable_sink"] = torch.randn(hq, device="cuda")
    import flash_attn_4_sm120 as fa

    out, lse = fa.flash_attn_func(q, k, v, causal=True, num_splits=splits, return_lse=True, **kw)
    ref, ref_lse = attention_ref(q, k, v, causal=True, **kw)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False, **kw)
    check(out, ref, pt)
    check_lse(lse, ref_lse)


@pytest.mark.parametrize("kv_dtype,d", [(None, 64), (E4M3, 64), (E5M2, 64), (E4M3, 128), (E5M2, 128), (E4M3, 96)])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("splits", [1, None])
def test_decode_tile_paged(kv_dtype, d, page_size, splits):
    """Paged caches with an empty sequence and odd lengths, 16-bit or FP8 (descales per batch and KV head; FP8 K/V
    widened in registers, ``_kernels/fwd_keysplit_fp8``)."""
    torch.manual_seed(page_size + d)
    b, hq, hkv = 4, 32, 8
    lens = [0, 1, 777, 5000]
    kc, vc, table, dense_k, dense_v = paged_cache(b, max(lens), page_size, hkv, d, d, spare=3)
    num_pages = kc.shape[0]
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda")
    kw = {}
    if kv_dtype is not None:
        k8, kd = quantize(dense_k, kv_dtype)
        v8, vd = quantize(dense_v, kv_dtype)
        kc8 = torch.empty(num_pages, page_size, hkv, d, dtype=kv_dtype, device="cuda")
        vc8 = torch.empty_like(kc8)
        kc8.view(torch.uint8)[table.long().flatten()] = k8.view(torch.uint8).reshape(-1, page_size, hkv, d)
        vc8.view(torch.uint8)[table.long().flatten()] = v8.view(torch.uint8).reshape(-1, page_size, hkv, d)
        kw = dict(k_descale=kd, v_descale=vd)
        k_ref, v_ref = dequantized(k8, kd), dequantized(v8, vd)
        kc, vc = kc8, vc8
    else:
        k_ref, v_ref = dense_k, dense_v
    assert takes_decode_tile(q, k_ref, d, d, "e4m3" if kv_dtype is not None else None, paged=True)
    import flash_attn_4_sm120 as fa

    out, _ = fa.flash_attn_varlen_func(q, kc, vc, seqused_k=used, page_table=table, num_splits=splits, **kw)
    for i, n in enumerate(lens):
        if n == 0:
            assert torch.equal(out[i], torch.zeros_like(out[i])), "a sequence without keys gives O = 0"
            continue
        kq, vq = k_ref[i : i + 1, :n], v_ref[i : i + 1, :n]
        ref, _ = attention_ref(q[i : i + 1].float(), kq.float(), vq.float())
        pt, _ = attention_ref(q[i : i + 1], kq.to(q.dtype), vq.to(q.dtype), upcast=False)
        check(out[i : i + 1], ref, pt)


@pytest.mark.parametrize("fp8", [E4M3, E5M2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d,dv", [(128, 128), (128, 64), (64, 64), (96, 96)])
@pytest.mark.parametrize("hq,hkv,sq,sk", [(32, 8, 1, 4097), (16, 1, 1, 65), (32, 8, 2, 1000)])
def test_decode_tile_fp8_dense(fp8, dtype, d, dv, hq, hkv, sq, sk):
    """FP8 K/V over the decode tile (widened in registers), dense, with descales, causal speculative rows, softcap
    and a sink on the longest case, split automatically."""
    torch.manual_seed(d + sk)
    b = 2
    q = torch.randn(b, sq, hq, d, dtype=dtype, device="cuda")
    k8, kd = quantize(torch.randn(b, sk, hkv, d, device="cuda"), fp8)
    v8, vd = quantize(torch.randn(b, sk, hkv, dv, device="cuda"), fp8)
    k_ref, v_ref = dequantized(k8, kd), dequantized(v8, vd)
    assert takes_decode_tile(q, k_ref, d, dv, "e4m3")
    kw = dict(softcap=10.0, learnable_sink=torch.randn(hq, device="cuda")) if sk == 4097 else {}
    import flash_attn_4_sm120 as fa

    causal = sq > 1
    out, lse = fa.flash_attn_func(q, k8, v8, causal=causal, k_descale=kd, v_descale=vd, return_lse=True, **kw)
    ref, ref_lse = attention_ref(q.float(), k_ref, v_ref, causal=causal, **kw)
    pt, _ = attention_ref(q, k_ref.to(dtype), v_ref.to(dtype), causal=causal, upcast=False, **kw)
    check(out, ref, pt)
    check_lse(lse, ref_lse)
