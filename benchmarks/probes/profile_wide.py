"""Run one head-dim-512 or MLA call a few times so Nsight Compute can read its pipes (a script, not a test).

Cases (the shapes of ``bench_mla.py``, through the public API at an SM120's CTAs per SM, the package's default):
``mla16`` (MLA decode 16x4096, 16 heads: the 16-row tile), ``mla128`` (16x4096, 128 heads: the 32-row tile),
``d512`` (prefill 2x2048 16/16 causal: the 32-row d512 tile).

    ncu --launch-skip 4 --launch-count 2 --metrics ... --csv python benchmarks/probes/profile_wide.py mla128
    python benchmarks/probes/profile_wide.py --ncu --out profile.json     # every case through ncu, parsed

``--ncu`` runs each case under ncu (``METRICS``: pipe and memory utilizations, achieved warps, and the issue-stall
reasons per issued instruction) and writes one JSON of {case: {kernel: {metric: value}}}.
"""

import argparse
import csv
import datetime
import io
import json
import subprocess
import sys
from pathlib import Path

METRICS = [
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.per_cycle_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_elapsed",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
]
CASES = ("mla16", "mla128", "d512")


def run_case(case: str, runs: int) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))
    import flash_attn_4_sm120 as fa

    torch.manual_seed(0)
    bf16 = dict(dtype=torch.bfloat16, device="cuda")
    if case == "d512":
        q, k, v = (torch.randn(2, 2048, 16, 512, **bf16) for _ in range(3))
        call = lambda: fa.flash_attn_func(q, k, v, causal=True)  # noqa: E731
    else:
        hq = 16 if case == "mla16" else 128
        q, qv = torch.randn(16, 1, hq, 64, **bf16), torch.randn(16, 1, hq, 512, **bf16)
        k, v = torch.randn(16, 4096, 1, 64, **bf16), torch.randn(16, 4096, 1, 512, **bf16)
        call = lambda: fa.flash_attn_func(q, k, v, qv=qv)  # noqa: E731
    for _ in range(runs):
        call()
    torch.cuda.synchronize()


def profile(case: str) -> dict:
    """{kernel name: {metric: value}} of the case's launches after the first two calls."""
    cmd = ["ncu", "--launch-skip", "4", "--launch-count", "2", "--metrics", ",".join(METRICS), "--csv",
           sys.executable, __file__, case]
    out = subprocess.run(cmd, capture_output=True, text=True)
    text = out.stdout[out.stdout.find('"ID"'):]
    kernels: dict = {}
    for row in csv.DictReader(io.StringIO(text)):
        name = row["Kernel Name"].split("(")[0][:80]
        value = row["Metric Value"].replace(",", "")
        try:
            kernels.setdefault(name, {})[row["Metric Name"]] = float(value)
        except ValueError:
            kernels.setdefault(name, {})[row["Metric Name"]] = value
    if not kernels:
        kernels["error"] = (out.stdout[-1500:] + out.stderr[-1500:])
    return kernels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", nargs="?", choices=CASES)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--ncu", action="store_true", help="profile every case under ncu")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not args.ncu:
        run_case(args.case, args.runs)
        return
    import torch

    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "metrics": METRICS,
              "cases": {case: profile(case) for case in ([args.case] if args.case else CASES)}}
    print(json.dumps(result, indent=1)[-6000:])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
