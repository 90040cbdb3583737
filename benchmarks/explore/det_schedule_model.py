"""The deterministic backward's launch order under the schedule model (a script, not a test; CPU only): which
orders its dQ counters allow, and what ``bwd_config._makespan``'s greedy model makes of them at causal shapes.

(Session 33's study of the highest-first order; session 34 added the lowest-first order, chosen per call by
``bwd_config.bwd_det_order``, which removes most of the tail modelled here: ``det_order_probe.py``.)

The deterministic mode must launch each (batch, KV head) pair's key blocks highest first (shortest first under a
causal mask): key block n adds its dQ to query block m after the higher key blocks that visit m, so a CTA may only
wait on CTAs launched before it. The default mode launches longest first in bands of pairs, which the deterministic
mode cannot. Variants modelled (step times: query heads per CTA x query blocks visited + the fixed steps per CTA):

* ``pair``: the shipped order (one pair after another, highest key block first), at the group split the rule takes;
* ``banded``: bands of pairs, each running the highest key block of every pair, then the next (the counters allow
  it: within a pair the order is unchanged), band 1-16;
* ``qsplit``: the CTAs of key blocks visiting more than ``thr`` query blocks split in two halves of their query
  range (each half its own CTA writing partial dK / dV, summed in fp32 like the group split's: the counters see one
  adder per (key block, query block) as before), launched together, with and without bands;
* ``default``: the default mode's longest-first bands, for reference.

    python benchmarks/explore/det_schedule_model.py [--slots 132]
"""

import argparse
import heapq
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))
from flash_attn_4_sm120 import bwd_config as bc  # noqa: E402

#: (batch, seqlen, heads_q, heads_kv, tile_m, tile_n): bench_bwd's causal GQA rows at d128 / d64's tiles
SHAPES = [(4, 2048, 8, 2, 64, 64), (2, 4096, 16, 4, 64, 64), (4, 4096, 32, 8, 64, 64), (8, 2048, 16, 16, 64, 64),
          (4, 4096, 32, 8, 64, 128)]


def makespan(jobs: list, pairs: int, band: int, slots: int) -> float:
    """Greedy list schedule of ``pairs`` copies of ``jobs`` (per pair, in launch order; a job is a tuple of CTA step
    times launched together), bands of ``band`` pairs running their pairs' job 0, then job 1, ..."""
    free = [0.0] * slots
    for first in range(0, pairs, band):
        width = min(band, pairs - first)
        for job in jobs:
            for _ in range(width):
                for w in job:
                    heapq.heapreplace(free, free[0] + w)
    return max(free)


def jobs_of(visits: list, heads: int, thr: int = 0) -> list:
    fixed = bc.GROUP_SPLIT_FIXED_STEPS
    out = []
    for v in visits:
        if thr and v > thr:
            half = v // 2
            out.append((heads * (v - half) + fixed, heads * half + fixed))
        else:
            out.append((heads * v + fixed,))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=132, help="CTA slots (H100 SMs x one CTA per SM at SM120 occupancy)")
    args = ap.parse_args()
    for b, s, hq, hkv, tm, tn in SHAPES:
        group = hq // hkv
        visits = bc._visits(s, s, tm, tn, True)
        print(f"{b}x{s} {hq}/{hkv} tiles {tm}x{tn}: steps (makespan in step times)")
        best_default = min(makespan(jobs_of(visits, group), b * hkv, band, args.slots) for band in (1, 2, 4, 8, 16))
        print(f"  default longest-first, whole group, best band: {best_default:.0f}")
        for split in [x for x in (1, 2, 4) if group % x == 0]:
            heads, pairs = group // split, b * hkv * split
            rows = []
            for thr in (0, 24, 16):
                jobs = jobs_of(visits[::-1], heads, thr)  # highest key block first
                cells = [makespan(jobs, pairs, band, args.slots) for band in (1, 2, 4, 8, 16) if band <= pairs]
                rows.append(f"{'pair/banded' if not thr else f'qsplit>{thr}'}: " + " ".join(f"{c:.0f}" for c in cells))
            print(f"  deterministic, group split {split} (bands 1, 2, 4, 8, 16): " + "; ".join(rows))


if __name__ == "__main__":
    main()
