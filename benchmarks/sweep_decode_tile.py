"""Forced-config sweep of the FP8 K/V decode tile (a script, not a test): every ``--config`` replaces the table's
``d{class}_fp8kv_decode`` entry in a fresh process, and every ``--splits`` count is timed on the FP8 decode cases
of ``bench_fp8.py`` (dense and page-16 caches, bf16 q and all-e4m3), replayed from CUDA graphs at an SM120's CTAs
per SM, beside the copy bandwidth in the same run. The table's entries and the split rule are read off its JSON.

    python benchmarks/sweep_decode_tile.py --config 64,4,4 --config 64,4,2 --splits 0 8 32 --out sweep.json
"""

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: (name, batch, cached keys, heads_q, heads_kv, head_dim): bench_fp8's decode rows over FP8 caches
CASES = [("1x32768 32/8 d128", 1, 32768, 32, 8, 128), ("16x8192 32/8 d128", 16, 8192, 32, 8, 128),
         ("64x2048 32/8 d128", 64, 2048, 32, 8, 128), ("32x3000 28/4 d128", 32, 3000, 28, 4, 128),
         ("4x16384 64/8 d64", 4, 16384, 64, 8, 64)]


def measure(tile_n: int, warps: int, stages: int, splits: list, cases: list) -> list:
    """Rows of one config (in this process: the table entry is replaced before any call plans)."""
    import torch

    import flash_attn_4_sm120 as fa
    from bench_fp8 import E4M3, quantize
    from bench_serving import copy_gbps, paged, time_impl
    from flash_attn_4_sm120 import config

    table = config.fwd_table()
    for key in [k for k in table if k.endswith("_fp8kv_decode")]:
        table[key] = config.FwdConfig(tile_m=16, tile_n=tile_n, num_warps=warps, num_stages=stages, q_in_regs=True,
                                       mainloop="cp_async", warps_on_keys=True)
    model = fa.dispatch_model(torch.device("cuda"))
    copy = copy_gbps()
    rows = []
    for name, b, sk, hq, hkv, d in CASES:
        if cases and not any(c in name for c in cases):
            continue
        torch.manual_seed(0)
        q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda")
        k8, kd = quantize(torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda"))
        v8, vd = quantize(torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda"))
        kc, vc, table_ = paged(k8.view(torch.uint8), v8.view(torch.uint8), 16)
        kc, vc = kc.view(E4M3), vc.view(E4M3)
        used = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        q8 = q.to(E4M3)
        one = torch.ones((b, hkv), device="cuda")
        for s in splits:
            ns = s or None
            calls = {
                "fp8 dense": lambda: fa.flash_attn_func(q, k8, v8, k_descale=kd, v_descale=vd, num_splits=ns),
                "fp8 paged16": lambda: fa.flash_attn_varlen_func(q, kc, vc, seqused_k=used, page_table=table_,
                                                                 k_descale=one, v_descale=one, num_splits=ns),
                "all-e4m3 dense": lambda: fa.flash_attn_func(q8, k8, v8, k_descale=kd, v_descale=vd,
                                                             num_splits=ns),
            }
            for label, call in calls.items():
                try:
                    ms = time_impl("ours", call, "graph", model, {})["ms"]
                    r = {"us": ms * 1e3, "copy_fraction": b * sk * hkv * 2 * d / ms / 1e6 / copy}
                except Exception as e:
                    r = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                row = {"case": name, "config": [16, tile_n, warps, stages], "splits": s or "auto",
                       "call": label, **r}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", action="append", default=[], metavar="TILE_N,WARPS,STAGES")
    ap.add_argument("--splits", type=int, nargs="+", default=[0], help="0: the automatic count")
    ap.add_argument("--cases", nargs="*")
    ap.add_argument("--out")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("ROWS " + json.dumps(measure(*map(int, args.one.split(",")), args.splits, args.cases or [])))
        return
    import torch

    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "method": "graph replay at SM120 CTAs per SM (bench_serving.time_impl), median of CUDA events",
              "rows": []}
    for cfg in args.config:
        cmd = [sys.executable, __file__, "--one", cfg, "--splits", *map(str, args.splits)]
        if args.cases:
            cmd += ["--cases", *args.cases]
        out = subprocess.run(cmd, capture_output=True, text=True)
        print(out.stdout[-3000:], out.stderr[-3000:], flush=True)
        for line in out.stdout.splitlines():
            if line.startswith("ROWS "):
                result["rows"] += json.loads(line[5:])
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
