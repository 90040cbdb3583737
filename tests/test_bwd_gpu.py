"""Backward on the GPU: dq, dk, dv (and dsink) of flash_attn_func / flash_attn_varlen_func through autograd,
against the fp32 reference's gradients with the house rule max|g - ref| <= 2 max|g_pt - ref| + atol
(``g_pt``: the same computation in the input dtype). Every head-dim class, masks and windows, softcap,
sinks, GQA / MQA, odd lengths, seqlen_q != seqlen_k, the LSE's own gradient, and varlen layouts."""

from __future__ import annotations

import pytest
import torch

from reference import attention_grads_ref, capture

pytestmark = pytest.mark.gpu

ATOL = {torch.bfloat16: 2e-3, torch.float16: 5e-4}


def _rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device="cuda")


def assert_close_grads(got, ref, pt, dtype, what):
    for name, g, r, p in zip(("dq", "dk", "dv", "dsink"), got, ref, pt):
        if r is None:
            assert g is None, f"{what}: {name} should be None"
            continue
        assert g is not None, f"{what}: {name} missing"
        assert not g.isnan().any(), f"{what}: {name} has NaN"
        err = (g.float() - r.float()).abs().max().item()
        pt_err = (p.float() - r.float()).abs().max().item()
        assert err <= 2 * pt_err + ATOL[dtype], f"{what}: max|{name}-ref|={err:.3e} > 2*{pt_err:.3e}+{ATOL[dtype]}"


def run_dense(b, sq, sk, hq, hkv, d, dv, dtype=torch.bfloat16, causal=False, window_size=(None, None),
              softcap=0.0, sink=False, with_dlse=False, seed=0, deterministic=False):
    import flash_attn_4_sm120 as fa

    torch.manual_seed(seed)
    q, k, v = _rand(b, sq, hq, d, dtype=dtype), _rand(b, sk, hkv, d, dtype=dtype), _rand(b, sk, hkv, dv, dtype=dtype)
    dout = _rand(b, sq, hq, dv, dtype=dtype)
    features = dict(causal=causal, window_size=window_size, softcap=softcap)
    sink_t = torch.randn(hq, device="cuda", dtype=torch.float32) if sink else None
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    sink_leaf = sink_t.clone().requires_grad_(True) if sink else None
    out, lse = fa.flash_attn_func(*leaves, learnable_sink=sink_leaf, return_lse=True, deterministic=deterministic,
                                  **features)
    dlse = torch.randn_like(lse) if with_dlse else None
    loss = (out.float() * dout.float()).sum()
    if with_dlse:
        loss = loss + (lse.masked_fill(~torch.isfinite(lse), 0.0) * dlse).sum()
    grads = torch.autograd.grad(loss, leaves + ([sink_leaf] if sink else []))
    got = (*grads[:3], grads[3] if sink else None)
    ref_features = dict(features, learnable_sink=sink_t)
    ref = attention_grads_ref(q, k, v, dout, True, dlse, **ref_features)
    pt = attention_grads_ref(q, k, v, dout, False, dlse, **dict(ref_features))
    assert_close_grads(got, ref, pt, dtype, f"b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d}x{dv} {features} sink={sink}")


@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bwd_basic(d, causal, dtype):
    run_dense(2, 256, 256, 4, 4, d, d, dtype, causal=causal)


@pytest.mark.parametrize("d,dv", [(40, 40), (72, 72), (96, 96), (104, 104), (112, 112), (120, 120), (136, 136),
                                  (160, 160), (168, 168), (192, 192), (192, 128), (200, 200), (256, 256), (8, 8),
                                  (128, 64), (96, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_bwd_head_dims(d, dv, causal):
    run_dense(1, 177, 177, 2, 1, d, dv, causal=causal)


@pytest.mark.parametrize("sq,sk", [(1, 1), (113, 799), (799, 113), (1, 300), (300, 1), (64, 64), (65, 129)])
@pytest.mark.parametrize("causal", [False, True])
def test_bwd_odd_lengths(sq, sk, causal):
    run_dense(2, sq, sk, 4, 2, 64, 64, causal=causal)
    run_dense(1, sq, sk, 2, 2, 128, 128, causal=causal)


@pytest.mark.parametrize("hq,hkv", [(8, 1), (8, 2), (6, 3)])
def test_bwd_gqa(hq, hkv):
    run_dense(2, 200, 300, hq, hkv, 128, 128, causal=True)
    run_dense(1, 150, 150, hq, hkv, 64, 64)


@pytest.mark.parametrize("window", [(32, 0), (16, 16), (None, 8), (64, None), (0, 0), (5, -3)])
@pytest.mark.parametrize("d", [64, 96, 128])
def test_bwd_windows(window, d):
    run_dense(2, 300, 300, 4, 2, d, d, window_size=window)
    run_dense(1, 200, 333, 2, 2, d, d, window_size=window)


@pytest.mark.parametrize("d", [64, 128, 144, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_bwd_softcap(d, causal):
    run_dense(2, 190, 190, 4, 2, d, d, causal=causal, softcap=15.0)


@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("window", [(None, None), (32, 0)])
def test_bwd_sink(d, window):
    run_dense(2, 190, 190, 4, 2, d, d, window_size=window, sink=True)
    run_dense(2, 190, 190, 4, 2, d, d, window_size=window, sink=True, with_dlse=True)


@pytest.mark.parametrize("d", [64, 128])
def test_bwd_lse_gradient(d):
    run_dense(2, 150, 250, 4, 4, d, d, causal=True, with_dlse=True)


def run_varlen(lens_q, lens_k, hq, hkv, d, causal=False, window_size=(None, None), softcap=0.0, sink=False,
               used_q=None, used_k=None, seed=0, deterministic=False):
    """Packed q and k/v with cu_seqlens (optionally seqused caps): every sequence's gradients against the
    dense reference of its used rows; rows past a used length get zero gradients."""
    import flash_attn_4_sm120 as fa
    from reference import varlen_batch

    torch.manual_seed(seed)
    q, k, v, cu_q, cu_k = varlen_batch(lens_q, lens_k, hq, hkv, d)
    dout = torch.randn_like(q)
    sink_t = torch.randn(hq, device="cuda") if sink else None
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    sink_leaf = sink_t.clone().requires_grad_(True) if sink else None
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device="cuda")  # noqa: E731
    out, _ = fa.flash_attn_varlen_func(
        *leaves, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
        seqused_q=i32(used_q) if used_q else None,
        seqused_k=i32(used_k) if used_k else None, causal=causal, window_size=window_size, softcap=softcap,
        learnable_sink=sink_leaf, deterministic=deterministic)
    grads = torch.autograd.grad((out.float() * dout.float()).sum(), leaves + ([sink_leaf] if sink else []))
    dq, dk, dv = grads[:3]
    dsink_ref = torch.zeros(hq, device="cuda") if sink else None
    dsink_pt = torch.zeros(hq, device="cuda") if sink else None
    for b in range(len(lens_q)):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        k0, k1 = int(cu_k[b]), int(cu_k[b + 1])
        uq = min(used_q[b], q1 - q0) if used_q else q1 - q0
        uk = min(used_k[b], k1 - k0) if used_k else k1 - k0
        for g, lo, hi, used in ((dq, q0, q1, uq), (dk, k0, k1, uk), (dv, k0, k1, uk)):
            assert not g[lo + used:hi].any(), f"sequence {b}: gradients in rows past the used length"
        if uq == 0:
            continue
        sl = lambda t, lo, n: t[lo:lo + n][None]  # noqa: E731
        feats = dict(causal=causal, window_size=window_size, softcap=softcap, learnable_sink=sink_t)
        args = (sl(q, q0, uq), sl(k, k0, uk), sl(v, k0, uk), sl(dout, q0, uq))
        ref = attention_grads_ref(*args, True, **dict(feats))
        pt = attention_grads_ref(*args, False, **dict(feats))
        got = (dq[q0:q0 + uq][None], dk[k0:k0 + uk][None], dv[k0:k0 + uk][None], None)
        assert_close_grads(got, (*ref[:3], None), (*pt[:3], None), torch.bfloat16, f"sequence {b}")
        if sink:
            dsink_ref += ref[3]
            dsink_pt += pt[3]
    if sink:
        assert_close_grads((None, None, None, grads[3]), (None, None, None, dsink_ref),
                           (None, None, None, dsink_pt), torch.bfloat16, "dsink")


@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_bwd_varlen(d, causal):
    run_varlen([100, 0, 257, 33], [120, 5, 257, 1], 4, 2, d, causal=causal)


def test_bwd_varlen_seqused_window_softcap_sink():
    run_varlen([100, 64, 257, 33], [120, 70, 257, 40], 4, 2, 128, window_size=(40, 8), softcap=20.0, sink=True,
               used_q=[90, 0, 200, 33], used_k=[120, 10, 250, 7])


@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window_size=(96, 32))],
                         ids=["full", "causal", "window"])
def test_bwd_deterministic_is_correct(d, mask):
    run_dense(2, 333, 333, 4, 2, d, d, deterministic=True, **mask)


@pytest.mark.parametrize("band", [1, 3, 1000])
def test_bwd_causal_key_block_bands(band, monkeypatch):
    """The causal key-block order (``tile_scheduler.KeyBlockScheduler``) visits every key block of every (batch,
    KV head) pair once whatever the band: one pair per band (the former order), 3 (a short last band: 2 x 5
    pairs), more than there are pairs; dense and varlen (key blocks past a sequence's end exit)."""
    from flash_attn_4_sm120 import backward

    monkeypatch.setattr(backward, "bwd_tile_band", lambda *a: band)
    backward.bwd_launch.cache_clear()  # the backward's host decisions are memoized per shape
    try:
        run_dense(2, 300, 333, 10, 5, 64, 64, causal=True)
        run_varlen([100, 0, 257, 33], [120, 5, 257, 1], 4, 2, 128, causal=True)
    finally:
        backward.bwd_launch.cache_clear()


@pytest.mark.parametrize("d", [64, 128, 160, 192])
def test_bwd_deterministic_rotated_order(d):
    """The unmasked deterministic mode's rotated order (``BwdSpec.rotated_turns``): square, more query blocks than
    key blocks, more key blocks than query blocks (those walk unrotated, highest first), and packed sequences of
    each kind in one call; against the reference, then bitwise repeatable."""
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120 import backward
    from flash_attn_4_sm120.problem import BwdSpec, FwdShape

    model = fa.dispatch_model(torch.device("cuda"))
    bspec = BwdSpec("bf16", d, d, False, deterministic=True)
    shape = FwdShape(batch=1, seqlen_q=1024, seqlen_k=1024, num_heads=4, num_heads_kv=2)
    assert backward._rotated_turns(bspec, backward.select_bwd_config(bspec, model), shape, model, 132)
    run_dense(2, 333, 333, 4, 2, d, d, deterministic=True)
    run_dense(1, 900, 200, 4, 2, d, d, deterministic=True)
    run_dense(1, 100, 1024, 4, 2, d, d, deterministic=True, sink=True)
    run_varlen([100, 0, 700, 33], [120, 5, 200, 600], 4, 2, d, deterministic=True)
    _assert_repeatable(d, dict())


def test_bwd_deterministic_varlen_is_correct():
    run_varlen([100, 0, 257, 33], [120, 5, 257, 1], 4, 2, 128, causal=True, sink=True, deterministic=True)
    run_varlen([100, 64, 257, 33], [120, 70, 257, 40], 4, 2, 64, window_size=(40, 8), used_q=[90, 0, 200, 33],
               used_k=[120, 10, 250, 7], deterministic=True)
    run_varlen([100, 0, 257, 33], [120, 5, 257, 1], 4, 2, 96, causal=True, deterministic=True)


@pytest.mark.parametrize("d", [64, 96, 128, 144, 192, 256])
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window_size=(300, 0)), dict(softcap=30.0)],
                         ids=["full", "causal", "window", "softcap"])
def test_bwd_deterministic_is_bitwise_repeatable(d, mask):
    """Large enough that many key blocks add into every query block at once: the default mode's order varies
    between runs; the deterministic mode's gradients (dsink included) must not."""
    _assert_repeatable(d, mask)


@pytest.fixture(params=[(False, 1, 1), (True, 1, 1), (True, 1, 3), (True, 2, 2)],
                ids=["highest", "lowest", "lowest-band3", "lowest-split2"])
def det_order(request, monkeypatch):
    """The causal deterministic mode's (order, group split, band) forced (``backward._det_order``; the rule picks
    them by the schedule model, ``bwd_schedule.bwd_det_order``)."""
    from flash_attn_4_sm120 import backward

    monkeypatch.setattr(backward, "_det_order", lambda *a: request.param)
    backward.bwd_launch.cache_clear()
    yield request.param
    backward.bwd_launch.cache_clear()  # before monkeypatch puts the rule back: no forced order stays cached


@pytest.mark.parametrize("d", [64, 96, 128, 144, 192, 256])
def test_bwd_deterministic_orders(det_order, d):
    """Both orders of the causal deterministic mode, whole, split and banded: gradients against the reference
    (square and bottom-right, dense and varlen) and bitwise repeatable (``_kernels/dq_accum``), on every class's
    tile (d96's role split and d64's varlen tile with their double-buffered dO included)."""
    run_dense(2, 333, 333, 4, 2, d, d, causal=True, deterministic=True)
    run_dense(1, 200, 333, 4, 2, d, d, causal=True, sink=True, deterministic=True)
    run_varlen([100, 0, 257, 33], [120, 5, 257, 1], 4, 2, d, causal=True, deterministic=True)
    _assert_repeatable(d, dict(causal=True))


def _assert_repeatable(d, mask):
    import flash_attn_4_sm120 as fa

    torch.manual_seed(0)
    q, k, v = _rand(2, 1500, 8, d, dtype=torch.bfloat16), _rand(2, 1500, 2, d, dtype=torch.bfloat16), \
        _rand(2, 1500, 2, d, dtype=torch.bfloat16)
    dout = _rand(2, 1500, 8, d, dtype=torch.bfloat16)
    sink = torch.randn(8, device="cuda", requires_grad=True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    runs = []
    for _ in range(3):
        out, _ = fa.flash_attn_func(*leaves, learnable_sink=sink, deterministic=True, **mask)
        runs.append(torch.autograd.grad(out, leaves + [sink], dout))
    for other in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv", "dsink"), runs[0], other):
            assert torch.equal(a, b), f"{name} differs between deterministic runs ({mask}, d={d})"


def test_bwd_deterministic_varlen_is_bitwise_repeatable():
    import flash_attn_4_sm120 as fa
    from reference import varlen_batch

    torch.manual_seed(0)
    q, k, v, cu_q, cu_k = varlen_batch([700, 0, 1025, 333], [900, 17, 1025, 64], 8, 2, 128)
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    runs = []
    for _ in range(3):
        out, _ = fa.flash_attn_varlen_func(*leaves, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=1025,
                                           max_seqlen_k=1025, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, leaves, dout))
    for other in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], other):
            assert torch.equal(a, b), f"{name} differs between deterministic varlen runs"


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_bwd_torch_compile_matches_eager(varlen):
    """torch.compile(fullgraph=True) of a training step's attention and loss: the backward custom op is traced
    (no graph break) and, in the deterministic mode, its gradients equal the eager path's bit for bit."""
    import flash_attn_4_sm120 as fa
    from reference import varlen_batch

    torch.manual_seed(0)
    if varlen:
        q, k, v, cu_q, cu_k = varlen_batch([300, 0, 129], [310, 7, 200], 8, 2, 128)
    else:
        q, k, v = _rand(2, 300, 8, 128, dtype=torch.bfloat16), _rand(2, 310, 2, 128, dtype=torch.bfloat16), \
            _rand(2, 310, 2, 128, dtype=torch.bfloat16)
    w = torch.randn(q.shape, device="cuda")
    sink = torch.randn(8, device="cuda")

    def step(q, k, v, sink):
        if varlen:
            out = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=300,
                                            max_seqlen_k=310, causal=True, learnable_sink=sink,
                                            window_size=(100, 0), deterministic=True)[0]
        else:
            out = fa.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, window_size=(100, 0),
                                     deterministic=True)[0]
        return (out.float() * w).sum()

    def grads(fn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sink)]
        return torch.autograd.grad(fn(*leaves), leaves)

    torch._dynamo.reset()
    compiled = grads(torch.compile(step, fullgraph=True))
    eager = grads(step)
    for name, a, b in zip(("dq", "dk", "dv", "dsink"), compiled, eager):
        assert torch.equal(a, b), f"{name}: compiled backward differs from eager"


def test_bwd_cuda_graph_replay():
    """Forward + backward captured in one CUDA graph and replayed on new inputs: the gradients equal an
    eager run's on the same inputs (deterministic mode, bitwise)."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(0)
    shapes = ((2, 257, 8, 64), (2, 333, 2, 64), (2, 333, 2, 64))
    q, k, v = (torch.randn(s, device="cuda", dtype=torch.bfloat16).requires_grad_(True) for s in shapes)
    dout = torch.randn(2, 257, 8, 64, device="cuda", dtype=torch.bfloat16)

    def run():
        out = fa.flash_attn_func(q, k, v, causal=True, deterministic=True)[0]
        return torch.autograd.grad(out, (q, k, v), dout)

    graph, static_grads = capture(run)
    with torch.no_grad():
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        dout.copy_(torch.randn_like(dout))
    graph.replay()
    torch.cuda.synchronize()
    eager = run()
    for name, a, b in zip(("dq", "dk", "dv"), static_grads, eager):
        assert torch.equal(a, b), f"{name}: graph replay differs from eager"


@pytest.mark.parametrize("window", [(None, None), (164, -100), (None, -700)],
                         ids=["full", "keys-unseen", "rows-empty"])
def test_bwd_writes_every_gradient_row(window):
    """flash_attn_bwd into NaN-filled dq / dk / dv: every row must be written (key blocks no query sees get
    zeros, rows that see no key get dq = 0), and the values match the autograd path's."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(0)
    q, k, v = _rand(2, 700, 4, 64, dtype=torch.bfloat16), _rand(2, 900, 2, 64, dtype=torch.bfloat16), \
        _rand(2, 900, 2, 64, dtype=torch.bfloat16)
    dout = _rand(2, 700, 4, 64, dtype=torch.bfloat16)
    out, lse = fa.flash_attn_fwd(q, k, v, window_size=window)
    poisoned = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    dq, dk, dv, dsink = fa.flash_attn_bwd(dout, q, k, v, out, lse, window_size=window, deterministic=True,
                                          dq=poisoned[0], dk=poisoned[1], dv=poisoned[2])
    assert dsink is None and dq is poisoned[0]
    for name, g in zip(("dq", "dk", "dv"), (dq, dk, dv)):
        assert not g.isnan().any(), f"{name}: rows left unwritten ({window})"
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = torch.autograd.grad(fa.flash_attn_func(*leaves, window_size=window, deterministic=True)[0], leaves, dout)
    for name, g, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert torch.equal(g, r), f"{name}: flash_attn_bwd differs from autograd ({window})"


@pytest.fixture
def role_split_tables(monkeypatch):
    """The d64 / d128 classes' table entries replaced by the role-split kernel (a tuning candidate until it is
    measured faster; these tests hold it to the same rules as the table's kernels)."""
    from flash_attn_4_sm120 import backward, bwd_config

    cfg = bwd_config.BwdConfig(64, 64, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2, role_split=True)
    monkeypatch.setitem(bwd_config.BWD_TABLE, 64, dataclasses_replace(cfg, stages_do=2))
    monkeypatch.setitem(bwd_config.BWD_TABLE, 128, cfg)
    backward.clear_caches()
    yield
    backward.clear_caches()


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window_size=(96, 32))],
                         ids=["full", "causal", "window"])
def test_bwd_role_split_candidate(role_split_tables, d, mask):
    run_dense(2, 333, 300, 8, 2, d, d, **mask)
    run_dense(1, 64, 64, 2, 2, d, d, dtype=torch.float16, sink=True, with_dlse=True, **mask)


def test_bwd_role_split_candidate_varlen_deterministic(role_split_tables):
    run_varlen([100, 0, 257, 33], [120, 5, 257, 1], 4, 2, 128, causal=True, sink=True, deterministic=True)
    run_varlen([100, 64, 257, 33], [120, 70, 257, 40], 4, 2, 112, window_size=(40, 8), used_q=[90, 0, 200, 33],
               used_k=[120, 10, 250, 7])


@pytest.fixture(params=[1, 2, 4], ids=["split1", "split2", "split4"])
def group_split(request, monkeypatch):
    """The backward's query-head group split forced (``backward._group_split``; the rule picks it from the
    grid otherwise, and splits most of this file's small GQA shapes)."""
    from flash_attn_4_sm120 import backward

    monkeypatch.setattr(backward, "_group_split", lambda *a: request.param)
    backward.bwd_launch.cache_clear()  # the backward's host decisions are memoized per shape
    yield request.param
    backward.bwd_launch.cache_clear()  # before monkeypatch puts the rule back: no forced split stays cached


@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window_size=(96, 32), softcap=20.0)],
                         ids=["full", "causal", "window-softcap"])
@pytest.mark.parametrize("d", [64, 128])
def test_bwd_group_split_dense(group_split, mask, d):
    run_dense(2, 333, 517, 8, 2, d, d, sink=True, with_dlse=True, **mask)


def test_bwd_group_split_varlen_seqused(group_split):
    run_varlen([100, 64, 257, 33], [120, 70, 257, 40], 8, 2, 128, causal=True, used_q=[90, 0, 200, 33],
               used_k=[120, 10, 250, 7])


def test_bwd_group_split_deterministic_is_bitwise_repeatable(group_split):
    import flash_attn_4_sm120 as fa

    torch.manual_seed(0)
    q, k = _rand(2, 900, 8, 128, dtype=torch.bfloat16), _rand(2, 900, 2, 128, dtype=torch.bfloat16)
    dout = _rand(2, 900, 8, 128, dtype=torch.bfloat16)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, k)]
    runs = [torch.autograd.grad(fa.flash_attn_func(*leaves, causal=True, deterministic=True)[0], leaves, dout)
            for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
