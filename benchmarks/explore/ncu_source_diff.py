"""Per-opcode executed instructions of two kernels' hottest loops, per loop iteration, from Nsight Compute's source
page (a script, not a test). Session 27 found with it that causal-as-lists' full-list steps evaluated the mask_mod
on every element (+32 ISETP, +32 FSEL per warp iteration against the causal flag's steps).

    # on the device, one kernel per report (launch-skip past the warm-up):
    ncu --kernel-name regex:Flash --launch-skip 2 --launch-count 1 --section SourceCounters -o /tmp/rep_a -f <cmd>
    ncu -i /tmp/rep_a.ncu-rep --page source --csv --print-source sass > a.csv
    # here:
    python benchmarks/explore/ncu_source_diff.py a.csv b.csv [--rows 30]
"""

import argparse
import collections
import csv
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from conformance import sass_opcodes  # noqa: E402  (the gate's SASS parsing)

_TARGET = re.compile(r"BRA\S*\s+(?:\S+,\s*)?(0x[0-9a-f]+)")


def load(path: str) -> list[dict]:
    rows = list(csv.reader(open(path)))
    header = next(r for r in rows if "Address" in r and "Source" in r)
    start = rows.index(header) + 1
    return [dict(zip(header, r)) for r in rows[start:] if len(r) == len(header)]


def hottest_loop(rows: list[dict]):
    """(first, last) row of the backward branch whose body executes the most warp instructions."""
    where = {int(r["Address"], 16): i for i, r in enumerate(rows)}
    executed = [int(r["Instructions Executed"]) for r in rows]
    best, span = -1, None
    for i, r in enumerate(rows):
        m = _TARGET.search(r["Source"])
        j = where.get(int(m.group(1), 16)) if m else None
        if j is not None and j < i:
            total = sum(executed[j:i + 1])
            if total > best:
                best, span = total, (j, i)
    return span


def per_iteration(rows: list[dict], span) -> tuple[collections.Counter, collections.Counter, int]:
    """(executed per iteration, stall samples) by opcode over the loop, and its iterations (the back branch's count)."""
    j, i = span
    iters = max(int(rows[i]["Instructions Executed"]), 1)
    executed, samples = collections.Counter(), collections.Counter()
    for r in rows[j:i + 1]:
        op = (sass_opcodes(r["Source"]) or ["?"])[0]
        executed[op] += int(r["Instructions Executed"]) / iters
        samples[op] += int(r.get("Warp Stall Sampling (All Samples)") or 0)
    return executed, samples, iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rows", type=int, default=30)
    args = ap.parse_args()
    res = []
    for path in (args.a, args.b):
        rows = load(path)
        span = hottest_loop(rows)
        ex, sm, iters = per_iteration(rows, span)
        total = sum(int(r["Instructions Executed"]) for r in rows)
        print(f"{path}: {total} warp instructions; hottest loop rows {span}, {iters} iterations, "
              f"{sum(ex.values()):.1f} instructions per iteration")
        res.append((ex, sm))
    (ea, sa), (eb, sb) = res
    print(f"{'opcode':30s} {'a/iter':>8s} {'b/iter':>8s} {'b-a':>8s} {'samples a':>10s} {'samples b':>10s}")
    for op in sorted(set(ea) | set(eb), key=lambda k: (-abs(eb[k] - ea[k]), k))[:args.rows]:
        print(f"{op:30s} {ea[op]:8.1f} {eb[op]:8.1f} {eb[op] - ea[op]:+8.1f} {sa[op]:10d} {sb[op]:10d}")


if __name__ == "__main__":
    main()
