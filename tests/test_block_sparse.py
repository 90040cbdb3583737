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


def test_check_accepts_and_returns_the_tile_factor():
    assert check_block_sparse(_ok(), 2, 8, 256, 256, tile_m=64, tile_n=64) == 2
    _, bwd = block_sparse_from_mask_fn(causal, 1, 1, 256, 256, (128, 64))
    assert check_block_sparse(bwd, 2, 8, 256, 256, tile_m=64, tile_n=64, backward=True) == 2


@pytest.mark.parametrize("kw, sizes, match", [
    (dict(), dict(tile_n=128), "key block 64 must equal the kernel's tile_n=128"),
    (dict(), dict(tile_m=96), "multiple of the kernel's tile_m=96"),
    (dict(block_size=None), dict(), "block_size is required"),
    (dict(cu_total_m_blocks=torch.zeros(2, dtype=torch.int32)), dict(), "not supported"),
    (dict(full_block_idx=None), dict(), "together"),
    (dict(mask_block_cnt=torch.zeros(1, 1, 3, dtype=torch.int32)), dict(), "mask_block_cnt has shape"),
    (dict(mask_block_cnt=torch.zeros(1, 1, 2, dtype=torch.int64)), dict(), "int32"),
    (dict(mask_block_idx=torch.zeros(1, 1, 2, 9, dtype=torch.int32)), dict(), "mask_block_idx has shape"),
], ids=["tile_n", "tile_m", "no-size", "varlen", "half-full", "rows", "dtype", "width"])
def test_check_refusals(kw, sizes, match):
    args = dict(batch=2, heads=8, seqlen_q=256, seqlen_k=256, tile_m=64, tile_n=64) | sizes
    with pytest.raises(ValueError, match=match):
        check_block_sparse(_ok(**kw), **args)


def test_named_tuple_matches_upstream_field_order():
    assert BlockSparseTensorsTorch._fields[:4] == ("mask_block_cnt", "mask_block_idx", "full_block_cnt",
                                                   "full_block_idx")
    assert "block_size" in BlockSparseTensorsTorch._fields
