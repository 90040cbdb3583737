"""Where the transformers Llama training step's time goes (a script, not a test): the training check's Llama
(``tools/train_check.py``: eager transformers, GQA 8/2, head_dim 128) with this bundle's attention (through
``kernels``, ``LOCAL_KERNELS``) and with SDPA held to its flash backend (FA2), per step:

* ``wall_ms``: wall time per step over 20 back-to-back steps (one synchronize at the end);
* ``submit_ms``: the host's time to issue those steps (the loop without the final synchronize): where it is
  close to ``wall_ms`` the step is host-bound and the GPU waits on Python;
* ``gpu_busy_ms``: the GPU's kernel time per step (torch.profiler), and the attention kernels' share;
* ``syncs``: what ``torch.cuda.set_sync_debug_mode("warn")`` reports over one step (a host-device synchronization
  inside a step serializes host and GPU time);
* the CPU ops by self time (torch.profiler) and the Python functions by own time (cProfile), 5 steps.

Session 30 measured this step at 17.45-21.19 ms with ours against 14.54-16.43 with SDPA-FA2 and 12.2 with SDPA
(cuDNN), ours moving 21-24% between two hosts where SDPA moved 0-1%.

    source .kit_client/device-setup.sh && python3 benchmarks/explore/profile_hf_step.py --out $OUT/hf_step.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "benchmarks"))

ATTENTION_NAMES = ("flash", "Flash", "fmha", "cudnn")


def measure(name: str, impl: str, ckpt: Path, top: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    import train_check
    from bench_step import hf_step

    step = hf_step(impl, ckpt)
    model = step.model
    data = list(train_check.batches(60, "cuda"))

    for ids, labels in data[:10]:
        step(ids, labels)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for ids, labels in data[10:30]:
        step(ids, labels)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    out = {"attn_implementation": model.config._attn_implementation,
           "submit_ms": (t1 - t0) / 20 * 1e3, "wall_ms": (t2 - t0) / 20 * 1e3}
    # host-device synchronizations inside one step
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(*data[30])
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    out["syncs"] = len(caught)
    out["sync_messages"] = sorted({str(w.message)[:200] + f" @ {Path(w.filename).name}:{w.lineno}" for w in caught})
    # torch.profiler over 5 steps
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for ids, labels in data[31:36]:
            step(ids, labels)
        torch.cuda.synchronize()
    gpu, attn = 0.0, 0.0
    cpu_ops = []
    for e in prof.key_averages():
        dev = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if e.device_type == torch.autograd.DeviceType.CUDA or (dev and not e.cpu_time_total):
            gpu += dev
            if any(s in e.key for s in ATTENTION_NAMES):
                attn += dev
        else:
            cpu_ops.append((e.self_cpu_time_total / 5e3, e.count // 5, e.key))
    out["gpu_busy_ms"] = gpu / 5e3
    out["attention_gpu_ms"] = attn / 5e3
    out["cpu_ops_self_ms_per_step"] = [{"ms": round(ms, 3), "calls": n, "op": k[:120]}
                                       for ms, n, k in sorted(cpu_ops, reverse=True)[:top]]
    # cProfile over 5 steps
    pr = cProfile.Profile()
    pr.enable()
    for ids, labels in data[36:41]:
        step(ids, labels)
    pr.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(top)
    pstats.Stats(pr, stream=text).sort_stats("cumulative").print_stats("flash_attn_4_sm120|flash_attention|kernels",
                                                                       top)
    out["cprofile"] = text.getvalue()
    del model, step
    torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--impls", nargs="*", default=["ours", "sdpa_fa2"])
    args = ap.parse_args()
    import datetime

    import torch

    import train_check
    from client_transformers import REPO_ID, VLLM_FA3_ID, set_local_kernels, set_offline

    train_check.SEQ, train_check.BATCH = args.seq, args.batch
    set_offline(True)
    set_local_kernels(str(ROOT), [REPO_ID, VLLM_FA3_ID])
    impls = {"ours": REPO_ID, "sdpa_fa2": "sdpa", "sdpa": "sdpa"}
    report = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "seq": args.seq,
              "batch": args.batch, "runs": {}}
    with tempfile.TemporaryDirectory() as work:
        ckpt = train_check.hf_checkpoint("llama", Path(work))
        for name in args.impls:
            with train_check.sdpa_backend(name):
                r = measure(name, impls[name], ckpt, args.top)
            report["runs"][name] = r
            print(f"== {name}: wall {r['wall_ms']:.2f} ms/step, submit {r['submit_ms']:.2f}, GPU busy "
                  f"{r['gpu_busy_ms']:.2f} (attention {r['attention_gpu_ms']:.2f}), syncs {r['syncs']}", flush=True)
            for m in r["sync_messages"][:8]:
                print("   sync:", m)
            for op in r["cpu_ops_self_ms_per_step"][:15]:
                print(f"   {op['ms']:7.3f} ms {op['calls']:4d}x {op['op']}")
            print(r["cprofile"][:6000])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
