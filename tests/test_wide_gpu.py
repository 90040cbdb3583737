"""Head dims past 256 on a GPU (``_kernels/fwd_wide``: the warps of each 16-row block split S's keys and O's columns,
exchanging row maxima and P through shared memory): every output and LSE against the fp32 reference, within twice
the error of the same attention in the input dtype plus atol (``max|out-ref| <= 2*max|pt-ref| + atol``).

Head dims 264-512 (dv != d too), bf16 and fp16, full / causal / window masks, softcap and the learnable sink, GQA
ratios 1-8, odd lengths around the 32-key block, prefill, decode and speculative decode (packed GQA), varlen with an
empty sequence, paged K/V at page sizes 1 / 16 / 64, split-KV with the combine at 512 columns, NaN-poisoned outputs,
the same call twice giving the same bits, and the refusals (backward, FP8, mods); MLA (``qv``) below.
"""

import pytest
import torch

from reference import attention_ref, capture, paged_cache, rotary_tables
from test_fp8_gpu import check
from test_keysplit_gpu import check_lse

pytestmark = pytest.mark.gpu
BF16 = dict(dtype=torch.bfloat16, device="cuda")


def _qkv(b, sq, sk, hq, hkv, d, dv, dtype=torch.bfloat16):
    return (torch.randn(b, sq, hq, d, dtype=dtype, device="cuda"), torch.randn(b, sk, hkv, d, dtype=dtype, device="cuda"),
            torch.randn(b, sk, hkv, dv, dtype=dtype, device="cuda"))


def _check_call(out, lse, q, k, v, **kw):
    ref, ref_lse = attention_ref(q, k, v, **kw)
    pt, _ = attention_ref(q, k, v, upcast=False, **kw)
    check(out, ref, pt)
    if lse is not None:
        check_lse(lse, ref_lse)


@pytest.mark.parametrize("d,dv", [(512, 512), (264, 264), (384, 384), (448, 320), (320, 512), (512, 128)])
@pytest.mark.parametrize("mask", ["full", "causal", "window"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill(d, dv, mask, dtype):
    import flash_attn_4_sm120 as fa

    torch.manual_seed(d + dv)
    q, k, v = _qkv(2, 157, 301, 4, 2, d, dv, dtype)
    kw = dict(causal=mask == "causal", window_size=(90, 20) if mask == "window" else (None, None))
    out = torch.full((2, 157, 4, dv), float("nan"), dtype=dtype, device="cuda")
    res, lse = fa.flash_attn_func(q, k, v, return_lse=True, **kw)
    out.copy_(res)
    _check_call(out, lse, q, k, v, **kw)
    again, _ = fa.flash_attn_func(q, k, v, **kw)
    assert torch.equal(again, res), "the row blocks' exchange is not deterministic"


@pytest.mark.parametrize("hq,hkv,sq", [(8, 1, 1), (16, 2, 1), (8, 8, 1), (8, 2, 4)])
@pytest.mark.parametrize("sk", [1, 31, 33, 4099])
@pytest.mark.parametrize("splits", [1, 5, None])
def test_decode_softcap_sink(hq, hkv, sq, sk, splits):
    """Decode and speculative decode (packed GQA), with softcap and a sink; split-KV merges 512 columns."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(hq + sk)
    q, k, v = _qkv(3, sq, sk, hq, hkv, 512, 512)
    kw = dict(causal=sq > 1, softcap=20.0, learnable_sink=torch.randn(hq, device="cuda"))
    out, lse = fa.flash_attn_func(q, k, v, num_splits=splits, return_lse=True, **kw)
    _check_call(out, lse, q, k, v, **kw)


def test_varlen_with_an_empty_sequence():
    import flash_attn_4_sm120 as fa

    torch.manual_seed(3)
    lq, lk = [5, 0, 64, 33], [40, 9, 700, 0]
    hq, hkv, d = 4, 1, 384
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = _qkv(1, sum(lq), sum(lk), hq, hkv, d, d)
    out = fa.flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lq),
                                    max_seqlen_k=max(lk), causal=True)[0]
    for i in range(len(lq)):
        qs, ks = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if lk[i] == 0:
            assert torch.equal(out[qs], torch.zeros_like(out[qs])), "a sequence without keys gives O = 0"
            continue
        _check_call(out[qs][None], None, q[:, qs], k[:, ks], v[:, ks], causal=True)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("splits", [1, None])
@pytest.mark.parametrize("d,dv", [(512, 512), (320, 512)])
def test_paged_decode(page_size, splits, d, dv):
    """A paged cache (pages shuffled over a pool) with an empty sequence and odd lengths (d512_paged: 32 rows,
    two 16-key stages)."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(page_size + d)
    b, hq, hkv = 4, 16, 2
    lens = [0, 1, 333, 3001]
    kc, vc, table, k, v = paged_cache(b, max(lens), page_size, hkv, d, dv)
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, 2, hq, d, dtype=torch.bfloat16, device="cuda")
    out, _ = fa.flash_attn_varlen_func(q, kc, vc, seqused_k=used, page_table=table, num_splits=splits, causal=True)
    for i, n in enumerate(lens):
        if n == 0:
            assert torch.equal(out[i], torch.zeros_like(out[i])), "a sequence without keys gives O = 0"
            continue
        _check_call(out[i : i + 1], None, q[i : i + 1], k[i : i + 1, :n], v[i : i + 1, :n], causal=True)


@pytest.mark.parametrize("feature", ["fp8", "mask_mod"])
def test_refused_combinations_name_themselves(feature):
    """FP8 and mods past 256 raise NotImplementedError naming the combination (no kernel runs)."""
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120 import flex_examples

    q, k, v = _qkv(2, 1, 64, 8, 2, 512, 512)
    if feature == "fp8":
        call = lambda: fa.flash_attn_func(q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn))  # noqa: E731
    else:
        call = lambda: fa.flash_attn_func(q, k, v, mask_mod=flex_examples.causal().mask_mod)  # noqa: E731
    with pytest.raises(NotImplementedError, match="head_dim > 256 with"):
        call()


def test_backward_refused():
    import flash_attn_4_sm120 as fa

    q, k, v = (t.requires_grad_() for t in _qkv(1, 16, 16, 2, 2, 512, 512))
    with pytest.raises(NotImplementedError, match="head_dim > 256 with backward"):
        fa.flash_attn_func(q, k, v)[0].sum().backward()


# -- MLA: qv beside the rope q; k the rope keys, v the latent (latent.py) -----------------------------------------


def _mla(b, sq, sk, hq, dv=512, dtype=torch.bfloat16):
    """(q rope, qv, k rope, v latent) for one KV head, scaled like absorbed MLA activations."""
    q = torch.randn(b, sq, hq, 64, dtype=dtype, device="cuda")
    qv = torch.randn(b, sq, hq, dv, dtype=dtype, device="cuda")
    k = torch.randn(b, sk, 1, 64, dtype=dtype, device="cuda")
    v = torch.randn(b, sk, 1, dv, dtype=dtype, device="cuda")
    return q, qv, k, v


def _mla_ref(q, qv, k, v, **kw):
    """The 576-wide attention [qv | q] . [v | k] with values v, through the reference (fp32 and the input dtype)."""
    qf, kf = torch.cat([qv, q], -1), torch.cat([v, k], -1)
    kw.setdefault("softmax_scale", qf.shape[-1] ** -0.5)
    ref, lse = attention_ref(qf, kf, v, **kw)
    pt, _ = attention_ref(qf, kf, v, upcast=False, **kw)
    return ref, lse, pt


@pytest.mark.parametrize("hq", [16, 64, 128])
@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 4099), (2, 777), (8, 3001)])
@pytest.mark.parametrize("splits", [1, None])
def test_mla_decode(hq, sq, sk, splits):
    """Decode and speculative decode (causal) with every query head packed over the one latent head."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(hq + sk)
    q, qv, k, v = _mla(2, sq, sk, hq)
    out = torch.full((2, sq, hq, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    res, lse = fa.flash_attn_func(q, k, v, qv=qv, causal=sq > 1, num_splits=splits, return_lse=True)
    out.copy_(res)
    ref, ref_lse, pt = _mla_ref(q, qv, k, v, causal=sq > 1)
    check(out, ref, pt)
    assert lse.shape == (2, sq, hq)  # upstream's layout with qv: heads last
    check_lse(lse.transpose(1, 2), ref_lse)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_mla_paged_decode_with_an_empty_sequence(page_size):
    """A paged latent cache and rope cache sharing one page table (pages shuffled over a pool), odd lengths."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(page_size)
    b, hq = 4, 64
    lens = [0, 1, 500, 2049]
    kc, vc, table, k, v = paged_cache(b, max(lens), page_size, 1, 64, 512, spare=3)
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, 1, hq, 64, dtype=torch.bfloat16, device="cuda")
    qv = torch.randn(b, 1, hq, 512, dtype=torch.bfloat16, device="cuda")
    out, _ = fa.flash_attn_varlen_func(q, kc, vc, qv=qv, seqused_k=used, page_table=table)
    for i, n in enumerate(lens):
        if n == 0:
            assert torch.equal(out[i], torch.zeros_like(out[i])), "a sequence without keys gives O = 0"
            continue
        ref, _, pt = _mla_ref(q[i : i + 1], qv[i : i + 1], k[i : i + 1, :n], v[i : i + 1, :n])
        check(out[i : i + 1], ref, pt)


def test_mla_kvcache_step_replays_from_a_cuda_graph():
    """A serving step (append the rope key and latent row, rotate, attend with qv over paged caches) captured in a
    CUDA graph: each replay appends at the new lengths and gives the eager step's bits."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(11)
    b, hq, page = 3, 128, 16
    kc, vc, table, _, _ = paged_cache(b, 400, page, 1, 64, 512)
    cos, sin = rotary_tables(512, 64, torch.bfloat16)
    lens = torch.tensor([5, 200, 399 - 16], dtype=torch.int32, device="cuda")
    q, qv = torch.randn(b, 1, hq, 64, **BF16), torch.randn(b, 1, hq, 512, **BF16)
    k, v = torch.randn(b, 1, 1, 64, **BF16), torch.randn(b, 1, 1, 512, **BF16)

    def step(k_cache, v_cache):
        return fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens=lens, page_table=table,
                                          qv=qv, causal=True, return_softmax_lse=True)

    graph, (out, lse) = capture(lambda: step(kc, vc))
    eager_k, eager_v = kc.clone(), vc.clone()  # the warm-up steps' appends included
    for _ in range(3):
        lens += 1
        graph.replay()
        ref_out, ref_lse = step(eager_k, eager_v)
        torch.cuda.synchronize()
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
        assert torch.equal(kc, eager_k) and torch.equal(vc, eager_v)


def test_mla_varlen_prefill_causal_and_scale():
    """Packed sequences (chunked prefill lengths), causal, an explicit softmax scale, fp16."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(11)
    lq, lk = [7, 130, 1], [300, 130, 64]
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, qv, k, v = _mla(1, sum(lq), sum(lk), 16, dtype=torch.float16)
    out, lse = fa.flash_attn_varlen_func(q[0], k[0], v[0], qv=qv[0], cu_seqlens_q=cq, cu_seqlens_k=ck,
                                         max_seqlen_q=max(lq), max_seqlen_k=max(lk), causal=True, softmax_scale=0.05,
                                         return_lse=True)
    assert lse.shape == (sum(lq), 16)  # upstream's layout with qv: (total_q, heads)
    for i in range(len(lq)):
        qs, ks = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        ref, ref_lse, pt = _mla_ref(q[:, qs], qv[:, qs], k[:, ks], v[:, ks], causal=True, softmax_scale=0.05)
        check(out[qs][None], ref, pt)
        check_lse(lse[qs].T[None], ref_lse)


def test_mla_refusals():
    import flash_attn_4_sm120 as fa

    q, qv, k, v = _mla(1, 1, 64, 16)
    with pytest.raises(ValueError, match="qv must have shape"):
        fa.flash_attn_func(q, k, v, qv=qv[..., :256])
    with pytest.raises(NotImplementedError, match="head_dim > 256 with backward"):
        fa.flash_attn_func(q, k, v, qv=qv.requires_grad_())
