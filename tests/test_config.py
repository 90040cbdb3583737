"""The tile table and the one validity predicate."""

from dataclasses import replace

import pytest

from flash_attn_4_sm120 import config
from flash_attn_4_sm120.execution_model import MODELS, SM120, Fp8MmaKind
from flash_attn_4_sm120.problem import FwdSpec


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_every_dispatchable_config_passes_the_predicate(model):
    pairs = config.dispatchable_fwd(model)
    dims = sum(len(d) for d in config.REPRESENTATIVE_HEAD_DIMS.values())
    classes = len(config.REPRESENTATIVE_HEAD_DIMS)
    masks = len(config.MASKS)
    # dtypes x masks x representative head dims, plus 3 softcap/sink combos x masks per class (bf16),
    # 3 varlen layouts x masks per class, and per class packed GQA: 2 x masks (plain, softcap + sink),
    # fp16 causal and causal over packed Q/K; split-KV: 2 x masks (unpacked, packed GQA), fp16 packed
    # causal over packed Q/K; plus each exact-head-dims entry in both dtypes with and without the sink
    # (those not already listed); paged K/V: 3 x masks per class (prefill, packed GQA with softcap +
    # sink, packed GQA split) plus chunked prefill and page sizes 1 and 256; FP8 K/V per class: decode over a dense
    # cache per mask, over a paged one with softcap + sink per mask, chunked prefill, dense prefill full and causal,
    # packed Q/K, e5m2 and fp16 q, plus the paged decode at each representative head dim; FP8 MMAs: prefill per mask
    # at each representative head dim that is a multiple of 16, plus per class softcap + sink, packed Q/K, decode over
    # a dense and over a paged cache; head dims past 256 (config.WIDE_HEAD_DIMS): both dtypes per mask, and at 512
    # per mask softcap, softcap + sink, packed GQA with both, packed split, packed Q/K; plus two packed split decodes;
    # paged prefill and packed split decode at three head-dim pairs, a page-1 local decode;
    # MLA per mask prefill, packed split decode and paged decode with softcap + sink, paged split decode at page sizes
    # 1 / 16 / 64, fp16 paged decode and packed Q/K
    wide = 2 * masks * len(config.WIDE_HEAD_DIMS) + 6 * masks + 2 + 3 * 2 + 1 + 3 * masks + 3 + 2  # + paged, MLA
    fp8_dims = sum(1 for ds in config.REPRESENTATIVE_HEAD_DIMS.values() for d, dv in ds if d % 16 == dv % 16 == 0)
    fp8_classes = classes
    if model.fp8_mma is Fp8MmaKind.NONE:  # no FP8 mma.sync: no FP8 MMA specs
        fp8_dims = fp8_classes = 0
    base = (2 * masks * dims + 3 * masks * classes + 3 * masks * classes + (2 * masks + 2) * classes
            + (2 * masks + 2) * classes + (3 * masks + 3) * classes + (2 * masks + 6) * classes + dims
            + masks * fp8_dims + 4 * fp8_classes + wide)
    assert len(set(pairs)) == len(pairs)
    # every spec with each config the tile-efficiency rule may pick for it
    assert all([cfg for s2, cfg in pairs if s2 == s] == list(config.dispatch_candidates(s, model))
               for s in {s for s, _ in pairs})
    specs = list(dict.fromkeys(s for s, _ in pairs))
    exact = [k for k in config.fwd_table() if config.EXACT_KEY.match(k)]
    covered = {config.exact_key(s) for s in specs}
    assert set(exact) <= covered
    assert base <= len(specs) <= base + 4 * len(exact)
    assert {(s.local, s.causal, s.softcap, s.has_sink) for s, _ in pairs} >= {
        (True, False, True, True), (False, True, False, False), (False, False, True, False)}
    for spec, cfg in pairs:
        assert config.fwd_config_problems(spec, cfg, model) == ()


def test_table_records_device_and_date():
    import json

    data = json.loads(config.TABLE_PATH.read_text())
    assert data["device"] and data["date"]
    base = {f"d{c}_{m}" for c in config.HEAD_DIM_CLASSES for m in ("full", "causal")}
    assert base <= set(data["table"])
    suffixes = ("bf16", "fp16", "local", "cp_async", "m128", "m64", "mha")
    packed = {f"d{c}_{kind}" for c in config.HEAD_DIM_CLASSES
              for kind in ("packgqa", "paged", "paged_m64", "fp8kv", "fp8mma", "decode", "fp8kv_decode", "latent",
                                                       "latent_decode")}
    exact = config.EXACT_KEY
    assert all(k in base or k in packed or any(k == f"{b}_{s}" for b in base for s in suffixes) or exact.match(k)
               for k in data["table"])
    for key, knobs in data["table"].items():
        if key.endswith(("_cp_async", "_paged", "_paged_m64")):  # paged K/V: no TMA
            assert knobs.get("mainloop", "cp_async") == "cp_async", key
        if key.endswith(("_m128", "_m64")):
            assert knobs["tile_m"] == int(key.rsplit("_m", 1)[1]), key
        if "unshared_kv" in knobs:  # the same tile with a deeper K/V pipeline, measured
            other = data["table"][knobs["unshared_kv"]]
            assert (other["tile_m"], other["tile_n"]) == (knobs["tile_m"], knobs["tile_n"]) and other.get("rate_tflops")
            assert other["num_stages"] > knobs["num_stages"], key
        for alt in knobs.get("alternates", ()):  # alternates are measured entries with fewer rows
            assert alt in data["table"] and data["table"][alt]["tile_m"] < knobs["tile_m"], (key, alt)
            assert knobs.get("rate_tflops") and data["table"][alt].get("rate_tflops"), (key, alt)


@pytest.mark.parametrize(
    "cfg, fragment",
    [
        pytest.param(config.FwdConfig(128, 128, 8, 2), "exceeds 101376", id="smem"),
        pytest.param(config.FwdConfig(128, 128, 4, 2), "accumulator registers", id="registers"),
        pytest.param(config.FwdConfig(96, 64, 4, 2), "multiple of 64", id="rows-per-warp"),
        pytest.param(config.FwdConfig(64, 40, 4, 2), "tile_n=40", id="tile-n"),
        pytest.param(config.FwdConfig(64, 64, 4, 5), "num_stages=5", id="stages"),
    ],
)
def test_predicate_names_each_problem(cfg, fragment):
    spec = FwdSpec("bf16", 128, 128, True)
    problems = config.fwd_config_problems(spec, cfg, SM120)
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize("d, dv, klass", [(8, 8, 64), (64, 64, 64), (72, 72, 96), (96, 96, 96), (104, 96, 128),
                                          (192, 128, 192), (128, 192, 192),
                                          (200, 200, 256), (256, 256, 256)])
def test_head_dim_classes(d, dv, klass):
    assert config.head_dim_class(FwdSpec("bf16", d, dv, False)) == klass


def test_static_smem_counts_against_the_budget():
    # 100352 B of dynamic smem + the 1024 B static section is exactly the 101376 B limit.
    spec = FwdSpec("bf16", 64, 64, False)
    cfg = config.FwdConfig(64, 64, 4, 3)
    assert config.fwd_smem_bytes(spec, cfg) + config.STATIC_SMEM_BYTES <= SM120.smem_per_cta


@pytest.mark.parametrize("d, tile_n, width", [(200, 32, 224), (232, 32, 256), (160, 32, 160), (72, 64, 80), (8, 64, 16),
                                              (144, 32, 160)])
def test_smem_width_keeps_copy_passes_inside_the_tile(d, tile_n, width):
    """A 16-column swizzle atom needs 64-row copy passes on 128 threads: with 32-row K tiles the width
    widens to a multiple of 32 (d=200 with 208 columns wrote past the tile: illegal address, H100, 2026-11-22)."""
    cfg = config.FwdConfig(64, tile_n, 4, 2)
    assert config.padded_head_dim(d, cfg) == width
    assert config.rows_per_copy_pass(width, cfg.num_threads) <= tile_n


@pytest.mark.parametrize("d, tile_m, tile_n, width", [(80, 256, 64, 80), (160, 128, 32, 160), (176, 128, 32, 192),
                                                      (144, 128, 32, 160), (72, 256, 64, 80), (112, 256, 32, 112)])
def test_tma_kv_tiles_are_not_widened(d, tile_m, tile_n, width):
    """TMA brings K/V in boxes of the tile's width: only Q/O (tile_m rows, copied by the threads) and the
    16-column atoms' limit bound the width. Widening d=80 to 96 for 64-row K tiles cost a sixth of the
    MMAs (d80 ping-pong 317 -> 332-352 TFLOPS with 80 columns, H100 at SM120 occupancy, 2026-11-24)."""
    cfg = config.FwdConfig(tile_m, tile_n, 8, 2, mainloop="tma", overlap=True, pingpong=True)
    assert config.padded_head_dim(d, cfg) == width
    assert config.rows_per_copy_pass(width, cfg.num_threads) <= tile_m
    # a TMA box spans the padded row: the predicate keeps TMA tiles to head dims they hold unpadded
    problems = config.fwd_config_problems(FwdSpec("bf16", d, d, False), cfg, SM120)
    assert (problems == ()) == (width == d)
    assert width == d or any("cp_async mainloop serves them" in p for p in problems)


def test_tile_efficiency_rule_moves_short_sequences_to_smaller_tiles():
    """Long sequences keep the class entry; short causal ones take the smaller-M alternates, as measured
    (entry_sweep short_*, H100 at SM120 occupancy, 2026-11-24)."""
    def pick(d, causal, s, group=1):
        spec = FwdSpec("bf16", d, d, causal)
        return config.choose_fwd_config(spec, SM120, s, s, s).tile_m
    assert pick(96, True, 4096) == 128 and pick(96, False, 4096) == 128
    # 12x777 24/8: the one-stage 128x64 tile (two CTAs per SM) 185-191 TFLOPS vs 170-178 for 64x32
    assert pick(96, True, 777) == 128 and pick(80, False, 537) == 128
    assert pick(96, True, 300) == 64  # 93 -> 120 at 16x300 32/8 (64x32 against the 256x64 ping-pong entry)
    assert pick(128, False, 777) == 128 and pick(128, True, 555) == 64
    # d64 (one-stage tiles, 2026-11-25): 16x537 MHA full keeps 128 rows (193 vs 190), causal moves to 64 (163 vs 139)
    assert pick(64, False, 537) == 128 and pick(64, True, 537) == 64 and pick(64, True, 1024) == 128
    for spec in (FwdSpec("bf16", 96, 96, True), FwdSpec("bf16", 128, 128, False), FwdSpec("bf16", 192, 128, True)):
        assert all(config.is_valid(spec, c, SM120) for c, _ in config.fwd_candidates(spec, SM120))
    # packed GQA and split-KV specs have their own entries and no alternates
    assert len(config.fwd_candidates(FwdSpec("bf16", 96, 96, True, pack_gqa=True), SM120)) == 1


def test_tile_work_counts_padded_rows_and_blocks():
    cfg = config.FwdConfig(128, 64, 8, 2, mainloop="tma", overlap=True, pingpong=True)
    o = config.TILE_OVERHEAD_BLOCKS
    assert config.tile_work(cfg, 256, 256, 256, False) == 2 * 128 * (4 + o) * 64
    # causal: tile 0 sees keys 0-127 (2 blocks), tile 1 keys 0-255 (4 blocks)
    assert config.tile_work(cfg, 256, 256, 256, True) == 128 * (2 + 4 + 2 * o) * 64
    # seqlen_q < seqlen_k: bottom-right aligned, every tile sees the 1000 - 256 earlier keys too
    assert config.tile_work(cfg, 256, 256, 1000, True) == 128 * (14 + 16 + 2 * o) * 64


def test_tile_band_fits_the_l2_share():
    mb = 1 << 20
    # 4096 keys of d=128 K and V: 2 MiB per KV head; 48 MiB of L2 -> 24 MiB per band -> 12 KV heads
    assert config.tile_band(48 * mb, 4096, 128, 128, 1) == 12
    assert config.tile_band(48 * mb, 4096, 128, 128, 4) == 48  # four query heads share each KV head
    assert config.tile_band(48 * mb, 1 << 20, 256, 256, 1) == 1  # one pair alone overflows: pair by pair
    assert config.tile_band(0, 0, 64, 64, 1) == 1


def test_table_keys_most_specific_first():
    spec = FwdSpec("fp16", 128, 128, False, local=True, seqused_k=True)
    assert config.table_keys(spec) == ["d128x128_local", "d128_causal_fp16", "d128_causal_local", "d128_causal",
                                       "d128_causal_cp_async"]
    # exact keys name the head dims and the features that change register demand
    assert config.exact_key(FwdSpec("bf16", 192, 128, True, softcap=True, split_kv=True)) == "d192x128_causal_softcap_splitkv"
    assert config.exact_key(FwdSpec("bf16", 128, 128, False, has_sink=True)) == "d128x128_full"


def test_every_table_entry_is_a_known_mainloop():
    for key, cfg in config.fwd_table().items():
        assert cfg.mainloop in config.MAINLOOPS, key


@pytest.mark.parametrize("layout", [dict(varlen_k=True), dict(seqused_k=True)])
def test_tma_mainloops_refuse_varlen_k_and_the_table_routes_around_them(layout):
    from dataclasses import replace

    spec = replace(FwdSpec("bf16", 128, 128, True), **layout)
    for ml in ("tma", "tma_ws"):
        problems = config.fwd_config_problems(spec, config.FwdConfig(128, 64, 4, 2, mainloop=ml), SM120)
        assert any("dense K/V" in p for p in problems)
    assert config.select_fwd_config(spec, SM120).mainloop == "cp_async"


def test_tma_mainloops_need_tma_in_the_model():
    from flash_attn_4_sm120.execution_model import SM80

    problems = config.fwd_config_problems(FwdSpec("bf16", 64, 64, False), config.FwdConfig(64, 64, 4, 2, mainloop="tma"), SM80)
    assert any("needs TMA" in p for p in problems)


def test_mbarriers_are_counted_in_smem():
    spec = FwdSpec("bf16", 128, 128, False)
    cp = config.fwd_smem_bytes(spec, config.FwdConfig(128, 64, 4, 2))
    tma = config.fwd_smem_bytes(spec, config.FwdConfig(128, 64, 4, 2, mainloop="tma"))
    assert tma == cp + config.MBARRIER_BYTES
    assert tma + config.STATIC_SMEM_BYTES <= SM120.smem_per_cta


def test_pack_gqa_selection_rule():
    from flash_attn_4_sm120.config import PACK_GQA_MAX_SEQLEN_Q, use_pack_gqa

    assert use_pack_gqa(None, 32, 8, 1)  # decode, GQA: packed
    assert use_pack_gqa(None, 32, 1, PACK_GQA_MAX_SEQLEN_Q - 1)  # MQA short query: packed
    assert not use_pack_gqa(None, 32, 8, PACK_GQA_MAX_SEQLEN_Q)  # full tiles already
    assert use_pack_gqa(None, 16, 16, 1) and use_pack_gqa(True, 16, 16, 1)  # MHA decode: the 64-row short-query tile
    assert not use_pack_gqa(None, 16, 16, PACK_GQA_MAX_SEQLEN_Q)  # MHA prefill: the prefill tiles
    assert use_pack_gqa(True, 28, 4, 4096) and not use_pack_gqa(False, 32, 8, 1)  # the caller decides


def test_packed_specs_take_the_packgqa_entry():
    from dataclasses import replace

    for d in (64, 128):
        spec = replace(FwdSpec("bf16", d, d, True), pack_gqa=True)
        assert config.table_keys(spec)[0] == f"d{d}_packgqa"
        cfg = config.select_fwd_config(spec, SM120)
        assert cfg == config.fwd_table()[f"d{d}_packgqa"] and cfg.tile_m == 64
    packed = [s for s, _ in config.dispatchable_fwd(SM120) if s.pack_gqa]
    assert {s.causal for s in packed} == {True, False} and any(s.local for s in packed)
    assert any(s.varlen_q and s.seqused_k for s in packed) and any(s.has_sink and s.softcap for s in packed)


def test_split_spec_with_a_sink_is_refused_by_the_predicate():
    spec = FwdSpec("bf16", 128, 128, causal=False, has_sink=True, split_kv=True)
    problems = config.fwd_config_problems(spec, config.FwdConfig(64, 64), SM120)
    assert any("sink enters once" in p for p in problems)


@pytest.mark.parametrize("requested, ctas, blocks, sms, batch, per_sm, want", [
    (1, 8, 128, 132, 1, 1, 1),          # 1 never splits
    (None, 128, 128, 132, 16, 1, 1),    # decode 16 x 8 KV heads, one 80 KB CTA per SM: one wave already
    (None, 128, 128, 132, 16, 2, 2),    # ... a tile two of which share an SM: to two per SM
    (0, 128, 128, 132, 16, 2, 2),       # 0 is automatic too
    (None, 64, 128, 132, 16, 1, 2),     # decode 16 x 4 KV heads (7-way GQA)
    (None, 256, 128, 132, 16, 2, 1),    # decode 16 x 16 heads: nearly 2 per SM already
    (None, 120, 128, 132, 30, 1, 1),    # 120 tiles: 11 splits would even the waves but pay 10 prologues each
    (None, 32, 128, 132, 4, 1, 4),      # decode 4 x 8 KV heads
    (None, 8, 683, 132, 1, 1, 16),      # decode 1 x 8 KV heads: 16 splits fill one wave (17 would spill a second)
    (None, 4096, 64, 132, 4, 1, 1),     # prefill fills the GPU: no split
    (None, 8, 6, 132, 1, 1, 1),         # too few key blocks for 4 per split
    (None, 8, 40, 132, 1, 1, 10),       # ... at most blocks // 4 splits
    (500, 1, 4096, 132, 1, 1, 128),     # at most MAX_SPLITS
    (None, 1, 4096, 132, 1, 1, 122),    # ... the fewest splits within 5% of the best time
    (None, 100, 128, 132, 25, 1, 5),    # 100 tiles leave 32 SMs idle: 5 splits, 4 waves (0.85 of unsplit)
    (500, 8, 7, 132, 1, 1, 7),          # an explicit count is clamped to the key blocks
    (200, 8, 4096, 132, 1000, 1, 65),   # ... and to the grid's z extent (batch * splits <= 65535)
])
def test_num_splits_choice(requested, ctas, blocks, sms, batch, per_sm, want):
    assert config.num_splits_for(requested, ctas, blocks, sms, batch, per_sm) == want


@pytest.mark.parametrize("ctas, one_m_block, want", [
    (136, True, 4),     # decode 34 x 4 KV heads: unsplit, a second wave of 4 CTAs doubles the time
    (136, False, 1),    # ... a prefill grid past one wave stays whole
    (264, True, 1),     # two full waves: nothing to even out
    (132, True, 1),     # one full wave
])
def test_split_choice_past_one_wave(ctas, one_m_block, want):
    assert config.num_splits_for(None, ctas, 128, 132, 34, 1, one_m_block=one_m_block) == want


def test_overlap_predicate():
    """overlap=True needs two stages and a loader that refills whole slots (not tma_ws)."""
    from flash_attn_4_sm120.config import FwdConfig, fwd_config_problems

    spec = FwdSpec("bf16", 64, 64, True)
    assert not fwd_config_problems(spec, FwdConfig(64, 64, 4, 2, overlap=True), SM120)
    assert any("num_stages must be 2" in p for p in fwd_config_problems(spec, FwdConfig(64, 64, 4, 3, overlap=True), SM120))
    assert any("tma_ws" in p for p in fwd_config_problems(spec, FwdConfig(64, 64, 4, 2, mainloop="tma_ws",
                                                                             overlap=True), SM120))
    # the previous block's P counts against the register budget: 128x64 at d=128 no longer fits
    assert any("O + S + P" in p for p in fwd_config_problems(FwdSpec("bf16", 128, 128, False),
                                                             FwdConfig(128, 64, 4, 2, overlap=True), SM120))


def test_pingpong_predicate():
    """pingpong=True needs the overlapped step, the "tma" loader and two 4-warp groups; it fits 99 KB
    at d=128 only with 32-key blocks (two 128-row Q halves = 64 KB)."""
    from flash_attn_4_sm120.config import FwdConfig, fwd_config_problems

    spec = FwdSpec("bf16", 128, 128, False)
    good = FwdConfig(256, 32, 8, 2, mainloop="tma", overlap=True, pingpong=True)
    assert not fwd_config_problems(spec, good, SM120)
    for bad in (replace(good, overlap=False), replace(good, mainloop="cp_async"), replace(good, num_warps=4)):
        assert any("pingpong=True" in p for p in fwd_config_problems(spec, bad, SM120)), bad
    assert any("shared memory" in p for p in fwd_config_problems(spec, replace(good, tile_n=48), SM120))


def test_persistent_predicate():
    """persistent=True rides on the ping-pong mainloop and serves dense, unpacked, unsplit query tiles;
    the specs it refuses name the reason (the table's fallback entries serve them)."""
    from flash_attn_4_sm120.config import FwdConfig, fwd_config_problems

    spec = FwdSpec("bf16", 128, 128, True)
    good = FwdConfig(256, 32, 8, 2, mainloop="tma", overlap=True, pingpong=True, persistent=True)
    assert not fwd_config_problems(spec, good, SM120)
    assert any("needs pingpong=True" in p for p in fwd_config_problems(spec, replace(good, pingpong=False), SM120))
    for bad in (replace(spec, split_kv=True), replace(spec, pack_gqa=True), replace(spec, varlen_q=True),
                replace(spec, seqused_q=True)):
        assert any("persistent=True with" in p for p in fwd_config_problems(bad, good, SM120)), bad


def test_mbarrier_release_predicate():
    """mbarrier_release=True changes how the plain TMA step hands its stages back: the cp.async loader
    and the overlapped step (its own slot schedule) refuse it, naming what would take it."""
    from flash_attn_4_sm120.config import FwdConfig, fwd_config_problems

    spec = FwdSpec("bf16", 256, 256, True)
    good = FwdConfig(64, 32, 4, 2, mainloop="tma", mbarrier_release=True)
    assert not fwd_config_problems(spec, good, SM120)
    for bad in (replace(good, mainloop="cp_async"), replace(good, mainloop="tma_ws"), replace(good, overlap=True)):
        assert any("mbarrier_release=True" in p and "mainloop=tma without overlap" in p
                   for p in fwd_config_problems(spec, bad, SM120)), bad


def test_occupancy_launch_smem_follows_the_model():
    from flash_attn_4_sm120.config import occupancy_launch_smem

    spec = FwdSpec("bf16", 128, 128, False)
    one = config.FwdConfig(tile_m=128, tile_n=64, num_warps=4, num_stages=2, mainloop="tma")  # 97 KB: 1 CTA per SM120 SM
    two = config.FwdConfig(tile_m=128, tile_n=64, num_warps=4, num_stages=2)  # d=64 below: 48 KB, 2 per SM
    h100 = (233472, 232448)
    assert occupancy_launch_smem(spec, one, SM120, None) == 0  # no GPU / FA4_SM120_OCCUPANCY=device
    assert occupancy_launch_smem(spec, one, SM120, (102400, 101376)) == 0  # the SM120 itself
    assert occupancy_launch_smem(spec, one, SM120, h100) == 232448 - 1024  # alone on an H100 SM
    spec64 = FwdSpec("bf16", 64, 64, False)
    assert 233472 // (occupancy_launch_smem(spec64, two, SM120, h100) + 2048) == 2


def test_min_ctas_leave_32_row_warps_all_their_registers():
    """A build promises ptxas as many CTAs per SM as shared memory allows, down to 128 registers a thread per
    16 rows of a warp: 32 rows per warp keep 255 (d40 128x64 one-stage spilled at the 168 of three CTAs)."""
    spec = FwdSpec("bf16", 40, 40, False)
    big = config.FwdConfig(128, 64, 4, 1, q_in_regs=True)
    small = config.FwdConfig(64, 64, 4, 1, q_in_regs=True)
    assert config.fwd_ctas_per_sm(spec, big, SM120) >= 3
    assert config.fwd_min_ctas_per_sm(spec, big, SM120, big.num_threads) == 2
    assert config.fwd_min_ctas_per_sm(spec, small, SM120, small.num_threads) == min(
        4, config.fwd_ctas_per_sm(spec, small, SM120))


def test_unshared_kv_takes_the_deeper_pipeline():
    """d64 non-causal: MHA (K/V from DRAM) takes the two-stage tile, GQA the one-stage one (16x537 20/20: 196-198 ->
    209-213 TFLOPS; 2x4096 32/8: 349-354 one-stage vs 338-345; H100 at SM120 occupancy, 2026-11-25)."""
    spec = FwdSpec("bf16", 64, 64, False)
    assert config.choose_fwd_config(spec, SM120, 537, 537, 537, True).num_stages == 1
    assert config.choose_fwd_config(spec, SM120, 537, 537, 537, False).num_stages == 2
    assert config.choose_fwd_config(spec, SM120, 4096, 4096, 4096, False).num_stages == 2
    assert config.choose_fwd_config(spec, SM120, 300, 300, 300, False).tile_m == 64  # the alternates stay
    # an entry without one serves both; every config either may run is dispatchable (gated, precompiled)
    causal = FwdSpec("bf16", 64, 64, True)
    assert config.fwd_candidates(causal, SM120, False) == config.fwd_candidates(causal, SM120, True)
    assert len(config.dispatch_candidates(spec, SM120)) == 3


@pytest.mark.parametrize("head_dim", [96, 128])
def test_paged_prefill_tile_follows_the_chunk_length(head_dim):
    """Prefill over paged K/V (no TMA: pages are gathered row by row) takes the 128-row 8-warp cp.async tile for
    long chunks and the 64-row tile where half a 128-row tile would be padding (paged_prefill_tiles_*:
    d128 4x512 306 vs 242 TFLOPS, 16x64 147 vs 218)."""
    spec = FwdSpec("bf16", head_dim, head_dim, causal=True, seqused_k=True, page_size=16)
    long = config.choose_fwd_config(spec, SM120, 512, 512, 4608, True)
    short = config.choose_fwd_config(spec, SM120, 64, 64, 2112, True)
    assert (long.tile_m, long.tile_n, long.num_warps, long.mainloop) == (128, 64, 8, "cp_async")
    assert (short.tile_m, short.num_warps) == (64, 4)
    for cfg in (long, short):
        assert config.is_valid(spec, cfg, SM120)


def test_paged_decode_keeps_the_packed_gqa_tile():
    """Decode over paged K/V packs the query heads of a KV group: the packed-GQA entry comes before the paged one."""
    spec = FwdSpec("bf16", 128, 128, causal=False, seqused_k=True, page_size=16, pack_gqa=True)
    assert config.table_keys(spec)[:2] == ["d128_packgqa", "d128_paged"]
    cfg = config.choose_fwd_config(spec, SM120, 4, 1, 8192, True)
    assert (cfg.tile_m, cfg.tile_n, cfg.num_stages) == (64, 48, 3)


def test_decode_rows_take_the_warps_on_keys_tile():
    """Packed rows that fit 16 (seqlen_q x group) run the d64 class's decode tile, with 16-bit and FP8 K/V alike, split
    or not; more rows, unpacked calls and classes without a decode entry keep the 64-row tiles."""
    for kv in (None, "e4m3", "e5m2"):
        for split in (False, True):
            spec = FwdSpec("bf16", 64, 64, causal=False, pack_gqa=True, kv_dtype=kv, split_kv=split, seqused_k=True,
                           page_size=16)
            decode = config.decode_entry(spec, SM120)
            assert decode is not None and decode.warps_on_keys and decode.tile_m == 16
            assert config.choose_fwd_config(spec, SM120, 16, 2, 8192, True) == decode
            assert config.choose_fwd_config(spec, SM120, 17, 17, 8192, True) != decode
            assert decode in config.dispatch_candidates(spec, SM120)
    assert config.decode_entry(FwdSpec("bf16", 64, 64, causal=False), SM120) is None  # unpacked
    assert config.decode_entry(FwdSpec("bf16", 128, 128, causal=False, pack_gqa=True), SM120) is None  # no d128 entry
    mma = FwdSpec("bf16", 64, 64, causal=False, pack_gqa=True, kv_dtype="e4m3", fp8_mma=True)
    assert config.decode_entry(mma, SM120) is None


def test_warps_on_keys_predicate():
    """The decode tile's rules: one 16-row tile, whole 16-key shares per warp, the cp.async multistage step,
    inference features only, a merge buffer within the tiles it reuses."""
    spec = FwdSpec("bf16", 64, 64, causal=True, pack_gqa=True)
    good = config.FwdConfig(tile_m=16, tile_n=64, num_warps=4, num_stages=3, q_in_regs=True, warps_on_keys=True)
    assert config.is_valid(spec, good, SM120)
    for bad, words in ((replace(good, tile_m=64), "16-row tile"), (replace(good, tile_n=32), "16-key shares"),
                       (replace(good, num_stages=1), "multistage"), (replace(good, overlap=True), "multistage")):
        assert any(words in p for p in config.fwd_config_problems(spec, bad, SM120)), bad
    assert any("not built" in p for p in config.fwd_config_problems(replace(spec, dropout=True), good, SM120))
    # the merge reuses the K/V tiles (partial O) and Q's (row statistics): 4 warps x 16 rows x (64 + 4) fp32, 512 B
    assert config.keysplit_merge_bytes(spec, good) == (4 * 16 * 68 * 4, 512)


@pytest.mark.parametrize("causal", [False, True])
def test_no_head_dim_gets_a_tma_tile_it_would_pad(causal):
    """A TMA box spans the tile's padded row, which a K / V row of a head dim that pads does not reach (the atom does
    not build: d72-d88, d104, d120 on sm_120a): every head dim, at every row count the tile rule weighs, gets a
    tile that holds its rows unpadded or a cp.async tile."""
    for d in range(8, 257, 8):
        spec = FwdSpec("bf16", d, d, causal=causal)
        for rows in (16, 333, 1000, 2048, 8192):
            cfg = config.choose_fwd_config(spec, SM120, rows, rows, rows)
            assert not cfg.uses_tma or config.smem_head_dims(spec, cfg) == (d, d), (d, rows, cfg)
