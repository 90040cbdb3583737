"""Time table-entry candidates the tuner cannot (a sliding window, a packed-GQA split-KV decode, softcap,
prefill split-KV, MHA decode) through the API with a config override, at both occupancies (a script, not
a test). Session 10 chose d128_causal_local with it; session 11 timed the softcap / split-KV entries, session 12
the d192 class.

    python benchmarks/explore/entry_sweep.py [--sets window decode shortq softcap splitkv d192 d160 d192x192] [--repeat N]
                                             [--occupancy model]
    # writes $OUT/explore.json
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))
import torch  # noqa: E402

from flash_attn_4_sm120.config import FwdConfig  # noqa: E402
from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV  # noqa: E402
from flash_attn_4_sm120.interface import _launch_fwd, _with_packing  # noqa: E402
from flash_attn_4_sm120.problem import validate_fwd  # noqa: E402
from timing import median_ms  # noqa: E402


def cp_async(tm: int, tn: int, stages: int, q_in_regs: bool) -> FwdConfig:
    return FwdConfig(tile_m=tm, tile_n=tn, num_warps=4, num_stages=stages, q_in_regs=q_in_regs, mainloop="cp_async")


def pingpong(tm: int, tn: int, q_in_regs: bool) -> FwdConfig:
    return FwdConfig(tile_m=tm, tile_n=tn, num_warps=8, num_stages=2, q_in_regs=q_in_regs, mainloop="tma",
                     overlap=True, pingpong=True)


#: None = the table's own entry
SMALL_TILES = [None, cp_async(64, 64, 2, True), cp_async(64, 32, 2, True), cp_async(64, 32, 2, False),
               cp_async(64, 64, 2, False), cp_async(64, 32, 3, True)]
#: the d128x128 ping-pong entries (full, causal) against the d128 class entries softcap / split-KV fall back to
PINGPONG = [None, pingpong(256, 32, False), pingpong(128, 64, True)]
#: the d192 class: its cp.async tile against the Q-in-registers ping-pong tile (session 12)
D192 = [None, cp_async(64, 32, 2, True), pingpong(128, 32, True)]
# set -> [(name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, causal, window_left, softcap, num_splits, candidates)]
# at head dims 128/128 unless the set is listed in SET_HEAD_DIMS
SETS = {
    "window": [("window1024", 1, 8192, 8192, 32, 8, True, 1024, 0.0, None, SMALL_TILES),
               ("causal8192", 1, 8192, 8192, 32, 8, True, None, 0.0, None, [None])],
    "decode": [("decode", 16, 1, 8192, 32, 8, False, None, 0.0, None, SMALL_TILES)],
    "shortq": [("shortq64_causal", 4, 64, 8192, 32, 8, True, None, 0.0, None, SMALL_TILES),
               ("shortq16", 8, 16, 4096, 32, 8, False, None, 0.0, None, SMALL_TILES)],
    "softcap": [("softcap_full", 4, 4096, 4096, 32, 8, False, None, 30.0, None, PINGPONG),
                ("softcap_causal", 4, 4096, 4096, 32, 8, True, None, 30.0, None, PINGPONG)],
    "splitkv": [("splitkv4_full", 1, 1024, 16384, 8, 8, False, None, 0.0, 4, PINGPONG),
                ("splitkv4_causal", 1, 1024, 16384, 8, 8, True, None, 0.0, 4, PINGPONG),
                ("mha_decode", 16, 1, 8192, 32, 32, False, None, 0.0, None, PINGPONG + SMALL_TILES[1:3])],
    # the d192 class (192/128, 160/160): its cp.async entry against the 16-rows-per-warp Q-in-registers ping-pong
    "d192": [("d192x128_full", 4, 4096, 4096, 16, 16, False, None, 0.0, None, D192),
             ("d192x128_causal", 4, 4096, 4096, 16, 16, True, None, 0.0, None, D192),
             ("d192x128_softcap_causal", 4, 4096, 4096, 16, 16, True, None, 30.0, None, D192),
             ("d192x128_splitkv4_causal", 1, 1024, 16384, 8, 8, True, None, 0.0, 4, D192),
             ("d192x128_window1024", 1, 8192, 8192, 16, 16, True, 1024, 0.0, None, D192)],
    "d160": [("d160_full", 4, 4096, 4096, 16, 16, False, None, 0.0, None, D192),
             ("d160_causal", 4, 4096, 4096, 16, 16, True, None, 0.0, None, D192)],
    "d192x192": [("d192x192_full", 2, 4096, 4096, 16, 16, False, None, 0.0, None, D192),
                 ("d192x192_causal", 2, 4096, 4096, 16, 16, True, None, 0.0, None, D192)],
}
#: (head_dim, head_dim_v) of the sets not at 128/128
SET_HEAD_DIMS = {"d192": (192, 128), "d160": (160, 160), "d192x192": (192, 192)}

#: Tile efficiency (session 14): per head-dim class, the table entry against smaller-M tiles, on long and short
#: sequences of both masks, so a rule can weigh a tile's rate on the work it computes against the padding of
#: its last M tile and of the causal diagonal.
SHORT_SHAPES = [(2, 4096, 32, 8), (4, 1024, 32, 8), (12, 777, 24, 8), (16, 537, 20, 20), (8, 555, 25, 5),
                (16, 300, 32, 8)]
SHORT_CANDIDATES = {
    (64, 64): [None, cp_async(64, 64, 2, True), cp_async(64, 64, 2, False), pingpong(128, 64, True)],
    (96, 96): [None, pingpong(128, 64, True), pingpong(128, 64, False), cp_async(64, 64, 2, True),
               cp_async(64, 32, 2, True), cp_async(64, 32, 2, False)],
    (80, 80): [None, pingpong(128, 64, True), cp_async(64, 64, 2, True), cp_async(64, 32, 2, True)],
    (128, 128): [None, pingpong(128, 64, True), pingpong(256, 32, False), cp_async(64, 64, 2, True),
                 cp_async(64, 32, 2, True)],
    (192, 128): [None, cp_async(64, 32, 2, True)],
}
#: head dims whose TMA K/V width has a choice of swizzle atoms (session 14 timed them with the 16-column atom
#: limit of config.padded_head_dim changed in a copy of the package): the table entry only
WIDTH_SHAPES = [(2, 4096, 32, 8), (4, 2048, 16, 16), (8, 555, 25, 5)]
for _d in (80, 112, 176):
    SETS[f"width_d{_d}"] = [(f"d{_d}_{b}x{s}_{hq}_{hkv}" + ("_causal" if c else ""), b, s, s, hq, hkv, c, None, 0.0,
                             None, [None], (_d, _d)) for (b, s, hq, hkv) in WIDTH_SHAPES for c in (False, True)]
for (_d, _dv), _cands in SHORT_CANDIDATES.items():
    SETS[f"short_d{_d}"] = [(f"d{_d}_{b}x{s}_{hq}_{hkv}" + ("_causal" if c else ""), b, s, s, hq, hkv, c, None, 0.0,
                             None, _cands, (_d, _dv))
                            for (b, s, hq, hkv) in SHORT_SHAPES for c in (False, True)]

#: Session 15: non-causal tiles against 8-warp ping-pong / one-CTA alternatives where the matrix misses upstream
#: or FA2 by < 5% (d64, d80, d192/128, d256 full)
FULL_SHAPES = {64: [(2, 4096, 32, 8), (4, 2048, 32, 32)], 80: [(2, 4096, 32, 8), (4, 2048, 32, 32), (10, 901, 12, 3)],
               192: [(4, 2048, 8, 8), (2, 4096, 16, 4)], 256: [(4, 2048, 8, 8), (2, 4096, 16, 4)]}
FULL_CANDIDATES = {
    (64, 64): [None, pingpong(256, 64, False), pingpong(128, 64, True), pingpong(256, 32, False),
               pingpong(128, 64, False), pingpong(128, 128, True)],
    (80, 80): [None, pingpong(128, 64, True), cp_async(128, 64, 2, False), cp_async(128, 32, 2, False),
               cp_async(128, 32, 2, True), pingpong(256, 32, False)],
    (192, 128): [None, pingpong(128, 32, False), cp_async(128, 32, 2, False), cp_async(64, 32, 3, True),
                 cp_async(64, 32, 2, True)],
    (256, 256): [None, pingpong(128, 16, False), cp_async(64, 32, 2, False), cp_async(64, 16, 3, True)],
}
for (_d, _dv), _cands in FULL_CANDIDATES.items():
    SETS[f"full_d{_d}"] = [(f"d{_d}_{b}x{s}_{hq}_{hkv}", b, s, s, hq, hkv, False, None, 0.0, None, _cands, (_d, _dv))
                           for (b, s, hq, hkv) in FULL_SHAPES[_d]]

#: Session 15: one-stage cp.async tiles (one K and one V buffer: 128x64 at head dims <= 96 fits twice in an
#: SM120 SM; 64x64 at d=256 fits once) against the table entries
S1_SHAPES = [(2, 4096, 32, 8, False), (4, 2048, 32, 32, False), (4, 2048, 32, 32, True), (2, 4096, 32, 8, True),
             (10, 901, 12, 3, False), (12, 777, 24, 8, True), (16, 537, 20, 20, False), (4, 4096, 20, 20, True)]
S1_CANDIDATES = {
    (64, 64): [None, cp_async(128, 64, 1, True), cp_async(128, 64, 1, False)],
    (80, 80): [None, cp_async(128, 64, 1, False), cp_async(128, 64, 1, True)],
    (96, 96): [None, cp_async(128, 64, 1, False)],
    (256, 256): [None, cp_async(64, 64, 1, False)],
}
S1_D256_SHAPES = [(4, 2048, 8, 8, False), (4, 2048, 8, 8, True), (2, 4096, 16, 4, False), (8, 1000, 16, 4, False),
                  (3, 3072, 14, 2, True)]
for (_d, _dv), _cands in S1_CANDIDATES.items():
    SETS[f"s1_d{_d}"] = [(f"d{_d}_{b}x{s}_{hq}_{hkv}" + ("_causal" if c else ""), b, s, s, hq, hkv, c, None, 0.0, None,
                          _cands, (_d, _dv)) for (b, s, hq, hkv, c) in (S1_D256_SHAPES if _d == 256 else S1_SHAPES)]

#: Session 16: the one-stage tiles as class entries and alternates, on the tile-efficiency shapes (rates at
#: 2x4096 32/8 for config.choose_fwd_config, and whether its picks are the fastest per shape)
S1_RULE_CANDIDATES = {
    (80, 80): [None, cp_async(128, 64, 1, False), cp_async(64, 32, 2, True), cp_async(64, 64, 1, True)],
    (96, 96): [None, cp_async(128, 64, 1, False), cp_async(64, 32, 2, True), cp_async(64, 64, 1, True)],
    (128, 128): [None, cp_async(64, 64, 1, True), cp_async(64, 64, 1, False), cp_async(64, 32, 2, True)],
    (192, 128): [None, cp_async(64, 32, 1, False), cp_async(64, 32, 1, True), cp_async(64, 64, 1, True),
                 cp_async(64, 32, 2, True)],
    (64, 64): [None, cp_async(128, 64, 1, True), cp_async(128, 64, 1, False), cp_async(64, 64, 1, True),
               cp_async(64, 64, 2, True)],
}
for (_d, _dv), _cands in S1_RULE_CANDIDATES.items():
    SETS[f"s1r_d{_d}"] = [(f"d{_d}x{_dv}_{b}x{s}_{hq}_{hkv}" + ("_causal" if c else ""), b, s, s, hq, hkv, c, None,
                           0.0, None, _cands, (_d, _dv)) for (b, s, hq, hkv) in SHORT_SHAPES for c in (False, True)]

#: the d128 class's 128-row alternate against the new 64-row one where the rule weighs them (non-causal)
SETS["s1r_d128_m128"] = [(f"d128x128_{b}x{s}_{hq}_{hkv}", b, s, s, hq, hkv, False, None, 0.0, None,
                          [None, pingpong(128, 64, True), cp_async(64, 64, 1, True)], (128, 128))
                         for (b, s, hq, hkv) in SHORT_SHAPES]

#: Session 16: 8-warp one-stage cp.async tiles (16 rows per warp, two warps per scheduler at one or two CTAs per
#: SM) against the table where the matrix still misses (192/128 full, d80 10x901) and beside it
def cp_async8(tm: int, tn: int, stages: int, q_in_regs: bool) -> FwdConfig:
    return FwdConfig(tile_m=tm, tile_n=tn, num_warps=8, num_stages=stages, q_in_regs=q_in_regs, mainloop="cp_async")


W8_CASES = {(192, 128): [(2, 4096, 16, 4, False), (3, 3072, 14, 2, False), (4, 2048, 8, 8, False), (2, 4096, 16, 4, True),
                         (12, 700, 18, 6, True)],
            (80, 80): [(10, 901, 12, 3, False), (2, 4096, 32, 8, False), (4, 2048, 32, 32, True)],
            (96, 96): [(2, 4096, 32, 8, False), (12, 777, 24, 8, True)],
            (64, 64): [(2, 4096, 32, 8, False), (16, 537, 20, 20, False), (4, 2048, 32, 32, True)]}
W8_CANDIDATES = {(192, 128): [None, cp_async8(128, 64, 1, False), cp_async8(128, 64, 1, True)],
                 (80, 80): [None, cp_async8(128, 64, 1, False)], (96, 96): [None, cp_async8(128, 64, 1, False)],
                 (64, 64): [None, cp_async8(128, 64, 2, True)]}
SETS["w8_probe"] = [(f"d{d}x{dv}_{b}x{s}_{hq}_{hkv}" + ("_causal" if c else ""), b, s, s, hq, hkv, c, None, 0.0, None,
                     W8_CANDIDATES[(d, dv)], (d, dv)) for (d, dv), shapes in W8_CASES.items() for (b, s, hq, hkv, c) in shapes]

#: the 8-warp one-stage Q-in-registers tile across the d192 class (192/128, 160/160, 192/192), with the class's 64-row
#: alternate at 2x4096 32/8 (the rule's rate shape)
D192_W8 = [None, cp_async8(128, 64, 1, True)]
SETS["w8_d192"] = [(f"d{d}x{dv}_{b}x{s}_{hq}_{hkv}" + ("_causal" if c else ""), b, s, s, hq, hkv, c, None, 0.0, None,
                    D192_W8 + ([cp_async(64, 32, 1, True)] if (b, s, hq) == (2, 4096, 32) else []), (d, dv))
                   for (d, dv) in ((192, 128), (160, 160), (192, 192))
                   for (b, s, hq, hkv) in ((2, 4096, 32, 8), (2, 4096, 16, 4), (4, 2048, 8, 8), (12, 700, 18, 6),
                                           (8, 555, 25, 5), (16, 1024, 16, 16))
                   for c in (False, True)]

#: the d192 class's 8-warp one-stage entry against its 64x32 one-stage alternate on short sequences (the rule's
#: crossover)
SETS["w8_d192_short"] = [(f"d{d}x{dv}_{b}x{s}_{hq}_{hkv}" + ("_causal" if c else ""), b, s, s, hq, hkv, c, None, 0.0,
                          None, [None, cp_async8(128, 64, 1, True), cp_async(64, 32, 1, True)], (d, dv))
                         for (d, dv) in ((192, 128), (160, 160), (192, 192))
                         for (b, s, hq, hkv) in ((2, 4096, 32, 8), (12, 700, 18, 6), (8, 555, 25, 5), (16, 1024, 16, 16),
                                                 (4, 1024, 32, 8), (16, 537, 20, 20), (12, 777, 24, 8), (16, 300, 32, 8))
                         for c in (False, True)]

#: d64 non-causal: the one-stage entry against the two-stage 128x64 tiles with and without Q in registers (16x537 MHA
#: is the shape the one-stage entry loses)
SETS["d64_full_stages"] = [(f"d64x64_{b}x{s}_{hq}_{hkv}", b, s, s, hq, hkv, False, None, 0.0, None,
                            [None, cp_async(128, 64, 2, True), cp_async(128, 64, 2, False)], (64, 64))
                           for (b, s, hq, hkv) in ((2, 4096, 32, 8), (4, 2048, 32, 32), (3, 3072, 28, 4), (16, 537, 20, 20),
                                                   (10, 901, 12, 3), (8, 555, 25, 5), (16, 1024, 16, 16))]

#: the d192 entry with and without the k-step fragment prefetch, at the lengths where 192/128 non-causal is closest
#: to upstream
SETS["w8_d192_prefetch"] = [(f"d192x128_{b}x{s}_{hq}_{hkv}" + ("_causal" if c else ""), b, s, s, hq, hkv, c, None, 0.0,
                             None, [None, FwdConfig(tile_m=128, tile_n=64, num_warps=8, num_stages=1, q_in_regs=True,
                                                    mainloop="cp_async", frag_prefetch=False)], (192, 128))
                            for (b, s, hq, hkv, c) in ((2, 4096, 16, 4, False), (3, 3072, 14, 2, False), (4, 2048, 8, 8, False),
                                                       (2, 4096, 16, 4, True))]


def label(cfg) -> str:
    if cfg is None:
        return "table"
    return (f"{cfg.tile_m}x{cfg.tile_n}w{cfg.num_warps}s{cfg.num_stages}" + ("q" if cfg.q_in_regs else "")
            + ("pp" if cfg.pingpong else "") + ("" if cfg.mainloop == "cp_async" else f"_{cfg.mainloop}")
            + ("" if cfg.frag_prefetch else "_nopf"))


def _inputs(case):
    """(q, k, v, spec, shape, params): fresh random inputs of ``case`` and the API's validation of them."""
    name, b, sq, sk, hq, hkv, causal, win, cap, splits, cands, (d, dv) = case
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, dv, dtype=torch.bfloat16, device="cuda")
    spec, shape, params = validate_fwd(q, k, v, None, causal, (win, 0) if win else (None, None), cap)
    return q, k, v, _with_packing(spec, shape, None), shape, params


def _warm(job) -> str:
    """Compile one (case, candidate) into the disk cache (a worker process)."""
    case, cfg, occ = job
    os.environ[OCCUPANCY_ENV] = occ
    try:
        q, k, v, spec, shape, params = _inputs(case)
        _launch_fwd(q, k, v, spec, shape, params, config=cfg, num_splits=case[9])
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # the timing loop reports it
        return f"{case[0]} {label(cfg)}: {str(e)[:120]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm-jobs", type=int, default=0, help="compile every candidate first in this many processes")
    ap.add_argument("--sets", nargs="+", choices=sorted(SETS), default=sorted(SETS))
    ap.add_argument("--repeat", type=int, default=1, help="time every candidate this many rounds (A/B interleaved)")
    ap.add_argument("--occupancy", nargs="+", choices=("model", "device"), default=["model", "device"])
    ap.add_argument("--labels", nargs="+", help="only these candidates (labels as printed; the table's entry always runs)")
    args = ap.parse_args()
    out = {}
    cases = [c if len(c) == 12 else (*c, SET_HEAD_DIMS.get(s, (128, 128))) for s in args.sets for c in SETS[s]]
    if args.warm_jobs:
        import multiprocessing

        jobs = list({(c[0], label(cfg), occ): (c, cfg, occ) for c in cases for cfg in c[10] for occ in args.occupancy
                     if cfg is None or not args.labels or label(cfg) in args.labels}.values())
        with multiprocessing.get_context("spawn").Pool(args.warm_jobs) as pool:
            for err in pool.imap_unordered(_warm, jobs):
                if err:
                    print("warm:", err, flush=True)
    for rnd, occ in ((r, o) for r in range(args.repeat) for o in args.occupancy):
        os.environ[OCCUPANCY_ENV] = occ
        for case in cases:
            name, b, sq, sk, hq, hkv, causal, win, cap, splits, cands, (d, dv) = case
            q, k, v, spec, shape, params = _inputs(case)
            if sq == 1 and occ == "model" and rnd == 0:  # what reading K and V once costs with PyTorch's own reduction
                ms = median_ms(lambda: (k.sum(), v.sum()))
                out[f"{name}|read_ceiling|torch.sum"] = {"ms": ms, "metric": b * sk * hkv * (d + dv) * 2 / ms / 1e6}
                print(f"{name}|read_ceiling|torch.sum", round(b * sk * hkv * (d + dv) * 2 / ms / 1e6), flush=True)
            ref = None
            for cfg in (c for c in cands if c is None or not args.labels or label(c) in args.labels):
                try:
                    call = lambda: _launch_fwd(q, k, v, spec, shape, params, config=cfg, num_splits=splits)  # noqa: E731
                    o = call()[0]
                    ref = o if ref is None else ref  # the table's output: every candidate must agree with it
                    err = (o.float() - ref.float()).abs().max().item()
                    ms = median_ms(call)
                except Exception as e:
                    print(name, occ, label(cfg), "ERR", str(e)[:150], flush=True)
                    continue
                if sq == 1:  # decode: K/V GB/s
                    metric = b * sk * hkv * (d + dv) * 2 / ms / 1e6
                else:  # nominal TFLOPS (causal: half the square, as the benchmark counts it)
                    metric = 2 * b * hq * sq * sk * (d + dv) * (0.5 if causal else 1.0) / ms / 1e9
                key = f"{name}|{occ}|{label(cfg)}" + (f"|round{rnd}" if args.repeat > 1 else "")
                out[key] = {"ms": ms, "metric": metric, "max_diff_vs_table": err}
                print(key, round(metric), f"diff={err:.2e}", flush=True)
    Path(os.environ.get("OUT", "."), "explore.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
