"""The cost of ``batch_invariant=True`` (a script, not a test): the forward benchmark grid (``bench_fwd.CASES``) and
decode steps over paged caches, each timed with the default dispatch and batch-invariant in the same run, at an
SM120's CTAs per SM (the package pads its launches); the figure is invariant time / default time. Decode is replayed
from CUDA graphs (its host time would hide the kernels').

    python benchmarks/bench_invariance.py [--out invariance.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
import flash_attn_4_sm120 as fa  # noqa: E402
from bench_fwd import CASES  # noqa: E402
from timing import median_ms  # noqa: E402

#: (name, batch, cache length, query heads, KV heads, head dim): one query row per sequence over a page-16 cache
DECODE = [("decode 1x8192 32/8 d128", 1, 8192, 32, 8, 128), ("decode 8x4096 32/8 d128", 8, 4096, 32, 8, 128),
          ("decode 64x2048 32/8 d128", 64, 2048, 32, 8, 128), ("decode 4x16384 64/8 d64", 4, 16384, 64, 8, 64),
          ("decode 16x4096 16/2 d256", 16, 4096, 16, 2, 256)]


def graphed(fn):
    """``fn`` captured in a CUDA graph after a warm-up; returns the replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def prefill_rows() -> list:
    rows = []
    for name, b, sq, sk, hq, hkv, d, dv, causal, window in CASES:
        q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, sk, hkv, dv, dtype=torch.bfloat16, device="cuda")
        ws = (window, 0) if window is not None else (None, None)
        row = {"case": name}
        for label, invariant in (("default", False), ("invariant", True)):
            try:
                row[label] = median_ms(lambda: fa.flash_attn_func(q, k, v, causal=causal, window_size=ws,
                                                                  batch_invariant=invariant))
            except Exception as e:  # noqa: BLE001  (reported, not fatal)
                row[label] = f"{type(e).__name__}: {str(e)[:160]}"
        if isinstance(row["default"], float) and isinstance(row["invariant"], float):
            row["cost"] = row["invariant"] / row["default"]
        print(row, flush=True)
        rows.append(row)
    return rows


def decode_rows() -> list:
    rows = []
    page = 16
    for name, b, n, hq, hkv, d in DECODE:
        pages = b * n // page
        k_cache = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device="cuda")
        v_cache = torch.randn_like(k_cache)
        table = torch.randperm(pages, device="cuda").to(torch.int32).view(b, -1)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda")
        row = {"case": name}
        for label, invariant in (("default", False), ("invariant", True)):
            step = graphed(lambda: fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, page_table=table,
                                                              causal=True, batch_invariant=invariant))
            row[label] = median_ms(step, iters=50)
        row["cost"] = row["invariant"] / row["default"]
        print(row, flush=True)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out")
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "prefill": prefill_rows(), "decode": decode_rows()}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
