"""Head dims past 256 and MLA on the host (no GPU): which tile the table gives each layout, the predicate's rules for
``dv_warps`` tiles and MLA keys, the shared-memory formula against the 99 KB budget, and the features refused past
256. The numerics on a device are ``test_wide_gpu.py``'s."""

import dataclasses

import pytest

from flash_attn_4_sm120 import config
from flash_attn_4_sm120.execution_model import SM120
from flash_attn_4_sm120.problem import LATENT_ROPE_DIM, BwdSpec, FwdSpec

MLA = dict(head_dim=512 + LATENT_ROPE_DIM, head_dim_v=512, latent_v=True)


def _spec(d=512, dv=512, **kw):
    return FwdSpec(**{"dtype": "bf16", "head_dim": d, "head_dim_v": dv, "causal": True, **kw})


@pytest.mark.parametrize("d,dv", [(264, 264), (384, 384), (512, 512), (448, 320), (320, 512), (512, 128)])
@pytest.mark.parametrize("layout", [{}, dict(pack_gqa=True, split_kv=True), dict(varlen_q=True, varlen_k=True),
                                    dict(seqused_k=True, page_size=16), dict(seqused_k=True, page_size=1,
                                                                              pack_gqa=True)])
def test_every_wide_layout_has_a_valid_tile_within_the_budget(d, dv, layout):
    spec = _spec(d, dv, **layout)
    cfg = config.select_fwd_config(spec, SM120)
    assert cfg.dv_warps > 1 and config.is_valid(spec, cfg, SM120)
    assert config.fwd_smem_bytes(spec, cfg) + config.STATIC_SMEM_BYTES <= SM120.smem_per_cta
    # paged K/V take the two-stage 32-row tile (the one-stage tile's paged copy spills on sm_120a)
    assert (cfg.num_stages == 2) == bool(spec.page_size)


@pytest.mark.parametrize("layout", [{}, dict(seqused_k=True, page_size=64, pack_gqa=True, split_kv=True),
                                    dict(varlen_q=True, varlen_k=True, seqused_q=True, seqused_k=True)])
def test_mla_takes_the_latent_tiles_with_key_stages_and_no_v_tile(layout):
    spec = _spec(**MLA, **layout)
    table = config.fwd_table()
    for cfg in (config.select_fwd_config(spec, SM120), config.decode_entry(spec, SM120)):
        assert cfg in (table["d512_latent"], table["d512_latent_decode"]) and cfg.num_stages >= 2
        assert config.is_valid(spec, cfg, SM120)
        assert config.fwd_smem_bytes(spec, cfg) + config.STATIC_SMEM_BYTES <= SM120.smem_per_cta
        plain = dataclasses.replace(spec, latent_v=False)
        # V read from the K tile: the stages hold 576 columns of K and none of V
        assert config.fwd_smem_bytes(spec, cfg) < config.fwd_smem_bytes(plain, cfg)
    assert spec.k_head_dim == LATENT_ROPE_DIM


@pytest.mark.parametrize("rows,tile_m", [(1, 16), (16, 16), (17, 32), (64, 32), (128, 32), (4096, 32)])
def test_mla_rows_pick_the_tile(rows, tile_m):
    """Rows that fit the 16-row tile (16 heads decoding) run it; more rows (128 heads, speculative decode, prefill)
    the 32-row tile, which reads each latent block for twice the rows."""
    spec = _spec(**MLA, seqused_k=True, pack_gqa=True)
    assert config.choose_fwd_config(spec, SM120, rows, 1, 8192).tile_m == tile_m
    unpacked = _spec(**MLA, seqused_k=True)
    assert config.choose_fwd_config(unpacked, SM120, rows, rows, 8192).tile_m == tile_m


@pytest.mark.parametrize("rows,tile_m", [(8, 16), (16, 16), (32, 32), (4096, 32)])
def test_wide_rows_pick_the_tile(rows, tile_m):
    """Past 256, packed rows that fit 16 (a decode step's GQA group) run the 16-row tile, more rows the 32-row one."""
    spec = _spec(seqused_k=True, pack_gqa=True)
    assert config.choose_fwd_config(spec, SM120, rows, 1, 8192).tile_m == tile_m
    assert config.choose_fwd_config(_spec(), SM120, rows, rows, 8192).tile_m == 32  # unpacked: the class entry


def test_predicate_names_the_wide_rules():
    base = config.fwd_table()["d512_decode"]  # 16 rows, 4 warps splitting each row block
    problems = config.fwd_config_problems(_spec(), dataclasses.replace(base, q_in_regs=True), SM120)
    assert any("Q read from shared memory" in p for p in problems)
    problems = config.fwd_config_problems(_spec(), dataclasses.replace(base, tile_m=32), SM120)
    assert any("tile_m = 16 x num_warps / dv_warps" in p for p in problems)
    problems = config.fwd_config_problems(_spec(**MLA), dataclasses.replace(base, num_stages=1), SM120)
    assert any("num_stages >= 2" in p for p in problems)
    # a 512-wide 16-row O block does not fit one warp: the rows-split tiles are not valid there
    assert not config.is_valid(_spec(), config.fwd_table()["d256_causal"], SM120)


@pytest.mark.parametrize("kw,feature", [(dict(kv_dtype="e4m3"), "fp8"), (dict(dropout=True), "dropout"),
                                        (dict(block_sparse=(128, 128, True)), "block_sparsity")])
def test_features_the_wide_tiles_do_not_serve_are_named(kw, feature):
    assert config.wide_features(_spec(**kw)) == (feature,)
    assert config.wide_features(_spec(256, 256, **kw)) == ()  # up to 256 the class tiles serve them
    assert config.wide_features(_spec(seqused_k=True, page_size=16)) == ()


def test_no_backward_past_256():
    with pytest.raises(NotImplementedError, match="head_dim > 256 with backward"):
        BwdSpec.of(_spec())
    BwdSpec.of(_spec(256, 256))
