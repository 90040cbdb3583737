"""Head dims past 256 on a GPU (``_kernels/fwd_wide``: the warps of each 16-row block split S's keys and O's columns,
exchanging row maxima and P through shared memory): every output and LSE against the fp32 reference, within twice
the error of the same attention in the input dtype plus atol (``max|out-ref| <= 2*max|pt-ref| + atol``).

Head dims 264-512 (dv != d too), bf16 and fp16, full / causal / window masks, softcap and the learnable sink, GQA
ratios 1-8, odd lengths around the 32-key block, prefill, decode and speculative decode (packed GQA), varlen with an
empty sequence, split-KV with the combine at 512 columns, NaN-poisoned outputs, the same call twice giving the same
bits, and the refusals (backward, paged K/V, FP8, mods).
"""

import pytest
import torch

from reference import attention_ref
from test_fp8_gpu import check
from test_keysplit_gpu import check_lse

pytestmark = pytest.mark.gpu


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


@pytest.mark.parametrize("feature", ["paged", "fp8", "mask_mod"])
def test_refused_combinations_name_themselves(feature):
    """Paged K/V, FP8 and mods past 256 raise NotImplementedError naming the combination (no kernel runs)."""
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120 import flex_examples

    q, k, v = _qkv(2, 1, 64, 8, 2, 512, 512)
    if feature == "paged":
        table = torch.arange(8, device="cuda", dtype=torch.int32).view(2, 4)
        call = lambda: fa.flash_attn_varlen_func(q, k.view(8, 16, 2, 512), v.view(8, 16, 2, 512),  # noqa: E731
                                                 seqused_k=torch.full((2,), 64, dtype=torch.int32, device="cuda"),
                                                 page_table=table)
    elif feature == "fp8":
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
