"""Probe (issue 18): which cp.async tile serves prefill over paged K/V (d=128 causal), where the TMA tiles of
dense K/V cannot gather pages. Times every listed config on paged K/V at several prefill shapes (chunked
prefill against a cache, whole prompts, short chunks), beside the dense call's own choice, at SM120 occupancy.

    python benchmarks/explore/paged_prefill_tiles.py [--head-dim 128|64|96|192] --out result.json
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "torch-ext"))

import torch  # noqa: E402

import flash_attn_4_sm120 as fa  # noqa: E402
from flash_attn_4_sm120 import interface  # noqa: E402
from flash_attn_4_sm120.config import FwdConfig  # noqa: E402
from bench_serving import paged  # noqa: E402
from timing import median_ms  # noqa: E402

# (batch, new rows, cached keys before them)
SHAPES = [(4, 512, 4096), (1, 2048, 0), (8, 128, 1024), (2, 1024, 1024), (16, 64, 2048)]
CONFIGS_BY_HEAD_DIM = {
    64: {
        "128x64 w4 s2 q1 (now)": dict(tile_m=128, tile_n=64, num_warps=4, num_stages=2, q_in_regs=True),
        "128x64 w8 s2 q1": dict(tile_m=128, tile_n=64, num_warps=8, num_stages=2, q_in_regs=True),
        "128x64 w8 s3 q1": dict(tile_m=128, tile_n=64, num_warps=8, num_stages=3, q_in_regs=True),
        "128x128 w8 s2 q1": dict(tile_m=128, tile_n=128, num_warps=8, num_stages=2, q_in_regs=True),
        "64x64 w4 s3 q1": dict(tile_m=64, tile_n=64, num_warps=4, num_stages=3, q_in_regs=True),
    },
    96: {
        "64x64 w4 s2 q1 (now)": dict(tile_m=64, tile_n=64, num_warps=4, num_stages=2, q_in_regs=True),
        "128x64 w8 s2 q1": dict(tile_m=128, tile_n=64, num_warps=8, num_stages=2, q_in_regs=True),
        "128x64 w8 s2 q0": dict(tile_m=128, tile_n=64, num_warps=8, num_stages=2, q_in_regs=False),
        "128x32 w4 s2 q1": dict(tile_m=128, tile_n=32, num_warps=4, num_stages=2, q_in_regs=True),
    },
    192: {
        "class choice (now)": None,
        "128x32 w8 s2 q0": dict(tile_m=128, tile_n=32, num_warps=8, num_stages=2, q_in_regs=False),
        "128x32 w8 s2 q1": dict(tile_m=128, tile_n=32, num_warps=8, num_stages=2, q_in_regs=True),
        "64x32 w4 s2 q0": dict(tile_m=64, tile_n=32, num_warps=4, num_stages=2, q_in_regs=False),
        "64x64 w4 s1 q0": dict(tile_m=64, tile_n=64, num_warps=4, num_stages=1, q_in_regs=False),
    },
}
CONFIGS = {
    "64x64 w4 s2 q1 (now)": dict(tile_m=64, tile_n=64, num_warps=4, num_stages=2, q_in_regs=True),
    "64x64 w4 s2 q1 ov": dict(tile_m=64, tile_n=64, num_warps=4, num_stages=2, q_in_regs=True, overlap=True),
    "128x64 w8 s2 q0": dict(tile_m=128, tile_n=64, num_warps=8, num_stages=2, q_in_regs=False),
    "128x64 w8 s2 q1": dict(tile_m=128, tile_n=64, num_warps=8, num_stages=2, q_in_regs=True),
    "128x64 w8 s2 q1 ov": dict(tile_m=128, tile_n=64, num_warps=8, num_stages=2, q_in_regs=True, overlap=True),
    "128x64 w8 s2 q0 ov": dict(tile_m=128, tile_n=64, num_warps=8, num_stages=2, q_in_regs=False, overlap=True),
    "128x64 w8 s1 q1": dict(tile_m=128, tile_n=64, num_warps=8, num_stages=1, q_in_regs=True),
    "128x128 w8 s1 q1": dict(tile_m=128, tile_n=128, num_warps=8, num_stages=1, q_in_regs=True),
    "128x32 w4 s3 q1": dict(tile_m=128, tile_n=32, num_warps=4, num_stages=3, q_in_regs=True),
    "128x32 w4 s2 q1 ov": dict(tile_m=128, tile_n=32, num_warps=4, num_stages=2, q_in_regs=True, overlap=True),
    "128x48 w4 s2 q1": dict(tile_m=128, tile_n=48, num_warps=4, num_stages=2, q_in_regs=True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    hq, hkv, d = 32, 8, args.head_dim
    configs = CONFIGS if d == 128 else CONFIGS_BY_HEAD_DIM[d]
    shapes = SHAPES if d == 128 else [SHAPES[0], SHAPES[1], SHAPES[4]]
    rows = []
    for b, sq, cached in shapes:
        sk = cached + sq
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        kc, vc, table = paged(k, v, 16)
        used = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        # causal FLOPs: every row sees the cache and its prefix of the new rows
        flops = 4 * b * hq * d * sq * (cached + (sq + 1) / 2)
        spec, shape, params, varlen = interface._validate_varlen_call(
            q, kc, vc, None, None, None, None, None, used, None, True, (None, None), 0.0, None, None, table)
        row = {"batch": b, "seqlen_q": sq, "cached": cached, "tflops": {}}
        row["tflops"]["dense (its own choice)"] = flops / median_ms(lambda: fa.flash_attn_func(q, k, v, causal=True)) / 1e9
        for name, knobs in configs.items():
            cfg = FwdConfig(**knobs) if knobs is not None else None
            try:
                ms = median_ms(lambda: interface._launch_fwd(q, kc, vc, spec, shape, params, varlen=varlen, config=cfg,
                                                             num_splits=1))
                row["tflops"][name] = flops / ms / 1e9
            except Exception as e:  # an invalid config names its problem
                row["tflops"][name] = f"{type(e).__name__}: {str(e)[:160]}"
        print(b, sq, cached, {k: (round(x) if isinstance(x, float) else x) for k, x in row["tflops"].items()}, flush=True)
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                                              "head_dim": d, "occupancy": "SM120 (package default)", "rows": rows},
                                             indent=1))


if __name__ == "__main__":
    main()
