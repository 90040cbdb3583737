"""The backward's causal key-block order (``tile_scheduler.KeyBlockScheduler``, ``bwd_config.bwd_tile_band``): GPU
time of the backward (CUDA-graph replays) per band size at causal shapes, same run. Band 1 is exactly the
former order (every key block of one (batch, KV head) pair, then the next pair); larger bands run key block 0 of
the band's pairs first, then key block 1, ... (longest first); "rule" is the package's choice (its band in
``rule_band``). Rows with dropout time forward + backward.

    python benchmarks/explore/bwd_band.py [--out bwd_band.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "torch-ext"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

import torch  # noqa: E402

from reference import capture  # noqa: E402
from timing import median_ms  # noqa: E402

#: (batch, seqlen, heads_q, heads_kv, head_dim, dropout_p)
SHAPES = [(4, 4096, 32, 8, 64, 0.0), (4, 4096, 32, 8, 64, 0.1), (2, 4096, 16, 4, 64, 0.0), (4, 1024, 32, 8, 64, 0.0),
          (4, 4096, 32, 8, 96, 0.0), (4, 4096, 32, 8, 128, 0.0), (8, 2048, 16, 16, 128, 0.0),
          (2, 4096, 16, 4, 128, 0.0), (4, 2048, 8, 2, 128, 0.0), (2, 4096, 16, 16, 256, 0.0)]
BANDS = (1, 2, 3, 4, 6, 8, 16, 4096)


def timer(b, s, hq, hkv, d, p):
    """A function timing one backward (forward + backward with dropout) from a CUDA graph, in ms."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(0)
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=bool(p))
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=bool(p)) for _ in range(2))
    dout = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
    if p:
        def step():
            out = fa.flash_attn_func(q, k, v, causal=True, dropout_p=p, dropout_seed=1)[0]
            return torch.autograd.grad(out, (q, k, v), dout)
    else:
        out, lse = fa.flash_attn_fwd(q, k, v, causal=True)

        def step():
            return fa.flash_attn_bwd(dout, q, k, v, out, lse, causal=True)

    def run():
        g, _ = capture(step, warmups=2)
        return median_ms(g.replay, iters=10, reps=7)
    return run


def main():
    from flash_attn_4_sm120 import backward

    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    rule = backward.bwd_tile_band
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for shape in SHAPES:
        b, s, hq, hkv, d, p = shape
        run = timer(*shape)
        row = {"shape": list(shape), "ms": {}}

        def recorded(*a, row=row):
            row["rule_band"] = rule(*a)
            return row["rule_band"]
        backward.bwd_tile_band = recorded
        backward.bwd_launch.cache_clear()  # the backward's host decisions are memoized per shape
        row["ms"]["rule"] = run()
        for band in BANDS:
            backward.bwd_tile_band = lambda *a, band=band: band
            backward.bwd_launch.cache_clear()
            row["ms"][band] = run()
        backward.bwd_tile_band = rule
        backward.bwd_launch.cache_clear()
        base = row["ms"][1]
        print(f"{b}x{s} {hq}/{hkv} d{d} p={p} (rule band {row.get('rule_band')}): band 1 {base:.3f} ms; "
              + " ".join(f"{k}: {v / base:.3f}" for k, v in row["ms"].items() if k != 1), flush=True)
        rows.append(row)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "l2_bytes": l2, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
