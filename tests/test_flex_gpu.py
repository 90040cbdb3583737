"""score_mod / mask_mod in the forward on a GPU, against an fp32 FlexAttention-style reference
(scores materialised, the example's torch twin applied elementwise): every gate example, d64 / d128, GQA,
decode-length queries (packed GQA), varlen sequence by sequence. Runs the mods path (``interface._flex_call``,
what flash_attn_func calls once the manifest lists score_mod as implemented)."""

import pytest
import torch

from flash_attn_4_sm120 import flex_examples, interface
from reference import masked_attention_ref

pytestmark = pytest.mark.gpu

EXAMPLES = {ex.name: ex for ex in flex_examples.gate_examples()}


def flex_ref(q, k, v, ex, upcast=True, causal=False, sink=None):
    """(out (b, sq, hq, dv), lse (b, hq, sq)) of q/k/v with example ``ex`` (plus the causal flag's mask and a
    learnable sink's logit in the denominator); fp32 or the input dtype."""
    (b, sq, hq, _), sk, dev = q.shape, k.shape[1], q.device
    bi, hi = torch.arange(b, device=dev).view(-1, 1, 1, 1), torch.arange(hq, device=dev).view(1, -1, 1, 1)
    qi, ki = torch.arange(sq, device=dev).view(1, 1, -1, 1), torch.arange(sk, device=dev).view(1, 1, 1, -1)
    keep = ex.torch_mask(bi, hi, qi, ki, sq, sk) if ex.torch_mask is not None else None
    if causal:
        keep = (ki <= qi + (sk - sq)) & (keep if keep is not None else True)

    def score_fn(scores, bi, hi, qi, ki):
        return ex.torch_score(scores, bi, hi, qi, ki, sq, sk)

    return masked_attention_ref(q, k, v, keep, upcast, score_fn if ex.torch_score is not None else None, sink)


def run_mods(q, k, v, ex, varlen=None):
    return interface._flex_call(q, k, v, varlen, dict(score_mod=ex.score_mod, mask_mod=ex.mask_mod),
                                softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
                                softcap=0.0, num_splits=None, pack_gqa=None, deterministic=False, return_lse=True)


def check(out, lse, q, k, v, ex, **ref_kw):
    ref, lse_ref = flex_ref(q, k, v, ex, **ref_kw)
    pt, _ = flex_ref(q, k, v, ex, upcast=False, **ref_kw)
    assert not out.isnan().any() and not lse.isnan().any()
    err = (out.float() - ref.float()).abs().max().item()
    pt_err = (pt.float() - ref.float()).abs().max().item()
    assert err <= 2 * pt_err + 1e-5, f"max|out-ref|={err:.3e} > 2*{pt_err:.3e}"
    neg = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), neg)
    assert (lse[~neg] - lse_ref[~neg]).abs().max().item() < 1e-3


@pytest.mark.parametrize("name", list(EXAMPLES))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("shape", [(2, 333, 517, 8, 2), (1, 300, 300, 4, 4), (4, 3, 1000, 16, 2)],
                         ids=["gqa", "mha-square", "decode"])
def test_mods_match_reference(name, head_dim, shape):
    torch.manual_seed(0)
    b, sq, sk, hq, hkv = shape
    q = torch.randn(b, sq, hq, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    out, lse = run_mods(q, k, v, EXAMPLES[name])
    check(out, lse, q, k, v, EXAMPLES[name])


@pytest.mark.parametrize("name", ["alibi8+causal", "chunked128", "alibi8"])
def test_mods_varlen_per_sequence(name):
    """Indices are positions within each sequence: every sequence of a packed batch equals its dense call."""
    torch.manual_seed(1)
    ex = EXAMPLES[name]
    lens_q, lens_k = [100, 0, 257, 33], [120, 5, 300, 33]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(sum(lens_k), 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(sum(lens_k), 2, 128, dtype=torch.bfloat16, device="cuda")
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
                  seqused_q=None, seqused_k=None, page_table=None, check_metadata=None)
    out, lse = run_mods(q, k, v, ex, varlen)
    for i in range(len(lens_q)):
        if lens_q[i] == 0:
            continue
        rows, keys = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        check(out[rows][None], lse[:, rows][None], q[rows][None], k[keys][None], v[keys][None], ex)


def test_mods_with_no_mod_equal_the_plain_kernel():
    """A mask_mod that keeps everything gives the plain (unmasked) result."""
    torch.manual_seed(2)
    q = torch.randn(2, 200, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 300, 2, 128, dtype=torch.bfloat16, device="cuda")
    keep_all = flex_examples.Example("all", mask_mod=lambda b, h, q_idx, kv_idx, s, aux: kv_idx >= 0,
                                     torch_mask=lambda b, h, q, kk, sq, sk: kk >= 0)
    out, lse = run_mods(q, k, k, keep_all)
    import flash_attn_4_sm120 as fa
    plain, plain_lse = fa.flash_attn_func(q, k, k, return_lse=True)
    assert (out.float() - plain.float()).abs().max().item() < 2e-2
    assert (lse - plain_lse).abs().max().item() < 1e-3


def flex_grads_ref(q, k, v, dout, ex, upcast=True):
    qs, ks, vs = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, _ = flex_ref(qs, ks, vs, ex, upcast)
    return torch.autograd.grad(out.float() if upcast else out, (qs, ks, vs), dout.float() if upcast else dout)


@pytest.mark.parametrize("name", list(EXAMPLES))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_mods_backward_match_reference(name, head_dim):
    """dQ, dK, dV through score_mod (its score_mod_bwd) and mask_mod against autograd of the fp32 reference,
    with the 2x rule (pt: the same in bf16)."""
    torch.manual_seed(3)
    ex = EXAMPLES[name]
    q = torch.randn(2, 211, 8, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(2, 333, 2, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(2, 333, 2, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dout = torch.randn(2, 211, 8, head_dim, dtype=torch.bfloat16, device="cuda")
    mods = dict(score_mod=ex.score_mod, mask_mod=ex.mask_mod, score_mod_bwd=ex.score_mod_bwd)
    out, _ = interface._flex_call(q, k, v, None, mods, softmax_scale=None, causal=False, window_size=(None, None),
                                  learnable_sink=None, softcap=0.0, num_splits=None, pack_gqa=None,
                                  deterministic=False, return_lse=False)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = flex_grads_ref(q, k, v, dout, ex)
    pt = flex_grads_ref(q, k, v, dout, ex, upcast=False)
    for n, g, r, p in zip("qkv", got, ref, pt):
        assert not g.isnan().any(), f"d{n} has NaN"
        err, pt_err = (g.float() - r).abs().max().item(), (p.float() - r).abs().max().item()
        assert err <= 2 * pt_err + 1e-4, f"d{n}: max|g-ref|={err:.3e} > 2*{pt_err:.3e}"


def test_score_mod_gradient_needs_score_mod_bwd():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    with pytest.raises(ValueError, match="score_mod_bwd"):
        interface._flex_call(q, q, q, None, dict(score_mod=EXAMPLES["alibi8"].score_mod), softmax_scale=None,
                             causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0,
                             num_splits=None, pack_gqa=None, deterministic=False, return_lse=False)


# -- through the public API: the other head-dim classes, fp16, sinks, the causal flag, split-KV, paged K/V,
# deterministic repeats, and the refusals (manifest interactions with score_mod)

HEAVY = [flex_examples.softcap(30.0), flex_examples.combined(flex_examples.alibi(8), flex_examples.causal())]


def _grads(q, k, v, dout, fn):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = fn(*leaves)
    return out, torch.autograd.grad(out.float(), leaves, dout.float())


def _check_grads(got, ref, pt, atol=1e-4):
    for n, g, r, p in zip("qkv", got, ref, pt):
        assert not g.isnan().any(), f"d{n} has NaN"
        err, pt_err = (g.float() - r.float()).abs().max().item(), (p.float() - r.float()).abs().max().item()
        assert err <= 2 * pt_err + atol, f"d{n}: max|g-ref|={err:.3e} > 2*{pt_err:.3e}"


def check_forward_and_grads(q, k, v, dout, ex, **extra):
    """flash_attn_func with ``ex``'s mods: out / LSE and dQ / dK / dV against the fp32 reference (2x rule)."""
    import flash_attn_4_sm120 as fa

    mods = dict(score_mod=ex.score_mod, mask_mod=ex.mask_mod, score_mod_bwd=ex.score_mod_bwd, **extra)
    out, lse = fa.flash_attn_func(q, k, v, return_lse=True, **mods)
    check(out, lse, q, k, v, ex)
    _, got = _grads(q, k, v, dout, lambda *t: fa.flash_attn_func(*t, **mods)[0])
    _, ref = _grads(q, k, v, dout, lambda *t: flex_ref(*t, ex)[0].float())
    _, pt = _grads(q, k, v, dout, lambda *t: flex_ref(*t, ex, upcast=False)[0])
    _check_grads(got, ref, pt)


@pytest.mark.parametrize("ex", HEAVY, ids=[e.name for e in HEAVY])
@pytest.mark.parametrize("dtype, d, dv", [(torch.bfloat16, 96, 96), (torch.bfloat16, 192, 128),
                                          (torch.bfloat16, 256, 256), (torch.float16, 128, 128)],
                         ids=["d96", "d192-128", "d256", "fp16"])
def test_public_api_forward_and_backward(ex, dtype, d, dv):
    torch.manual_seed(4)
    q = torch.randn(2, 173, 8, d, dtype=dtype, device="cuda")
    k = torch.randn(2, 250, 2, d, dtype=dtype, device="cuda")
    v = torch.randn(2, 250, 2, dv, dtype=dtype, device="cuda")
    dout = torch.randn(2, 173, 8, dv, dtype=dtype, device="cuda")
    check_forward_and_grads(q, k, v, dout, ex)


@pytest.mark.parametrize("window", [None, (64, 0)], ids=["causal", "causal-window"])
def test_score_mod_with_the_causal_flag_and_a_sink(window):
    import flash_attn_4_sm120 as fa

    torch.manual_seed(5)
    ex = EXAMPLES["alibi8"]
    q = torch.randn(2, 200, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 300, 2, 128, dtype=torch.bfloat16, device="cuda")
    sink = torch.randn(8, device="cuda")
    kw = dict(causal=True, learnable_sink=sink, score_mod=ex.score_mod, score_mod_bwd=ex.score_mod_bwd)
    if window is None:
        out, lse = fa.flash_attn_func(q, k, k, return_lse=True, **kw)
        check(out, lse, q, k, k, ex, causal=True, sink=sink)
    else:  # the window's reference: a mask on top of causal
        left = window[0]
        win = flex_examples.Example("win", score_mod=ex.score_mod, torch_score=ex.torch_score,
                                    torch_mask=lambda b, h, qi, ki, sq, sk: ki >= qi + (sk - sq) - left)
        out, lse = fa.flash_attn_func(q, k, k, return_lse=True, window_size=window, **kw)
        check(out, lse, q, k, k, win, causal=True, sink=sink)


@pytest.mark.parametrize("num_splits", [3, 0], ids=["3-splits", "auto"])
def test_split_kv_decode_with_mods(num_splits):
    import flash_attn_4_sm120 as fa

    torch.manual_seed(6)
    for ex in HEAVY:
        q = torch.randn(3, 2, 16, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(3, 3000, 2, 128, dtype=torch.bfloat16, device="cuda")
        out, lse = fa.flash_attn_func(q, k, k, return_lse=True, num_splits=num_splits, score_mod=ex.score_mod,
                                      mask_mod=ex.mask_mod)
        check(out, lse, q, k, k, ex)


@pytest.mark.parametrize("page_size", [16, 1])
def test_paged_kv_with_mods(page_size):
    """kv_idx is the logical key position: a paged cache equals the dense K/V it holds."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(7)
    b, sk, hkv, d = 2, 320, 2, 128
    pages = sk // page_size
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    perm = torch.randperm(b * pages + 3, device="cuda")[: b * pages]
    kc = torch.zeros(b * pages + 3, page_size, hkv, d, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    kc[perm], vc[perm] = k.reshape(b * pages, page_size, hkv, d), v.reshape(b * pages, page_size, hkv, d)
    table = perm.view(b, pages).to(torch.int32)
    for ex in HEAVY:
        for sq in (1, 150):
            q = torch.randn(b, sq, 8, d, dtype=torch.bfloat16, device="cuda")
            out, lse = fa.flash_attn_func(q, kc, vc, page_table=table, return_lse=True, score_mod=ex.score_mod,
                                          mask_mod=ex.mask_mod)
            check(out, lse, q, k, v, ex)


def test_varlen_backward_with_mods_matches_each_sequence():
    import flash_attn_4_sm120 as fa

    torch.manual_seed(8)
    ex = HEAVY[1]
    cu_q = torch.tensor([0, 100, 100, 257], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 120, 125, 325], dtype=torch.int32, device="cuda")
    q = torch.randn(257, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(325, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(325, 2, 128, dtype=torch.bfloat16, device="cuda")
    dout = torch.randn(257, 8, 128, dtype=torch.bfloat16, device="cuda")
    mods = dict(score_mod=ex.score_mod, mask_mod=ex.mask_mod, score_mod_bwd=ex.score_mod_bwd)
    _, got = _grads(q, k, v, dout, lambda *t: fa.flash_attn_varlen_func(
        *t, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=157, max_seqlen_k=200, **mods)[0])
    for i in (0, 2):
        rows, keys = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        one = (q[rows][None], k[keys][None], v[keys][None])
        _, ref = _grads(*one, dout[rows][None], lambda *t: flex_ref(*t, ex)[0].float())
        _, pt = _grads(*one, dout[rows][None], lambda *t: flex_ref(*t, ex, upcast=False)[0])
        _check_grads([got[0][rows][None], got[1][keys][None], got[2][keys][None]], ref, pt)
    assert got[1][120:125].abs().max() == 0  # the sequence with no queries: no key gradient


def test_deterministic_backward_with_mods_is_bitwise_repeatable():
    import flash_attn_4_sm120 as fa

    torch.manual_seed(9)
    ex = HEAVY[1]
    q = torch.randn(2, 333, 8, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 517, 2, 64, dtype=torch.bfloat16, device="cuda")
    dout = torch.randn(2, 333, 8, 64, dtype=torch.bfloat16, device="cuda")
    mods = dict(score_mod=ex.score_mod, mask_mod=ex.mask_mod, score_mod_bwd=ex.score_mod_bwd, deterministic=True)
    runs = [_grads(q, k, k, dout, lambda *t: fa.flash_attn_func(*t, **mods)[0])[1] for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


def test_refusals_through_the_public_api():
    import flash_attn_4_sm120 as fa

    q = torch.randn(1, 64, 2, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(NotImplementedError, match="mask_mod replaces the causal flag"):
        fa.flash_attn_func(q, q, q, causal=True, mask_mod=EXAMPLES["causal"].mask_mod)
    with pytest.raises(NotImplementedError, match="fold the cap"):
        fa.flash_attn_func(q, q, q, softcap=10.0, score_mod=EXAMPLES["alibi8"].score_mod)
    with pytest.raises(ValueError, match="score_mod_bwd"):
        fa.flash_attn_func(q.requires_grad_(), q, q, score_mod=EXAMPLES["alibi8"].score_mod)


def test_mods_under_torch_compile_break_the_graph_and_match_eager():
    import flash_attn_4_sm120 as fa

    torch.manual_seed(10)
    ex = HEAVY[1]
    q = torch.randn(2, 128, 8, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 128, 2, 64, dtype=torch.bfloat16, device="cuda")

    def f(q, k):
        return fa.flash_attn_func(q * 2, k, k, score_mod=ex.score_mod, mask_mod=ex.mask_mod)[0] + 1

    torch._dynamo.reset()
    assert torch.equal(torch.compile(f)(q, k), f(q, k))


# -- aux tensors (the kernels' aux slots)


def _aux_examples(seqlen):
    slopes = torch.rand(8, device="cuda") * 0.25
    doc_ids = (torch.arange(seqlen, device="cuda", dtype=torch.int32) * 7 // 300).to(torch.int32)  # ~43-token docs
    bias = torch.randn(8, 2 * 40 + 1, device="cuda")
    return [flex_examples.alibi_slopes(slopes), flex_examples.documents(doc_ids), flex_examples.relative_bias(bias)]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["alibi-slopes", "documents", "relative-bias"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_aux_tensor_mods_forward_and_backward(which, head_dim):
    torch.manual_seed(11)
    ex = _aux_examples(300)[which]
    q = torch.randn(2, 300, 8, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 300, 2, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(2, 300, 2, head_dim, dtype=torch.bfloat16, device="cuda")
    dout = torch.randn_like(q)
    check_forward_and_grads(q, k, v, dout, ex, aux_tensors=list(ex.aux_tensors))


def test_aux_tensor_mods_decode_and_new_values():
    """Packed-GQA decode reads the slopes per query head; new aux values reuse the kernel (runtime arguments)."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(12)
    q = torch.randn(3, 2, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(3, 1000, 2, 128, dtype=torch.bfloat16, device="cuda")
    for _ in range(2):
        ex = _aux_examples(1000)[0]
        out, lse = fa.flash_attn_func(q, k, k, return_lse=True, score_mod=ex.score_mod,
                                      aux_tensors=list(ex.aux_tensors))
        check(out, lse, q, k, k, ex)


# -- aux scalars (the kernels' scalar slots)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_aux_scalar_mods_forward_and_backward(head_dim):
    """A Float32 cap read by score_mod and score_mod_bwd and an Int32 window width read by mask_mod
    (``aux_scalars``), forward and backward against the reference."""
    torch.manual_seed(13)
    ex = flex_examples.combined(flex_examples.softcap_scalar(20.0), flex_examples.window_scalar(96, slot=1))
    q = torch.randn(2, 300, 8, head_dim, dtype=torch.bfloat16, device="cuda") * 3
    k = torch.randn(2, 300, 2, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(2, 300, 2, head_dim, dtype=torch.bfloat16, device="cuda")
    check_forward_and_grads(q, k, v, torch.randn_like(q), ex, aux_scalars=ex.aux_scalars)


def test_aux_scalars_are_runtime_values():
    """New values reuse the compiled kernel and change the result; cutlass.Float32 / Int32 values work as Python
    numbers do (their types are part of the compile key, as upstream's)."""
    import cutlass

    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.compile_cache import default_cache

    torch.manual_seed(14)
    q = torch.randn(2, 3, 8, 64, dtype=torch.bfloat16, device="cuda") * 3  # decode rows: packed GQA
    k = torch.randn(2, 700, 2, 64, dtype=torch.bfloat16, device="cuda")
    compiles = []
    for cap, width, numerics in ((10.0, 50, False), (40.0, 300, False), (25.0, 120, True), (15.0, 640, True)):
        ex = flex_examples.combined(flex_examples.softcap_scalar(cap), flex_examples.window_scalar(width, slot=1))
        scalars = (cutlass.Float32(cap), cutlass.Int32(width)) if numerics else ex.aux_scalars
        out, lse = fa.flash_attn_func(q, k, k, return_lse=True, score_mod=ex.score_mod, mask_mod=ex.mask_mod,
                                      aux_scalars=scalars)
        check(out, lse, q, k, k, ex)
        compiles.append(default_cache().stats.compiles)
    assert compiles[1] == compiles[0] and compiles[3] == compiles[2]
