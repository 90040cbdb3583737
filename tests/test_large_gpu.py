"""Tensors with more than 2^31 elements (run on the device; skipped without CUDA or without the memory).

Every global offset that can pass 2^31 elements must be 64-bit: a decode over 2M keys (K/V over
2^31 elements, dense and packed), a prefill whose Q/O pass 2^31 elements, split-KV partials over
2^31 elements and their combine. Checked against the fp32 reference on the rows with the largest
offsets (the last ones), NaN-poisoned outputs included."""

import pytest
import torch

from reference import attention_ref

pytestmark = pytest.mark.gpu

BIG = 2**31


def _need(gib: float):
    if not torch.cuda.is_available() or torch.cuda.mem_get_info()[0] < gib * 2**30:
        pytest.skip(f"needs {gib} GiB of free GPU memory")


def _ref_per_head(q, k, v, upcast):
    """attention_ref's operation order one query head at a time (no (sk, hq, d) repeat of 2M keys)."""
    hq, hkv, scale = q.shape[2], k.shape[2], q.shape[-1] ** -0.5
    outs, lses = [], []
    for h in range(hq):
        qq, kk, vv = q[0, :, h], k[0, :, h // (hq // hkv)], v[0, :, h // (hq // hkv)]
        if upcast:
            qq, kk, vv = qq.float(), kk.float(), vv.float()
        s = ((qq * scale) @ kk.T).float()
        lse = torch.logsumexp(s, dim=-1)
        outs.append((torch.exp(s - lse[:, None]).to(vv.dtype) @ vv).to(q.dtype))
        lses.append(lse)
    return torch.stack(outs, dim=1)[None], torch.stack(lses)[None]


def _check_rows(out, lse, q, k, v, rows):
    """Reference on query rows ``rows`` of batch 0 only (all keys)."""
    if k.shape[1] > 100_000:
        ref, ref_lse = _ref_per_head(q[:1, rows], k[:1], v[:1], True)
        pt, _ = _ref_per_head(q[:1, rows], k[:1], v[:1], False)
    else:
        ref, ref_lse = attention_ref(q[:1, rows], k[:1], v[:1])
        pt, _ = attention_ref(q[:1, rows], k[:1], v[:1], upcast=False)
    got = out[:1, rows]
    assert not got.isnan().any() and not lse[:1, :, rows].isnan().any()
    err = (got.float() - ref.float()).abs().max().item()
    pt_err = (pt.float() - ref.float()).abs().max().item()
    assert err <= 2 * pt_err + 1e-5, f"max|out-ref|={err:.3e} > 2*{pt_err:.3e}"
    # 1e-3 as elsewhere, widened past 100k keys: one CTA sums 2M probabilities sequentially in fp32
    # (measured 1.9e-3 at 2M keys unsplit on the H100, 2026-11-24; the output passes the 2x rule)
    lse_tol = 1e-3 if k.shape[1] <= 100_000 else 5e-3
    assert (lse[:1, :, rows] - ref_lse).abs().max().item() <= lse_tol


@pytest.mark.parametrize("num_splits", [None, 1, 8], ids=["auto", "whole", "split8"])
@pytest.mark.parametrize("layout", ["dense", "packed"])
def test_decode_over_kv_past_2_31_elements(layout, num_splits):
    import flash_attn_4_sm120 as fa

    _need(12)
    sk, hkv, d = 2_097_216, 8, 128  # 2,147,549,184 elements per K/V tensor
    assert sk * hkv * d > BIG
    torch.manual_seed(0)
    q = torch.randn(1, 1, 64, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(1, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    if layout == "dense":
        out, lse = fa.flash_attn_func(q, k, v, num_splits=num_splits, return_lse=True)
    else:
        cu = torch.tensor([0, sk], dtype=torch.int32, device="cuda")
        out, lse = fa.flash_attn_varlen_func(q, k[0], v[0], cu_seqlens_q=None, cu_seqlens_k=cu, max_seqlen_q=1,
                                             max_seqlen_k=sk, num_splits=num_splits, return_lse=True)
    torch.cuda.synchronize()
    _check_rows(out, lse, q, k, v, slice(0, 1))
    del k, v


@pytest.mark.parametrize("num_splits", [1, 2], ids=["whole", "split2"])
def test_prefill_with_q_and_o_past_2_31_elements(num_splits):
    """Q/O of 2^31+ elements (split2: fp32 partials of twice that, and the combine reading them)."""
    import flash_attn_4_sm120 as fa

    _need(30 if num_splits > 1 else 14)
    sq, hq, d = 262_176, 64, 128
    assert sq * hq * d > BIG
    torch.manual_seed(1)
    q = torch.randn(1, sq, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1, 300, 8, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(1, 300, 8, d, dtype=torch.bfloat16, device="cuda")
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, hq, sq), float("nan"), device="cuda")
    fa.flash_attn_fwd(q, k, v, out=out, lse=lse, num_splits=num_splits)
    torch.cuda.synchronize()
    _check_rows(out, lse, q, k, v, slice(sq - 40, sq))
