"""Block-sparse metadata (block_sparse.py) on the CPU: classes, lists, both directions, the mask-function
builder, and the checks against the kernel tile."""

import itertools

import pytest
import torch

from flash_attn_4_sm120.block_sparse import (EMPTY, FULL, PARTIAL, BlockSparseTensorsTorch, block_classes,
                                             block_sparse_from_mask, block_sparse_from_mask_fn, check_block_sparse)


def causal(b, h, q, k):
    return k <= q


def document(b, h, q, k):
    doc = lambda i: (i >= 70).long() + (i >= 190).long() + b  # noqa: E731 (batch 1 shifts the boundaries)
    return doc(q) == doc(k)


def brute_classes(mask, bq, bk):
    b, h, sq, sk = mask.shape
    out = torch.empty(b, h, -(-sq // bq), -(-sk // bk), dtype=torch.int8)
    for i, j, m, n in itertools.product(range(b), range(h), range(out.shape[2]), range(out.shape[3])):
        blk = mask[i, j, m * bq:(m + 1) * bq, n * bk:(n + 1) * bk]
        out[i, j, m, n] = EMPTY if not blk.any() else (FULL if blk.all() else PARTIAL)
    return out


def dense(fn, b, h, sq, sk):
    idx = [torch.arange(x).view(*(-1 if d == i else 1 for d in range(4))) for i, x in enumerate((b, h, sq, sk))]
    return fn(*idx).expand(b, h, sq, sk)


@pytest.mark.parametrize("fn", [causal, document], ids=["causal", "document"])
@pytest.mark.parametrize("sq, sk, bq, bk", [(300, 300, 64, 64), (129, 250, 32, 64), (64, 64, 64, 64)])
def test_classes_match_brute_force(fn, sq, sk, bq, bk):
    mask = dense(fn, 2, 1, sq, sk)
    assert torch.equal(block_classes(mask, (bq, bk)), brute_classes(mask, bq, bk))


def test_lists_both_directions():
    mask = dense(document, 2, 3, 300, 260)
    fwd, bwd = block_sparse_from_mask(mask, (64, 64))
    cls = block_classes(mask, (64, 64))
    for t, c in ((fwd, cls), (bwd, cls.transpose(-1, -2))):
        for cnt, idx, which in ((t.mask_block_cnt, t.mask_block_idx, PARTIAL), (t.full_block_cnt, t.full_block_idx, FULL)):
            assert cnt.dtype == idx.dtype == torch.int32 and idx.shape[:3] == cnt.shape == c.shape[:3]
            for pos in itertools.product(*(range(x) for x in cnt.shape)):
                want = (c[pos] == which).nonzero().flatten().tolist()
                assert int(cnt[pos]) == len(want) and idx[pos][: len(want)].tolist() == want  # ascending
    assert fwd.block_size == bwd.block_size == (64, 64)
    # every block is in exactly one list or skipped
    assert int((fwd.mask_block_cnt + fwd.full_block_cnt).sum()) == int((cls != EMPTY).sum())


def test_mask_fn_in_chunks_equals_the_dense_mask():
    got = block_sparse_from_mask_fn(document, 2, 1, 300, 260, (64, 64), rows_per_chunk=64)
    want = block_sparse_from_mask(dense(document, 2, 1, 300, 260), (64, 64))
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert a == b if not isinstance(a, torch.Tensor) else torch.equal(a, b)


def test_causal_counts_and_broadcast_shapes():
    fwd, _ = block_sparse_from_mask_fn(causal, 1, 1, 256, 256, (64, 64))
    assert fwd.mask_block_cnt.shape == (1, 1, 4)
    assert fwd.mask_block_cnt.flatten().tolist() == [1, 1, 1, 1]  # the diagonal block
    assert fwd.full_block_cnt.flatten().tolist() == [0, 1, 2, 3]  # the blocks below it


def _ok(**kw):
    fwd, _ = block_sparse_from_mask_fn(causal, 1, 1, 256, 256, (128, 64))
    return fwd._replace(**kw)


def test_check_accepts_and_returns_the_block_size():
    assert check_block_sparse(_ok(), 2, 8, 256, 256) == (128, 64)
    _, bwd = block_sparse_from_mask_fn(causal, 1, 1, 256, 256, (128, 64))
    assert check_block_sparse(bwd, 2, 8, 256, 256, backward=True) == (128, 64)
    fwd, _ = block_sparse_from_mask_fn(causal, 2, 8, 300, 1000, (256, 128))  # whole multiples, odd lengths
    assert check_block_sparse(fwd, 2, 8, 300, 1000) == (256, 128)


@pytest.mark.parametrize("kw, sizes, match", [
    (dict(block_size=(128, 96)), dict(), r"key block of 64 \(e.g. \(128, 128\)"),
    (dict(block_size=(64, 64)), dict(), "query block must be a multiple of 128"),
    (dict(block_size=None), dict(), "block_size is required"),
    (dict(cu_total_m_blocks=torch.zeros(2, dtype=torch.int32)), dict(), "not supported"),
    (dict(full_block_idx=None), dict(), "together"),
    (dict(mask_block_cnt=torch.zeros(1, 1, 3, dtype=torch.int32)), dict(), "mask_block_cnt has shape"),
    (dict(mask_block_cnt=torch.zeros(1, 1, 2, dtype=torch.int64)), dict(), "int32"),
    (dict(mask_block_idx=torch.zeros(1, 1, 2, 9, dtype=torch.int32)), dict(), "mask_block_idx has shape"),
    (dict(mask_block_idx=torch.zeros(1, 1, 4, 2, dtype=torch.int32).transpose(2, 3)), dict(), "contiguous"),
    (dict(), dict(heads=3, batch=1), None),
], ids=["key-block", "query-block", "no-size", "varlen", "half-full", "rows", "dtype", "width", "stride", "heads-1"])
def test_check_refusals(kw, sizes, match):
    args = dict(batch=2, heads=8, seqlen_q=256, seqlen_k=256) | sizes
    if match is None:  # batch / heads of 1 broadcast over any call's
        assert check_block_sparse(_ok(**kw), **args) == (128, 64)
        return
    with pytest.raises(ValueError, match=match):
        check_block_sparse(_ok(**kw), **args)


def test_check_refuses_other_objects():
    with pytest.raises(ValueError, match="must be a BlockSparseTensorsTorch"):
        check_block_sparse(torch.zeros(2, 3), 1, 1, 10, 10)


def test_named_tuple_matches_upstream_field_order():
    assert BlockSparseTensorsTorch._fields[:4] == ("mask_block_cnt", "mask_block_idx", "full_block_cnt",
                                                   "full_block_idx")
    assert "block_size" in BlockSparseTensorsTorch._fields


# -- the call's spec and the refusals (validation.with_block_sparse), on the CPU


def _shape(batch=2, heads=8, seqlen_q=256, seqlen_k=256):
    from flash_attn_4_sm120.problem import FwdShape

    return FwdShape(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_heads=heads, num_heads_kv=2)


def _sparse_call(spec=None, needs_grad=False, num_splits=None, pack_gqa=None, tensors=None, deterministic=False):
    from flash_attn_4_sm120 import validation
    from flash_attn_4_sm120.problem import FwdParams, FwdSpec

    spec = spec or FwdSpec("bf16", 128, 128, causal=False)
    params = FwdParams(softmax_scale=0.125, scale_log2=0.18, softcap_scale=0.0, window_left=0, window_right=0,
                       sink=None)
    return validation.with_block_sparse(spec, _shape(), params, tensors or _ok(), needs_grad, num_splits, pack_gqa,
                                        None, deterministic)


def test_the_spec_records_the_block_size_and_the_full_lists():
    spec, params = _sparse_call()
    assert spec.block_sparse == (128, 64, True) and len(params.sparse) == 4
    spec, params = _sparse_call(tensors=_ok(full_block_cnt=None, full_block_idx=None))
    assert spec.block_sparse == (128, 64, False) and params.sparse[2] is None


@pytest.mark.parametrize("kw, match", [
    (dict(needs_grad=True, deterministic=True), "deterministic=False with block_sparse_tensors"),
    (dict(num_splits=4), "num_splits=None or 1"),
    (dict(pack_gqa=True), "pack_gqa=None or False"),
], ids=["deterministic-backward", "split", "pack-gqa"])
def test_refused_combinations(kw, match):
    with pytest.raises(NotImplementedError, match=match):
        _sparse_call(**kw)


@pytest.mark.parametrize("spec_kw, match", [
    (dict(varlen_q=True, varlen_k=True), "use a dense batch"),
    (dict(page_size=16), "use dense K/V"),
], ids=["varlen", "paged"])
def test_refused_layouts(spec_kw, match):
    from flash_attn_4_sm120.problem import FwdSpec

    with pytest.raises(NotImplementedError, match=match):
        _sparse_call(spec=FwdSpec("bf16", 128, 128, causal=False, **spec_kw))


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("block", [(128, 128), (128, 64), (256, 192)])
def test_every_head_dim_has_a_tile_that_divides_the_blocks(d, block):
    """The predicate routes block-sparse specs to tiles whose mainloop walks the lists (cp.async, or the overlapped
    TMA one; never the plain TMA step, tma_ws or persistent) dividing the block, with and without a mask_mod, causal
    or not: a block size check_block_sparse accepts always finds a config."""
    from flash_attn_4_sm120 import flex, flex_examples
    from flash_attn_4_sm120.config import block_sparse_problems, fwd_candidates
    from flash_attn_4_sm120.execution_model import SM120
    from flash_attn_4_sm120.problem import FwdSpec

    key = flex.ModKey.of(mask_mod=flex_examples.chunked_local(256).mask_mod)
    for mods, causal in ((None, False), (None, True), (key, False)):
        spec = FwdSpec("bf16", d, d, causal, block_sparse=(*block, True), mods=mods)
        for cfg, _ in fwd_candidates(spec, SM120):
            assert not block_sparse_problems(spec, cfg)
            assert cfg.mainloop == "cp_async" or (cfg.mainloop == "tma" and cfg.overlap)
            assert not cfg.persistent
            assert block[0] % cfg.tile_m == 0 and block[1] % cfg.tile_n == 0


def test_a_gradient_is_supported():
    spec, _ = _sparse_call(needs_grad=True)
    assert spec.block_sparse == (128, 64, True)


def test_backward_lists_on_the_cpu():
    """Per KV head and key tile, entries g * query_tiles + m: the causal map at 64-row / 64-key tiles, GQA 4/2."""
    from flash_attn_4_sm120.block_sparse import backward_lists

    fwd, _ = block_sparse_from_mask_fn(causal, 1, 1, 256, 256, (128, 128))
    mc, mi, fc, fi = backward_lists(fwd, (128, 128), 4, 2, 256, 256, 64, 64)
    assert mc.shape == (1, 2, 4) and mi.shape == (1, 2, 4, 8)
    # key tile 0 (keys 0-63): the diagonal block's query tiles 0, 1 (mask) and the full block's 2, 3, per head
    assert mi[0, 0, 0, :mc[0, 0, 0]].tolist() == [0, 1, 4, 5]
    assert fi[0, 0, 0, :fc[0, 0, 0]].tolist() == [2, 3, 6, 7]
    # key tile 3 (keys 192-255): only the second diagonal block, query tiles 2, 3
    assert mi[0, 1, 3, :mc[0, 1, 3]].tolist() == [2, 3, 6, 7] and fc[0, 1, 3] == 0


def test_backward_lists_are_remembered_per_tensor_version():
    """The backward reuses the lists derived for the same forward tensors; an in-place change of a tensor or other
    tensors derive them anew (equal to ``backward_lists``)."""
    from flash_attn_4_sm120.block_sparse import backward_lists, cached_backward_lists

    fwd, _ = block_sparse_from_mask_fn(causal, 1, 1, 256, 256, (128, 128))
    args = ((128, 128), 4, 2, 256, 256, 64, 64)
    first = cached_backward_lists(fwd, *args)
    assert cached_backward_lists(fwd, *args) is first
    assert all(torch.equal(a, b) for a, b in zip(first, backward_lists(fwd, *args)))
    fwd.mask_block_cnt.zero_()  # in place: a new version
    again = cached_backward_lists(fwd, *args)
    assert again is not first and int(again[0].sum()) == 0
    other, _ = block_sparse_from_mask_fn(causal, 1, 1, 256, 256, (128, 128))
    assert all(torch.equal(a, b) for a, b in zip(cached_backward_lists(other, *args), first))


def test_backward_lists_take_a_refinement_of_the_tile_classes():
    """A refinement (the device's mask_mod pass, here a torch stand-in with the exact classes) replaces the tiles'
    classes before the lists are compacted, may give the lists the call's batch, and is part of the cache key."""
    from flash_attn_4_sm120.block_sparse import TileRefine, backward_lists, block_classes, cached_backward_lists

    sq = sk = 256
    fwd, _ = block_sparse_from_mask_fn(causal, 1, 1, sq, sk, (128, 128))
    keep = torch.arange(sk).view(1, -1) <= torch.arange(sq).view(-1, 1)
    exact = block_classes(keep.expand(3, 1, sq, sk), (64, 64))  # per batch, as a mask_mod reading b would give
    seen = []

    def run(tiles):
        seen.append(tuple(tiles.shape))
        return exact.clone()

    args = ((128, 128), 2, 1, sq, sk, 64, 64)
    plain = backward_lists(fwd, *args)
    mc, mi, fc, fi = backward_lists(fwd, *args, refine=TileRefine(run, ("k", 1)))
    assert seen == [(1, 1, 4, 4)] and mc.shape == (3, 1, 4) and plain[0].shape == (1, 1, 4)
    # key tile 0 (keys 0-63): query tile 0 is its diagonal (partial), tiles 1-3 full, per query head g = 0, 1
    assert mc[0, 0].tolist() == [2, 2, 2, 2] and fc[0, 0].tolist() == [6, 4, 2, 0]
    assert plain[0][0, 0].tolist() == [4, 4, 4, 4] and plain[2][0, 0].tolist() == [4, 4, 0, 0]
    assert sorted(fi[1, 0, 0, :6].tolist()) == [1, 2, 3, 5, 6, 7]
    first = cached_backward_lists(fwd, *args, TileRefine(run, ("k", 1)))
    assert cached_backward_lists(fwd, *args, TileRefine(run, ("k", 1))) is first
    assert cached_backward_lists(fwd, *args, TileRefine(run, ("k", 2))) is not first
    assert cached_backward_lists(fwd, *args)[0].shape == (1, 1, 4)


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("block", [(128, 128), (128, 64)])
def test_every_backward_class_has_a_tile_for_the_blocks(d, block):
    from flash_attn_4_sm120 import flex, flex_examples
    from flash_attn_4_sm120.bwd_config import bwd_config_problems, select_bwd_config
    from flash_attn_4_sm120.execution_model import SM120
    from flash_attn_4_sm120.problem import BwdSpec

    key = flex.ModKey.of(mask_mod=flex_examples.chunked_local(256).mask_mod)
    alibi = flex_examples.alibi(4)
    scored = flex.ModKey.of(score_mod=alibi.score_mod, score_mod_bwd=alibi.score_mod_bwd)
    for mods, causal in ((None, False), (None, True), (key, False), (scored, False)):
        spec = BwdSpec("bf16", d, d, causal, block_sparse=block, mods=mods)
        cfg = select_bwd_config(spec, SM120)
        assert not bwd_config_problems(spec, cfg, SM120)
        # the role split runs mask_mods in its S warp group; a score_mod's pre-mod scores keep the 8-warp tile
        assert cfg.role_split == (d == 128 and mods is not scored)
        assert block[0] % cfg.tile_m == 0 and block[1] % cfg.tile_n == 0


def test_sparse_tiles_run_longest_first():
    """Block-sparse forward tiles take the causal tiles' longest-first banded order (lists of causal-shaped masks grow
    with the query block); a dense unmasked spec keeps the plain order."""
    from flash_attn_4_sm120.config import banded_tile_order, choose_fwd_config
    from flash_attn_4_sm120.execution_model import SM120
    from flash_attn_4_sm120.problem import FwdSpec

    sparse = FwdSpec("bf16", 128, 128, False, block_sparse=(128, 128, True))
    dense = FwdSpec("bf16", 128, 128, False)
    assert sparse.longest_first and FwdSpec("bf16", 128, 128, True).longest_first and not dense.longest_first
    cfg = choose_fwd_config(sparse, SM120, 4096, 4096, 4096)
    assert cfg.tile_m == 128 and banded_tile_order(sparse, cfg)
    assert not banded_tile_order(dense, choose_fwd_config(dense, SM120, 4096, 4096, 4096))


@pytest.mark.parametrize("knobs, walks", [
    (dict(mainloop="cp_async"), True),
    (dict(mainloop="cp_async", overlap=True), True),
    (dict(mainloop="tma", overlap=True, pingpong=True), True),
    (dict(mainloop="tma"), False),
    (dict(mainloop="tma_ws"), False),
    (dict(mainloop="tma", overlap=True, pingpong=True, persistent=True), False),
])
def test_which_mainloops_walk_the_lists(knobs, walks):
    """The plain TMA step, the warp-specialized producer and the persistent loop take their tiles from the dense
    range: the predicate refuses them for block-sparse specs; cp.async and the overlapped TMA mainloop walk lists."""
    from flash_attn_4_sm120.config import FwdConfig, block_sparse_problems
    from flash_attn_4_sm120.problem import FwdSpec

    spec = FwdSpec("bf16", 128, 128, False, block_sparse=(128, 128, True))
    cfg = FwdConfig(128, 64, 8, 2, **knobs)
    assert (not block_sparse_problems(spec, cfg)) == walks
