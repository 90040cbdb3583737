"""Probe (issue 18): decode bandwidth of the split-KV packed-GQA forward (d=128, GQA 32/8) by tile and split
count, replayed from a CUDA graph at SM120 occupancy. A decode tile holds one query's 4 heads in 64 rows, so
the kernel is a stream of K/V: what matters is the bytes each SM keeps in flight (stages x tile_n) and how
evenly the splits cover the SMs.

    python benchmarks/explore/decode_tiles.py --out result.json
"""

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "torch-ext"))

import torch  # noqa: E402

from flash_attn_4_sm120 import interface  # noqa: E402
from flash_attn_4_sm120.config import FwdConfig  # noqa: E402
from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV  # noqa: E402
from flash_attn_4_sm120.problem import validate_fwd  # noqa: E402
from bench_serving import graphed  # noqa: E402
from timing import median_ms  # noqa: E402

CASES = [(1, 32768), (16, 8192), (64, 2048)]
CONFIGS = {
    "64x64 s2 (now)": dict(tile_m=64, tile_n=64, num_warps=4, num_stages=2, q_in_regs=True),
    "64x32 s3": dict(tile_m=64, tile_n=32, num_warps=4, num_stages=3, q_in_regs=True),
    "64x48 s3": dict(tile_m=64, tile_n=48, num_warps=4, num_stages=3, q_in_regs=True),
    "64x32 s2": dict(tile_m=64, tile_n=32, num_warps=4, num_stages=2, q_in_regs=True),
}
SPLITS = (None, 8, 16, 24, 32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    hq, hkv, d = 32, 8, 128
    rows = []
    for b, sk in CASES:
        q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        spec, shape, params = validate_fwd(q, k, v, None, False)
        spec = interface._with_packing(spec, shape, None)
        kv_bytes = 2 * k.numel() * 2
        row = {"batch": b, "seqlen_k": sk, "gbps": {}}
        for name, knobs in CONFIGS.items():
            cfg = FwdConfig(**knobs)
            for splits in SPLITS:
                call = (lambda cfg=cfg, splits=splits: interface._launch_fwd(q, k, v, spec, shape, params, config=cfg,
                                                                             num_splits=splits))
                try:
                    with mock.patch.dict(os.environ, {OCCUPANCY_ENV: "model"}):
                        replay = graphed(call)
                    row["gbps"][f"{name} splits={splits or 'auto'}"] = kv_bytes / median_ms(replay) / 1e6
                except Exception as e:
                    row["gbps"][f"{name} splits={splits or 'auto'}"] = f"{type(e).__name__}: {str(e)[:120]}"
        print(b, sk, {k: (round(x) if isinstance(x, float) else x) for k, x in row["gbps"].items()}, flush=True)
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                                              "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
