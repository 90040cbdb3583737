"""Dropout on a GPU: the kernels' mask is exactly ``dropout.dropout_keep_mask`` (read off the output with
V = identity, forward and through the backward's dV), outputs and gradients against the fp32 reference with that
mask (the 2x rule), every head-dim class, causal / windows / softcap / sinks / GQA, odd lengths, varlen (rows and
columns from each sequence's start), split-KV and paged K/V forwards, mods and block sparsity beside it, the
deterministic backward bitwise repeatable, dropout_p=0 exactly the plain call, and the seed's effect."""

from __future__ import annotations

import math

import pytest
import torch

import flash_attn_4_sm120 as fa
from flash_attn_4_sm120 import block_sparse as bs
from flash_attn_4_sm120 import flex_examples as fx
from flash_attn_4_sm120.dropout import dropout_keep_mask, keep_scale
from reference import attention_grads_ref, attention_ref, capture, varlen_batch

pytestmark = pytest.mark.gpu

ATOL = {torch.bfloat16: 2e-3, torch.float16: 5e-4}
SEED = 1234567891011


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=dtype, device="cuda")


def _mask(b, h, sq, sk, p, seed=SEED):
    return dropout_keep_mask(seed, 0, b, h, sq, sk, p, device="cuda")


def _close(got, ref, pt, dtype, what):
    assert not got.isnan().any(), f"{what}: NaN"
    err = (got.float() - ref.float()).abs().max().item()
    pt_err = (pt.float() - ref.float()).abs().max().item()
    assert err <= 2 * pt_err + ATOL[dtype], f"{what}: max|got-ref|={err:.3e} > 2*{pt_err:.3e}+{ATOL[dtype]}"


def run(b, sq, sk, hq, hkv, d, dv, p=0.17, dtype=torch.bfloat16, grads=True, **features):
    """One dropout call (seeded), its output and (``grads``) gradients against the reference with the same mask."""
    torch.manual_seed(0)
    q, k, v = _rand(b, sq, hq, d, dtype=dtype), _rand(b, sk, hkv, d, dtype=dtype), _rand(b, sk, hkv, dv, dtype=dtype)
    sink = features.pop("learnable_sink", None)
    deterministic = features.pop("deterministic", False)
    leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
    sink_leaf = sink.clone().requires_grad_(grads) if sink is not None else None
    out, lse = fa.flash_attn_func(*leaves, dropout_p=p, dropout_seed=SEED, learnable_sink=sink_leaf,
                                  return_lse=True, deterministic=deterministic, **features)
    feats = dict(features, learnable_sink=sink, dropout=(_mask(b, hq, sq, sk, p), keep_scale(p)))
    ref, lse_ref = attention_ref(q, k, v, **feats)
    pt, _ = attention_ref(q, k, v, upcast=False, **feats)
    what = f"b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d}x{dv} p{p} {features}"
    _close(out, ref, pt, dtype, what)
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite] - lse_ref[finite]).abs().max().item() < 1e-3, f"{what}: the LSE keeps every element"
    if not grads:
        return
    dout = torch.randn_like(out)
    got = torch.autograd.grad((out.float() * dout.float()).sum(), leaves + ([sink_leaf] if sink is not None else []))
    ref_g = attention_grads_ref(q, k, v, dout, True, **dict(feats))
    pt_g = attention_grads_ref(q, k, v, dout, False, **dict(feats))
    for name, g, r, t in zip(("dq", "dk", "dv", "dsink"), got, ref_g, pt_g):  # dsink: D = dO.O holds the dropout
        _close(g, r, t, dtype, f"{what} {name}")


def test_kernel_mask_is_the_documented_mask():
    """V = identity: out[q, j] = P[q, j] keep[q, j] / (1 - p), so the output's zeros are the dropped elements; the
    kernel's mask must equal dropout_keep_mask exactly (two key tiles and more, a partial last one, GQA heads)."""
    b, hq, hkv, sq, sk, p = 2, 4, 2, 200, 144, 0.3
    q, k = _rand(b, sq, hq, 160), _rand(b, sk, hkv, 160)
    v = torch.eye(sk, 160, device="cuda", dtype=torch.bfloat16)[None, :, None, :].expand(b, sk, hkv, 160).contiguous()
    out, _ = fa.flash_attn_func(q, k, v, dropout_p=p, dropout_seed=SEED)
    kept = out[..., :sk].permute(0, 2, 1, 3) != 0
    assert torch.equal(kept, _mask(b, hq, sq, sk, p))
    rate = kept.float().mean().item()
    assert abs(rate - (1 - p)) < 0.01


def test_backward_regenerates_the_mask():
    """p = 0.5: a backward mask that differs from the forward's in any element moves dV[j] = sum_q P z dO and dQ / dK
    far past the 2x rule."""
    run(1, 130, 190, 2, 2, 64, 64, p=0.5)
    run(1, 130, 190, 2, 2, 96, 96, p=0.5)  # d96's kv_in_regs split: P reaches dS signed (bwd_rolesplit.signed_p)
    run(1, 130, 190, 2, 2, 128, 128, p=0.5)  # d128's full walk: its kv_in_regs split's runs (RunKeepFlags)


@pytest.mark.parametrize("d,dv", [(64, 64), (80, 80), (96, 96), (128, 128), (192, 128), (256, 256), (40, 40), (8, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(d, dv, causal):
    run(2, 177, 177, 4, 2, d, dv, causal=causal)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
def test_d96_class_tile(causal, dtype):
    """d96's 128x64 class tile at a length the tile-efficiency rule keeps it for (177 tokens take the 64-row
    alternate): causal, its registers hold no P in both widths beside the keep words, so it converts and masks P
    call by call (``convert_keep_pairs``); full, it converts all of P and then masks it (``apply_keep_pairs``)."""
    from flash_attn_4_sm120.config import FwdSpec, choose_fwd_config, dropout_on_pairs

    spec = FwdSpec("bf16" if dtype == torch.bfloat16 else "fp16", 96, 96, causal=causal, dropout=True)
    cfg = choose_fwd_config(spec, fa.dispatch_model(torch.device("cuda")), 1024, 1024, 1024)
    assert cfg.tile_m == 128 and dropout_on_pairs(spec, cfg) == (not causal)
    run(1, 1024, 1024, 2, 1, 96, 96, causal=causal, dtype=dtype)


@pytest.mark.parametrize("sq,sk", [(1, 1), (113, 799), (799, 113), (64, 64), (65, 129)])
def test_odd_lengths(sq, sk):
    # One key per row: the true dS is 0 (O = z V, so D = dO.O = z dP), and the kernels' D, from the 16-bit O as
    # FA2's, leaves a rounding residue the 16-bit autograd baseline lacks (0 there): gradients from two keys on.
    grads = sk > 1
    run(2, sq, sk, 4, 2, 128, 128, causal=True, grads=grads)
    run(1, sq, sk, 2, 1, 64, 64, grads=grads)
    run(1, sq, sk, 2, 1, 96, 96, causal=True, grads=grads)
    run(1, sq, sk, 2, 1, 128, 128, grads=grads)  # d128 full: the run layout (causal d128: the 64x64 split)


@pytest.mark.parametrize("window", [(32, 0), (16, 16), (None, 8)])
def test_windows(window):
    run(2, 300, 300, 4, 2, 128, 128, window_size=window)
    run(1, 300, 300, 2, 1, 96, 96, window_size=window)


def test_softcap_and_sink():
    run(2, 190, 190, 4, 2, 128, 128, causal=True, softcap=15.0)
    run(2, 190, 190, 4, 2, 64, 64, learnable_sink=torch.randn(4, device="cuda"))


@pytest.mark.parametrize("p", [0.0001, 0.1, 0.9])
def test_probabilities(p):
    run(1, 256, 256, 2, 2, 128, 128, p=p, causal=True)
    run(1, 256, 256, 2, 2, 96, 96, p=p)
    run(1, 256, 256, 2, 2, 128, 128, p=p)


def test_fp16():
    run(2, 200, 200, 4, 4, 128, 128, dtype=torch.float16, causal=True)
    run(2, 200, 200, 4, 2, 96, 96, dtype=torch.float16)
    run(2, 200, 200, 4, 2, 128, 128, dtype=torch.float16)


def test_pack_gqa_runs_unpacked():
    """pack_gqa=True (or the automatic choice for short queries) still draws per query head: the same result."""
    torch.manual_seed(0)
    q, k, v = _rand(2, 4, 8, 128), _rand(2, 300, 1, 128), _rand(2, 300, 1, 128)
    a, _ = fa.flash_attn_func(q, k, v, dropout_p=0.2, dropout_seed=SEED, pack_gqa=True)
    b, _ = fa.flash_attn_func(q, k, v, dropout_p=0.2, dropout_seed=SEED, pack_gqa=False)
    assert torch.equal(a, b)
    ref, _ = attention_ref(q, k, v, dropout=(_mask(2, 8, 4, 300, 0.2), keep_scale(0.2)))
    pt, _ = attention_ref(q, k, v, upcast=False, dropout=(_mask(2, 8, 4, 300, 0.2), keep_scale(0.2)))
    _close(a, ref, pt, torch.bfloat16, "pack_gqa")


def test_zero_p_is_the_plain_call():
    torch.manual_seed(0)
    q, k, v = _rand(2, 300, 4, 128), _rand(2, 300, 2, 128), _rand(2, 300, 2, 128)
    plain, _ = fa.flash_attn_func(q, k, v, causal=True)
    zero, _ = fa.flash_attn_func(q, k, v, causal=True, dropout_p=0.0, dropout_seed=5)
    assert torch.equal(plain, zero)


def test_seed_reproduces_and_changes_the_mask():
    torch.manual_seed(0)
    q, k, v = _rand(1, 256, 2, 64), _rand(1, 256, 2, 64), _rand(1, 256, 2, 64)
    a, _ = fa.flash_attn_func(q, k, v, dropout_p=0.3, dropout_seed=11)
    b, _ = fa.flash_attn_func(q, k, v, dropout_p=0.3, dropout_seed=11)
    c, _ = fa.flash_attn_func(q, k, v, dropout_p=0.3, dropout_seed=12)
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(3)
    d1, _ = fa.flash_attn_func(q, k, v, dropout_p=0.3)
    d2, _ = fa.flash_attn_func(q, k, v, dropout_p=0.3)
    torch.manual_seed(3)
    d3, _ = fa.flash_attn_func(q, k, v, dropout_p=0.3)
    assert torch.equal(d1, d3) and not torch.equal(d1, d2), "unseeded calls: fresh seeds that torch.manual_seed fixes"


@pytest.mark.parametrize("d", [64, 96, 128])
def test_varlen(d):
    """Rows and columns count from each sequence's start, batch = sequence index: each sequence matches the dense
    reference with its slice of the (sequences, heads, max_q, max_k) mask; gradients too (d64 / d96: their role
    splits, which take varlen)."""
    # (no one-key sequence: see test_odd_lengths)
    lens_q, lens_k, hq, hkv, p = [100, 0, 257, 33], [120, 5, 257, 40], 4, 2, 0.25
    torch.manual_seed(0)
    q, k, v, cu_q, cu_k = varlen_batch(lens_q, lens_k, hq, hkv, d)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = fa.flash_attn_varlen_func(*leaves, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                       max_seqlen_k=max(lens_k), causal=True, dropout_p=p, dropout_seed=SEED)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad((out.float() * dout.float()).sum(), leaves)
    mask = _mask(len(lens_q), hq, max(lens_q), max(lens_k), p)
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq == 0:
            continue
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        args = (q[q0:q0 + lq][None], k[k0:k0 + lk][None], v[k0:k0 + lk][None])
        feats = dict(causal=True, dropout=(mask[i:i + 1, :, :lq, :lk], keep_scale(p)))
        ref, _ = attention_ref(*args, **feats)
        pt, _ = attention_ref(*args, upcast=False, **feats)
        _close(out[q0:q0 + lq][None], ref, pt, torch.bfloat16, f"sequence {i}")
        rg = attention_grads_ref(*args, dout[q0:q0 + lq][None], True, **dict(feats))
        pg = attention_grads_ref(*args, dout[q0:q0 + lq][None], False, **dict(feats))
        for name, g, r, t in zip(("dq", "dk", "dv"), (dq[q0:q0 + lq][None], dk[k0:k0 + lk][None],
                                                      dv[k0:k0 + lk][None]), rg, pg):
            _close(g, r, t, torch.bfloat16, f"sequence {i} {name}")


def test_split_kv_and_paged_forward():
    torch.manual_seed(0)
    b, sk, h, d, p = 2, 2048, 4, 128, 0.2
    q, k, v = _rand(b, 1, h, d), _rand(b, sk, h, d), _rand(b, sk, h, d)
    feats = dict(dropout=(_mask(b, h, 1, sk, p), keep_scale(p)))
    ref, _ = attention_ref(q, k, v, **feats)
    pt, _ = attention_ref(q, k, v, upcast=False, **feats)
    out, _ = fa.flash_attn_func(q, k, v, dropout_p=p, dropout_seed=SEED, num_splits=4)
    _close(out, ref, pt, torch.bfloat16, "split-KV")
    page = 64
    perm = torch.randperm(b * sk // page, device="cuda")
    kc = torch.empty(b * sk // page, page, h, d, dtype=k.dtype, device="cuda")
    vc = torch.empty_like(kc)
    kc[perm] = k.reshape(-1, page, h, d)
    vc[perm] = v.reshape(-1, page, h, d)
    table = perm.view(b, -1).to(torch.int32)
    out, _ = fa.flash_attn_func(q, kc, vc, page_table=table, dropout_p=p, dropout_seed=SEED)
    _close(out, ref, pt, torch.bfloat16, "paged")


def test_mods_and_block_sparsity():
    """Dropout beside a mask_mod (chunked local attention) and beside block-sparse lists (documents of 128: every
    listed block full): forward and gradients."""
    torch.manual_seed(0)
    b, s, h, d, p = 2, 512, 4, 128, 0.2
    q, k, v = _rand(b, s, h, d), _rand(b, s, h, d), _rand(b, s, h, d)
    qi, ki = torch.arange(s, device="cuda").view(-1, 1), torch.arange(s, device="cuda").view(1, -1)
    docs = (qi // 128 == ki // 128)[None, None]
    chunked = docs & (ki <= qi)
    drop = _mask(b, h, s, s, p) * keep_scale(p)
    sparse = bs.block_sparse_from_mask(docs.expand(b, h, s, s), (128, 128))[0]
    dout = _rand(b, s, h, d)
    for what, keep, kwargs in (("mask_mod", chunked, dict(mask_mod=fx.chunked_local(128).mask_mod)),
                               ("block_sparse", docs, dict(block_sparse_tensors=sparse))):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, _ = fa.flash_attn_func(*leaves, dropout_p=p, dropout_seed=SEED, **kwargs)
        got = torch.autograd.grad((out.float() * dout.float()).sum(), leaves)
        refs = []
        for upcast in (True, False):  # out = (softmax(masked scores) * drop) V, fp32 and in bf16
            rl = [t.clone().requires_grad_(True) for t in (q, k, v)]
            qf, kf, vf = (t.float() if upcast else t for t in rl)
            sc = torch.einsum("bqhd,bkhd->bhqk", qf / math.sqrt(d), kf).float().masked_fill(~keep, float("-inf"))
            pr = torch.softmax(sc, dim=-1) * drop
            o = torch.einsum("bhqk,bkhd->bqhd", pr.to(vf.dtype), vf).to(q.dtype)
            refs.append((o, torch.autograd.grad((o.float() * dout.float()).sum(), rl)))
        _close(out, refs[0][0], refs[1][0], torch.bfloat16, what)
        for name, g, r, t in zip(("dq", "dk", "dv"), got, refs[0][1], refs[1][1]):
            _close(g, r, t, torch.bfloat16, f"{what} {name}")


@pytest.mark.parametrize("d", [96, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_backward_is_bitwise_repeatable(causal, d):
    """d96: its kv_in_regs split (P passed signed), d128: its 64x64 smem-operand split."""
    torch.manual_seed(0)
    q, k, v = _rand(2, 777, 8, d), _rand(2, 777, 2, d), _rand(2, 777, 2, d)
    dout = _rand(2, 777, 8, d)
    results = []
    for _ in range(3):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, _ = fa.flash_attn_func(*leaves, causal=causal, dropout_p=0.1, dropout_seed=SEED, deterministic=True)
        results.append(torch.autograd.grad((out.float() * dout.float()).sum(), leaves))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))
    run(1, 300, 300, 4, 2, d, d, causal=causal, deterministic=True)


def _identity_v(b, sk, hkv, d):
    return torch.eye(sk, d, device="cuda", dtype=torch.bfloat16)[None, :, None, :].expand(b, sk, hkv, d).contiguous()


def _check_own_mask(q, k, v, out, grads, dout, p, what, **features):
    """V = identity: the mask a call used, read off its output (out[q, j] != 0 iff kept), then out and (dq, dk, dv)
    against the fp32 reference with that mask: a backward that drew another mask than its forward fails here."""
    kept = out[..., :k.shape[1]].permute(0, 2, 1, 3) != 0
    rate = kept.float().mean().item()
    assert abs(rate - (1 - p)) < 0.02, f"{what}: keep rate {rate:.3f}"
    feats = dict(features, dropout=(kept, keep_scale(p)))
    ref, _ = attention_ref(q, k, v, **feats)
    pt, _ = attention_ref(q, k, v, upcast=False, **feats)
    _close(out, ref, pt, torch.bfloat16, what)
    ref_g = attention_grads_ref(q, k, v, dout, True, **dict(feats))
    pt_g = attention_grads_ref(q, k, v, dout, False, **dict(feats))
    for name, g, r, t in zip(("dq", "dk", "dv"), grads, ref_g, pt_g):
        _close(g, r, t, torch.bfloat16, f"{what} {name}")
    return kept


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_torch_compile_matches_eager(varlen):
    """torch.compile(fullgraph=True) of a training step with dropout: the call traces through the custom ops (no graph
    break: the seed slot is built by device ops), and with a seed the compiled output and gradients equal eager's
    bit for bit (deterministic backward)."""
    torch.manual_seed(0)
    if varlen:
        q, k, v, cu_q, cu_k = varlen_batch([300, 0, 129], [310, 7, 200], 8, 2, 128)
    else:
        q, k, v = _rand(2, 300, 8, 128), _rand(2, 310, 2, 128), _rand(2, 310, 2, 128)
    w = torch.randn(q.shape, device="cuda")

    def step(q, k, v):
        args = dict(causal=True, window_size=(100, 0), deterministic=True, dropout_p=0.2, dropout_seed=SEED)
        if varlen:
            out = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=300,
                                            max_seqlen_k=310, **args)[0]
        else:
            out = fa.flash_attn_func(q, k, v, **args)[0]
        return out, (out.float() * w).sum()

    def run_step(fn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, loss = fn(*leaves)
        return (out, *torch.autograd.grad(loss, leaves))

    torch._dynamo.reset()
    compiled = run_step(torch.compile(step, fullgraph=True))
    eager = run_step(step)
    for name, a, b in zip(("out", "dq", "dk", "dv"), compiled, eager):
        assert torch.equal(a, b), f"{name}: compiled differs from eager"


def test_unseeded_dropout_under_torch_compile():
    """Without a seed, a compiled step draws a fresh seed on the device per call; forward and backward of one call
    use the same mask (checked against the reference with the mask read off the output)."""
    torch.manual_seed(0)
    b, s, hq, hkv, d, p = 2, 128, 4, 2, 128, 0.25
    q, k, v = _rand(b, s, hq, d), _rand(b, s, hkv, d), _identity_v(b, s, hkv, d)
    dout = _rand(b, s, hq, d)

    def step(q, k, v):
        out = fa.flash_attn_func(q, k, v, dropout_p=p)[0]  # no mask: every zero of out is a dropped element
        return out, (out.float() * dout.float()).sum()

    compiled = torch.compile(step, fullgraph=True)
    masks = []
    for i in range(2):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, loss = compiled(*leaves)
        grads = torch.autograd.grad(loss, leaves)
        masks.append(_check_own_mask(q, k, v, out, grads, dout, p, f"compiled call {i}"))
    assert not torch.equal(masks[0], masks[1]), "two unseeded calls drew the same mask"


@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
def test_dropout_cuda_graph_replay(seeded):
    """Forward + backward with dropout captured in one CUDA graph: unseeded, every replay draws a fresh seed (torch's
    generator advances per replay) and its gradients match its own mask; seeded, a replay equals the eager call."""
    torch.manual_seed(0)
    b, s, hq, hkv, d, p = 2, 144, 4, 2, 160, 0.3
    q, k = _rand(b, s, hq, d).requires_grad_(True), _rand(b, s, hkv, d).requires_grad_(True)
    v = _identity_v(b, s, hkv, d).requires_grad_(True)
    dout = _rand(b, s, hq, d)
    seed = SEED if seeded else None

    def run_once():
        out = fa.flash_attn_func(q, k, v, dropout_p=p, dropout_seed=seed, deterministic=True)[0]
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    graph, static = capture(run_once)
    masks = []
    for i in range(2):
        graph.replay()
        torch.cuda.synchronize()
        masks.append(_check_own_mask(q.detach(), k.detach(), v.detach(), static[0], static[1:], dout, p,
                                     f"replay {i}"))
    if seeded:
        eager = run_once()
        for name, a, c in zip(("out", "dq", "dk", "dv"), static, eager):
            assert torch.equal(a, c), f"{name}: seeded replay differs from eager"
        assert torch.equal(masks[0], masks[1])
    else:
        assert not torch.equal(masks[0], masks[1]), "two replays drew the same mask"
