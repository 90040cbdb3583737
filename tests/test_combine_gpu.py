"""The public flash_attn_combine (upstream FlashAttention-4's signature) on the GPU: against an fp32
reference merge, dense and packed layouts (cu_seqlens with an empty sequence, seqused), splits whose
LSE is -inf (weight 0) and rows every split left at -inf (out = 0, lse = -inf), fp32 / bf16 / fp16
outputs, a preallocated out, and a round trip: keys split by hand over flash_attn_func calls and
merged equal one call over all keys."""

import pytest
import torch

from reference import attention_ref

pytestmark = pytest.mark.gpu


def _merge_ref(o_part, lse_part):
    """fp32 reference: lse = logsumexp_s lse_s, O = sum_s exp(lse_s - lse) O_s (0 where every split is -inf)."""
    lse = torch.logsumexp(lse_part, dim=0)
    w = torch.exp(lse_part - lse.masked_fill(torch.isneginf(lse), 0.0)[None])
    w = w.masked_fill(torch.isneginf(lse_part), 0.0)
    return (w[..., None] * o_part).sum(0), lse


def _partials(shape, splits, d, seed):
    torch.manual_seed(seed)
    o = torch.randn(splits, *shape, d, device="cuda")
    lse = torch.randn(splits, *shape, device="cuda") * 3
    lse[0, ..., 0] = -float("inf")  # split 0 saw no key of head 0's rows: weight 0
    lse[:, ..., -1][(slice(None),) + (0,) * (len(shape) - 1)] = -float("inf")  # a row all splits left at -inf
    return o, lse


def _check(out, lse, ref_o, ref_lse, dtype):
    atol = 1e-5 if dtype == torch.float32 else (2e-2 if dtype == torch.bfloat16 else 4e-3)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out.float() - ref_o).abs().max().item() <= atol * max(1.0, ref_o.abs().max().item())
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    fin = ~torch.isneginf(ref_lse)
    assert (lse[fin] - ref_lse[fin]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 72, 128, 256])
@pytest.mark.parametrize("splits", [1, 2, 5, 17])
def test_dense(splits, d, dtype):
    import flash_attn_4_sm120 as fa

    o, lse = _partials((2, 37, 3), splits, d, seed=splits * d)
    out, got_lse = fa.flash_attn_combine(o, lse, out_dtype=dtype)
    assert out.shape == (2, 37, 3, d) and out.dtype == dtype and got_lse.shape == (2, 37, 3)
    _check(out, got_lse, *_merge_ref(o, lse), dtype)


@pytest.mark.parametrize("with_cu", [True, False], ids=["cu_seqlens", "one-sequence"])
@pytest.mark.parametrize("splits", [2, 7])
def test_packed(splits, with_cu):
    import flash_attn_4_sm120 as fa

    o, lse = _partials((120, 4), splits, 128, seed=splits)
    cu = torch.tensor([0, 50, 50, 120], dtype=torch.int32, device="cuda") if with_cu else None
    out, got_lse = fa.flash_attn_combine(o, lse, out_dtype=torch.bfloat16, cu_seqlens=cu)
    assert out.shape == (120, 4, 128) and got_lse.shape == (120, 4)
    _check(out, got_lse, *_merge_ref(o, lse), torch.bfloat16)


def test_seqused_preallocated_out_and_no_lse():
    import flash_attn_4_sm120 as fa

    o, lse = _partials((3, 40, 2), 4, 128, seed=9)
    used = torch.tensor([40, 0, 17], dtype=torch.int32, device="cuda")
    out = torch.full((3, 40, 2, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    got, none = fa.flash_attn_combine(o, lse, out=out, out_dtype=torch.bfloat16, seqused=used, return_lse=False)
    assert got is out and none is None
    ref_o, _ = _merge_ref(o, lse)
    for b, n in enumerate(used.tolist()):
        if n:
            assert (out[b, :n].float() - ref_o[b, :n]).abs().max().item() <= 2e-2 * ref_o.abs().max().item()
    _, lse_used = fa.flash_attn_combine(o, lse, out_dtype=torch.bfloat16, seqused=used)
    assert torch.isneginf(lse_used[1]).all() and torch.isneginf(lse_used[2, 17:]).all()


@pytest.mark.parametrize("chunks", [2, 3])
def test_round_trip_over_split_keys(chunks):
    """Keys split by hand: flash_attn_func per chunk (out, lse), merged, equals the fp32 reference over all keys."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(chunks)
    q = torch.randn(2, 77, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 1000, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(2, 1000, 2, 128, dtype=torch.bfloat16, device="cuda")
    bounds = torch.linspace(0, 1000, chunks + 1).long().tolist()
    outs, lses = [], []
    for a, b in zip(bounds, bounds[1:]):
        o, l = fa.flash_attn_func(q, k[:, a:b], v[:, a:b], return_lse=True, softmax_scale=128 ** -0.5)
        outs.append(o.float())
        lses.append(l.transpose(1, 2))  # (batch, seqlen, heads), upstream's combine layout
    out, lse = fa.flash_attn_combine(torch.stack(outs), torch.stack(lses), out_dtype=torch.bfloat16)
    ref, ref_lse = attention_ref(q, k, v)
    pt, _ = attention_ref(q, k, v, upcast=False)
    err = (out.float() - ref.float()).abs().max().item()
    pt_err = (pt.float() - ref.float()).abs().max().item()
    assert err <= 2 * pt_err + 1e-5, (err, pt_err)
    assert (lse.transpose(1, 2) - ref_lse).abs().max().item() <= 1e-3
