"""Host microseconds of the bundle's custom-op bodies inside a compiled training step against the same calls in a
tight loop (a script, not a test).

Session 45: the compiled transformers Llama's step issues ~1.4 ms more host work with ours than with SDPA (8 op
calls), several times what ``explore/op_host_probe.py`` measures for the ops in a loop (37 / 83 us). This times the
parts of each op body with ``perf_counter`` wrappers (``_call_key``, the forward's ``_run_plan``, ``_grads``,
``run_bwd``, the ``bwd_launch`` lookup, each backward launch) over ``--steps`` steps of the compiled plain GPT and
the compiled transformers Llama (ours: the tree's package for the plain GPT, the build kernels loads for the Llama),
records what the backward op receives (dLSE a tensor or None, dO's and q / k / v's layouts: AOTAutograd may hand a
zero-filled tangent for the unused LSE), then replays the last recorded backward call (``_grads``) in a loop with
the same wrappers: the in-step / loop ratio per backward part.

    source .kit_client/device-setup.sh && python3 benchmarks/explore/step_op_timing.py --out $OUT/op_timing.json
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "torch-ext"))


class Timers:
    """Per-name call counts and total seconds of wrapped functions (``wrap``)."""

    def __init__(self):
        self.total = collections.defaultdict(float)
        self.calls = collections.defaultdict(int)

    def wrap(self, name, fn):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.total[name] += time.perf_counter() - t0
                self.calls[name] += 1
        return call

    def per_call_us(self) -> dict:
        return {n: {"calls": self.calls[n], "us_per_call": self.total[n] / self.calls[n] * 1e6} for n in self.total}


def instrument(iface, backward, timers: Timers, seen: dict):
    """Install the wrappers; returns a function that removes them."""
    saved = {(iface, "_call_key"): iface._call_key, (iface, "_grads"): iface._grads,
             (iface, "_run_plan"): iface._run_plan, (backward, "run_bwd"): backward.run_bwd,
             (backward, "bwd_launch"): backward.bwd_launch}
    grads = iface._grads

    def spy_grads(q, k, v, out, lse, dout, dlse, *rest, **kw):
        seen["grads"] = (q, k, v, out, lse, dout, dlse, *rest)
        seen["grads_kw"] = kw
        seen.setdefault("facts", {
            "dlse": None if dlse is None else [list(dlse.shape), str(dlse.dtype), bool(dlse.is_contiguous())],
            "dout_contiguous": bool(dout.is_contiguous()),
            "qkv_contiguous": [bool(t.is_contiguous()) for t in (q, k, v)],
            "qkv_strides": [list(t.stride()) for t in (q, k, v)]})
        return grads(q, k, v, out, lse, dout, dlse, *rest, **kw)

    launch_fn = backward.bwd_launch

    def spy_launch(*a, **kw):
        launch = launch_fn(*a, **kw)
        return dataclasses.replace(launch, pre=timers.wrap("launch pre", launch.pre),
                                   main=timers.wrap("launch main", launch.main),
                                   post=timers.wrap("launch post", launch.post))

    iface._call_key = timers.wrap("_call_key", iface._call_key)
    iface._grads = timers.wrap("_grads", spy_grads)
    iface._run_plan = timers.wrap("_run_plan (fwd)", iface._run_plan)
    backward.run_bwd = timers.wrap("run_bwd", backward.run_bwd)
    backward.bwd_launch = timers.wrap("bwd_launch", spy_launch)

    def remove():
        for (mod, name), fn in saved.items():
            setattr(mod, name, fn)
    return remove


def measure(label, step, data, iface, backward, steps: int) -> dict:
    import torch

    for i in range(5):
        step(*data[i % len(data)])
    torch.cuda.synchronize()
    timers, seen = Timers(), {}
    remove = instrument(iface, backward, timers, seen)
    t0 = time.perf_counter()
    try:
        for i in range(steps):
            step(*data[i % len(data)])
    finally:
        remove()
    issue = (time.perf_counter() - t0) / steps * 1e3
    torch.cuda.synchronize()
    in_step = timers.per_call_us()
    # the last backward call again, in a loop, with the same wrappers
    loop_timers = Timers()
    remove = instrument(iface, backward, loop_timers, {})
    try:
        args, kw = seen["grads"], seen["grads_kw"]
        for _ in range(200):
            iface._grads(*args, **kw)
    finally:
        remove()
    torch.cuda.synchronize()
    loop = loop_timers.per_call_us()
    rows = {name: {"in_step_us": r["us_per_call"], "calls_per_step": r["calls"] / steps,
                   "loop_us": loop.get(name, {}).get("us_per_call")} for name, r in in_step.items()}
    for name, r in rows.items():
        loop_us = r["loop_us"]
        print(f"{label:12s} {name:18s} in step {r['in_step_us']:7.1f} us ({r['calls_per_step']:.0f}/step)  "
              f"loop {loop_us if loop_us is None else round(loop_us, 1)}", flush=True)
    print(f"{label:12s} issue {issue:.2f} ms/step; {seen.get('facts')}", flush=True)
    return {"issue_ms": issue, "parts": rows, "facts": seen.get("facts")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    import tempfile

    import torch

    import bench_step
    import train_check

    bench_step.client_setup(args.seq, args.batch)
    bench_step.compile_without_caches()
    fa = __import__("flash_attn_4_sm120")
    iface, backward = fa.interface, fa.backward
    data = list(train_check.batches(8, "cuda"))
    report = {"device": torch.cuda.get_device_name(), "seq": args.seq, "batch": args.batch}
    report["plain"] = measure("plain", bench_step.compiled_plain_step(fa, "ours_tree"), data, iface, backward,
                              args.steps)
    with tempfile.TemporaryDirectory() as work:
        from client_transformers import REPO_ID

        ckpt = train_check.hf_checkpoint("llama", Path(work))
        step = bench_step.hf_step(REPO_ID, ckpt, compiled=True, tag="ours")
        step(*data[0])  # the build kernels loads for transformers, imported by now
        hub = _hub_package()
        report["llama_package"] = hub.__name__
        report["llama_compiled"] = measure("llama_comp", step, data, hub.interface, hub.backward, args.steps)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


def _hub_package():
    """The bundle package that kernels loaded (not the tree's ``flash_attn_4_sm120``): the one the transformers
    model's attention calls."""
    for name, mod in list(sys.modules.items()):
        if name.endswith(".interface") and hasattr(mod, "_bwd_impl") and name != "flash_attn_4_sm120.interface":
            return sys.modules[name.rsplit(".", 1)[0]]
    raise RuntimeError("no bundle package loaded through kernels")


if __name__ == "__main__":
    sys.exit(main())
