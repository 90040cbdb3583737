"""Compile the kernels bench_fwd.py's cases dispatch to, in parallel processes, into the disk compile caches:
ours, and upstream flash-attn-4's (its own disk cache, which bench_fwd.py enables too) when it is installed
(a fresh device machine compiles each of them serially inside the timed script otherwise: 10-30 s apiece).

    python benchmarks/warm_cache.py [--jobs 8] [--matrix] [--cases SUBSTRING ...]
"""
import argparse
import functools
import multiprocessing
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))


def _warm(case, occupancies=("model", "device")) -> str:
    import bench_fwd  # noqa: F401  (sets upstream's environment before anything imports it)
    import torch

    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV

    name, b, sq, sk, hq, hkv, d, dv, causal, window = case
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, dv, dtype=torch.bfloat16, device="cuda")
    for occ in occupancies:  # the padded launch is part of the compile key
        os.environ[OCCUPANCY_ENV] = occ
        fa.flash_attn_func(q, k, v, causal=causal, window_size=(window, 0) if window else (None, None))
    up = bench_fwd.upstream_fa4()
    if up is not None:
        try:
            up(q, k, v, causal, window)
        except Exception as e:  # reported by the benchmark itself
            name += f" (upstream: {type(e).__name__})"
    torch.cuda.synchronize()
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--matrix", action="store_true", help="the generalization matrix too (bench_fwd --matrix)")
    ap.add_argument("--sm120-only", action="store_true", help="only the launches padded to the SM120 model's occupancy")
    ap.add_argument("--cases", nargs="*", help="only the cases whose names contain one of these strings")
    args = ap.parse_args()
    from bench_fwd import CASES, matrix_cases

    cases = CASES + (matrix_cases() if args.matrix else [])
    cases = [c for c in cases if not args.cases or any(s in c[0] for s in args.cases)]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        warm = functools.partial(_warm, occupancies=("model",) if args.sm120_only else ("model", "device"))
        for name in pool.imap_unordered(warm, cases):
            print("warm:", name, flush=True)


if __name__ == "__main__":
    main()
