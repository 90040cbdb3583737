"""Which d64 backward tile serves ``deterministic=True`` best (issue 19: deterministic <= 1.3x the default's time;
d64 full measured 1.32-1.33x on the table's 4-warp 64x64 tile). A script, not a test.

The deterministic backward orders each query block's dQ additions by key block (one counter per query block), so a
step's wait is paid once per (key block, query block) pair: tiles with more keys per CTA (64x128) or more warps per
step (the 8-warp role split) pay it over more work. Timed at SM120 occupancy (the package default), 4x4096 32/8 bf16
(``bench_bwd``'s d64 rows), full and causal: the table's default backward, then the deterministic one on the table
tile, the heavy 64x128 8-warp tile and the 64x64 / 64x128 role splits (each entry patched into ``BWD_TABLE``; the
kernels compile first in spawned processes).

    python benchmarks/explore/deterministic_tiles.py --out det_tiles.json [--jobs 8]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import multiprocessing
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))

#: (batch, seqlen, heads_q, heads_kv, head_dim): bench_bwd's d64 rows and tune_bwd's d64 shape (a quarter of the CTAs)
SHAPES = ((4, 4096, 32, 8, 64), (2, 4096, 16, 4, 64))


def candidates():
    from flash_attn_4_sm120.bwd_config import BWD_TABLE, BWD_TABLE_DROPOUT, BWD_TABLE_HEAVY, BwdConfig

    return {"table": BWD_TABLE[64], "heavy_64x128_w8": BWD_TABLE_HEAVY[64],
            "rolesplit_64x64": BWD_TABLE_DROPOUT[64],
            "rolesplit_64x128": BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2,
                                          role_split=True)}


def _use(cfg):
    from flash_attn_4_sm120 import backward, bwd_config

    bwd_config.BWD_TABLE[64] = cfg
    backward.clear_caches()


def _inputs(shape, rows=None):
    import torch

    b, s, hq, hkv, d = shape
    s = rows or s
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
               for h in (hq, hkv, hkv))
    return q, k, v, torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")


def _warm(item) -> str:
    import torch

    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.bwd_config import BwdConfig

    cfg, causal, det = BwdConfig(**item[0]), item[1], item[2]
    _use(cfg)
    q, k, v, dout = _inputs(SHAPES[0], 256)
    try:
        out = fa.flash_attn_func(q, k, v, causal=causal, deterministic=det)[0]
        torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:200]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--configs", nargs="*", default=["table", "heavy_64x128_w8", "rolesplit_64x128"])
    args = ap.parse_args()

    import torch

    cands = {n: c for n, c in candidates().items() if n in args.configs}
    table = candidates()["table"]
    plan = [(name, cfg, causal, det) for causal in (False, True) for name, cfg in cands.items()
            for det in (False, True)]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        warm = list(pool.imap(_warm, [(asdict(cfg), causal, det) for _, cfg, causal, det in plan]))
    rows = []
    for shape in SHAPES:
        base = {}
        q, k, v, dout = _inputs(shape)
        for (name, cfg, causal, det), w in zip(plan, warm):
            rows.append(time_one(shape, name, cfg, causal, det, w, base, (q, k, v, dout)))
    _use(table)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "date": datetime.date.today().isoformat(), "shapes": SHAPES,
                                              "occupancy": "sm120 (package default)", "rows": rows}, indent=1))


def time_one(shape, name, cfg, causal, det, warm, base, tensors):
    """One timing row; ``base``: the table tile's default time per causal flag (the table runs first)."""
    import torch

    import flash_attn_4_sm120 as fa
    from timing import median_ms

    q, k, v, dout = tensors
    b, s, hq, _, d = shape
    row = {"shape": shape, "config_name": name, "config": asdict(cfg), "causal": causal, "deterministic": det}
    if warm != "ok":
        row["error"] = warm
    else:
        _use(cfg)
        out = fa.flash_attn_func(q, k, v, causal=causal, deterministic=det)[0]
        ms = median_ms(functools.partial(torch.autograd.grad, out, (q, k, v), dout, retain_graph=True))
        flops = 2.5 * 4 * b * hq * s * s * d * (0.5 if causal else 1.0)
        row.update(ms=ms, tflops=flops / ms / 1e9)
        if not det and name == "table":
            base[causal] = ms
        row["vs_default"] = ms / base[causal] if causal in base else None
    print(f"{shape} {'causal' if causal else 'full  '} {name:18s} det={int(det)}: " +
          (f"{row['ms']:.3f} ms {row['tflops']:.0f} TFLOPS {row['vs_default']:.3f}x the table's default"
           if "ms" in row else row["error"]), flush=True)
    return row


if __name__ == "__main__":
    main()
