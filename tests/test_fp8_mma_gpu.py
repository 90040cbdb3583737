"""All-FP8 attention on a GPU: q, k, v e4m3 run both GEMMs as FP8 MMAs with P rounded to e4m3
(``_kernels/fwd_fp8_mma``), FlashAttention-3's scheme. Every output is checked against the fp32 reference on the
dequantized inputs (``x.float() * x_descale``), within twice the error of a torch emulation of the same pipeline
plus atol: fp32 scores, P = exp(s - row max) rounded to e4m3, O = P V / (sum of the unrounded P [+ sink]), in bf16
(``emulation``). The kernel's P differs from the emulation's by the online softmax's reference max (P <= 256 there,
<= 1 here): the same relative rounding of e4m3 on the normal range.

Covers head dims 40-256 (dv != d too), full / causal / window masks, softcap + sink, GQA ratios 1-8, odd lengths,
per-head and per-tensor scales (2^-8, 1, 2^8), dense, packed (varlen, split-KV) and paged K/V at page sizes 1 / 16 /
64 with empty sequences (decode and speculative decode, packed GQA), NaN-poisoned outputs, torch.compile
fullgraph, and the widening rule: an e5m2 q (P stays 16-bit) is exact to within the bf16 rule.
"""

import math

import pytest
import torch

from reference import attention_ref, visible
from test_fp8_gpu import E4M3, E5M2, check, dequantized, quantize

pytestmark = pytest.mark.gpu


def emulation(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0, learnable_sink=None):
    """The FP8 MMA pipeline in torch on dequantized fp32 q (b, sq, hq, d), k / v (b, sk, hkv, d): see the module
    docstring. Rows that see no key (and no sink) give 0."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(hq // hkv, dim=2), v.repeat_interleave(hq // hkv, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible(sq, sk, causal, window_size, q.device), float("-inf"))
    m = s.amax(dim=-1, keepdim=True) if sk else s.new_full((b, hq, sq, 1), float("-inf"))
    if learnable_sink is not None:
        m = torch.maximum(m, learnable_sink.float().view(1, hq, 1, 1))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    denom = p.sum(dim=-1)
    if learnable_sink is not None:
        denom = denom + torch.exp(learnable_sink.float().view(1, hq, 1) - m[..., 0])
    p8 = p.to(E4M3).float()
    out = torch.einsum("bhqk,bkhd->bqhd", p8, v) / denom.clamp_min(1e-30).transpose(1, 2)[..., None]
    return out.bfloat16()


def inputs(b, sq, sk, hq, hkv, d, dv=None, per_head=True):
    """(q8, qd, k8, kd, v8, vd): e4m3 tensors with their descales, each (batch, KV head) as FlashAttention-3 takes
    them (q's shared by the query heads of a KV group)."""
    dv = dv or d
    q = torch.randn(b, sq, hq, d, device="cuda")
    q8, qd = quantize(q.view(b, sq, hkv, hq // hkv * d), E4M3, per_head)
    k8, kd = quantize(torch.randn(b, sk, hkv, d, device="cuda") * 3, E4M3, per_head)
    v8, vd = quantize(torch.randn(b, sk, hkv, dv, device="cuda"), E4M3, per_head)
    return q8.view(b, sq, hq, d), qd, k8, kd, v8, vd


def q_dequantized(q8, qd):
    return q8.float() * qd.repeat_interleave(q8.shape[2] // qd.shape[1], dim=1)[:, None, :, None]


def check_fp8(out, q, k, v, atol=2e-3, **kw):
    """``out`` against the fp32 reference with the emulation's error as the baseline (``check``)."""
    ref, lse = attention_ref(q, k, v, **kw)
    check(out, ref, emulation(q, k, v, **kw), atol=atol)
    return lse


@pytest.mark.parametrize("d,dv", [(64, 64), (48, 48), (96, 96), (128, 128), (112, 112), (128, 64), (192, 192),
                                  (176, 176), (256, 256), (208, 208)])
@pytest.mark.parametrize("mask", ["full", "causal", "local"])
def test_dense(d, dv, mask):
    from flash_attn_4_sm120 import flash_attn_func

    torch.manual_seed(d + dv)
    b, sq, sk, hq, hkv = 2, 77, 301, 8, 2
    q8, qd, k8, kd, v8, vd = inputs(b, sq, sk, hq, hkv, d, dv)
    kw = dict(causal=mask == "causal", window_size=(90, 17) if mask == "local" else (None, None))
    out, lse = flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True, **kw)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, dv)
    ref_lse = check_fp8(out, q_dequantized(q8, qd), dequantized(k8, kd), dequantized(v8, vd), **kw)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= 1e-3


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 1), (32, 8)])
@pytest.mark.parametrize("scale", [1.0, 2.0 ** -8, 2.0 ** 8])
def test_per_tensor_scales_softcap_sink(hq, hkv, scale):
    """Per-tensor scales (one element expanded to (batch, heads_kv)), GQA 1-8, softcap and a learnable sink."""
    from flash_attn_4_sm120 import flash_attn_func

    torch.manual_seed(hq + int(math.log2(scale)))
    b, sq, sk, d = 3, 129, 257, 128
    q8, qd, k8, kd, v8, vd = inputs(b, sq, sk, hq, hkv, d, per_head=False)
    one = {name: torch.tensor([[x[0, 0].item() * scale]], device="cuda").expand(b, hkv) for name, x in
           (("q", qd), ("k", kd), ("v", vd))}
    sink = torch.randn(hq, device="cuda")
    kw = dict(causal=True, softcap=15.0, learnable_sink=sink)
    out, _ = flash_attn_func(q8, k8, v8, q_descale=one["q"], k_descale=one["k"], v_descale=one["v"], **kw)
    check_fp8(out, q_dequantized(q8, one["q"]), dequantized(k8, one["k"]), dequantized(v8, one["v"]),
              atol=2e-3 * scale, **kw)


@pytest.mark.parametrize("splits", [1, 3])
def test_varlen_packed(splits):
    """Packed q and K/V (chunked-prefill lengths, an empty sequence), split-KV forced and off, into a NaN-poisoned
    output."""
    from flash_attn_4_sm120 import flash_attn_varlen_func

    torch.manual_seed(splits)
    lq, lk = [3, 0, 130, 17, 64], [300, 5, 130, 1000, 0]
    hq, hkv, d = 8, 2, 128
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q8, qd, k8, kd, v8, vd = inputs(1, sum(lq), sum(lk), hq, hkv, d, per_head=False)
    b = len(lq)
    ex = {name: x[:1].expand(b, hkv) for name, x in (("q", qd), ("k", kd), ("v", vd))}
    out = torch.full((sum(lq), hq, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    res, _ = flash_attn_varlen_func(q8[0], k8[0], v8[0], cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lq),
                                    max_seqlen_k=max(lk), causal=True, num_splits=splits, q_descale=ex["q"],
                                    k_descale=ex["k"], v_descale=ex["v"])
    out.copy_(res)
    for i in range(b):
        qs, ks = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        check_fp8(out[qs][None], q8[:, qs].float() * qd[0, 0], k8[:, ks].float() * kd[0, 0],
                  v8[:, ks].float() * vd[0, 0], causal=True)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("pack_gqa", [None, False])
def test_paged_decode(page_size, sq, pack_gqa):
    """Decode and speculative decode over a paged e4m3 cache (split-KV automatic), an empty sequence among odd
    lengths, per (batch, KV head) scales. Packed (automatic), the rows fit the FP8 K/V decode tile, which runs them
    with q widened (``fp8.decode_widened``); unpacked, they run the FP8 MMAs."""
    from flash_attn_4_sm120 import flash_attn_varlen_func

    torch.manual_seed(page_size + sq)
    lens = [0, 1, 67, 700, 2049]
    b, hq, hkv, d = len(lens), 16, 4, 128
    max_pages = max(-(-n // page_size) for n in lens)
    num_pages = b * max_pages + 2
    k8, _ = quantize(torch.randn(1, num_pages * page_size, hkv, d, device="cuda"), E4M3)
    v8, _ = quantize(torch.randn(1, num_pages * page_size, hkv, d, device="cuda"), E4M3)
    k_cache, v_cache = k8.view(num_pages, page_size, hkv, d), v8.view(num_pages, page_size, hkv, d)
    table = torch.randperm(num_pages, device="cuda")[:b * max_pages].view(b, max_pages).to(torch.int32)
    qd, kd, vd = (torch.rand(b, hkv, device="cuda") * 0.1 + 0.01 for _ in range(3))
    q8 = torch.randn(b, sq, hq, d, device="cuda").mul(30).clamp(-448, 448).to(E4M3)
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_varlen_func(q8, k_cache, v_cache, seqused_k=used, page_table=table, max_seqlen_q=sq,
                                      causal=True, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True,
                                      pack_gqa=pack_gqa)
    for i, n in enumerate(lens):
        rows = torch.tensor([table[i, j // page_size].item() * page_size + j % page_size for j in range(n)],
                            dtype=torch.long, device="cuda")
        kk = k8[0, rows].float()[None] * kd[i][None, None, :, None]
        vv = v8[0, rows].float()[None] * vd[i][None, None, :, None]
        ref_lse = check_fp8(out[i:i + 1], q_dequantized(q8[i:i + 1], qd[i:i + 1]), kk, vv, causal=True)
        assert torch.equal(torch.isneginf(lse[i]), torch.isneginf(ref_lse[0]))


def test_e5m2_q_widened_exactly():
    """The FP8 MMAs take e4m3 only: an e5m2 q (beside e5m2 K/V) is widened to bf16 exactly and P stays 16-bit, so
    the bf16 rule holds (``check`` against the same attention in bf16)."""
    from flash_attn_4_sm120 import flash_attn_func

    torch.manual_seed(5)
    b, sq, sk, hq, hkv, d = 2, 33, 200, 6, 3, 96
    q8 = torch.randn(b, sq, hq, d, device="cuda").to(E5M2)
    k8, kd = quantize(torch.randn(b, sk, hkv, d, device="cuda"), E5M2)
    v8, vd = quantize(torch.randn(b, sk, hkv, d, device="cuda"), E5M2)
    out, _ = flash_attn_func(q8, k8, v8, k_descale=kd, v_descale=vd)
    ref, _ = attention_ref(q8.float(), dequantized(k8, kd), dequantized(v8, vd))
    pt, _ = attention_ref(q8.bfloat16(), dequantized(k8, kd).bfloat16(), dequantized(v8, vd).bfloat16(), upcast=False)
    check(out, ref, pt)


def test_torch_compile_fullgraph():
    """Under ``torch.compile(fullgraph=True)`` an all-FP8 call is the namespaced FP8 op: the same bits as eager."""
    from flash_attn_4_sm120 import flash_attn_func

    torch.manual_seed(17)
    q8, qd, k8, kd, v8, vd = inputs(2, 100, 300, 8, 2, 128)

    def step(q8, k8, v8, qd, kd, vd):
        return flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True)

    eager = step(q8, k8, v8, qd, kd, vd)
    compiled = torch.compile(step, fullgraph=True)(q8, k8, v8, qd, kd, vd)
    for a, c in zip(eager, compiled):
        assert torch.equal(a, c)
