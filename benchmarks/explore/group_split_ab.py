"""A/B of the backward's query-head group split (``bwd_config.bwd_group_split``), a script, not a test: for
training-sized GQA shapes, the backward alone (``torch.autograd.grad`` of a kept forward) with the split forced
to each divisor of the group and with the rule's choice, interleaved over rounds, ``timing.median_ms``.

    cd benchmarks && FA4_SM120_OCCUPANCY=model python3 explore/group_split_ab.py --out $OUT/group_split_ab.json \
        [--deterministic] [--shapes 0 4]
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
from flash_attn_4_sm120 import backward  # noqa: E402
from timing import median_ms  # noqa: E402

#: (batch, seqlen, heads_q, heads_kv, d, causal)
SHAPES = [(4, 2048, 8, 2, 128, True), (4, 1024, 32, 8, 128, True), (8, 1024, 16, 4, 64, True),
          (8, 512, 8, 2, 128, True), (2, 4096, 16, 4, 128, True), (4, 2048, 8, 2, 128, False),
          (1, 8192, 32, 8, 128, True), (16, 1024, 32, 8, 128, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deterministic", action="store_true", help="the deterministic backward (its own key-block order)")
    ap.add_argument("--shapes", type=int, nargs="*", help="indices into SHAPES (default: all)")
    args = ap.parse_args()
    rule = backward._group_split
    rows = []
    for b, s, hq, hkv, d, causal in [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES:
        torch.manual_seed(0)
        q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        v = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        dout = torch.randn_like(q)
        out = fa.flash_attn_func(q, k, v, causal=causal, deterministic=args.deterministic)[0]
        group = hq // hkv
        chosen = []
        backward._group_split = lambda *a: chosen.append(rule(*a)) or chosen[-1]
        backward.bwd_launch.cache_clear()  # the backward's host decisions are memoized per shape
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        variants = {f"split{x}": x for x in range(1, group + 1) if group % x == 0}
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, x in variants.items():
                backward._group_split = lambda *a, x=x: x
                backward.bwd_launch.cache_clear()
                times[name].append(median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                                             iters=20, reps=7))
        backward._group_split = rule
        backward.bwd_launch.cache_clear()
        flops = 2.5 * 4 * b * hq * s * s * d * (0.5 if causal else 1.0)
        ms = {name: statistics.median(t) for name, t in times.items()}
        row = {"shape": [b, s, hq, hkv, d, causal], "deterministic": args.deterministic, "rule": chosen[0], "ms": ms,
               "tflops": {n: flops / m / 1e9 for n, m in ms.items()}}
        rows.append(row)
        print(row["shape"], "rule", chosen[0], " ".join(f"{n}={t:.0f}TF" for n, t in row["tflops"].items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "date": datetime.date.today().isoformat(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
