"""Where dropout's time goes, kernel by kernel (a script, not a test): forward + backward through autograd under
torch.profiler, GPU time per kernel (no host time), with and without ``dropout_p``, per mask. Session 29 asked why
d64 causal's backward pays about as much for dropout as d64 full's (0.72 vs 0.78 ms at 4x4096 32/8) when it runs
half the tiles; d128 causal pays half of d128 full, as expected.

    python benchmarks/explore/dropout_kernels.py [--head-dims 64 128] [--out dropout_kernels.json]

``--rs64`` adds d64 rows on the 64x64 role split (``BWD_TABLE_DROPOUT[64]`` patched in as the table entry).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "torch-ext"))

import torch  # noqa: E402

SHAPE = (4, 4096, 32, 8)
MASKS = {"full": dict(), "causal": dict(causal=True), "window": dict(window_size=(1024, 0))}


def kernel_ms(step, iters: int = 5) -> dict:
    """GPU milliseconds per call of each kernel ``step()`` launches (names shortened), averaged over ``iters``."""
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    out = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            out[short(ev.name)] += ev.device_time_total / 1000.0 / iters
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def short(name: str) -> str:
    for key in ("FlashBwdRoleSplit", "BwdMultistage", "BwdPreprocess", "BwdPostprocess", "FwdCombine", "Fwd"):
        if key in name:
            return key
    return name[:40]


def main():
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120 import backward, bwd_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--rs64", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    b, s, hq, hkv = SHAPE
    rows = []
    variants = [(d, "table") for d in args.head_dims] + ([(64, "rs64")] if args.rs64 else [])
    for d, tile in variants:
        saved = bwd_config.BWD_TABLE[64]
        if tile == "rs64":
            bwd_config.BWD_TABLE[64] = bwd_config.BWD_TABLE_DROPOUT[64]
        bwd_config.select_bwd_config.cache_clear()
        backward.clear_caches()
        torch.manual_seed(0)
        q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        k, v = (torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(2))
        dout = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
        for mask, kw in MASKS.items():
            row = {"head_dim": d, "tile": tile, "mask": mask}
            for p in (0.0, 0.1):
                def step(p=p, kw=kw):
                    out = fa.flash_attn_func(q, k, v, dropout_p=p, dropout_seed=1234 if p else None, **kw)[0]
                    return torch.autograd.grad(out, (q, k, v), dout)
                row[f"p{p}"] = kernel_ms(step)
            base, drop = row["p0.0"], row["p0.1"]
            cost = {n: drop.get(n, 0.0) - base.get(n, 0.0) for n in set(base) | set(drop)}
            row["dropout_cost_ms"] = cost
            rows.append(row)
            print(f"d{d} {tile:5s} {mask:6s} " + "  ".join(
                f"{n} {base.get(n, 0):.3f}->{drop.get(n, 0):.3f}" for n in sorted(set(base) | set(drop))), flush=True)
        bwd_config.BWD_TABLE[64] = saved
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "shape": SHAPE, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
