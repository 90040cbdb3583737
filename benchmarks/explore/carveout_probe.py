"""Can the H100 run every kernel (ours and the peers') at an SM120's CTAs per SM? (a script, not a test)

An SM120 SM has 100 KB of shared memory, an H100 SM 228 KB: a 64-99 KB forward CTA runs twice per H100 SM
and once per SM120 SM, and two co-resident CTAs hide each other's softmax. The package pads our own
launches (``ExecutionModel.occupancy_launch_smem``); the peers' launches cannot be padded, and a co-resident
"holder" kernel does not work (session 8). This probe (session 10, which confirmed it:
``benchmarks/results/carveout_probe_h100_2026-11-23.json.gz``; ``benchmarks/occupancy.py`` is what the benchmark uses) tries the context's cache-configuration preference instead
(``cuCtxSetCacheConfig``): with L1 preferred, the driver should give each kernel the smallest shared-memory
carveout its CTA fits in, which for a 64-99 KB CTA is the 100 KB configuration an SM120 has.

    python benchmarks/explore/carveout_probe.py --out probe.json           # timings per preference
    ncu --metrics launch__shared_mem_config_size,... python benchmarks/explore/carveout_probe.py --ncu

Per case and preference it times ours (table entry, natural launch), ours padded to SM120 occupancy
(``tune_fwd.launch_smem``, as the package launches by default), SDPA flash (FA2) and upstream flash-attn-4's SM120 path.
"""

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_120")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from bench_fwd import sdpa, upstream_fa4  # noqa: E402
from timing import median_ms  # noqa: E402
from occupancy import PREFERENCES, set_cache_config  # noqa: E402
from tune_fwd import dense_launch, launch_smem  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))
from flash_attn_4_sm120.compiler import compile_fwd  # noqa: E402
from flash_attn_4_sm120.config import select_fwd_config  # noqa: E402
from flash_attn_4_sm120.interface import dispatch_model  # noqa: E402
from flash_attn_4_sm120.problem import FwdSpec  # noqa: E402

# (name, batch, seqlen, heads_q, heads_kv, head_dim, causal)
CASES = [("d128 full", 4, 4096, 32, 8, 128, False), ("d128 causal", 4, 4096, 32, 8, 128, True),
         ("d64 full", 4, 4096, 16, 16, 64, False), ("d64 causal", 4, 4096, 16, 16, 64, True)]


def impls_for(case, model, num_sms):
    _, b, s, hq, hkv, d, causal = case
    spec = FwdSpec("bf16", d, d, causal)
    cfg = select_fwd_config(spec, model)
    out = {}
    for name, device_occupancy in (("ours", True), ("ours_sm120_padded", False)):
        fn = compile_fwd(spec, cfg, model, model.compile_target, launch_smem=launch_smem(spec, cfg, device_occupancy))
        out[name], _ = dense_launch(fn, b, s, hq, hkv, d, num_sms)
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda")
    fa2 = sdpa(SDPBackend.FLASH_ATTENTION)
    out["sdpa_flash_fa2"] = lambda: fa2(q, k, v, causal, None)
    up = upstream_fa4()
    if up is not None:
        out["fa4_sm120_path"] = lambda: up(q, k, v, causal, None)
    return out, cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--ncu", action="store_true", help="one launch per (case, preference, impl), for a profiler")
    ap.add_argument("--prefs", nargs="+", default=["none", "l1", "equal"], choices=list(PREFERENCES))
    args = ap.parse_args()
    torch.zeros(1, device="cuda")  # the primary context is current from here on
    model = dispatch_model(torch.device("cuda"))
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    records = []
    for case in CASES:
        impls, cfg = impls_for(case, model, num_sms)
        for fn in impls.values():  # compile / warm up under the default preference
            fn()
        torch.cuda.synchronize()
        for pref in args.prefs:
            set_cache_config(pref)
            for name, fn in impls.items():
                if args.ncu:
                    torch.cuda.nvtx.range_push(f"{case[0]}|{pref}|{name}")
                    fn()
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_pop()
                    continue
                ms = median_ms(fn)
                _, b, s, hq, _, d, causal = case
                tflops = 4 * b * hq * s * s * d * (0.5 if causal else 1.0) / ms / 1e9
                records.append({"case": case[0], "pref": pref, "impl": name, "ms": ms, "tflops": tflops})
                print(f"{case[0]:12s} {pref:6s} {name:18s} {tflops:6.1f} TFLOPS", flush=True)
        set_cache_config("none")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
            "method": "benchmarks/explore/carveout_probe.py (cuCtxSetCacheConfig preference per block of timings)",
            "records": records}, indent=1))


if __name__ == "__main__":
    main()
