"""``batch_invariant=True`` on a GPU: a row's output and LSE, and a sequence's gradients, bitwise the same across
batch size and composition, packed and dense layouts, prefill, chunked prefill and decode, dense and paged K/V, and
shapes where the default dispatch would split the keys, pick another tile or split the backward's group."""

import pytest
import torch

import flash_attn_4_sm120 as fa
from flash_attn_4_sm120 import invariance
from reference import attention_ref

pytestmark = pytest.mark.gpu

HEAD_DIMS = [64, 96, 128, 192, 256]


def _randn(*shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)


def _packed(tensors):
    return torch.cat([t[0] for t in tensors]), torch.tensor([0, *torch.tensor([t.shape[1] for t in tensors]).cumsum(0)],
                                                             dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_a_sequence_alone_and_in_batches_of_other_sizes(d, causal):
    """Sequence 0 alone, in a dense batch of 3 and packed beside sequences of other lengths (GQA 4:1): the same bits,
    and the result matches the fp32 reference within the usual rule."""
    hq, hkv, n = 8, 2, 700
    q, k, v = (_randn(1, n, h, d, seed=i) for i, h in enumerate((hq, hkv, hkv)))
    alone, lse_alone = fa.flash_attn_func(q, k, v, causal=causal, return_lse=True, batch_invariant=True)
    others = [tuple(_randn(1, n, h, d, seed=10 * j + i) for i, h in enumerate((hq, hkv, hkv))) for j in (1, 2)]
    dense = [torch.cat([t[i] for t in [(q, k, v), *others]]) for i in range(3)]
    out3, lse3 = fa.flash_attn_func(*dense, causal=causal, return_lse=True, batch_invariant=True)
    assert torch.equal(out3[:1], alone) and torch.equal(lse3[:1], lse_alone)
    lens = [n, 33, 1500]
    mixed = [(q, k, v)] + [tuple(_randn(1, m, h, d, seed=100 + m + i) for i, h in enumerate((hq, hkv, hkv)))
                           for m in lens[1:]]
    (qp, cu), (kp, _), (vp, _) = (_packed([t[i] for t in mixed]) for i in range(3))
    outp, lsep = fa.flash_attn_varlen_func(qp, kp, vp, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens),
                                           max_seqlen_k=max(lens), causal=causal, return_lse=True,
                                           batch_invariant=True)
    assert torch.equal(outp[:n], alone[0]) and torch.equal(lsep[:, :n], lse_alone[0])
    ref, _ = attention_ref(q, k, v, None, causal)
    pt, _ = attention_ref(q, k, v, None, causal, upcast=False)
    assert (alone.float() - ref.float()).abs().max() <= 2 * (pt.float() - ref.float()).abs().max() + 1e-5


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_prefill_chunked_prefill_and_decode_rows_agree(d):
    """A causal prefill over two chunks and a part (``invariance.chunk_keys``, C); the same rows as a chunk of a
    chunked prefill (100 rows ending 700 keys before the end), as single-row decode steps through
    flash_attn_with_kvcache over a paged cache and through flash_attn_varlen_func over dense K/V: the same bits.
    Row C - 1 sees one chunk (its decode runs unsplit), row C two, the last row three; the default would split each
    decode its own way."""
    c = invariance.chunk_keys()
    hq, hkv, n = 16, 2, 2 * c + 704
    q, k, v = (_randn(1, n, h, d, seed=i) for i, h in enumerate((hq, hkv, hkv)))
    full, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True, batch_invariant=True)
    lo, hi = n - 800, n - 700
    chunk, lse_c = fa.flash_attn_func(q[:, lo:hi], k[:, :hi], v[:, :hi], causal=True, return_lse=True,
                                      batch_invariant=True)
    assert torch.equal(chunk, full[:, lo:hi]) and torch.equal(lse_c, lse[..., lo:hi])
    page = 16
    pages = n // page
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(1)).to("cuda")
    k_cache = torch.zeros(pages + 3, page, hkv, d, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    k_cache[order] = k[0].view(pages, page, hkv, d)
    v_cache[order] = v[0].view(pages, page, hkv, d)
    table = order.to(torch.int32)[None]
    for row in (c - 1, c, n - 1):
        step, lse_s = fa.flash_attn_with_kvcache(q[:, row:row + 1], k_cache, v_cache,
                                                 cache_seqlens=torch.tensor([row + 1], dtype=torch.int32,
                                                                            device="cuda"),
                                                 page_table=table, causal=True, return_softmax_lse=True,
                                                 batch_invariant=True)
        assert torch.equal(step, full[:, row:row + 1]) and torch.equal(lse_s, lse[..., row:row + 1])
        dense, lse_d = fa.flash_attn_varlen_func(q[:, row:row + 1], k[:, :row + 1], v[:, :row + 1], causal=True,
                                                 return_lse=True, batch_invariant=True)
        assert torch.equal(dense, full[:, row:row + 1]) and torch.equal(lse_d, lse[..., row:row + 1])
    ref, _ = attention_ref(q, k, v, None, True)
    pt, _ = attention_ref(q, k, v, None, True, upcast=False)
    assert (full.float() - ref.float()).abs().max() <= 2 * (pt.float() - ref.float()).abs().max() + 1e-5


def test_a_long_decode_runs_in_chunks_and_matches_its_prefill_row():
    """One row over 16384 keys at 8 / 1 heads: batch-invariant runs it in chunks (a CTA each where unsplit it had
    one CTA) and gives the prefill's last row; with a learnable sink, which every batch-invariant call adds in the
    combine, a decode row of one chunk and one of two each match their prefill's row."""
    d, n = 128, 16384
    q, k, v = _randn(1, n, 8, d, seed=1), _randn(1, n, 1, d, seed=2), _randn(1, n, 1, d, seed=3)
    last, lse = fa.flash_attn_func(q[:, -1:], k, v, causal=True, return_lse=True, batch_invariant=True)
    split, _ = fa.flash_attn_func(q[:, -1:], k, v, causal=True, return_lse=True)
    full, lse_f = fa.flash_attn_func(q[:, -300:], k, v, causal=True, return_lse=True, batch_invariant=True)
    assert torch.equal(last, full[:, -1:]) and torch.equal(lse, lse_f[..., -1:])
    assert (last.float() - split.float()).abs().max() < 2e-2  # the default: the same values to rounding
    sink = torch.randn(8, device="cuda")
    c = invariance.chunk_keys()
    m = c + c // 2
    prefill, lse_p = fa.flash_attn_func(q[:, :m], k[:, :m], v[:, :m], causal=True, learnable_sink=sink,
                                        return_lse=True, batch_invariant=True)
    for row in (c // 2, m - 1):  # one chunk, two
        step, lse_s = fa.flash_attn_func(q[:, row:row + 1], k[:, :row + 1], v[:, :row + 1], causal=True,
                                         learnable_sink=sink, return_lse=True, batch_invariant=True)
        assert torch.equal(step, prefill[:, row:row + 1]) and torch.equal(lse_s, lse_p[..., row:row + 1])


@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("left", [1000, "wide"])
def test_window_rows_agree_between_prefill_and_decode(left, with_sink):
    """Sliding windows over a prefill longer than a chunk: a window narrower than a chunk runs uncut (with a sink,
    merged in the combine as one piece), a wider one in chunks; either way a decode step's row is the prefill's."""
    c = invariance.chunk_keys()
    d, n = 128, c + 600
    left = c + 100 if left == "wide" else left
    q, k, v = _randn(1, n, 8, d, seed=4), _randn(1, n, 2, d, seed=5), _randn(1, n, 2, d, seed=6)
    sink = torch.randn(8, device="cuda") if with_sink else None
    full, lse = fa.flash_attn_func(q, k, v, causal=True, window_size=(left, 0), learnable_sink=sink,
                                   return_lse=True, batch_invariant=True)
    for row in (c - 1, n - 1):
        step, lse_s = fa.flash_attn_func(q[:, row:row + 1], k[:, :row + 1], v[:, :row + 1], causal=True,
                                         window_size=(left, 0), learnable_sink=sink, return_lse=True,
                                         batch_invariant=True)
        assert torch.equal(step, full[:, row:row + 1]) and torch.equal(lse_s, lse[..., row:row + 1])


@pytest.mark.parametrize("d", [64, 128, 192])
def test_gradients_of_a_sequence_alone_and_in_a_batch(d):
    """The backward of sequence 0 alone (a small GQA grid: the deterministic mode would split the group and pick
    its order by shape), inside a dense batch of 4 and packed beside another sequence: the same dq, dk, dv bits."""
    hq, hkv, n = 16, 2, 640

    def grads(batch):
        q, k, v = (torch.cat([_randn(1, n, h, d, seed=10 * j + i) for j in range(batch)]).requires_grad_()
                   for i, h in enumerate((hq, hkv, hkv)))
        dout = torch.cat([_randn(1, n, hq, d, seed=100 + j) for j in range(batch)])
        out = fa.flash_attn_func(q, k, v, causal=True, batch_invariant=True)[0]
        return [g[:1] for g in torch.autograd.grad(out, (q, k, v), dout)]

    alone = grads(1)
    for a, b in zip(alone, grads(4)):
        assert torch.equal(a, b)
    # packed beside a sequence of another length: the backward runs the same tile (bwd_invariant_config)
    seqs = [[_randn(1, m, h, d, seed=10 * j + i)[0] for i, h in enumerate((hq, hkv, hkv))]
            for j, m in ((0, n), (7, 333))]
    q, k, v = (torch.cat([s[i] for s in seqs]).requires_grad_() for i in range(3))
    dout = torch.cat([_randn(1, n, hq, d, seed=100)[0], _randn(1, 333, hq, d, seed=107)[0]])
    cu = torch.tensor([0, n, n + 333], dtype=torch.int32, device="cuda")
    out = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n, max_seqlen_k=n,
                                    causal=True, batch_invariant=True)[0]
    for a, b in zip(alone, torch.autograd.grad(out, (q, k, v), dout)):
        assert torch.equal(a[0], b[:n])


def test_the_environment_switch_gives_the_arguments_bits(monkeypatch):
    q, k, v = _randn(2, 300, 4, 64, seed=1), _randn(2, 300, 4, 64, seed=2), _randn(2, 300, 4, 64, seed=3)
    explicit = fa.flash_attn_func(q, k, v, causal=True, batch_invariant=True)[0]
    monkeypatch.setenv(invariance.BATCH_INVARIANT_ENV, "1")
    assert torch.equal(fa.flash_attn_func(q, k, v, causal=True)[0], explicit)
    assert torch.equal(fa.flash_attn_func(q, k, v, causal=True)[0], explicit)  # the remembered plan


def _same_width_tiles():
    """(head dim, config): the batch-invariant family's tiles and one config of every kind (mainloop, overlap,
    ping-pong, persistence, stage hand-back, warps, rows) the tuner may build at the class's invariant key width, at
    each class's head dim."""
    from flash_attn_4_sm120.config import (INVARIANT_TILE_N, FwdSpec, candidate_fwd_configs, invariant_family,
                                           same_row_arithmetic)
    from flash_attn_4_sm120.execution_model import resolve_dispatch_model

    model = resolve_dispatch_model(None, "sm120")
    params = []
    for d, width in INVARIANT_TILE_N.items():
        kinds = {}
        family = [cfg for causal in (False, True) for shared in (False, True)
                  for cfg, _ in invariant_family(FwdSpec("bf16", d, d, causal=causal), model, shared)]
        for cfg in family + list(candidate_fwd_configs(FwdSpec("bf16", d, d, causal=True), model)):
            if same_row_arithmetic(cfg, width):
                kinds.setdefault((cfg.mainloop, cfg.pingpong, cfg.overlap, cfg.persistent, cfg.mbarrier_release,
                                  cfg.num_warps, cfg.tile_m), cfg)
        params += [pytest.param(d, cfg, id=f"d{d}-{i}") for i, cfg in enumerate(kinds.values())]
    return params


@pytest.mark.parametrize("d, cfg", _same_width_tiles())
def test_every_tile_of_one_key_width_gives_the_same_bits(d, cfg):
    """``config.same_row_arithmetic``: every tile kind at a class's invariant key width (cp.async, TMA, warp-specialized,
    overlapped, ping-pong, persistent; 64-256 rows on 4 or 8 warps) gives a row the bits of the 64-row cp.async tile,
    causal (diagonal blocks masked) and with a window, softcap and sink, so batch-invariant calls may pick any of them
    by shape."""
    from flash_attn_4_sm120.config import FwdConfig, fwd_config_problems
    from flash_attn_4_sm120.launch import launch_fwd
    from flash_attn_4_sm120.problem import validate_fwd

    q, k, v = _randn(2, 300, 6, d, seed=d), _randn(2, 517, 2, d, seed=d + 1), _randn(2, 517, 2, d, seed=d + 2)
    sink = torch.randn(6, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    for features in (dict(causal=True), dict(causal=False, window_size=(100, 20), softcap=20.0, learnable_sink=sink)):
        spec, shape, params = validate_fwd(q, k, v, None, features["causal"], features.get("window_size", (None, None)),
                                           features.get("softcap", 0.0), features.get("learnable_sink"))
        base = next(c for st in (2, 1) for c in [FwdConfig(64, cfg.tile_n, 4, st)]
                    if not fwd_config_problems(spec, c, fa.dispatch_model(q.device)))
        results = []
        for config in (base, cfg):
            out = torch.full((2, 300, 6, d), float("nan"), dtype=q.dtype, device="cuda")
            lse = torch.full((2, 6, 300), float("nan"), dtype=torch.float32, device="cuda")
            launch_fwd(q, k, v, spec, shape, params, out, lse, config=config, num_splits=1)
            results.append((out, lse))
        (out0, lse0), (out1, lse1) = results
        assert not out0.isnan().any() and torch.equal(out0, out1) and torch.equal(lse0, lse1), features
