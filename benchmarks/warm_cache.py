"""Compile the kernels bench_fwd.py's cases dispatch to, in parallel processes, into the disk compile cache
(a fresh device machine compiles each of them serially inside the timed script otherwise: 10-20 s apiece).

    python benchmarks/warm_cache.py [--jobs 8]
"""
import argparse
import multiprocessing
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))


def _warm(case) -> str:
    import torch

    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV

    name, b, sq, sk, hq, hkv, d, dv, causal, window = case
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, dv, dtype=torch.bfloat16, device="cuda")
    for occ in ("model", "device"):  # the padded launch is part of the compile key
        os.environ[OCCUPANCY_ENV] = occ
        fa.flash_attn_func(q, k, v, causal=causal, window_size=(window, 0) if window else (None, None))
    torch.cuda.synchronize()
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    args = ap.parse_args()
    from bench_fwd import CASES

    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for name in pool.imap_unordered(_warm, CASES):
            print("warm:", name, flush=True)


if __name__ == "__main__":
    main()
