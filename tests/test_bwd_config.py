"""Backward host logic on the CPU: the config predicate and table, and the query blocks a key block visits."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from flash_attn_4_sm120._kernels import block_info
from flash_attn_4_sm120.bwd_config import (BWD_TABLE, BWD_TABLE_FALLBACK, BWD_TABLE_HEAVY, BWD_TABLE_SMEM_OPERANDS,
                                           BWD_TABLE_UNSPLIT, BwdConfig, bwd_banded, bwd_config_problems,
                                           bwd_kv_copy_threads, bwd_kv_regs, bwd_padded_head_dim, bwd_sdp_n_step,
                                           bwd_rotated_start, bwd_smem_bytes, bwd_step_divisor,
                                           candidate_bwd_configs, dispatchable_bwd, select_bwd_config)
from flash_attn_4_sm120.bwd_schedule import bwd_tile_band
from flash_attn_4_sm120.execution_model import SM80, SM90, SM120
from flash_attn_4_sm120.flex import ModKey
from flash_attn_4_sm120.problem import BwdSpec, FwdSpec
from reference import visible


@pytest.mark.parametrize("d", list(range(8, 257, 8)))
@pytest.mark.parametrize("model", [SM120, SM90, SM80])
def test_every_head_dim_has_a_valid_table_config(d, model):
    for dv in (d, 128 if d > 128 else d):
        spec = BwdSpec("bf16", d, dv, causal=True)
        cfg = select_bwd_config(spec, model)
        assert bwd_config_problems(spec, cfg, model) == ()
        assert bwd_smem_bytes(spec, cfg) + 1024 <= model.smem_per_cta
        assert bwd_padded_head_dim(d, cfg) >= d and bwd_padded_head_dim(d, cfg) % 16 == 0


def test_predicate_names_each_problem():
    spec = BwdSpec("bf16", 128, 128, causal=False)
    assert any("shared memory" in p for p in bwd_config_problems(spec, BwdConfig(64, 64, 8, 2, 2), SM120))
    assert any("tile_m" in p for p in bwd_config_problems(spec, BwdConfig(48, 64, 8, 2, 1), SM120))
    assert any("S/dP" in p for p in bwd_config_problems(spec, BwdConfig(64, 64, 8, 2, 1, sdp_warps_m=8), SM120))
    assert any("dq_chunks" in p for p in bwd_config_problems(spec, BwdConfig(64, 64, 8, 2, 1, dq_chunks=0), SM120))


@pytest.mark.parametrize("d,dv,tile", [(136, 136, (64, 64)), (160, 160, (64, 64)), (160, 96, (64, 64)),
                                       (168, 168, (32, 64)), (192, 128, (32, 64)), (192, 192, (32, 64))])
def test_d129_to_d160_take_the_64x64_tile(d, dv, tile):
    """The d160 class runs a 64x64 tile (97 KB at its padded 160 columns), the d192 class the 32x64 tile, whose 64x64
    tile's Q, dO, K and V would exceed 101376 B; a score_mod at d160 takes the 32x64 tile (the predicate says why)."""
    for det in (False, True):
        cfg = select_bwd_config(BwdSpec("bf16", d, dv, causal=True, deterministic=det), SM120)
        assert (cfg.tile_m, cfg.tile_n) == tile
    assert any("shared memory" in p for p in bwd_config_problems(BwdSpec("bf16", 168, 168, True), BWD_TABLE[160],
                                                                 SM120))
    softcap_mod = dataclasses.replace(BwdSpec("bf16", 160, 160, True), mods=ModKey(score_mod="softcap"))
    assert any("pre-mod scores" in p for p in bwd_config_problems(softcap_mod, BWD_TABLE[160], SM120))
    assert select_bwd_config(softcap_mod, SM120) == BWD_TABLE_FALLBACK[160]


@pytest.mark.parametrize("d", [64, 96, 128, 160, 192, 256])
def test_tuning_candidates_are_valid_and_hold_the_table(d):
    spec = BwdSpec("bf16", d, d, causal=True)
    cands = candidate_bwd_configs(spec, SM120)
    assert len(cands) == len(set(cands)) > 0
    assert all(bwd_config_problems(spec, c, SM120) == () for c in cands)
    assert select_bwd_config(spec, SM120) in cands


def test_role_split_predicate():
    cfg = BwdConfig(64, 64, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2, role_split=True)
    assert bwd_config_problems(BwdSpec("bf16", 128, 128, causal=True), cfg, SM120) == ()
    assert cfg.role_warps == 4 and BwdConfig(64, 64, 8, 2, 1).role_warps == 8
    assert any("softcap" in p for p in bwd_config_problems(BwdSpec("bf16", 128, 128, True, softcap=True), cfg, SM120))
    assert any("must match" in p for p in bwd_config_problems(BwdSpec("bf16", 192, 128, True), cfg, SM120))
    assert any("double-buffered Q" in p for p in bwd_config_problems(
        BwdSpec("bf16", 128, 128, True), BwdConfig(64, 64, 8, 1, 1, role_split=True), SM120))
    # the step divisor is the role split's: the 8-warp and 4-warp tiles spilled with it
    assert any("step divisor" in p for p in bwd_config_problems(
        BwdSpec("bf16", 128, 128, True), BwdConfig(64, 64, 8, 2, 1, step_divisor=True), SM120))
    assert bwd_config_problems(BwdSpec("bf16", 128, 128, True), BwdConfig(
        64, 64, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2, role_split=True, step_divisor=True), SM120) == ()
    # 4 warps split S/dP: 8 warps along the rows do not fit a group
    assert any("S/dP" in p for p in bwd_config_problems(
        BwdSpec("bf16", 128, 128, True), BwdConfig(64, 64, 8, 2, 1, sdp_warps_m=8, role_split=True), SM120))


def test_selection_falls_back_when_the_table_entry_cannot_run(monkeypatch):
    """The d128 entry is the role split, which runs neither softcap nor head_dim != head_dim_v: the fallback
    entry serves those, varlen keeps the role split (no heavy entry at d128); with no entry that fits,
    selection raises naming the problems."""
    from flash_attn_4_sm120 import bwd_config

    rs, fb = BWD_TABLE[128], bwd_config.BWD_TABLE_FALLBACK[128]
    assert rs.role_split and not fb.role_split
    select_bwd_config.cache_clear()
    try:
        assert select_bwd_config(BwdSpec("bf16", 128, 128, True), SM120) == rs
        assert select_bwd_config(BwdSpec("bf16", 128, 128, True, varlen_q=True, varlen_k=True), SM120) == rs
        assert select_bwd_config(BwdSpec("bf16", 128, 128, True, softcap=True), SM120) == fb
        assert select_bwd_config(BwdSpec("bf16", 128, 64, True), SM120) == fb
        assert select_bwd_config(BwdSpec("bf16", 112, 112, False, local=True), SM120) == rs
        monkeypatch.delitem(bwd_config.BWD_TABLE_FALLBACK, 128)
        select_bwd_config.cache_clear()
        with pytest.raises(ValueError, match="softcap"):
            select_bwd_config(BwdSpec("bf16", 128, 128, True, softcap=True), SM120)
    finally:
        select_bwd_config.cache_clear()


def test_d96_role_split_and_its_alternatives():
    """d96's entry is the role split with its S / dP operands in registers, dropout included; dropout
    beside varlen and varlen in the highest-first deterministic order (no registers for them there) take the same
    split with both operands in shared memory; a
    plain spec neither can run (head dims unequal once padded to 32) takes the 4-warp tile, heavy specs (softcap) the
    8-warp one, varlen stays on the role split (faster, no spills), and with unequal head dims dropout
    goes past the 4-warp tile (too many registers beside the keep flags) to the 8-warp one."""
    rs, smem, unsplit, heavy = BWD_TABLE[96], BWD_TABLE_SMEM_OPERANDS[96], BWD_TABLE_UNSPLIT[96], BWD_TABLE_HEAVY[96]
    assert rs.role_split and rs.kv_in_regs and smem.role_split and not smem.kv_in_regs
    assert not unsplit.role_split and unsplit.num_warps == 4 and heavy.num_warps == 8
    cases = {BwdSpec("bf16", 96, 96, True): rs, BwdSpec("bf16", 72, 72, False, local=True, deterministic=True): rs,
             BwdSpec("bf16", 80, 96, False): rs, BwdSpec("bf16", 96, 48, True): unsplit,
             BwdSpec("bf16", 64, 96, False): unsplit, BwdSpec("bf16", 96, 96, True, softcap=True): heavy,
             BwdSpec("bf16", 96, 96, False, varlen_q=True): rs,
             BwdSpec("bf16", 96, 96, True, varlen_q=True, varlen_k=True, deterministic=True): smem,
             BwdSpec("bf16", 96, 96, True, varlen_q=True, varlen_k=True, deterministic=True, lowest_first=True): rs,
             BwdSpec("bf16", 96, 96, True, softcap=True, varlen_q=True, varlen_k=True): heavy,
             BwdSpec("bf16", 96, 96, True, dropout=True): rs,
             BwdSpec("bf16", 96, 96, True, varlen_q=True, varlen_k=True, dropout=True): smem,
             BwdSpec("bf16", 96, 48, False, dropout=True): heavy}
    for spec, cfg in cases.items():
        assert select_bwd_config(spec, SM120) == cfg, spec


def test_kv_in_regs_puts_p_and_ds_in_the_v_region():
    """``kv_in_regs``: the role split's S / dP B operands in registers (a warp's 32 of 128 keys at d96: 48 registers),
    P and dS in V's shared memory (94208 B for d96's 64x128 tile, where separate tiles need 116 KB); refused off the
    role split, with dropout where a warp's keys are not whole n8 atoms or beside varlen (or, at 24 keys per warp,
    the deterministic mode), and
    for varlen in the highest-first deterministic order (the sm_120a gate's spills)."""
    cfg = BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=1, dkv_warps_n=2, dq_warps_m=4, role_split=True, kv_in_regs=True)
    spec = BwdSpec("bf16", 96, 96, True)
    assert bwd_kv_regs(cfg, 96) == 48 and bwd_kv_regs(BWD_TABLE[192], 192) == 0
    # d128's 64x96 split: 24 keys per warp, one n8 atom per warp step, 48 registers, 98304 B
    d128 = BWD_TABLE[128]
    assert d128.kv_in_regs and bwd_kv_regs(d128, 128) == 48 and bwd_sdp_n_step(d128) == 8 and bwd_sdp_n_step(cfg) == 16
    assert bwd_smem_bytes(BwdSpec("bf16", 128, 128, True), d128) == 98304
    # dropout runs it too on full walks (a warp's 24 keys as one run of n8 atoms, ``dropout_mask.RunKeepFlags``), not
    # beside the deterministic mode (its spill) nor varlen; causal and windowed walks take the 64x64 split (faster)
    assert select_bwd_config(BwdSpec("bf16", 128, 128, False, dropout=True), SM120) == d128
    for masked in (BwdSpec("bf16", 128, 128, True, dropout=True), BwdSpec("bf16", 128, 128, False, local=True,
                                                                           dropout=True)):
        assert not bwd_config_problems(masked, d128, SM120)
        assert select_bwd_config(masked, SM120) == BWD_TABLE_SMEM_OPERANDS[128]
    det = BwdSpec("bf16", 128, 128, True, deterministic=True, dropout=True)
    assert any("deterministic" in p for p in bwd_config_problems(det, d128, SM120))
    assert select_bwd_config(det, SM120) == BWD_TABLE_SMEM_OPERANDS[128]
    assert bwd_smem_bytes(spec, cfg) == 94208 and not bwd_config_problems(spec, cfg, SM120)
    plain = BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=1, dkv_warps_n=2, dq_warps_m=4, role_split=True)
    assert bwd_smem_bytes(spec, plain) == 118784
    assert any("shared memory" in p for p in bwd_config_problems(spec, plain, SM120))
    assert any("kv_in_regs is the role split" in p for p in bwd_config_problems(
        spec, BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=1, dkv_warps_n=4, dq_warps_m=4, kv_in_regs=True), SM120))
    assert not bwd_config_problems(BwdSpec("bf16", 96, 96, True, dropout=True), cfg, SM120)
    assert not bwd_config_problems(BwdSpec("bf16", 128, 128, True, dropout=True), d128, SM120)
    odd = BwdConfig(64, 80, 8, 2, 1, sdp_warps_m=1, dkv_warps_n=2, dq_warps_m=1, role_split=True, kv_in_regs=True)
    assert any("20 keys per warp" in p for p in bwd_config_problems(BwdSpec("bf16", 128, 128, True, dropout=True),
                                                                    odd, SM120))
    assert any("dropout" in p for p in bwd_config_problems(
        BwdSpec("bf16", 96, 96, True, varlen_q=True, varlen_k=True, dropout=True), cfg, SM120))
    packed = BwdSpec("bf16", 96, 96, True, varlen_q=True, varlen_k=True, deterministic=True)
    assert any("highest-first" in p for p in bwd_config_problems(packed, cfg, SM120))
    assert not bwd_config_problems(BwdSpec("bf16", 96, 96, True, varlen_q=True, varlen_k=True), cfg, SM120)


def test_key_tiles_the_cta_copy_pass_does_not_divide_move_by_warp_group():
    """A 96-key tile at d96 (64-row copy passes for 256 threads): the role split moves K / V by a warp group each
    (32-row passes), so the predicate admits it; the 8-warp kernel has no groups and is refused with the rows
    named. Tiles the CTA's pass divides keep the CTA-wide copy."""
    spec = BwdSpec("bf16", 96, 96, True)
    split = BwdConfig(64, 96, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=4, role_split=True)
    assert bwd_kv_copy_threads(split, 96, 96) == 128 and not bwd_config_problems(spec, split, SM120)
    plain = BwdConfig(64, 96, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=4)
    assert bwd_kv_copy_threads(plain, 96, 96) == 256
    assert any("tile_n of 64-row" in p for p in bwd_config_problems(spec, plain, SM120))
    for d, cfg in BWD_TABLE.items():
        assert bwd_kv_copy_threads(cfg, d, d) in (cfg.num_threads, cfg.num_threads // 2)
    assert bwd_kv_copy_threads(BWD_TABLE[128], 128, 128) == 256


def test_dispatchable_covers_every_class_and_mask():
    pairs = dispatchable_bwd(SM120)
    # every entry is compiled by the gate: the dispatchable specs', or the flex cases' (mods reach FALLBACK[64]),
    # or the block-sparse cases' (mods with lists reach FALLBACK[256])
    from flash_attn_4_sm120 import conformance

    gated = {cfg for _, cfg in pairs} | {c.config
                                         for c in conformance.flex_cases(SM120) + conformance.sparse_cases(SM120)
                                         if isinstance(c, conformance.BwdCase)}
    assert gated == (set(BWD_TABLE.values()) | set(BWD_TABLE_HEAVY.values()) | set(BWD_TABLE_FALLBACK.values())
                     | set(BWD_TABLE_UNSPLIT.values()) | set(BWD_TABLE_SMEM_OPERANDS.values()))
    assert {(s.causal, s.local) for s, _ in pairs} == {(False, False), (True, False), (False, True)}
    assert any(s.softcap for s, _ in pairs) and any(s.varlen_q and s.seqused_k for s, _ in pairs)


def test_causal_key_block_order_and_its_band():
    """Causal specs and block-sparse lists run their key blocks longest first in bands (deterministic ones in their
    lowest-first order only; not windows without lists; not key tiles under 64 keys); the band
    is the smallest the schedule model finds within 1% of its best among bands whose Q, dO and dQ accumulator rows
    fit the L2, at least one."""
    assert BwdSpec("bf16", 64, 64, True).longest_first
    assert BwdSpec("bf16", 64, 64, True, deterministic=True, lowest_first=True).longest_first
    for spec in (BwdSpec("bf16", 64, 64, False, block_sparse=(128, 128)),
                 BwdSpec("bf16", 128, 128, True, local=True, block_sparse=(128, 128))):
        assert spec.longest_first and bwd_banded(spec, select_bwd_config(spec, SM120)), spec
    for d, banded in ((64, True), (96, True), (128, True), (192, True), (256, False)):  # d256: 32-key tiles
        spec = BwdSpec("bf16", d, d, True)
        assert bwd_banded(spec, select_bwd_config(spec, SM120)) is banded, d
    for spec in (BwdSpec("bf16", 64, 64, False), BwdSpec("bf16", 64, 64, True, deterministic=True),
                 BwdSpec("bf16", 64, 64, True, local=True)):
        assert not spec.longest_first, spec
    # the schedule model (H100 sizes: 132 SMs at one CTA each, 50 MB of L2), causal 4x4096 32/8 with 4 query
    # heads per KV head: d64 (64x128 tiles, 8 MiB of rows per pair) takes 4 pairs per band (32 pairs: 3 and 6
    # leave a short last band); d128 (64x64, 16 MiB per pair) is capped at 2 by the L2; d256 2x4096 16/16 has no
    # imbalance the order removes (its key blocks' CTAs are many and short): 1
    l2, slots = 50 * 2**20, 132
    assert bwd_tile_band(l2, 4096, 4096, 64, 64, 64, 128, 4, 32, slots) == 4
    assert bwd_tile_band(l2, 4096, 4096, 128, 128, 64, 64, 4, 32, slots) == 2
    assert bwd_tile_band(l2, 4096, 4096, 256, 256, 32, 32, 1, 32, slots) == 1
    assert bwd_tile_band(2**20, 4096, 4096, 64, 64, 64, 128, 4, 32, slots) == 1  # one pair's rows exceed the L2
    assert bwd_tile_band(l2, 4096, 4096, 64, 64, 64, 128, 4, 1, slots) == 1  # one pair


def test_paged_forward_has_no_backward_spec():
    with pytest.raises(NotImplementedError, match="paged"):
        BwdSpec.of(FwdSpec("bf16", 64, 64, causal=True, page_size=16))


WINDOWS = [(False, False, 0, 0), (True, False, 0, 0), (False, True, 3, 0), (False, True, 0, 5), (False, True, 7, 2),
           (False, True, -2, 6), (False, True, 5, -3), (False, True, 40, 40)]


@pytest.mark.parametrize("causal,local,left,right", WINDOWS)
def test_query_blocks_cover_every_visible_pair(causal, local, left, right):
    """Exhaustive on small sizes: the backward's key block n visits query block m if some row of m sees some
    key of n, and (windows with non-negative bounds, the usual ones) only then; a band that misses its own
    diagonal (a negative bound) may visit a pair with no visible entry, which its element mask zeroes."""
    for sq, sk, tm, tn in itertools.product((1, 5, 16, 37), (1, 7, 16, 41), (16, 32), (16, 32)):
        window = (left if local else None, right if local else None)
        seen = visible(sq, sk, causal, window)
        for n in range(-(-sk // tn)):
            m_start, m_end = block_info.query_block_range(n, sq, sk, tm, tn, causal, local, left, right)
            for m in range(-(-sq // tm)):
                any_seen = bool(seen[m * tm:(m + 1) * tm, n * tn:(n + 1) * tn].any())
                visited = m_start <= m < m_end
                exact = left >= 0 and right >= 0
                assert visited == any_seen if exact else visited or not any_seen, (sq, sk, tm, tn, n, m, m_start, m_end)


@pytest.mark.parametrize("causal,local,left,right", WINDOWS)
def test_unmasked_pairs_see_every_entry(causal, local, left, right):
    """A (query block, key block) pair the backward runs without an element mask (the forward's unmasked range)
    has every entry visible, also for the rows past seqlen_q of the last query block, whose P is zero anyway."""
    for sq, sk, tm, tn in itertools.product((5, 16, 37), (7, 16, 41), (16, 32), (16, 32)):
        window = (left if local else None, right if local else None)
        seen = visible(sq, sk, causal, window)
        for m in range(-(-sq // tm)):
            _, us, ue, _ = block_info.block_range(m, sq, sk, tm, tn, causal, local, left, right)
            for n in range(us, ue):
                assert bool(seen[m * tm:min((m + 1) * tm, sq), n * tn:(n + 1) * tn].all()), (sq, sk, tm, tn, m, n)
        assert torch.is_tensor(seen)


# -- the query-head group split of small GQA grids (bwd_schedule.bwd_group_split)


def test_group_split_keeps_mha_and_large_grids_whole():
    from flash_attn_4_sm120.bwd_schedule import bwd_group_split

    assert bwd_group_split(2048, 2048, 64, 64, 8, 1, 4, True, 132) == 1  # MHA: nothing to split
    assert bwd_group_split(8192, 8192, 64, 64, 8, 4, 4, True, 132) == 1  # 128 x 8 x 4 CTAs: many waves
    assert bwd_group_split(0, 0, 64, 64, 2, 4, 4, True, 132) == 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,hkv,group,batch,slots", [
    (2048, 2048, 2, 4, 4, 132), (1024, 1024, 8, 4, 4, 132), (512, 512, 2, 4, 8, 170), (333, 517, 2, 4, 2, 132),
    (4096, 4096, 1, 8, 1, 48), (100, 3000, 2, 6, 3, 188)])
@pytest.mark.parametrize("banded", [False, True])
def test_group_split_divides_the_group_and_never_models_slower(sq, sk, hkv, group, batch, slots, causal, banded):
    """The chosen split divides the group, never models slower than the whole group, and a grid of under half a
    wave splits wherever that saves ``GROUP_SPLIT_MIN_SAVED_STEPS`` (a whole group's CTA that long)."""
    from flash_attn_4_sm120.bwd_schedule import (GROUP_SPLIT_FIXED_STEPS, GROUP_SPLIT_MIN_SAVED_STEPS, _visits,
                                                  bwd_group_split)

    band = dict(banded=banded and causal, l2_bytes=50 << 20, head_dim=128, head_dim_v=128)
    s = bwd_group_split(sq, sk, 64, 64, hkv, group, batch, causal, slots, **band)
    assert group % s == 0
    longest = group * max(_visits(sq, sk, 64, 64, causal)) + GROUP_SPLIT_FIXED_STEPS
    if -(-sk // 64) * hkv * batch <= slots // 2 and longest >= 2 * GROUP_SPLIT_MIN_SAVED_STEPS:
        assert s > 1


@pytest.mark.parametrize("b,s,hq,hkv,d,causal,best", [
    (4, 2048, 8, 2, 128, True, 1), (4, 1024, 32, 8, 128, True, 1), (8, 1024, 16, 4, 64, True, 1),
    (8, 512, 8, 2, 128, True, 1), (2, 4096, 16, 4, 128, True, 1), (4, 2048, 8, 2, 128, False, 1),
    (1, 8192, 32, 8, 128, True, 1), (16, 1024, 32, 8, 128, True, 1)])
def test_group_split_picks_the_measured_winner(b, s, hq, hkv, d, causal, best):
    """H100 at SM120 occupancy (132 SMs, one CTA each; group_split_ab_h100_2026-11-26.json, the banded
    longest-first order): the split that measured fastest -- the whole group at every shape, by 2-15% where the
    per-pair model had split (4 x 2048 8/2, 8 x 1024 16/4 d64, 2 x 4096 16/4: 4 splits) -- with the product's
    tiles (d128 64x64, d64 64x128) and band inputs."""
    from flash_attn_4_sm120.bwd_schedule import bwd_group_split

    tile_n = 128 if d == 64 else 64
    assert bwd_group_split(s, s, 64, tile_n, hkv, hq // hkv, b, causal, 132, banded=causal, l2_bytes=50 << 20,
                           head_dim=d, head_dim_v=d) == best


@pytest.mark.parametrize("b,s,hq,hkv,d,best", [(1, 2048, 8, 1, 128, 8), (1, 1024, 8, 1, 64, 8),
                                               (2, 1024, 8, 2, 128, 4)])
def test_group_split_still_splits_grids_no_band_fills(b, s, hq, hkv, d, best):
    """Under the banded order a grid of one or a few (batch, KV head) pairs is still far under a wave (MQA, batch
    1: 32 CTAs on 132 slots): the split fills it."""
    from flash_attn_4_sm120.bwd_schedule import bwd_group_split

    tile_n = 128 if d == 64 else 64
    assert bwd_group_split(s, s, 64, tile_n, hkv, hq // hkv, b, True, 132, banded=True, l2_bytes=50 << 20,
                           head_dim=d, head_dim_v=d) == best


def test_rotated_start_only_where_every_key_block_sees_every_query_block():
    rot = BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2, role_split=True, rotated_start=True)
    assert BWD_TABLE[64].rotated_start and not BWD_TABLE[128].rotated_start  # measured per class
    assert bwd_rotated_start(BwdSpec("bf16", 64, 64, causal=False), rot)
    assert bwd_rotated_start(BwdSpec("bf16", 64, 64, causal=False, varlen_q=True, varlen_k=True), rot)
    assert not bwd_rotated_start(BwdSpec("bf16", 64, 64, causal=False), BWD_TABLE[128])
    assert not bwd_rotated_start(BwdSpec("bf16", 64, 64, causal=True), rot)
    assert not bwd_rotated_start(BwdSpec("bf16", 64, 64, causal=False, local=True), rot)
    assert not bwd_rotated_start(BwdSpec("bf16", 64, 64, causal=False, deterministic=True), rot)
    assert not bwd_rotated_start(BwdSpec("bf16", 64, 64, causal=False, block_sparse=(128, 128, True)), rot)


def test_step_divisor_for_dense_steps_of_the_entries_that_carry_it():
    assert bwd_step_divisor(BwdSpec("bf16", 128, 128, causal=True), BWD_TABLE[128])
    assert bwd_step_divisor(BwdSpec("bf16", 96, 96, causal=False), BWD_TABLE[96])
    assert not bwd_step_divisor(BwdSpec("bf16", 64, 64, causal=True), BWD_TABLE[64])
    # block-sparse list entries keep the division (measured: prefix-LM lists slower with the divisor)
    assert not bwd_step_divisor(BwdSpec("bf16", 128, 128, causal=False, block_sparse=(128, 128, True)), BWD_TABLE[128])


@pytest.mark.parametrize("b,s,hq,hkv,d,best", [(4, 2048, 8, 2, 128, (True, 1, 8)), (16, 1024, 32, 8, 128, (True, 1, 8)),
                                               (2, 4096, 16, 4, 128, (True, 1, None)),
                                               (4, 4096, 32, 8, 128, (True, 1, None)),
                                               (4, 4096, 32, 8, 64, (True, 1, None)),
                                               (8, 2048, 16, 16, 128, (False, 1, 1))])
def test_det_order_picks_the_measured_winner(b, s, hq, hkv, d, best):
    """The causal deterministic order (H100, SM120 occupancy, deterministic_order_h100_2026-11-26.json.gz):
    lowest first ran 0.90-0.93x the highest-first time at the GQA shapes (probe: bands of 8 fastest at 4 x 2048 8/2
    and 16 x 1024 32/8, 4 and 8 equal at 2 x 4096 16/4; whole groups faster than split 2), 1.42x at 8 x 2048 16/16
    (MHA: 128 pairs of short CTAs, whose chains the banded order starts together). None: any band."""
    from flash_attn_4_sm120.bwd_schedule import bwd_det_order

    tile_n = 128 if d == 64 else 64
    got = bwd_det_order(s, s, 64, tile_n, hkv, hq // hkv, b, 132, 50 << 20, d, d, True)
    assert got[:2] == best[:2] and best[2] in (None, got[2]), got


def test_chained_makespan_starts_a_pairs_ctas_a_lag_apart():
    from flash_attn_4_sm120.bwd_schedule import _chained_makespan, _makespan

    assert _chained_makespan([10, 10, 10], 1, 1, 3, 0.9) == pytest.approx(11.8)
    assert _chained_makespan([10, 10, 10], 2, 2, 6, 0.9) == pytest.approx(11.8)  # pairs do not chain
    assert _chained_makespan([12, 8, 4], 4, 2, 5, 0.0) == _makespan([12, 8, 4], 4, 2, 5)


@pytest.mark.parametrize("sq,sk,tm,tn", [(333, 333, 64, 64), (200, 333, 64, 128), (517, 130, 32, 64), (64, 1000, 64, 32)])
@pytest.mark.parametrize("mask", [(True, False, 0, 0), (False, True, 96, 32), (False, True, 40, 0), (False, False, 0, 0)])
def test_turn_ranks_order_every_query_blocks_adders(sq, sk, tm, tn, mask):
    """The deterministic counters (``_kernels/dq_accum``): the key blocks whose backward range visits query block m
    are exactly the forward's range of m, and each order ranks them 0 .. k-1 (a rank missing or repeated would
    hang a CTA); lowest first, a higher key block's rank is higher (it launches later)."""
    from flash_attn_4_sm120._kernels.block_info import block_range, query_block_range
    from flash_attn_4_sm120._kernels.dq_accum import turn_rank

    causal, local, left, right = mask
    num_m, num_n = -(-sq // tm), -(-sk // tn)
    visitors = {m: [] for m in range(num_m)}
    for n in range(num_n):
        lo, hi = query_block_range(n, sq, sk, tm, tn, causal, local, left, right)
        for m in range(lo, hi):
            visitors[m].append(n)
    for m, ns in visitors.items():
        ranges = block_range(m, sq, sk, tm, tn, causal, local, left, right)
        assert ns == list(range(ranges[0], ranges[3])), (m, ns, ranges)
        for lowest in (False, True):
            ranks = [turn_rank(n, ranges, lowest) for n in ns]
            assert sorted(ranks) == list(range(len(ns))), (m, lowest, ranks)
            assert ranks == sorted(ranks, reverse=not lowest)


@pytest.mark.parametrize("num_m, num_n", [(1, 1), (5, 5), (9, 4), (16, 15), (4, 9), (3, 40), (40, 3)])
def test_rotated_ranks_follow_the_arrival_order(num_m, num_n):
    """The rotated order (``BwdSpec.rotated_turns``): every query block ranks its key blocks 0 .. n-1, and in the
    order they reach it -- key block n starts at query block n where the sequence has no more key blocks than query
    blocks (else all start at block 0 in the highest-first order) -- so no CTA waits on one that reaches the block
    later, and no two CTAs can wait on each other (a rank after a later arrival could deadlock)."""
    from flash_attn_4_sm120._kernels.dq_accum import turn_rank

    rotation = [n % num_m if num_n <= num_m else 0 for n in range(num_n)]
    for m in range(num_m):
        ranks = [turn_rank(n, (0, 0, 0, num_n), False, (m, num_m)) for n in range(num_n)]
        assert sorted(ranks) == list(range(num_n)), (m, ranks)
        steps = [(m - rotation[n]) % num_m for n in range(num_n)]
        order = sorted(range(num_n), key=lambda n: ranks[n])
        assert [steps[n] for n in order] == sorted(steps), (m, ranks, steps)
        if num_n > num_m:  # simultaneous arrivals: the highest key block first, as the unrotated order
            assert ranks == [num_n - 1 - n for n in range(num_n)]


def test_rotated_order_is_chosen_for_unmasked_deterministic_calls_that_fit():
    """A deterministic call without a mask runs the rotated order when its pair's key blocks fit the CTA slots
    together and the pairs fill a wave nearly evenly; masked or oversized calls keep their orders; the predicate
    refuses it elsewhere."""
    from flash_attn_4_sm120 import backward
    from flash_attn_4_sm120.bwd_config import bwd_config_problems, select_bwd_config
    from flash_attn_4_sm120.problem import FwdShape

    spec = BwdSpec("bf16", 128, 128, False, deterministic=True)
    cfg = select_bwd_config(spec, SM120)
    fits = FwdShape(batch=4, seqlen_q=2048, seqlen_k=2048, num_heads=16, num_heads_kv=16)
    too_long = FwdShape(batch=1, seqlen_q=2048, seqlen_k=cfg.tile_n * 1000, num_heads=16, num_heads_kv=16)
    assert backward._rotated_turns(spec, cfg, fits, SM120, 132)
    assert not backward._rotated_turns(spec, cfg, too_long, SM120, 132)
    # 86 key blocks of 96 on 132 slots: the pair straddling two waves would hold 46 slots idle
    d104 = BwdSpec("bf16", 104, 104, False, deterministic=True)
    straddles = FwdShape(batch=2, seqlen_q=8192, seqlen_k=8192, num_heads=32, num_heads_kv=8)
    assert select_bwd_config(d104, SM120).tile_n == 96
    assert not backward._rotated_turns(d104, select_bwd_config(d104, SM120), straddles, SM120, 132)
    assert backward._rotated_turns(d104, select_bwd_config(d104, SM120), fits, SM120, 132)
    for other in (BwdSpec("bf16", 128, 128, True, deterministic=True), BwdSpec("bf16", 128, 128, False),
                  BwdSpec("bf16", 128, 128, False, local=True, deterministic=True)):
        assert not backward._rotated_turns(other, cfg, fits, SM120, 132)
        assert bwd_config_problems(dataclasses.replace(other, rotated_turns=True), cfg, SM120)
    assert not bwd_config_problems(dataclasses.replace(spec, rotated_turns=True), cfg, SM120)


def test_lowest_first_order_admission():
    """The predicate admits the lowest-first order for causal deterministic specs on every class's tile, dense and
    varlen, double-buffered dO tiles, d96's role split and d64's varlen tile included (dQ is repeatable there
    under this order as long as the forward is: ``_kernels/softmax``), and refuses it
    elsewhere; ``bwd_det_order`` never weighs it where it is closed."""
    from flash_attn_4_sm120.bwd_config import bwd_lowest_first_open
    from flash_attn_4_sm120.bwd_schedule import bwd_det_order

    def lo(d, **kw):
        return BwdSpec("bf16", d, d, True, deterministic=True, lowest_first=True, **kw)

    assert all(bwd_lowest_first_open(lo(d), SM120) for d in (64, 96, 128, 192, 256))
    assert all(bwd_lowest_first_open(lo(d, varlen_q=True, varlen_k=True), SM120) for d in (64, 96, 128))
    assert bwd_lowest_first_open(lo(64, softcap=True), SM120)  # d64's heavy tile: a double-buffered dO
    assert select_bwd_config(lo(64, softcap=True), SM120).stages_do == 2
    assert bwd_config_problems(BwdSpec("bf16", 64, 64, False, deterministic=True, lowest_first=True),
                               select_bwd_config(BwdSpec("bf16", 64, 64, False, deterministic=True), SM120), SM120)
    assert bwd_config_problems(BwdSpec("bf16", 64, 64, True, deterministic=False, lowest_first=True),
                               select_bwd_config(BwdSpec("bf16", 64, 64, True), SM120), SM120)
    assert bwd_det_order(2048, 2048, 64, 64, 2, 4, 4, 132, 50 << 20, 96, 96, True, False)[0] is False
