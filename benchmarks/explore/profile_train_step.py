"""Where a compiled training step's time goes: the training check's plain GPT (``tools/train_check.py``) with
the bundle's attention and with SDPA, under ``torch.profiler`` (a script, not a test).

Session 22 measured the compiled plain model at 11.3 ms per step with the bundle against 8.3 ms with SDPA
(2048x4 tokens, H100), more than the attention kernels' own gap explains. This prints, per attention, the step
time (CUDA events), the GPU time per kernel name (top ``--top``), the GPU time of the attention kernels against
everything else, and the GPU's idle share of the profiled window (host-bound launches show there); writes
the same as JSON.

    python3 benchmarks/explore/profile_train_step.py --seq 2048 --batch 4 --out $OUT/train_profile.json

Runs from the tree (``torch-ext``), so the benchmark kit suffices (no ``kernels`` wheel, no transformers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "torch-ext"))

#: substrings of kernel names that are attention (ours and the peers'), the rest is the model around it
ATTENTION_NAMES = ("flash", "Flash", "fmha", "cudnn")


def profile(fa, steps: int, top: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    import train_check

    model = train_check.plain_model(fa)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = list(train_check.batches(steps + 10, "cuda"))

    def step(ids, labels):
        loss = compiled(ids, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i, (ids, labels) in enumerate(data[:10]):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(ids, labels)
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    step_ms = statistics.median(s.elapsed_time(e) for s, e in times[3:])
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        for ids, labels in data[10:]:
            step(ids, labels)
        torch.cuda.synchronize()
    kernels, first, last = {}, None, None
    for ev in prof.events():
        if ev.device_type.name != "CUDA" or ev.device_time_total <= 0:
            continue
        k = kernels.setdefault(ev.name, {"us": 0.0, "calls": 0})
        k["us"] += ev.device_time_total
        k["calls"] += 1
        t0, t1 = ev.time_range.start, ev.time_range.end
        first = t0 if first is None else min(first, t0)
        last = t1 if last is None else max(last, t1)
    busy = sum(k["us"] for k in kernels.values())
    attn = sum(k["us"] for n, k in kernels.items() if any(s in n for s in ATTENTION_NAMES))
    span = (last - first) if first is not None else 0.0
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1]["us"])[:top]
    return {"step_ms_events": step_ms, "profiled_steps": steps,
            "gpu_busy_ms_per_step": busy / steps / 1e3, "attention_ms_per_step": attn / steps / 1e3,
            "window_ms_per_step": span / steps / 1e3, "gpu_idle_share": 1 - busy / span if span else None,
            "top_kernels": [{"name": n[:160], "ms_per_step": k["us"] / steps / 1e3, "calls_per_step": k["calls"] / steps}
                            for n, k in ranked]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch

    import flash_attn_4_sm120 as ours
    import train_check

    train_check.SEQ, train_check.BATCH = args.seq, args.batch
    report = {"device": torch.cuda.get_device_name(), "seq": args.seq, "batch": args.batch, "runs": {}}
    for name, fa in (("ours", ours), ("sdpa", None)):
        report["runs"][name] = r = profile(fa, args.steps, args.top)
        print(f"== {name}: {r['step_ms_events']:.2f} ms/step (events); GPU busy {r['gpu_busy_ms_per_step']:.2f} ms, "
              f"attention {r['attention_ms_per_step']:.2f} ms, idle share {r['gpu_idle_share']:.1%}", flush=True)
        for k in r["top_kernels"]:
            print(f"   {k['ms_per_step']:7.3f} ms  x{k['calls_per_step']:4.0f}  {k['name'][:110]}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
