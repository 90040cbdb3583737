"""flash_attn_combine (upstream FlashAttention-4's signature) on the GPU, against an fp32 reference merge:
dense and packed layouts (cu_seqlens with an empty sequence and rows past the last one, seqused, one
sequence), 1 to 17 splits, head dims 64/72/128/256, fp32/bf16/fp16 outputs, splits whose LSE is -inf
(weight 0) and rows every split left at -inf (out = 0, lse = -inf), rows no sequence covers (out = 0,
lse = -inf), a preallocated NaN-poisoned out checked written everywhere, return_lse=False, partials
the kernel cannot read in place, large LSE offsets; and a round trip: the keys of an attention split by
hand over flash_attn_func calls and merged equal the fp32 reference over all keys.

Tolerance (the repo's rule): max|out - ref| <= 2 max|pt - ref| + atol, where ref is the merge computed
in fp64 and pt the same merge rounded to the output dtype; lse within 1e-4 + 1e-6 |ref| and -inf exactly
where the reference has it. The round trip compares with the fp32 attention reference instead."""

import math

import pytest
import torch

from reference import attention_ref

pytestmark = pytest.mark.gpu

NEG_INF = -math.inf
ATOL = 1e-4  # fp32 merge with the kernel's ex2/lg2 approximations, |O| <~ 5
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float16, id="fp16")]


def merge_ref(o_part, lse_part):
    """The merge over dim 0 in fp64 (the fp32 reference, and then some): lse = logsumexp_s lse_s,
    O = sum_s exp(lse_s - lse) O_s (0 where every split is -inf)."""
    o_part, lse_part = o_part.double(), lse_part.double()
    lse = torch.logsumexp(lse_part, dim=0)
    w = torch.exp(lse_part - lse.masked_fill(torch.isneginf(lse), 0.0)[None])
    return (w[..., None] * o_part).sum(0), lse


def partials(shape, splits, d, seed, lse_offset=0.0):
    """Random fp32 partials (splits, *shape, d) / (splits, *shape): split 0 saw no key of head 0's rows
    (lse -inf, weight 0) and one row (second position or the only one, last head) has -inf in every split."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    o = torch.randn(splits, *shape, d, device="cuda", generator=g)
    lse = torch.randn(splits, *shape, device="cuda", generator=g) * 3 + lse_offset
    lse[0, ..., 0] = NEG_INF
    lse[(slice(None),) + (0,) * (len(shape) - 2) + (min(1, shape[-2] - 1), -1)] = NEG_INF
    return o, lse


def covered_rows(total, cu_seqlens, seqused):
    """(total,) bool: rows some packed sequence covers (the forward's clamping of the metadata)."""
    covered = torch.zeros(total, dtype=torch.bool)
    for b in range(len(cu_seqlens) - 1):
        start = min(max(cu_seqlens[b], 0), total)
        end = (min(max(cu_seqlens[b + 1], start), total) if seqused is None
               else start + min(max(seqused[b], 0), total - start))
        covered[start:end] = True
    return covered.cuda()


def check(out, lse, ref_o, ref_lse, covered=None):
    """The tolerance rule on out, lse -inf exactly where the reference has it, every element written."""
    torch.cuda.synchronize()
    if covered is not None:  # rows no sequence covers: out = 0, lse = -inf
        ref_o = ref_o.masked_fill(~covered[..., None, None], 0.0)
        ref_lse = ref_lse.masked_fill(~covered[..., None], NEG_INF)
    assert not out.isnan().any(), "out has unwritten (NaN) elements"
    pt_err = (ref_o.to(out.dtype).float() - ref_o).abs().max().item()
    err = (out.float() - ref_o).abs().max().item()
    assert err <= 2 * pt_err + ATOL, (err, pt_err)
    if lse is not None:
        assert not lse.isnan().any(), "lse has unwritten (NaN) elements"
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
        fin = ~torch.isneginf(ref_lse)
        assert ((lse[fin] - ref_lse[fin]).abs() <= 1e-4 + 1e-6 * ref_lse[fin].abs()).all()


@pytest.mark.parametrize("preallocated", [False, True], ids=["alloc", "out="])
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 72, 128, 256, 264, 392, 512], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("splits", [1, 2, 5, 17], ids=lambda s: f"splits{s}")
def test_dense(splits, d, out_dtype, preallocated):
    import flash_attn_4_sm120 as fa

    o, lse = partials((3, 37, 5), splits, d, seed=splits * 1000 + d)
    out = torch.full((3, 37, 5, d), math.nan, dtype=out_dtype, device="cuda") if preallocated else None
    got, got_lse = fa.flash_attn_combine(o, lse, out=out, out_dtype=out_dtype)
    assert got.shape == (3, 37, 5, d) and got.dtype == out_dtype and got_lse.shape == (3, 37, 5)
    assert got_lse.dtype == torch.float32 and got_lse.transpose(1, 2).is_contiguous()  # upstream's layout
    if preallocated:
        assert got is out
    check(got, got_lse, *merge_ref(o, lse))


def test_default_out_dtype_is_the_partials():
    import flash_attn_4_sm120 as fa

    o, lse = partials((2, 19, 3), 3, 128, seed=4)
    assert fa.flash_attn_combine(o, lse)[0].dtype == torch.float32
    got, got_lse = fa.flash_attn_combine(o.bfloat16(), lse)  # bf16 partials: converted, bf16 out
    assert got.dtype == torch.bfloat16
    check(got, got_lse, *merge_ref(o.bfloat16(), lse))


@pytest.mark.parametrize(
    "cu, used",
    [
        pytest.param((0, 50, 50, 113, 120), None, id="cu_seqlens-empty-seq-tail-rows"),
        pytest.param((0, 50, 50, 113, 120), (41, 0, 63, 2), id="cu_seqlens-seqused"),
        pytest.param(None, None, id="one-sequence"),
        pytest.param(None, (77,), id="one-sequence-seqused"),
        pytest.param((0,), None, id="no-sequence"),
    ],
)
@pytest.mark.parametrize("out_dtype", DTYPES[1:])
@pytest.mark.parametrize("splits", [3, 17], ids=lambda s: f"splits{s}")
def test_packed(splits, out_dtype, cu, used):
    import flash_attn_4_sm120 as fa

    o, lse = partials((123, 4), splits, 72, seed=splits)
    out = torch.full((123, 4, 72), math.nan, dtype=out_dtype, device="cuda")
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device="cuda")
    used_t = None if used is None else torch.tensor(used, dtype=torch.int32, device="cuda")
    got, got_lse = fa.flash_attn_combine(o, lse, out=out, cu_seqlens=cu_t, seqused=used_t)
    assert got is out and got_lse.shape == (123, 4) and got_lse.transpose(0, 1).is_contiguous()
    check(out, got_lse, *merge_ref(o, lse), covered_rows(123, cu if cu is not None else (0, 123), used))


@pytest.mark.parametrize("out_dtype", DTYPES)
def test_dense_seqused_poisoned_out_and_no_lse(out_dtype):
    import flash_attn_4_sm120 as fa

    o, lse = partials((3, 40, 2), 4, 128, seed=9)
    used = torch.tensor([40, 0, 17], dtype=torch.int32, device="cuda")
    out = torch.full((3, 40, 2, 128), math.nan, dtype=out_dtype, device="cuda")
    got, none = fa.flash_attn_combine(o, lse, out=out, seqused=used, return_lse=False)
    assert got is out and none is None
    covered = torch.arange(40, device="cuda")[None, :] < used[:, None]
    check(out, None, *merge_ref(o, lse), covered)
    got, got_lse = fa.flash_attn_combine(o, lse, out_dtype=out_dtype, seqused=used)  # allocated: written too
    check(got, got_lse, *merge_ref(o, lse), covered)


def test_rows_all_neg_inf():
    import flash_attn_4_sm120 as fa

    o = torch.randn(5, 2, 33, 3, 64, device="cuda")
    out = torch.full((2, 33, 3, 64), math.nan, dtype=torch.bfloat16, device="cuda")
    _, lse = fa.flash_attn_combine(o, torch.full((5, 2, 33, 3), NEG_INF, device="cuda"), out=out)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_zero_splits():
    import flash_attn_4_sm120 as fa

    out = torch.full((7, 3, 64), math.nan, device="cuda")
    _, lse = fa.flash_attn_combine(torch.empty(0, 7, 3, 64, device="cuda"), torch.empty(0, 7, 3, device="cuda"),
                                   out=out)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("kind", ["lse-transposed-buffer", "decode-seqlen-1", "o-transposed-head-dim",
                                  "o-misaligned", "o-strided-splits"])
def test_partial_layouts(kind):
    """Partials read in place (a transposed (..., heads, seqlen) LSE buffer, decode) or copied first."""
    import flash_attn_4_sm120 as fa

    o, lse = partials((2, 1 if kind == "decode-seqlen-1" else 29, 6), 5, 128, seed=11)
    if kind == "lse-transposed-buffer":
        lse = lse.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif kind == "o-transposed-head-dim":
        o = o.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif kind == "o-misaligned":
        o = torch.cat([torch.zeros(1, device="cuda"), o.flatten()])[1:].view(o.shape)
    elif kind == "o-strided-splits":
        o = torch.cat([o, o], dim=0)[::2]
    out = torch.full(o.shape[1:], math.nan, dtype=torch.float16, device="cuda")
    _, got_lse = fa.flash_attn_combine(o, lse, out=out)
    check(out, got_lse, *merge_ref(o, lse))


def test_large_lse_offsets():
    """LSEs near 700 (exp overflows fp32): the merge subtracts the row max first."""
    import flash_attn_4_sm120 as fa

    o, lse = partials((2, 45, 3), 6, 72, seed=5, lse_offset=700.0)
    got, got_lse = fa.flash_attn_combine(o, lse)
    check(got, got_lse, *merge_ref(o, lse))


@pytest.mark.parametrize(
    "causal, bounds",
    [
        pytest.param(False, (0, 333, 334, 1000), id="full-3-chunks"),
        pytest.param(False, (0, 64, 128, 640, 641, 1000), id="full-5-uneven-chunks"),
        pytest.param(True, (0, 200, 517, 1000), id="causal-3-chunks"),
    ],
)
def test_round_trip_over_split_keys(causal, bounds):
    """The keys split by hand: flash_attn_func per chunk (out, lse (b, h, s)), the outputs stacked in fp32
    and the LSEs transposed to (b, s, h), merged; against the fp32 reference over all keys. Causal chunks
    keep the full problem's diagonal with window_size=(None, seqlen_k - chunk end) (bottom-right
    alignment: key j is visible to query i iff j <= i + seqlen_k - seqlen_q), so the first rows of later
    chunks see no key (lse -inf, weight 0). pt is the same pipeline in bf16 (attention_ref(upcast=False)
    per chunk, merged, rounded to bf16)."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(len(bounds))
    seqlen_k = bounds[-1]
    seqlen_q = seqlen_k if causal else 77
    q = torch.randn(2, seqlen_q, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, seqlen_k, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(2, seqlen_k, 2, 128, dtype=torch.bfloat16, device="cuda")
    outs, lses, pt_outs, pt_lses = [], [], [], []
    for a, b in zip(bounds, bounds[1:]):
        window = (None, seqlen_k - b) if causal else (None, None)
        o, lse = fa.flash_attn_func(q, k[:, a:b], v[:, a:b], window_size=window, return_lse=True)
        outs.append(o.float())
        lses.append(lse.transpose(1, 2))  # (batch, seqlen, heads): upstream's combine layout
        pt_o, pt_lse = attention_ref(q, k[:, a:b], v[:, a:b], window_size=window, upcast=False)
        pt_outs.append(pt_o.float())
        pt_lses.append(pt_lse.transpose(1, 2))
    out, lse = fa.flash_attn_combine(torch.stack(outs), torch.stack(lses), out_dtype=torch.bfloat16)
    assert out.shape == q.shape and lse.shape == (2, seqlen_q, 8)
    ref, ref_lse = attention_ref(q, k, v, causal=causal)
    pt = merge_ref(torch.stack(pt_outs), torch.stack(pt_lses))[0].to(torch.bfloat16)
    torch.cuda.synchronize()
    err = (out.float() - ref.float()).abs().max().item()
    pt_err = (pt.float() - ref.float()).abs().max().item()
    assert err <= 2 * pt_err + 1e-5, (err, pt_err)
    assert not torch.isneginf(lse).any()
    assert (lse.transpose(1, 2) - ref_lse).abs().max().item() <= 1e-3
