"""Measure first-call time of the forward (compile + launch) with a cold and a warm disk cache.

Each measurement runs in a fresh process; the parent prints both. The DSL's own file cache is
turned off (CUTE_DSL_DISABLE_FILE_CACHING=1) so "cold" really compiles.

    python tools/first_call_time.py [--json out.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import sys, time, torch
sys.path.insert(0, sys.argv[1])
import flash_attn_4_sm120 as fa
from flash_attn_4_sm120.compile_cache import default_cache
q = torch.randn(2, 1000, 16, 128, dtype=torch.bfloat16, device="cuda")
k = torch.randn(2, 1000, 4, 128, dtype=torch.bfloat16, device="cuda")
torch.cuda.synchronize()
t = time.perf_counter()
fa.flash_attn_func(q, k, k, causal=True)
torch.cuda.synchronize()
first = time.perf_counter() - t
t = time.perf_counter()
fa.flash_attn_func(q, k, k, causal=True)
torch.cuda.synchronize()
print(first, time.perf_counter() - t, default_cache().stats.compiles, default_cache().stats.disk_hits)
"""

# Import cost of the DSL alone (fresh process): the floor under any first call.
IMPORT = "import time; t = time.perf_counter(); import cutlass.cute, tvm_ffi; print(time.perf_counter() - t)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1] / "torch-ext"
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "FA4_SM120_CACHE_DIR": cache, "CUTE_DSL_DISABLE_FILE_CACHING": "1"}
        res = {}
        for label in ("cold", "warm"):
            out = subprocess.run([sys.executable, "-c", CHILD, str(root)], env=env, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr[-2000:])
            first, second, compiles, disk_hits = out.stdout.split()[-4:]
            res[label] = {"first_call_s": float(first), "second_call_s": float(second),
                          "compiles": int(compiles), "disk_hits": int(disk_hits)}
            print(f"{label:5s} disk cache: first call {float(first):.3f} s (compiles={compiles}, disk hits={disk_hits}); "
                  f"second call {float(second) * 1e3:.2f} ms")
        out = subprocess.run([sys.executable, "-c", IMPORT], capture_output=True, text=True, check=True)
        res["import_cutlass_s"] = float(out.stdout.split()[-1])
        print(f"import cutlass.cute + tvm_ffi alone: {res['import_cutlass_s']:.3f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
