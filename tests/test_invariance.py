"""Batch invariance on the host (``invariance.py``, ``config.invariant_config``, ``backward.bwd_launch``): one forward
tile per head-dim class for every layout, the refusals before anything runs, and the backward's fixed order. The
bitwise checks are in ``test_invariance_gpu.py``."""

from dataclasses import replace

import pytest
import torch

import flash_attn_4_sm120 as fa
from flash_attn_4_sm120 import backward, invariance
from flash_attn_4_sm120.config import (INVARIANT_TILE_N, choose_fwd_config, fwd_config_problems, head_dim_class,
                                       invariant_config, invariant_family, same_row_arithmetic)
from flash_attn_4_sm120.execution_model import SM120
from flash_attn_4_sm120.problem import BwdSpec, FwdShape, FwdSpec


def _layouts(d, dtype="bf16"):
    base = FwdSpec(dtype, d, d, causal=True)
    return [base, replace(base, causal=False), replace(base, causal=False, local=True),
            replace(base, softcap=True, has_sink=True), replace(base, varlen_q=True, varlen_k=True, seqused_q=True,
                                                                seqused_k=True),
            replace(base, pack_gqa=True), replace(base, seqused_k=True, page_size=16, pack_gqa=True),
            replace(base, seqused_k=True, page_size=1), replace(base, varlen_q=True, seqused_k=True, page_size=256)]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("d", list(range(8, 257, 8)))
def test_every_layout_runs_tiles_of_one_row_arithmetic(d, dtype):
    """Every layout, mask and feature of a head dim runs valid tiles of INVARIANT_TILE_N keys with each row's block on
    one warp (``same_row_arithmetic``), whatever the shape: prefill, decode, K/V shared between heads or not."""
    width = INVARIANT_TILE_N[head_dim_class(FwdSpec(dtype, d, d, causal=True))]
    for spec in _layouts(d, dtype):
        for shared_kv in (True, False):
            for cfg, _ in invariant_family(spec, SM120, shared_kv):
                assert fwd_config_problems(spec, cfg, SM120) == ()
                assert same_row_arithmetic(cfg, width) and cfg.tile_n == width and not cfg.warps_on_keys
        for rows, sq, sk in ((1, 1, 8192), (8, 1, 4096), (700, 700, 700), (4096, 4096, 4096)):
            assert invariant_config(spec, SM120, rows, sq, sk) in [c for c, _ in invariant_family(spec, SM120)]


def test_the_family_keeps_the_default_prefill_tile_where_it_has_the_width():
    """Long prefills keep the default's table tile where it walks INVARIANT_TILE_N keys (d128: the TMA ping-pong
    128 x 64), and short calls move to a smaller tile of the same width by the tile-efficiency rule."""
    spec = FwdSpec("bf16", 128, 128, causal=True)
    assert invariant_config(spec, SM120, 4096, 4096, 4096) == choose_fwd_config(spec, SM120, 4096, 4096, 4096)
    assert invariant_config(spec, SM120, 4, 1, 8192).tile_m == 64
    for d in (64, 96):
        spec = FwdSpec("bf16", d, d, causal=False)
        assert invariant_config(spec, SM120, 4096, 4096, 4096) == choose_fwd_config(spec, SM120, 4096, 4096, 4096)


def test_past_256_is_refused():
    with pytest.raises(NotImplementedError, match="up to 256"):
        invariant_config(FwdSpec("bf16", 320, 320, causal=True), SM120)


def test_the_environment_decides_when_the_call_does_not(monkeypatch):
    monkeypatch.delenv(invariance.BATCH_INVARIANT_ENV, raising=False)
    assert not invariance.requested(None) and invariance.requested(True)
    monkeypatch.setenv(invariance.BATCH_INVARIANT_ENV, "1")
    assert invariance.requested(None) and not invariance.requested(False)
    monkeypatch.setenv(invariance.BATCH_INVARIANT_ENV, "0")
    assert not invariance.requested(None)
    with pytest.raises(TypeError, match="True, False or None"):
        invariance.requested(1)


def _qkv(d=64):
    q = torch.zeros(2, 8, 4, d, dtype=torch.bfloat16)
    return q, q[:, :, :2], q[:, :, :2]


@pytest.mark.parametrize("kwargs,words", [
    (dict(num_splits=2), "split-KV"),
    (dict(score_mod=lambda s, b, h, q, kv, info, aux: s), "score_mod"),
    (dict(dropout_p=0.1), "dropout"),
    (dict(qv=torch.zeros(2, 8, 4, 64, dtype=torch.bfloat16)), "qv"),
    (dict(k_descale=torch.ones(2, 2)), "FP8"),
])
@pytest.mark.parametrize("entry", ["func", "varlen"])
def test_what_it_cannot_combine_with_is_refused_before_anything_runs(entry, kwargs, words):
    q, k, v = _qkv()
    call = fa.flash_attn_func if entry == "func" else fa.flash_attn_varlen_func
    with pytest.raises(NotImplementedError, match=words):
        call(q, k, v, batch_invariant=True, **kwargs)


def test_the_kvcache_entry_refuses_before_it_appends():
    q, k, v = _qkv()
    cache = torch.zeros(2, 16, 2, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="FP8"):
        fa.flash_attn_with_kvcache(q, cache, cache, batch_invariant=True)
    with pytest.raises(NotImplementedError, match="split-KV"):
        fa.flash_attn_with_kvcache(q, k, v, num_splits=4, batch_invariant=True)


def test_the_environment_refuses_as_the_argument_does(monkeypatch):
    monkeypatch.setenv(invariance.BATCH_INVARIANT_ENV, "1")
    with pytest.raises(NotImplementedError, match="split-KV"):
        fa.flash_attn_func(*_qkv(), num_splits=3)
    with pytest.raises(ValueError, match="CUDA tensors"):  # batch_invariant=False: the default path's checks
        fa.flash_attn_func(*_qkv(), num_splits=3, batch_invariant=False)


def test_the_backward_keeps_one_order_whatever_the_grid(monkeypatch):
    """A small causal GQA grid: the deterministic mode picks its order, group split and band by shape; the
    batch-invariant backward keeps highest first, unsplit, one pair per band."""
    monkeypatch.setattr(backward, "_side_kernels", lambda spec, model, target, cfg=None: (
        "pre", "post", cfg or backward.select_bwd_config(spec, model)))
    monkeypatch.setattr(backward, "_main_kernel", lambda spec, model, target, smem, cfg=None: spec)
    backward.bwd_launch.cache_clear()
    bspec = BwdSpec("bf16", 128, 128, causal=True, deterministic=True)
    shape = FwdShape(batch=1, seqlen_q=1024, seqlen_k=1024, num_heads=32, num_heads_kv=2)
    try:
        free = backward.bwd_launch(bspec, shape, SM120, "sm_120a", None, 188, 96 << 20)
        fixed = backward.bwd_launch(bspec, shape, SM120, "sm_120a", None, 188, 96 << 20, invariant=True)
    finally:
        backward.bwd_launch.cache_clear()
    assert free.split > 1 or free.main.lowest_first  # the shape-chosen order moves away from the fixed one here
    assert (fixed.split, fixed.band, fixed.main.lowest_first, fixed.main.group_split) == (1, 1, False, 1)


@pytest.mark.parametrize("d", list(range(8, 257, 8)))
def test_the_backward_runs_one_tile_for_every_layout(d):
    """Dense, packed and capped layouts of the same options get one backward tile (the deterministic varlen specs the
    table sends elsewhere included), valid for each."""
    from flash_attn_4_sm120.bwd_config import bwd_config_problems, bwd_invariant_config

    for causal, softcap in ((False, False), (True, False), (True, True)):
        base = BwdSpec("bf16", d, d, causal=causal, softcap=softcap)
        layouts = [base, replace(base, varlen_q=True, varlen_k=True),
                   replace(base, varlen_q=True, varlen_k=True, seqused_q=True, seqused_k=True),
                   replace(base, seqused_k=True)]
        cfgs = {bwd_invariant_config(replace(s, deterministic=True), SM120) for s in layouts}
        assert len(cfgs) == 1
        cfg = cfgs.pop()
        assert all(bwd_config_problems(replace(s, deterministic=True), cfg, SM120) == () for s in layouts)


def test_calls_longer_than_a_chunk_split_at_fixed_keys():
    """A batch-invariant call runs unsplit up to one chunk of keys (``INVARIANT_CHUNK_KEYS``) and in one split per
    chunk past it, at the same keys for every head-dim class; with a sink always through the combine (one chunk
    too); past the combine's splits it is refused with the alternative named."""
    from flash_attn_4_sm120.config import (INVARIANT_CHUNK_KEYS, MAX_SPLITS, chunked_spec, invariant_chunks,
                                           invariant_config)

    c = INVARIANT_CHUNK_KEYS
    for d in (64, 96, 128, 192, 256):
        spec = FwdSpec("bf16", d, d, causal=True)
        cfg = invariant_config(spec, SM120)
        assert invariant_chunks(cfg, c, False) == 0 and invariant_chunks(cfg, c, True) == 1
        assert invariant_chunks(cfg, c + 1, False) == 2 and invariant_chunks(cfg, 8 * c, False) == 8
        split = chunked_spec(spec, cfg)
        assert split.split_kv and not split.has_sink and split.split_chunk * cfg.tile_n == c
        assert invariant_config(split, SM120).tile_n == cfg.tile_n
        with pytest.raises(NotImplementedError, match="batch_invariant=False"):
            invariant_chunks(cfg, MAX_SPLITS * c + 1, False)


def test_a_window_no_wider_than_a_chunk_is_never_cut():
    """A window whose rows see at most one chunk of keys runs unsplit at any length (with a sink: one split of the
    whole range, merged in the combine); a wider window is cut as a causal call is."""
    from flash_attn_4_sm120.config import INVARIANT_CHUNK_KEYS, WHOLE_CHUNK_BLOCKS, chunked_spec, invariant_chunks

    c = INVARIANT_CHUNK_KEYS
    spec = FwdSpec("bf16", 128, 128, causal=False, local=True)
    cfg = invariant_config(spec, SM120)
    assert invariant_chunks(cfg, 16 * c, False, span=c) == 0 and invariant_chunks(cfg, 16 * c, True, span=c) == 1
    assert invariant_chunks(cfg, 16 * c, False, span=c + 1) == 16
    assert chunked_spec(spec, cfg, whole=True).split_chunk == WHOLE_CHUNK_BLOCKS


def test_the_chunk_size_comes_from_the_environment_once(monkeypatch):
    """``FA4_SM120_INVARIANT_CHUNK_KEYS`` sets the chunk (read on first use); it must be a multiple of 64 keys."""
    from flash_attn_4_sm120.config import INVARIANT_CHUNK_KEYS

    try:
        for raw, keys in (("", INVARIANT_CHUNK_KEYS), ("1024", 1024)):
            monkeypatch.setenv(invariance.CHUNK_KEYS_ENV, raw)
            invariance.chunk_keys.cache_clear()
            assert invariance.chunk_keys() == keys
        for raw in ("1000", "0", "lots"):
            monkeypatch.setenv(invariance.CHUNK_KEYS_ENV, raw)
            invariance.chunk_keys.cache_clear()
            with pytest.raises(ValueError, match="multiple of 64"):
                invariance.chunk_keys()
    finally:
        monkeypatch.delenv(invariance.CHUNK_KEYS_ENV)
        invariance.chunk_keys.cache_clear()
