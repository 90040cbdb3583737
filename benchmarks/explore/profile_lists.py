"""Run one forward of ``bench_flex``'s cases a few times so a profiler can compare the causal flag with causal as
block-sparse lists (a script, not a test; issue 20's "causal via mask_mod within 10%" gap, notes/perf.md session 26).

Under Nsight Compute, one case per run, at an SM120's occupancy (the package pads shared memory):
    FA4_SM120_OCCUPANCY=model ncu --kernel-name regex:Flash --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats \
        --page raw --csv python benchmarks/explore/profile_lists.py --case "causal flag"

The lists are built before the runs; the forward (``--backward``: forward and backward, ``--kernel-name
regex:RoleSplit`` for the d128 backward's main kernel) runs ``--runs`` times on one shape with nothing between them,
so ``--launch-skip`` leaves out the first launches and their cold caches.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from bench_flex import SHAPE, cases, ours_call  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="causal mask_mod + block sparse", help="a case name of bench_flex.cases()")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--backward", action="store_true", help="forward + backward (profile the backward's kernels)")
    args = ap.parse_args()
    by_name = {name: (kwargs, ex) for name, kwargs, ex, _ in cases()}
    if args.case not in by_name:
        raise SystemExit(f"unknown case {args.case!r}; cases: {', '.join(by_name)}")
    run = ours_call(*by_name[args.case])
    b, s, hq, hkv, d = SHAPE
    torch.manual_seed(0)
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda")
    if args.backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        dout = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
        for _ in range(args.runs):
            torch.autograd.grad(run(q, k, v), (q, k, v), dout)
    else:
        with torch.no_grad():
            for _ in range(args.runs):
                run(q, k, v)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
