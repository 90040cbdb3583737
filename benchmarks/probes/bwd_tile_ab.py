"""A/B of backward tiles for one head-dim class on shapes of the off-grid sweep (a probe, not a test): each named
config is patched into ``bwd_config.BWD_TABLE`` for the class in turn and timed, default and deterministic, at an
SM120's CTAs per SM, upstream's SM120 path in the same run. The kernels compile first in ``--jobs`` processes.

    python benchmarks/probes/bwd_tile_ab.py --class 192 --head-dims 136 144 152 160 [--dv 128] [--every 2] \
        --out ab.json --config "64x64w8=64,64,8,1,1,2,4,4" --config "32x64w8=32,64,8,2,1,2,2,2"

A config is ``name=tile_m,tile_n,warps,stages_q,stages_do,sdp_warps_m,dkv_warps_n,dq_warps_m``; the table's own entry
is always timed as ``table``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))


def parse_config(text: str):
    from flash_attn_4_sm120.bwd_config import BwdConfig

    name, _, raw = text.partition("=")
    tm, tn, w, sq, sdo, sdp, dkv, dq = map(int, raw.split(","))
    return name, BwdConfig(tm, tn, w, sq, sdo, sdp_warps_m=sdp, dkv_warps_n=dkv, dq_warps_m=dq)


def use(cls: int, cfg) -> None:
    from flash_attn_4_sm120 import backward, bwd_config

    bwd_config.BWD_TABLE[cls] = cfg
    backward.clear_caches()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--class", dest="cls", type=int, required=True)
    ap.add_argument("--head-dims", type=int, nargs="+", required=True)
    ap.add_argument("--config", action="append", default=[])
    ap.add_argument("--dv", type=int, help="head_dim_v of every case (default: the head dim)")
    ap.add_argument("--every", type=int, default=1, help="time every n-th sweep case of those head dims")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--out")
    ap.add_argument("--warm", help=argparse.SUPPRESS)  # "i/n": compile every n-th (config, case) pair from i
    args = ap.parse_args()
    import torch

    from bench_bwd import ours, ours_deterministic, peers_and_ours, run_cases
    from bench_fwd import training_inputs
    from sweep_bwd import sweep_cases
    from flash_attn_4_sm120.bwd_config import BWD_TABLE

    configs = [("table", BWD_TABLE[args.cls])] + [parse_config(c) for c in args.config]
    cases = sweep_cases(args.head_dims)[::args.every]
    if args.dv:
        cases = [(f"{name}_dv{args.dv}", *rest[:-2], args.dv, rest[-1]) for name, *rest in cases]
    if args.warm:
        i, n = map(int, args.warm.split("/"))
        pairs = [(c, case) for c in configs for case in cases][i::n]
        for (name, cfg), (_, b, sq, sk, hq, hkv, d, dv, causal) in pairs:
            use(args.cls, cfg)
            q, k, v, dout = training_inputs(b, min(sq, 512), min(sk, 512), hq, hkv, d, dv)
            for fn in (ours, ours_deterministic):
                try:
                    torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout)
                except Exception as e:  # noqa: BLE001  (the timed run reports it)
                    print(f"{name}: {type(e).__name__}: {str(e)[:160]}")
        return
    argv = [sys.executable, __file__, "--class", str(args.cls), "--head-dims", *map(str, args.head_dims),
            "--every", str(args.every), *(["--dv", str(args.dv)] if args.dv else []), *sum((["--config", c] for c in args.config), [])]
    for proc in [subprocess.Popen([*argv, "--warm", f"{i}/{args.jobs}"]) for i in range(args.jobs)]:
        proc.wait()
    result = {"class": args.cls, "configs": {name: repr(cfg) for name, cfg in configs}, "by_config": {}}
    result["upstream"] = run_cases(cases, peers_and_ours(["fa4_sm120_path"]), ("sm120",), fwd_bwd=False)
    for name, cfg in configs:
        use(args.cls, cfg)
        result["by_config"][name] = run_cases(cases, {"ours": ours, "ours_deterministic": ours_deterministic},
                                              ("sm120",), fwd_bwd=False)
        if args.out:
            result.update(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat())
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
