"""The causal deterministic backward's order, group split and band (``bwd_config.bwd_det_order``), a script, not a
test: for training-sized causal shapes, the backward alone (``torch.autograd.grad`` of a kept forward) with
``backward._det_order`` forced to each variant and with the rule's choice, interleaved over rounds
(``timing.median_ms``), beside each variant's modelled time (``_makespan`` / ``_chained_makespan``).

    cd benchmarks && FA4_SM120_OCCUPANCY=model python3 explore/det_order_probe.py --out $OUT/det_order.json
"""

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))

import flash_attn_4_sm120 as fa  # noqa: E402
from flash_attn_4_sm120 import backward, bwd_config as bc  # noqa: E402
from timing import median_ms  # noqa: E402

#: (batch, seqlen, heads_q, heads_kv, d): causal, d128's 64x64 tiles
SHAPES = [(4, 2048, 8, 2, 128), (2, 4096, 16, 4, 128), (16, 1024, 32, 8, 128), (8, 2048, 16, 16, 128)]
VARIANTS = [(False, 1, 1), (False, 2, 1), (False, 4, 1), (True, 1, 2), (True, 1, 4), (True, 1, 8), (True, 1, 16),
            (True, 2, 4), (True, 2, 8), (True, 2, 16)]


def modelled(b, s, hq, hkv, variant, slots=132):
    lowest, split, band = variant
    pairs, heads = b * hkv * split, hq // hkv // split
    works = [heads * v + bc.GROUP_SPLIT_FIXED_STEPS for v in bc._visits(s, s, 64, 64, True)]
    if lowest:
        return bc._chained_makespan(works, pairs, band, slots, bc.DET_CHAIN_LAG)
    return bc._makespan(works[::-1], pairs, 1, slots)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rule = backward._det_order
    rows = []
    for b, s, hq, hkv, d in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        v = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        dout = torch.randn_like(q)
        out = fa.flash_attn_func(q, k, v, causal=True, deterministic=True)[0]
        chosen = []
        backward._det_order = lambda *a: chosen.append(rule(*a)) or chosen[-1]
        backward.bwd_launch.cache_clear()
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        group = hq // hkv
        variants = [x for x in VARIANTS if group % x[1] == 0 and x[2] <= b * hkv * x[1]]
        times = {x: [] for x in variants}
        for _ in range(args.rounds):
            for x in variants:
                backward._det_order = lambda *a, x=x: x
                backward.bwd_launch.cache_clear()
                times[x].append(median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                                          iters=20, reps=7))
        backward._det_order = rule
        backward.bwd_launch.cache_clear()
        row = {"shape": [b, s, hq, hkv, d], "rule": list(chosen[0]), "variants": [
            {"lowest_first": x[0], "split": x[1], "band": x[2], "ms": statistics.median(t), "runs": t,
             "modelled_steps": modelled(b, s, hq, hkv, x)} for x, t in times.items()]}
        rows.append(row)
        best = min(row["variants"], key=lambda r: r["ms"])
        print(f"{b}x{s} {hq}/{hkv} d{d}: rule {chosen[0]}; " + ", ".join(
            f"{'lo' if r['lowest_first'] else 'hi'}{r['split']}b{r['band']} {r['ms']:.3f}ms ({r['modelled_steps']:.0f})"
            for r in row["variants"]) + f"; best {best['lowest_first']},{best['split']},{best['band']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                                              "occupancy": "sm120 (FA4_SM120_OCCUPANCY=model)", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
