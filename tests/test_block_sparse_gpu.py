"""Block sparsity on a GPU against an fp32 reference with the mask the lists and the mods describe,
forward and backward: the example masks built into lists (causal, prefix-LM, documents) against the same
mask_mod dense, random block maps with and without full lists, the causal flag and windows on top of lists, a
score_mod and a sink beside them, odd lengths (a full list holding the sequence's partial last block), rows with
no listed block, broadcast batch / head dimensions, every head-dim class, fp16, corrupt lists (clamped, never a
fault); gradients with the 2x rule and the backward's derived lists against the builder's transpose."""

import pytest
import torch

import flash_attn_4_sm120 as fa
from flash_attn_4_sm120 import block_sparse as bs
from flash_attn_4_sm120 import flex_examples as fx
from reference import masked_attention_ref

pytestmark = pytest.mark.gpu


def ref_attn(q, k, v, keep, upcast=True, score_fn=None, sink=None):
    """``reference.masked_attention_ref``: the mask ``keep`` (B or 1, H or 1, sq, sk; None = all), an optional
    ``score_fn(scores, bi, hi, qi, ki)`` on the scaled scores and a sink logit; fp32 or the input dtype."""
    return masked_attention_ref(q, k, v, keep, upcast, score_fn, sink)


def listed(t, sq, sk):
    """(mask-listed, full-listed) element maps (B', H', sq, sk) of forward block-sparse tensors ``t``."""
    bq, bk = t.block_size

    def expand(cnt, idx):
        b, h, m = cnt.shape
        n = -(-sk // bk)
        valid = torch.arange(idx.shape[-1], device=cnt.device) < cnt[..., None]
        # the kernel clamps indices to the key blocks; invalid slots go to a dummy column n
        cols = torch.where(valid, idx.long().clamp(0, n - 1), n)
        blocks = torch.zeros(b, h, m, n + 1, dtype=torch.bool, device=cnt.device).scatter_(-1, cols, True)[..., :n]
        el = blocks.repeat_interleave(bq, dim=2).repeat_interleave(bk, dim=3)
        return el[:, :, :sq, :sk]

    full = expand(t.full_block_cnt, t.full_block_idx) if t.full_block_cnt is not None else None
    return expand(t.mask_block_cnt, t.mask_block_idx), full


def effective_keep(t, sq, sk, mask_keep=None):
    """What the kernel keeps: mask-listed elements the mask (mask_mod) keeps, and every full-listed element."""
    in_mask, in_full = listed(t, sq, sk)
    keep = in_mask if mask_keep is None else in_mask & mask_keep
    return keep if in_full is None else keep | in_full


def check(out, lse, q, k, v, keep, **kw):
    ref, lse_ref = ref_attn(q, k, v, keep, **kw)
    pt, _ = ref_attn(q, k, v, keep, upcast=False, **kw)
    assert not out.isnan().any() and not lse.isnan().any()
    err = (out.float() - ref.float()).abs().max().item()
    pt_err = (pt.float() - ref.float()).abs().max().item()
    assert err <= 2 * pt_err + 1e-5, f"max|out-ref|={err:.3e} > 2*{pt_err:.3e}"
    neg = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), neg), "rows without keys must have lse = -inf"
    assert (lse[~neg] - lse_ref[~neg]).abs().max().item() < 1e-3
    assert out[neg.transpose(1, 2)].abs().max().item() == 0 if neg.any() else True


def _qkv(b, sq, sk, hq, hkv, d, dv=None, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(b, sq, hq, d, dtype=dtype, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=dtype, device="cuda")
    v = torch.randn(b, sk, hkv, dv or d, dtype=dtype, device="cuda")
    return q, k, v


def _mask_of(ex, sq, sk):
    dev = "cuda"
    return ex.torch_mask(torch.zeros(1, 1, 1, 1, dtype=torch.long, device=dev),
                         torch.zeros(1, 1, 1, 1, dtype=torch.long, device=dev),
                         torch.arange(sq, device=dev).view(1, 1, -1, 1), torch.arange(sk, device=dev).view(1, 1, 1, -1),
                         sq, sk)


EXAMPLES = {"causal": fx.causal(), "prefix-lm": fx.prefix_lm(200), "documents": fx.chunked_local(256)}


@pytest.mark.parametrize("block", [(128, 128), (128, 64), (256, 128)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_masks_as_lists_match_the_dense_mask(name, head_dim, block):
    """The lists built from an example's mask plus its mask_mod give the dense masked attention (full blocks
    skip the mask_mod: they are fully kept), at odd lengths where the last key block is partial."""
    ex = EXAMPLES[name]
    b, sq, sk, hq, hkv = 2, 777, 777, 8, 2
    q, k, v = _qkv(b, sq, sk, hq, hkv, head_dim)
    fwd, _ = bs.block_sparse_from_example(ex, 1, 1, sq, sk, block, "cuda")
    out, lse = fa.flash_attn_func(q, k, v, mask_mod=ex.mask_mod, block_sparse_tensors=fwd, return_lse=True)
    check(out, lse, q, k, v, _mask_of(ex, sq, sk))


@pytest.mark.parametrize("d, dv, dtype", [(96, 96, torch.bfloat16), (192, 128, torch.bfloat16),
                                          (256, 256, torch.bfloat16), (128, 128, torch.float16),
                                          (64, 64, torch.float16)], ids=["d96", "d192-128", "d256", "fp16", "fp16-d64"])
def test_head_dim_classes_and_fp16(d, dv, dtype):
    ex = EXAMPLES["documents"]
    q, k, v = _qkv(2, 600, 900, 4, 4, d, dv, dtype)
    fwd, _ = bs.block_sparse_from_example(ex, 1, 1, 600, 900, (128, 128), "cuda")
    out, lse = fa.flash_attn_func(q, k, v, mask_mod=ex.mask_mod, block_sparse_tensors=fwd, return_lse=True)
    check(out, lse, q, k, v, _mask_of(ex, 600, 900))


def random_lists(b, h, sq, sk, block, density, full_share, seed, device="cuda"):
    """Forward tensors of a random block map: each block listed with probability ``density``, a listed block
    full with probability ``full_share``; per (batch, head)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    m, n = -(-sq // block[0]), -(-sk // block[1])
    listed_ = torch.rand(b, h, m, n, generator=g) < density
    full = listed_ & (torch.rand(b, h, m, n, generator=g) < full_share)
    cls = torch.where(full, bs.FULL, torch.where(listed_, bs.PARTIAL, bs.EMPTY)).to(torch.int8)
    fwd, _ = bs.block_sparse_from_classes(cls.to(device), block)
    return fwd


@pytest.mark.parametrize("full_share", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_random_block_maps(head_dim, full_share):
    """Without a mask_mod, every element of a listed block is kept (bounds aside): the output is attention over
    the union of the listed blocks; some rows list no block (out 0, lse -inf); distinct lists per batch and head."""
    b, sq, sk, hq, hkv = 2, 700, 1000, 4, 2
    q, k, v = _qkv(b, sq, sk, hq, hkv, head_dim, seed=1)
    fwd = random_lists(b, hq, sq, sk, (128, 128), 0.25, full_share, seed=head_dim)
    out, lse = fa.flash_attn_func(q, k, v, block_sparse_tensors=fwd, return_lse=True)
    check(out, lse, q, k, v, effective_keep(fwd, sq, sk))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_full_blocks_skip_the_mask_mod(head_dim):
    """Upstream's contract: a full-listed block is attended whole, the mask_mod not evaluated there (here a
    document mask_mod that would drop most of a random map's full blocks), mask-listed blocks through it; the
    forward (both sparse mainloops' full-list steps) and the backward keep the same elements."""
    ex = EXAMPLES["documents"]
    b, sq, sk, hq, hkv = 2, 640, 896, 4, 2
    q, k, v = _qkv(b, sq, sk, hq, hkv, head_dim, seed=3)
    fwd = random_lists(b, hq, sq, sk, (128, 128), 0.5, 0.5, seed=17 + head_dim)
    keep = effective_keep(fwd, sq, sk, _mask_of(ex, sq, sk))
    out, lse = fa.flash_attn_func(q, k, v, mask_mod=ex.mask_mod, block_sparse_tensors=fwd, return_lse=True)
    check(out, lse, q, k, v, keep)
    check_grads(q, k, v, keep, lambda *t: fa.flash_attn_func(*t, mask_mod=ex.mask_mod, block_sparse_tensors=fwd)[0])


def test_without_full_lists_and_broadcast_dimensions():
    b, sq, sk, hq, hkv = 3, 512, 640, 8, 1
    q, k, v = _qkv(b, sq, sk, hq, hkv, 128, seed=2)
    fwd = random_lists(1, hq, sq, sk, (128, 64), 0.3, 0.0, seed=5)
    fwd = fwd._replace(full_block_cnt=None, full_block_idx=None)
    out, lse = fa.flash_attn_func(q, k, v, block_sparse_tensors=fwd, return_lse=True)
    check(out, lse, q, k, v, effective_keep(fwd, sq, sk))


@pytest.mark.parametrize("window", [None, (300, 0), (200, 100)], ids=["causal", "causal-window", "window"])
def test_causal_flag_and_windows_on_top_of_lists(window):
    """Full blocks the diagonal or a window edge crosses are masked element-wise: the flags' mask always holds."""
    b, sq, sk, hq, hkv = 2, 800, 900, 4, 2
    q, k, v = _qkv(b, sq, sk, hq, hkv, 128, seed=3)
    fwd = random_lists(b, hq, sq, sk, (128, 128), 0.6, 0.7, seed=7)
    causal = window is None or window[1] == 0
    kw = dict(causal=causal) if window is None else dict(causal=causal, window_size=window)
    out, lse = fa.flash_attn_func(q, k, v, block_sparse_tensors=fwd, return_lse=True, **kw)
    qi = torch.arange(sq, device="cuda").view(-1, 1) + (sk - sq)
    ki = torch.arange(sk, device="cuda").view(1, -1)
    left, right = window if window is not None else (None, 0)
    flag = ki <= qi + right
    if left is not None:
        flag &= ki >= qi - left
    check(out, lse, q, k, v, effective_keep(fwd, sq, sk) & flag)


def test_score_mod_and_sink_beside_lists():
    ex = fx.combined(fx.alibi(8), fx.chunked_local(256))
    b, sq, sk = 2, 640, 640
    q, k, v = _qkv(b, sq, sk, 8, 2, 128, seed=4)
    sink = torch.randn(8, device="cuda")
    fwd, _ = bs.block_sparse_from_example(ex, 1, 1, sq, sk, (128, 128), "cuda")
    out, lse = fa.flash_attn_func(q, k, v, score_mod=ex.score_mod, mask_mod=ex.mask_mod, learnable_sink=sink,
                                  block_sparse_tensors=fwd, return_lse=True)

    def score_fn(scores, bi, hi, qi, ki):
        return ex.torch_score(scores, bi, hi, qi, ki, sq, sk)

    check(out, lse, q, k, v, _mask_of(ex, sq, sk), score_fn=score_fn, sink=sink)


def test_documents_from_an_aux_tensor_with_lists():
    doc_ids = (torch.arange(1024, device="cuda", dtype=torch.int32) // 300).to(torch.int32)
    ex = fx.documents(doc_ids)
    q, k, v = _qkv(2, 1024, 1024, 8, 2, 128, seed=6)
    fwd, _ = bs.block_sparse_from_example(ex, 1, 1, 1024, 1024, (128, 128), "cuda")
    out, lse = fa.flash_attn_func(q, k, v, mask_mod=ex.mask_mod, aux_tensors=list(ex.aux_tensors),
                                  block_sparse_tensors=fwd, return_lse=True)
    check(out, lse, q, k, v, _mask_of(ex, 1024, 1024))


def test_corrupt_lists_are_clamped_not_faults():
    """Counts past the lists' width or negative and indices past the key blocks or negative: the kernel clamps
    them (wrong attention, by the caller's fault, but no fault and no NaN)."""
    b, sq, sk = 2, 500, 300
    q, k, v = _qkv(b, sq, sk, 4, 4, 128, seed=8)
    fwd = random_lists(b, 4, sq, sk, (128, 128), 0.5, 0.5, seed=9)
    cnt = fwd.mask_block_cnt.clone()
    cnt[0, 0, 0], cnt[1, 1, 1] = 1000, -5
    idx = fwd.mask_block_idx.clone()
    idx[0, :, :, 0], idx[1, :, :, -1] = 1 << 30, -(1 << 30)
    full_idx = fwd.full_block_idx.clone().fill_(77)
    bad = fwd._replace(mask_block_cnt=cnt, mask_block_idx=idx, full_block_idx=full_idx,
                       full_block_cnt=fwd.full_block_cnt.clone().fill_(1 << 20))
    out, lse = fa.flash_attn_func(q, k, v, block_sparse_tensors=bad, return_lse=True)
    torch.cuda.synchronize()
    assert not out.isnan().any()


def test_layouts_and_deterministic_backward_are_refused():
    q, k, v = _qkv(1, 256, 256, 4, 4, 64)
    fwd, _ = bs.block_sparse_from_example(fx.causal(), 1, 1, 256, 256, (128, 128), "cuda")
    with pytest.raises(NotImplementedError, match="deterministic=False with block_sparse_tensors"):
        fa.flash_attn_func(q.clone().requires_grad_(), k, v, block_sparse_tensors=fwd, deterministic=True)
    with pytest.raises(NotImplementedError, match="num_splits=None or 1"):
        fa.flash_attn_func(q, k, v, block_sparse_tensors=fwd, num_splits=3)
    with pytest.raises(ValueError, match="multiple of 128"):
        fa.flash_attn_func(q, k, v, block_sparse_tensors=fwd._replace(block_size=(64, 128)))


# -- the backward (lists derived from the forward's: block_sparse.backward_lists)


def _grads(q, k, v, dout, fn):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = fn(*leaves)
    return torch.autograd.grad(out.float(), leaves, dout.float())


def check_grads(q, k, v, keep, call, atol=1e-4, **ref_kw):
    """dQ / dK / dV of ``call(q, k, v)`` against autograd of the fp32 reference with mask ``keep`` (2x rule)."""
    dout = torch.randn(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device="cuda")
    got = _grads(q, k, v, dout, call)
    ref = _grads(q, k, v, dout, lambda *t: ref_attn(*t, keep, **ref_kw)[0].float())
    pt = _grads(q, k, v, dout, lambda *t: ref_attn(*t, keep, upcast=False, **ref_kw)[0])
    for n, g, r, p in zip("qkv", got, ref, pt):
        assert not g.isnan().any(), f"d{n} has NaN"
        err, pt_err = (g.float() - r.float()).abs().max().item(), (p.float() - r.float()).abs().max().item()
        assert err <= 2 * pt_err + atol, f"d{n}: max|g-ref|={err:.3e} > 2*{pt_err:.3e}"


@pytest.mark.parametrize("block", [(128, 128), (128, 64)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_backward_of_example_masks(name, head_dim, block):
    ex = EXAMPLES[name]
    sq = sk = 555
    q, k, v = _qkv(2, sq, sk, 8, 2, head_dim, seed=11)
    fwd, _ = bs.block_sparse_from_example(ex, 1, 1, sq, sk, block, "cuda")
    check_grads(q, k, v, _mask_of(ex, sq, sk),
                lambda *t: fa.flash_attn_func(*t, mask_mod=ex.mask_mod, block_sparse_tensors=fwd)[0])


@pytest.mark.parametrize("full_share", [0.0, 0.6])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_backward_of_random_block_maps(head_dim, full_share):
    """Per-(batch, head) lists, GQA 4/2: the backward's per-KV-head lists walk each query head's own blocks."""
    b, sq, sk = 2, 400, 700
    q, k, v = _qkv(b, sq, sk, 4, 2, head_dim, seed=12)
    fwd = random_lists(b, 4, sq, sk, (128, 128), 0.3, full_share, seed=13 + head_dim)
    check_grads(q, k, v, effective_keep(fwd, sq, sk), lambda *t: fa.flash_attn_func(*t, block_sparse_tensors=fwd)[0])


@pytest.mark.parametrize("d, dv, dtype", [(96, 96, torch.bfloat16), (192, 128, torch.bfloat16),
                                          (256, 256, torch.bfloat16), (128, 128, torch.float16)],
                         ids=["d96", "d192-128", "d256", "fp16"])
def test_backward_head_dim_classes_with_a_mask_mod(d, dv, dtype):
    ex = EXAMPLES["documents"]
    q, k, v = _qkv(2, 300, 520, 4, 2, d, dv, dtype, seed=14)
    fwd, _ = bs.block_sparse_from_example(ex, 1, 1, 300, 520, (128, 128), "cuda")
    check_grads(q, k, v, _mask_of(ex, 300, 520),
                lambda *t: fa.flash_attn_func(*t, mask_mod=ex.mask_mod, block_sparse_tensors=fwd)[0])


def test_backward_with_the_causal_flag_score_mod_and_sink():
    """The causal flag on top of random lists; then ALiBi (score_mod_bwd) beside document lists with a sink."""
    b, sq, sk = 2, 384, 512
    q, k, v = _qkv(b, sq, sk, 8, 2, 128, seed=15)
    fwd = random_lists(b, 8, sq, sk, (128, 128), 0.6, 0.7, seed=16)
    qi = torch.arange(sq, device="cuda").view(-1, 1) + (sk - sq)
    flag = torch.arange(sk, device="cuda").view(1, -1) <= qi
    check_grads(q, k, v, effective_keep(fwd, sq, sk) & flag,
                lambda *t: fa.flash_attn_func(*t, causal=True, block_sparse_tensors=fwd)[0])
    ex = fx.combined(fx.alibi(8), fx.chunked_local(256))
    sink = torch.randn(8, device="cuda")
    docs, _ = bs.block_sparse_from_example(ex, 1, 1, sq, sk, (128, 128), "cuda")

    def score_fn(scores, bi, hi, qi, ki):
        return ex.torch_score(scores, bi, hi, qi, ki, sq, sk)

    check_grads(q, k, v, _mask_of(ex, sq, sk),
                lambda *t: fa.flash_attn_func(*t, score_mod=ex.score_mod, score_mod_bwd=ex.score_mod_bwd,
                                              mask_mod=ex.mask_mod, learnable_sink=sink,
                                              block_sparse_tensors=docs)[0],
                score_fn=score_fn, sink=sink)


def test_backward_lists_match_a_dense_transpose():
    """The device-side derivation against the builder's own transposed tensors, expanded to 64-row tiles."""
    ex = EXAMPLES["prefix-lm"]
    fwd, bwd = bs.block_sparse_from_example(ex, 1, 1, 512, 512, (128, 128), "cuda")
    mc, mi, fc, fi = bs.backward_lists(fwd, (128, 128), 2, 1, 512, 512, 64, 64)
    # key tile 2j and 2j + 1 of key block j list the query tiles 2m, 2m + 1 of each listed query block m, per head
    for j in range(4):
        want_mask = sorted(g * 8 + 2 * m + r for g in range(2) for m in bwd.mask_block_idx[0, 0, j,
                           :bwd.mask_block_cnt[0, 0, j]].tolist() for r in range(2))
        want_full = sorted(g * 8 + 2 * m + r for g in range(2) for m in bwd.full_block_idx[0, 0, j,
                           :bwd.full_block_cnt[0, 0, j]].tolist() for r in range(2))
        for tile in (2 * j, 2 * j + 1):
            assert sorted(mi[0, 0, tile, :mc[0, 0, tile]].tolist()) == want_mask
            assert sorted(fi[0, 0, tile, :fc[0, 0, tile]].tolist()) == want_full


def _refine(ex, b, hq, sq, sk, tile=(64, 64)):
    """The backward's ``TileRefine`` of a call with ``ex``'s mask_mod (and aux tensors) at ``tile``."""
    from types import SimpleNamespace

    from flash_attn_4_sm120 import backward, flex, launch
    from flash_attn_4_sm120.problem import BwdSpec, FwdShape

    mods = flex.register(flex.ModKey.of(mask_mod=ex.mask_mod, aux_tensors=ex.aux_tensors), mask_mod=ex.mask_mod)
    bspec = BwdSpec("bf16", 128, 128, causal=False, mods=mods, block_sparse=(128, 128))
    shape = FwdShape(batch=b, seqlen_q=sq, seqlen_k=sk, num_heads=hq, num_heads_kv=hq)
    model, target = launch.model_and_target(torch.cuda.current_device(), None, None)
    cfg = SimpleNamespace(tile_m=tile[0], tile_n=tile[1])
    return backward._tile_refine(bspec, cfg, shape, tuple(ex.aux_tensors), model, target)


@pytest.mark.parametrize("tile", [(64, 64), (32, 64), (64, 128)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_refined_backward_lists_are_the_exact_tile_classes(name, tile):
    """The lists of (128, 128) blocks refined by the mask_mod on the device equal the lists of the mask's own
    tile classes: a partial block's wholly kept tiles are full steps, its wholly dropped ones are not visited."""
    ex = EXAMPLES[name]
    sq, sk, hq = 555, 700, 2
    fwd, _ = bs.block_sparse_from_example(ex, 1, hq, sq, sk, (128, 128), "cuda")
    got = bs.backward_lists(fwd, (128, 128), hq, 1, sq, sk, *tile, refine=_refine(ex, 1, hq, sq, sk, tile))
    exact = bs.block_classes(_mask_of(ex, sq, sk).expand(1, hq, sq, sk), tile)  # (1, H, mt, nt)
    mt, nt = exact.shape[2:]
    steps = exact.permute(0, 3, 1, 2).reshape(1, 1, nt, hq * mt)  # per key tile: g * mt + m
    want = bs._lists(steps, bs.PARTIAL) + bs._lists(steps, bs.FULL)
    for g, w, label in zip(got, want, ("mask_cnt", "mask_idx", "full_cnt", "full_idx")):
        assert torch.equal(g, w), label
    unrefined = bs.backward_lists(fwd, (128, 128), hq, 1, sq, sk, *tile)
    refined, before = int(got[0].sum()), int(unrefined[0].sum())
    # every example's diagonal blocks hold whole 64 x 64 tiles (at 64 x 128 only the causal one)
    assert refined < before if tile[1] == 64 or name == "causal" else refined <= before


def _batch_documents(doc_ids):
    """Documents that differ per batch (``doc_ids`` (B, S) int32, ``aux_tensors[0]``), causal inside: the mask_mod
    reads its batch argument."""

    def mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        import cutlass
        import cutlass.cute as cute

        batch, rows, cols = (cute.make_rmem_tensor((1,), cutlass.Int32) for _ in range(3))
        batch.store(b)
        rows.store(q_idx)
        cols.store(kv_idx)
        diff = cute.make_rmem_tensor((1,), cutlass.Int32)
        diff[0] = cutlass.Int32(aux_tensors[0][batch[0], rows[0]]) - cutlass.Int32(aux_tensors[0][batch[0], cols[0]])
        return (diff.load() == 0) & (kv_idx <= q_idx)

    def torch_mask(b, h, q, k, seqlen_q, seqlen_k):
        return (doc_ids[b, q] == doc_ids[b, k]) & (k <= q)

    return fx.Example("batch-documents", mask_mod=mask_mod, torch_mask=torch_mask, aux_tensors=(doc_ids,))


def test_refinement_per_batch_and_after_an_aux_tensor_changes():
    """Lists that list every block as partial, shared by the batch (broadcast), beside a mask_mod that reads its
    batch and an aux tensor: the refinement evaluates every batch (the tiles differ per batch), and an in-place
    change of the aux tensor gives new lists (the cached ones would be wrong)."""
    b, s, hq, hkv = 3, 640, 4, 2
    cuts = torch.tensor([[0, 100, 380], [0, 256, 512], [0, 300, 301]], device="cuda")
    pos = torch.arange(s, device="cuda")
    doc_ids = ((pos.view(1, -1) >= cuts[:, 1:2]).int() + (pos.view(1, -1) >= cuts[:, 2:3]).int()).to(torch.int32)
    ex = _batch_documents(doc_ids)
    n = -(-s // 128)
    every = torch.arange(n, dtype=torch.int32, device="cuda").expand(1, 1, n, n).contiguous()
    lists = bs.BlockSparseTensorsTorch(torch.full((1, 1, n), n, dtype=torch.int32, device="cuda"), every,
                                       block_size=(128, 128))
    q, k, v = _qkv(b, s, s, hq, hkv, 128, seed=21)

    def keep_now():
        bi = torch.arange(b, device="cuda").view(-1, 1, 1, 1)
        return ex.torch_mask(bi, None, pos.view(1, 1, -1, 1), pos.view(1, 1, 1, -1), s, s)

    def call(*t):
        return fa.flash_attn_func(*t, mask_mod=ex.mask_mod, aux_tensors=[doc_ids], block_sparse_tensors=lists)[0]

    check_grads(q, k, v, keep_now(), call)
    doc_ids.copy_(doc_ids.flip(0).clone())  # other documents, same tensor, same lists
    check_grads(q, k, v, keep_now(), call)
