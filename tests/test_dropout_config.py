"""Dropout's host side on the CPU: every head-dim class finds a forward and a backward config the
predicate accepts (never persistent or packed; the d128 backward's role split), the call's seed slot, and the kernels' element
order (every element of a thread's fragment once, a Philox call's 8 elements together)."""

import pytest
import torch

from flash_attn_4_sm120 import bwd_config, config, dropout
from flash_attn_4_sm120.execution_model import SM120
from flash_attn_4_sm120.problem import BwdSpec, FwdSpec

CLASSES = [(64, 64), (96, 96), (128, 128), (192, 128), (256, 256), (40, 40), (128, 64)]


@pytest.mark.parametrize("d, dv", CLASSES)
@pytest.mark.parametrize("causal", [False, True])
def test_every_class_has_dropout_configs(d, dv, causal):
    spec = FwdSpec("bf16", d, dv, causal, dropout=True)
    for cfg in config.dispatch_candidates(spec, SM120):
        assert not config.fwd_config_problems(spec, cfg, SM120)
        assert not cfg.persistent
    bspec = BwdSpec("bf16", d, dv, causal, dropout=True)
    cfg = bwd_config.select_bwd_config(bspec, SM120)
    assert not bwd_config.bwd_config_problems(bspec, cfg, SM120)
    # the role split at d64, d96 and d128 (group 0 draws the tile's keep flags; d64's 64x128 table entry, causal
    # included, passes P and P keep as two tiles; the kv_in_regs entries of d96 and d128 pass P with
    # the dropped elements negated, d128's warps drawing their 24 keys as one run of n8 atoms): each class's entry
    # without dropout, except d128's causal walks (its 64x64 smem-operand split: ``_prefers_smem_operands``)
    cls = bwd_config.bwd_head_dim_class(bspec)
    assert cfg.role_split == (d == dv and cls in (64, 96, 128))
    if cls == 64 and d == dv:
        assert cfg.tile_n == 128
    if d == dv and cls in (96, 128):
        assert cfg.kv_in_regs == (cls == 96 or not causal)
        if cfg.kv_in_regs:
            assert cfg == bwd_config.select_bwd_config(BwdSpec("bf16", d, dv, causal), SM120)
        else:
            assert cfg == bwd_config.BWD_TABLE_SMEM_OPERANDS[cls]


@pytest.mark.parametrize("deterministic", [False, True])
def test_d96_dropout_keeps_its_entry_but_with_varlen(deterministic):
    """d96 dropout runs the class's ``kv_in_regs`` entry, as d96 without dropout (the signed P tile and the slot's
    words read where used: no local memory on sm_120a), except beside varlen's per-sequence addressing
    (one local word): the smem-operand split."""
    plain = BwdSpec("bf16", 96, 96, True, deterministic=deterministic, lowest_first=deterministic, dropout=True)
    packed = BwdSpec("bf16", 96, 96, True, varlen_q=True, varlen_k=True, dropout=True)
    assert bwd_config.select_bwd_config(plain, SM120).kv_in_regs
    assert not bwd_config.select_bwd_config(packed, SM120).kv_in_regs
    assert any("varlen" in why for why in bwd_config.bwd_config_problems(packed, bwd_config.BWD_TABLE[96], SM120))


def test_dropout_refuses_packed_and_persistent_tiles():
    cfg = config.FwdConfig(256, 32, 8, 2, mainloop="tma", overlap=True, pingpong=True, persistent=True)
    assert config.dropout_problems(FwdSpec("bf16", 128, 128, False, dropout=True), cfg)
    packed = FwdSpec("bf16", 128, 128, False, pack_gqa=True, dropout=True)
    assert config.dropout_problems(packed, config.FwdConfig(64, 64, 4, 1, q_in_regs=True))


def test_a_spec_without_dropout_is_unchanged():
    """dropout=False is the default: the plain spec's configs and keys are exactly today's."""
    for d, dv in CLASSES:
        plain = FwdSpec("bf16", d, dv, True)
        assert plain == FwdSpec("bf16", d, dv, True, dropout=False)
        assert BwdSpec.of(plain).dropout is False


@pytest.mark.parametrize("seed", [0, 1, 2 ** 31, 2 ** 32 + 5, 2 ** 63 - 1])
def test_rng_slot_holds_the_seed_words(seed):
    t = dropout.rng_tensor(seed, 7, 0.1)
    words = [int(x) & 0xFFFFFFFF for x in t.tolist()]
    assert t.dtype == torch.int32 and words == [seed & 0xFFFFFFFF, seed >> 32, 7, dropout.keep_threshold(0.1)]


NEIGHBOURS = [16 * (c // 4) + [0, 1, 8, 9][c % 4] for c in range(16)]  # a warp's atoms side by side (forward)
INTERLEAVED = [32 * (c // 4) + [0, 1, 8, 9][c % 4] for c in range(8)]  # 16 columns per warp of two (half calls)


@pytest.mark.parametrize("col_pos, per_call", [(NEIGHBOURS, 16), (INTERLEAVED, 8)], ids=["whole", "half"])
def test_kernel_element_order_is_call_major(col_pos, per_call):
    from flash_attn_4_sm120._kernels.dropout_mask import KeepFlags

    rows, cols = 4, len(col_pos)
    flags = KeepFlags(None, None, None, None, rows, cols, col_pos)
    assert sorted(flags.order) == [(r, c) for r in range(rows) for c in range(cols)]
    for i in range(0, len(flags.order), per_call):  # each call: one m16 atom's two row halves x its cell's columns
        calls = {flags.slot(r, c)[0] for r, c in flags.order[i:i + per_call]}
        assert len(calls) == 1
    assert flags.pairs == [(r, c) for r, c in flags.order if c % 2 == 0]


@pytest.mark.parametrize("col_pos, warp_cols", [(NEIGHBOURS, (0, 64)), (INTERLEAVED, (0, 16))], ids=["whole", "half"])
def test_kernel_slots_draw_the_documented_mask(col_pos, warp_cols):
    """The kernels' call / word / byte choice (``KeepFlags.slot``, for every lane of warps whose fragments have two
    m16 atoms, at the warps' column offsets; a half call's word half taken from the column at run time, as
    ``KeepFlags._word`` does) reproduces ``dropout_keep_mask`` element by element, on the CPU."""
    from flash_attn_4_sm120._kernels.dropout_mask import KeepFlags

    seed, offset, p, b, h, heads, q0, k0 = 0x1234_5678_9ABC, 3, 0.3, 1, 2, 3, 32, 64
    rows, cols = 4, len(col_pos)
    row_pos = [16 * (r // 2) + 8 * (r % 2) for r in range(rows)]
    ref = dropout.dropout_keep_mask(seed, offset, b + 1, heads, q0 + 48, k0 + 192, p)[b, h]
    flags = KeepFlags(None, None, None, None, rows, cols, col_pos)
    t = dropout.keep_threshold(p)
    for warp_col, lane in ((w, lane) for w in warp_cols for lane in range(32)):
        lr, lc = lane // 4, 2 * (lane % 4) + warp_col
        for r, c in flags.order:
            (r0, c0), word, byte = flags.slot(r, c)
            q, k = q0 + lr + row_pos[r0], k0 + lc + col_pos[c0]  # the call's first element (the counter's)
            if flags.half_call[c0]:
                word = 2 * (r % 2) + ((k >> 4) & 1)
            ctr0 = (q >> 4) * 32 + (q & 7) * 4 + ((k & 7) >> 1)
            words = dropout.philox4x32((ctr0, k >> 5, b * heads + h, offset), (seed & 0xFFFFFFFF, seed >> 32))
            value = (int(words[word]) >> (8 * byte)) & 0xFF
            assert (value >= t) == bool(ref[q0 + lr + row_pos[r], k0 + lc + col_pos[c]]), (warp_col, lane, r, c)


def test_run_layout_draws_the_documented_mask():
    """``RunKeepFlags`` (a warp's run of n8 atoms starting at any multiple of 8: d128's ``kv_in_regs`` split, 24
    keys per warp at 24 w): both cells' calls per m16 atom, each column's call, word and byte half from its own key
    (``RunKeepFlags.pick``, the arithmetic the kernel runs, here on ints), reproduce ``dropout_keep_mask`` for every
    lane of the four warps, on the CPU."""
    from flash_attn_4_sm120._kernels.dropout_mask import RunKeepFlags, atom_run

    seed, offset, p, b, h, heads, q0, k0 = 0x1234_5678_9ABC, 3, 0.3, 1, 2, 3, 32, 64
    col_pos = [8 * (c // 2) + c % 2 for c in range(6)]
    assert atom_run(col_pos) and not atom_run(INTERLEAVED)
    rows = 4
    row_pos = [16 * (r // 2) + 8 * (r % 2) for r in range(rows)]
    ref = dropout.dropout_keep_mask(seed, offset, b + 1, heads, q0 + 48, k0 + 96, p)[b, h]
    t = dropout.keep_threshold(p)
    kept = 0
    for warp, lane in ((w, lane) for w in range(4) for lane in range(32)):
        first = k0 + 24 * warp + 2 * (lane % 4)  # the thread's first key column
        for r in range(rows):
            q_call = q0 + lane // 4 + row_pos[r - r % 2]
            ctr0 = (q_call >> 4) * 32 + (q_call & 7) * 4 + ((first & 7) >> 1)
            calls = [dropout.philox4x32((ctr0, (first >> 5) + i, b * heads + h, offset), (seed & 0xFFFFFFFF, seed >> 32))
                     for i in range(2)]
            for c in range(len(col_pos)):
                k = first + col_pos[c]
                second, upper, shift = RunKeepFlags.pick(k, first)
                value = (int(calls[second][2 * (r % 2) + upper]) >> shift >> (8 * (c % 2))) & 0xFF
                keep = bool(ref[q0 + lane // 4 + row_pos[r], k])
                assert (value >= t) == keep, (warp, lane, r, c)
                kept += keep
    assert 0.6 < kept / (4 * 32 * rows * len(col_pos)) < 0.8


def test_unseeded_slot_comes_from_torch_generator():
    """Without a seed the slot's seed words come from torch's generator of the device (device ops only, so a CUDA
    graph replay draws anew): torch.manual_seed reproduces them, and the offset / threshold words are set."""
    torch.manual_seed(7)
    a = dropout.rng_tensor(None, 0, 0.1)
    b = dropout.rng_tensor(None, 0, 0.1)
    torch.manual_seed(7)
    c = dropout.rng_tensor(None, 0, 0.1)
    assert torch.equal(a, c) and not torch.equal(a[:2], b[:2])
    assert a[2:].tolist() == [0, dropout.keep_threshold(0.1)]


@pytest.mark.parametrize("seed", [None, 123])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_dropout_traces_into_one_graph(seed, varlen):
    """torch.compile(fullgraph=True) of a training step with dropout traces (forward and, AOT, the backward) through
    the custom ops with no graph break; the real op then refuses CPU tensors at run time."""
    import flash_attn_4_sm120 as fa

    q = torch.randn(1, 64, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor([0, 64], dtype=torch.int32)

    def step(q):
        if varlen:
            out = fa.flash_attn_varlen_func(q[0], q[0], q[0], cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=64,
                                            max_seqlen_k=64, causal=True, dropout_p=0.1,
                                            dropout_seed=seed)[0]
        else:
            out = fa.flash_attn_func(q, q, q, causal=True, dropout_p=0.1, dropout_seed=seed)[0]
        return out.float().sum()

    torch._dynamo.reset()
    with pytest.raises(ValueError, match="CUDA tensors"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(q)
