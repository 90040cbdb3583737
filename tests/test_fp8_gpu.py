"""FP8 K/V on a GPU (FlashAttention-3's descale convention): every output against the fp32 reference computed on
the dequantized inputs (``k.float() * k_descale[b, h_kv]``), within twice the error of the same attention in the
input dtype plus atol (``max|out-ref| <= 2*max|pt-ref| + atol``).

Covers e4m3 and e5m2 K/V beside bf16 and fp16 q, an FP8 q (widened exactly, its scale joining K's), per-(batch,
KV head) scales and per-tensor ones (expanded views, strides 0) of 1, 2^-8 and 2^8; dense, packed (varlen) and
paged K/V at page sizes 1, 16 and 64, empty sequences, odd lengths, GQA ratios 1-8 packed and not, split-KV,
causal / window / softcap / sink; ``flash_attn_with_kvcache`` over a paged FP8 cache, also replayed in a CUDA
graph, and appending (rotated, quantized) keys into dense and paged FP8 caches; and outputs poisoned with NaN
before the call.
"""

import math

import pytest
import torch

from reference import attention_ref

pytestmark = pytest.mark.gpu

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}


def quantize(x, fp8, per_head=True, scale=None):
    """(x in ``fp8``, fp32 descale (batch, heads_kv)) of x (batch, seqlen, heads_kv, d): amax scaling per (batch,
    KV head) or per tensor; ``scale`` fixes the per-tensor scale (a power of two)."""
    b, _, h, _ = x.shape
    if scale is not None:
        d = torch.full((b, h), scale, device=x.device)
    elif per_head:
        d = (x.float().abs().amax(dim=(1, 3)) / FP8_MAX[fp8]).clamp_min(1e-12)
    else:
        d = (x.float().abs().amax() / FP8_MAX[fp8]).clamp_min(1e-12).expand(b, h).contiguous()
    q8 = (x.float() / d[:, None, :, None]).clamp(-FP8_MAX[fp8], FP8_MAX[fp8]).to(fp8)
    return q8, d


def dequantized(x8, d):
    return x8.float() * d[:, None, :, None]


def check(out, ref, pt, atol=1e-3):
    assert not out.isnan().any(), "unwritten or NaN output"
    err = (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0
    pt_err = (pt.float() - ref.float()).abs().max().item() if out.numel() else 0.0
    assert err <= 2 * pt_err + atol, f"max|out-ref|={err:.3e} > 2*{pt_err:.3e} + {atol}"


def reference(q, k, v, **kw):
    """(fp32 reference, same attention in q's dtype) of q over dequantized fp32 k / v."""
    ref, lse = attention_ref(q.float(), k, v, **kw)
    pt, _ = attention_ref(q, k.to(q.dtype), v.to(q.dtype), upcast=False, **kw)
    return ref, lse, pt


@pytest.mark.parametrize("fp8", [E4M3, E5M2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_dense(fp8, dtype, d, causal):
    from flash_attn_4_sm120 import flash_attn_func

    torch.manual_seed(d + causal)
    b, sq, sk, hq, hkv = 2, 77, 301, 8, 2
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    k8, kd = quantize(torch.randn(b, sk, hkv, d, device="cuda") * 3, fp8)
    v8, vd = quantize(torch.randn(b, sk, hkv, d, device="cuda"), fp8)
    out, lse = flash_attn_func(q, k8, v8, causal=causal, k_descale=kd, v_descale=vd, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape
    ref, ref_lse, pt = reference(q, dequantized(k8, kd), dequantized(v8, vd), causal=causal)
    check(out, ref, pt)
    assert (lse - ref_lse).abs().max().item() <= 1e-3


@pytest.mark.parametrize("fp8", [E4M3, E5M2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_widening_exact(fp8, dtype):
    """Every finite FP8 code, subnormals and zeros included, reaches the MMAs as exactly its value: with one key
    per sequence the output is V's row itself."""
    from flash_attn_4_sm120 import flash_attn_func

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8).float()
    codes = torch.where(codes.isfinite(), codes, torch.zeros_like(codes))
    if dtype == torch.float16:
        codes = codes.clamp(-65504, 65504)
    v = codes.view(2, 1, 1, 128).to(fp8).cuda()
    q = torch.randn(2, 3, 2, 128, device="cuda", dtype=dtype)
    k = torch.randn(2, 1, 1, 128, device="cuda").to(fp8)
    out, _ = flash_attn_func(q, k, v)
    assert torch.equal(out.float(), v.float().expand(2, 3, 2, 128))


@pytest.mark.parametrize("scale", [1.0, 2.0 ** -8, 2.0 ** 8])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 1), (32, 8)])
def test_per_tensor_scales(scale, hq, hkv):
    """A per-tensor scale as serving engines pass it: a one-element tensor expanded to (batch, heads_kv)."""
    from flash_attn_4_sm120 import flash_attn_func

    torch.manual_seed(hq)
    b, sq, sk, d = 3, 5, 129, 128
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    k8, kd = quantize(torch.randn(b, sk, hkv, d, device="cuda") * scale, E4M3, scale=scale / 16)
    v8, vd = quantize(torch.randn(b, sk, hkv, d, device="cuda") * scale, E4M3, scale=scale / 16)
    one = torch.tensor([[scale / 16]], device="cuda")
    out, _ = flash_attn_func(q, k8, v8, causal=True, k_descale=one.expand(b, hkv), v_descale=one.expand(b, hkv))
    ref, _, pt = reference(q, dequantized(k8, kd), dequantized(v8, vd), causal=True)
    check(out, ref, pt, atol=1e-3 * scale)


def test_default_scales_and_fp8_q():
    """Without scales FP8 K/V are read at scale 1; a widened FP8 q takes q_descale (per (batch, KV head), joined
    with K's) and the output is bf16."""
    from flash_attn_4_sm120 import flash_attn_func

    torch.manual_seed(1)
    b, sq, sk, hq, hkv, d = 2, 33, 200, 6, 3, 96
    k8, kd = quantize(torch.randn(b, sk, hkv, d, device="cuda"), E4M3)
    v8, vd = quantize(torch.randn(b, sk, hkv, d, device="cuda"), E4M3)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    out, _ = flash_attn_func(q, k8, v8)
    ref, _, pt = reference(q, k8.float(), v8.float())
    check(out, ref, pt)
    # (an e5m2 q beside e4m3 K/V is widened exactly; all-e4m3 calls run the FP8 MMAs: test_fp8_mma_gpu.py)
    q8 = torch.randn(b, sq, hq, d, device="cuda").to(E5M2)
    qd = torch.rand(b, hkv, device="cuda") + 0.5
    out, _ = flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16
    q_deq = q8.float() * qd.repeat_interleave(hq // hkv, dim=1)[:, None, :, None]
    ref, _ = attention_ref(q_deq, dequantized(k8, kd), dequantized(v8, vd))
    pt, _ = attention_ref(q_deq.bfloat16(), dequantized(k8, kd).bfloat16(), dequantized(v8, vd).bfloat16(),
                          upcast=False)
    check(out, ref, pt)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("features", ["plain", "window_softcap_sink"])
def test_paged_decode(page_size, sq, features):
    """Decode and speculative decode (seqlen_q 1-4) over a paged FP8 cache, packed GQA, split-KV automatic, an
    empty sequence among odd lengths."""
    from flash_attn_4_sm120 import flash_attn_varlen_func

    torch.manual_seed(page_size + sq)
    lens = [0, 1, 67, 700, 2049]
    b, hq, hkv, d = len(lens), 16, 4, 128
    max_pages = max(-(-n // page_size) for n in lens)
    num_pages = b * max_pages + 2
    k8, kd_pages = quantize(torch.randn(1, num_pages * page_size, hkv, d, device="cuda"), E4M3)
    v8, _ = quantize(torch.randn(1, num_pages * page_size, hkv, d, device="cuda"), E4M3)
    k_cache, v_cache = k8.view(num_pages, page_size, hkv, d), v8.view(num_pages, page_size, hkv, d)
    table = torch.randperm(num_pages, device="cuda")[:b * max_pages].view(b, max_pages).to(torch.int32)
    kd = torch.rand(b, hkv, device="cuda") * 0.1 + 0.01
    vd = torch.rand(b, hkv, device="cuda") * 0.1 + 0.01
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    kw = dict(causal=True)
    if features != "plain":
        kw.update(window_size=(300, 0), softcap=20.0)
        sink = torch.randn(hq, device="cuda")
    else:
        sink = None
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.full((b, sq, hq, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    res, lse = flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=used, page_table=table, max_seqlen_q=sq,
                                      k_descale=kd, v_descale=vd, learnable_sink=sink, return_lse=True, **kw)
    out.copy_(res)
    for i, n in enumerate(lens):
        rows = torch.tensor([table[i, j // page_size].item() * page_size + j % page_size for j in range(n)],
                            dtype=torch.long, device="cuda")
        kk = k8[0, rows].float()[None] * kd[i][None, None, :, None]
        vv = v8[0, rows].float()[None] * vd[i][None, None, :, None]
        ref, ref_lse, pt = reference(q[i:i + 1], kk, vv, learnable_sink=sink, **kw)
        check(out[i:i + 1], ref, pt)
        finite = ~torch.isneginf(ref_lse[0])
        assert torch.equal(torch.isneginf(lse[i]), ~finite)


@pytest.mark.parametrize("splits", [1, 3])
def test_varlen_packed_kv(splits):
    """Packed (cu_seqlens) Q and FP8 K/V, chunked-prefill lengths, split-KV forced and off."""
    from flash_attn_4_sm120 import flash_attn_varlen_func

    torch.manual_seed(splits)
    lq, lk = [3, 0, 130, 17], [300, 5, 130, 1000]
    hq, hkv, d = 8, 8, 64
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lq), hq, d, device="cuda", dtype=torch.bfloat16)
    k8, kd = quantize(torch.randn(1, sum(lk), hkv, d, device="cuda"), E5M2, per_head=False)
    v8, vd = quantize(torch.randn(1, sum(lk), hkv, d, device="cuda"), E5M2, per_head=False)
    b = len(lq)
    out, _ = flash_attn_varlen_func(q, k8[0], v8[0], cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lq),
                                    max_seqlen_k=max(lk), causal=True, num_splits=splits,
                                    k_descale=kd[:1].expand(b, hkv), v_descale=vd[:1].expand(b, hkv))
    for i in range(b):
        qs, ks = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        ref, _, pt = reference(q[qs][None], k8[:, ks].float() * kd[0, 0], v8[:, ks].float() * vd[0, 0], causal=True)
        check(out[qs][None], ref, pt)


def test_kvcache_decode_and_graph():
    """``flash_attn_with_kvcache`` over a paged FP8 cache with scales; the same step replayed in a CUDA graph gives
    the same bits."""
    from flash_attn_4_sm120 import flash_attn_with_kvcache

    torch.manual_seed(5)
    b, hq, hkv, d, page = 4, 32, 8, 128, 16
    lens = torch.tensor([1000, 1, 0, 513], dtype=torch.int32, device="cuda")
    max_pages = 64
    k8, _ = quantize(torch.randn(1, b * max_pages * page, hkv, d, device="cuda"), E4M3)
    v8, _ = quantize(torch.randn(1, b * max_pages * page, hkv, d, device="cuda"), E4M3)
    k_cache, v_cache = k8.view(-1, page, hkv, d), v8.view(-1, page, hkv, d)
    table = torch.randperm(b * max_pages, device="cuda").view(b, max_pages).to(torch.int32)
    kd, vd = torch.rand(b, hkv, device="cuda") + 0.5, torch.rand(b, hkv, device="cuda") + 0.5
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    args = dict(cache_seqlens=lens, page_table=table, causal=True, k_descale=kd, v_descale=vd)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, **args)
    for i in range(b):
        n = int(lens[i])
        rows = torch.cat([torch.arange(page, device="cuda") + table[i, j] * page for j in range(-(-n // page))])[:n] \
            if n else torch.zeros(0, dtype=torch.long, device="cuda")
        kk = k8[0, rows.long()].float()[None] * kd[i][None, None, :, None]
        vv = v8[0, rows.long()].float()[None] * vd[i][None, None, :, None]
        ref, _, pt = reference(q[i:i + 1], kk, vv, causal=True)
        check(out[i:i + 1], ref, pt)
    static = torch.empty_like(out)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attn_with_kvcache(q, k_cache, v_cache, out=static, **args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flash_attn_with_kvcache(q, k_cache, v_cache, out=static, **args)
    static.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, out)


def test_backward_refused():
    from flash_attn_4_sm120 import flash_attn_func

    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k8, _ = quantize(torch.randn(1, 8, 2, 64, device="cuda"), E4M3)
    with pytest.raises(NotImplementedError, match="FP8"):
        flash_attn_func(q, k8, k8)
    assert math.isfinite(flash_attn_func(q.detach(), k8, k8)[0].float().abs().max().item())


def neox(x, cos, sin, pos):
    """GPT-NeoX rotary of x (batch, n, heads, d) at positions pos (batch, n), cos / sin (seqlen_ro, d / 2)."""
    c, s = cos[pos][:, :, None].float(), sin[pos][:, :, None].float()
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_kvcache_append_into_fp8_cache(paged, rotary, fp8):
    """New bf16 keys / values (rotated first) are quantized into the FP8 cache with their scales (value / scale,
    rounded to nearest), the rest of the cache untouched, and the step attends over the cache as it now is."""
    from flash_attn_4_sm120 import flash_attn_with_kvcache

    torch.manual_seed(7 + paged + 2 * rotary)
    b, hq, hkv, d, n_new, page, cap = 3, 8, 2, 128, 3, 16, 256
    lens = torch.tensor([0, 37, 200], dtype=torch.int32, device="cuda")
    dense8, _ = quantize(torch.randn(b, cap, hkv, d, device="cuda"), fp8, scale=1 / 64)
    dense_v8, _ = quantize(torch.randn(b, cap, hkv, d, device="cuda"), fp8, scale=1 / 64)
    kd = torch.rand(b, hkv, device="cuda") * 0.02 + 0.005
    vd = torch.rand(b, hkv, device="cuda") * 0.02 + 0.005
    kn = torch.randn(b, n_new, hkv, d, device="cuda", dtype=torch.bfloat16)
    vn = torch.randn(b, n_new, hkv, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(b, n_new, hq, d, device="cuda", dtype=torch.bfloat16)
    kw = dict(cache_seqlens=lens, causal=True, k_descale=kd, v_descale=vd)
    if rotary:
        cos, sin = (f(torch.rand(cap, d // 2, device="cuda") * 6).to(torch.bfloat16) for f in (torch.cos, torch.sin))
        kw.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=False)
    if paged:
        table = torch.randperm(b * cap // page, device="cuda").view(b, cap // page).to(torch.int32)
        kc = torch.empty(b * cap // page, page, hkv, d, device="cuda", dtype=fp8)
        vc = torch.empty_like(kc)
        rows = (table.long()[:, :, None] * page + torch.arange(page, device="cuda")).view(b, cap)
        kc.view(-1, hkv, d)[rows] = dense8
        vc.view(-1, hkv, d)[rows] = dense_v8
        kw["page_table"] = table
    else:
        kc, vc = dense8.clone(), dense_v8.clone()
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, **kw)
    k_now = kc.view(-1, hkv, d)[rows] if paged else kc
    v_now = vc.view(-1, hkv, d)[rows] if paged else vc
    pos = lens[:, None].long() + torch.arange(n_new, device="cuda")
    k_rot = neox(kn, cos, sin, pos) if rotary else kn.float()
    for i in range(b):
        n = int(lens[i])
        assert torch.equal(k_now[i, :n].view(torch.uint8), dense8[i, :n].view(torch.uint8))  # untouched
        assert torch.equal(k_now[i, n + n_new:].view(torch.uint8), dense8[i, n + n_new:].view(torch.uint8))
        for got, new, scale in ((k_now[i, n:n + n_new], k_rot[i], kd[i]), (v_now[i, n:n + n_new], vn[i].float(), vd[i])):
            want = (new * (1.0 / scale)[None, :, None]).clamp(-FP8_MAX[fp8], FP8_MAX[fp8]).to(fp8)
            same = got.view(torch.uint8) == want.view(torch.uint8)
            assert same.float().mean().item() >= 0.99  # rounding of new * (1 / scale): ties may differ by a code
            assert ((got.float() - want.float()).abs() <= want.float().abs() * 0.26 + 2 ** -16).all()
        kk = k_now[i:i + 1, :n + n_new].float() * kd[i][None, None, :, None]
        vv = v_now[i:i + 1, :n + n_new].float() * vd[i][None, None, :, None]
        qi = neox(q[i:i + 1], cos, sin, pos[i:i + 1]).bfloat16() if rotary else q[i:i + 1]
        ref, _, pt = reference(qi, kk, vv, causal=True)
        check(out[i:i + 1], ref, pt)


def test_torch_compile_fullgraph():
    """Under ``torch.compile(fullgraph=True)`` FP8 calls are the namespaced FP8 op: the same bits as eager."""
    from flash_attn_4_sm120 import flash_attn_func, flash_attn_varlen_func

    torch.manual_seed(11)
    b, hq, hkv, d, page = 2, 8, 2, 128, 16
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k8, kd = quantize(torch.randn(b, 256, hkv, d, device="cuda"), E4M3)
    v8, vd = quantize(torch.randn(b, 256, hkv, d, device="cuda"), E4M3)
    table = torch.arange(b * 256 // page, device="cuda", dtype=torch.int32).view(b, -1)
    used = torch.tensor([100, 256], dtype=torch.int32, device="cuda")

    def step(q, k8, v8, kd, vd):
        dense, _ = flash_attn_func(q, k8, v8, causal=True, k_descale=kd, v_descale=vd)
        paged, lse = flash_attn_varlen_func(q, k8.view(-1, page, hkv, d), v8.view(-1, page, hkv, d), seqused_k=used,
                                            page_table=table, causal=True, k_descale=kd, v_descale=vd,
                                            return_lse=True)
        return dense, paged, lse

    eager = step(q, k8, v8, kd, vd)
    compiled = torch.compile(step, fullgraph=True)(q, k8, v8, kd, vd)
    for a, c in zip(eager, compiled):
        assert torch.equal(a, c)


def test_low_level_forward_reads_fp8_at_unit_scale():
    """``flash_attn_fwd`` (no descale arguments) reads FP8 K/V at scale 1."""
    from flash_attn_4_sm120 import flash_attn_fwd

    torch.manual_seed(13)
    q = torch.randn(2, 40, 4, 64, device="cuda", dtype=torch.bfloat16)
    k8, v8 = (torch.randn(2, 90, 2, 64, device="cuda").to(E4M3) for _ in range(2))
    out, lse = flash_attn_fwd(q, k8, v8, causal=True)
    ref, ref_lse, pt = reference(q, k8.float(), v8.float(), causal=True)
    check(out, ref, pt)
    assert (lse - ref_lse).abs().max().item() <= 1e-3


def test_kvcache_fp8_dense_cache_rows_and_leftpad():
    """A dense FP8 cache read through ``cache_batch_idx`` and ``cache_leftpad`` (packed rows from per-sequence
    starts), with new keys appended at each sequence's end."""
    from flash_attn_4_sm120 import flash_attn_with_kvcache

    torch.manual_seed(17)
    b, hq, hkv, d, cap, n_new = 3, 8, 4, 128, 128, 2
    kc, _ = quantize(torch.randn(5, cap, hkv, d, device="cuda"), E4M3, scale=1 / 64)
    vc, _ = quantize(torch.randn(5, cap, hkv, d, device="cuda"), E4M3, scale=1 / 64)
    rows = torch.tensor([4, 0, 2], dtype=torch.int32, device="cuda")
    pad = torch.tensor([0, 5, 17], dtype=torch.int32, device="cuda")
    lens = torch.tensor([30, 64, 100], dtype=torch.int32, device="cuda")
    kd, vd = torch.full((b, hkv), 1 / 64, device="cuda"), torch.full((b, hkv), 1 / 64, device="cuda")
    q = torch.randn(b, n_new, hq, d, device="cuda", dtype=torch.bfloat16)
    kn = torch.randn(b, n_new, hkv, d, device="cuda", dtype=torch.bfloat16)
    vn = torch.randn(b, n_new, hkv, d, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, cache_batch_idx=rows, cache_leftpad=pad,
                                  causal=True, k_descale=kd, v_descale=vd)
    for i in range(b):
        r, p, n = int(rows[i]), int(pad[i]), int(lens[i])
        kk = kc[r, p:n + n_new].float()[None] / 64
        vv = vc[r, p:n + n_new].float()[None] / 64
        ref, _, pt = reference(q[i:i + 1], kk, vv, causal=True)
        check(out[i:i + 1], ref, pt)
