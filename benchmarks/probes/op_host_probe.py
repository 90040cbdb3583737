"""Host microseconds per call of the custom ops a compiled training graph calls, layer by layer (a script, not a
test).

The compiled plain GPT's step is host-bound with the bundle (``benchmarks/bench_step.py``); this splits an op
call's host time into the dispatcher and ``torch.library.custom_op`` layers (``torch.ops`` call, as an inductor
graph makes it, under ``no_grad`` as AOTAutograd's runtime runs the forward graph's ops) and the bundle's own impl
(``custom_ops._fwd_impl`` / ``_bwd_impl`` called directly), for the tree's package and the build loaded through
``kernels`` (``--profile``: cProfiles of the tree's op calls), and forward + backward through autograd beside
SDPA's (``--breakdown``: that call's parts); a small causal GQA shape, so the GPU never holds the host back.
Median of 7 rounds of 200 calls.

    source .kit_client/device-setup.sh && python3 benchmarks/probes/op_host_probe.py --out $OUT/op_host.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))


def per_call_us(fn, calls: int = 200, rounds: int = 7) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


PROFILE = False
BREAKDOWN = False


def _module(iface, name: str):
    """The package's module ``name`` beside ``iface`` (the tree's package or the build ``kernels`` loaded)."""
    return importlib.import_module(iface.__name__.rsplit(".", 1)[0] + "." + name)


def breakdown(iface, ours_step, qkv, qkv_t, ours_dout) -> dict:
    """Where an eager fwd+bwd call's host time goes (``--breakdown``): the forward with a graph built, the backward
    body (``backward.run_bwd``) with and without its three launches, each launch alone, the dQ accumulator's
    zero fill, and the autograd floor (a Python autograd.Function that only returns its input's view, forward and
    backward through the engine, against the same with a native op)."""
    import dataclasses

    import torch

    backward, ag = _module(iface, "backward"), _module(iface, "autograd")
    captured = {}
    run_bwd, bwd_launch = backward.run_bwd, backward.bwd_launch

    def spy_launch(*a, **kw):
        launch = bwd_launch(*a, **kw)
        captured["launch"] = launch

        def wrap(name, fn):
            def call(*args):
                captured[name] = args
                return fn(*args)
            return call
        return dataclasses.replace(launch, pre=wrap("pre", launch.pre), main=wrap("main", launch.main),
                                   post=wrap("post", launch.post))

    grads_fn = ag.gradients

    def spy_grads(*x, **y):
        captured["grads_args"] = x
        return grads_fn(*x, **y)
    ag.gradients = spy_grads

    def spy_run(*a, **kw):
        captured["run_bwd"] = (a, kw)
        return run_bwd(*a, **kw)
    backward.run_bwd, backward.bwd_launch = spy_run, spy_launch
    try:
        ours_step()
    finally:
        backward.run_bwd, backward.bwd_launch = run_bwd, bwd_launch
        ag.gradients = grads_fn
    torch.cuda.synchronize()
    a, kw = captured["run_bwd"]
    launch = captured["launch"]
    rows = {}
    q, k, v = qkv
    qt, kt, vt = qkv_t
    rows["fwd with grad (graph built), ours"] = per_call_us(lambda: iface.flash_attn_func(q, k, v, causal=True))
    rows["fwd with grad (graph built), SDPA"] = per_call_us(
        lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True))
    rows["bwd body (run_bwd)"] = per_call_us(lambda: run_bwd(*a, **kw))

    def noop(*args):
        return None
    quiet = dataclasses.replace(launch, pre=noop, main=noop, post=noop)
    backward.bwd_launch = lambda *x, **y: quiet
    try:
        rows["bwd body, launches skipped"] = per_call_us(lambda: run_bwd(*a, **kw))
    finally:
        backward.bwd_launch = bwd_launch
    for name in ("pre", "main", "post"):
        fn, args = getattr(launch, name), captured[name]
        rows[f"launch {name} alone"] = per_call_us(lambda fn=fn, args=args: fn(*args))
    dq_acc = captured["main"][6]
    rows["torch.zeros (dQ accumulator)"] = per_call_us(lambda: torch.zeros(dq_acc.shape, dtype=dq_acc.dtype,
                                                                           device=dq_acc.device))
    rows["torch.empty (dQ accumulator)"] = per_call_us(lambda: torch.empty(dq_acc.shape, dtype=dq_acc.dtype,
                                                                           device=dq_acc.device))

    grads_fn = ag.gradients
    fixed = grads_fn(*captured["grads_args"]) if "grads_args" in captured else None
    if fixed is not None:
        ag.gradients = lambda *x, **y: fixed
        try:
            rows["fwd+bwd autograd, ours, backward body skipped"] = per_call_us(ours_step)
        finally:
            ag.gradients = grads_fn
    rows["fwd + autograd.grad, ours"] = per_call_us(
        lambda: torch.autograd.grad(iface.flash_attn_func(q, k, v, causal=True)[0], (q, k, v), ours_dout))
    rows["fwd + autograd.grad, SDPA"] = per_call_us(lambda: torch.autograd.grad(
        torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True), (qt, kt, vt),
        ours_dout.transpose(1, 2)))

    rows.update(timed_inside(iface, backward, ours_step, lambda: backward.run_bwd(*a, **kw)))

    class Ident(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g
    x = torch.randn(8, device="cuda", requires_grad=True)
    g = torch.ones(8, device="cuda")
    rows["autograd floor, Python Function"] = per_call_us(lambda: Ident.apply(x).backward(g))
    rows["autograd floor, native op"] = per_call_us(lambda: x.view_as(x).backward(g))
    return rows


def timed_inside(iface, backward, ours_step, direct) -> dict:
    """Mean microseconds spent inside ``autograd.gradients``, ``run_bwd`` and each of the three backward launches when the
    autograd engine calls the backward (``ours_step``) and when ``run_bwd`` is called on this thread (``direct``),
    from wrappers that time each call with ``perf_counter`` (H100, 2026-11-27: the backward body cost ~180 us through
    autograd against ~50 us called directly)."""
    import collections
    import dataclasses
    import threading

    import torch

    spent = collections.defaultdict(float)
    threads = set()

    def timed(name, fn):
        def call(*x, **y):
            t0 = time.perf_counter()
            try:
                return fn(*x, **y)
            finally:
                spent[name] += time.perf_counter() - t0
                threads.add((name, threading.get_ident() == threading.main_thread().ident))
        return call
    ag = _module(iface, "autograd")
    grads_fn, run_bwd, bwd_launch = ag.gradients, backward.run_bwd, backward.bwd_launch

    def launch_timed(*x, **y):
        launch = bwd_launch(*x, **y)
        return dataclasses.replace(launch, pre=timed("pre", launch.pre), main=timed("main", launch.main),
                                   post=timed("post", launch.post))
    rows = {}
    for label, fn in (("autograd", ours_step), ("direct", direct)):
        ag.gradients, backward.run_bwd = timed("gradients", grads_fn), timed("run_bwd", run_bwd)
        backward.bwd_launch = timed("bwd_launch", launch_timed)
        try:
            fn()
            torch.cuda.synchronize()
            spent.clear()
            threads.clear()
            n = 300
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
        finally:
            ag.gradients, backward.run_bwd, backward.bwd_launch = grads_fn, run_bwd, bwd_launch
        for name, total in sorted(spent.items()):
            rows[f"inside {name}, {label}"] = total / n * 1e6
        print(f"{label}: (function, on the main thread): {sorted(threads)}", flush=True)
    return rows


def probe(label: str, iface) -> dict:
    import torch

    torch.manual_seed(0)
    b, s, hq, hkv, d = 1, 256, 8, 2, 128
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    ops = _module(iface, "custom_ops")
    fwd_op, bwd_op = (getattr(op, "_opoverload", op) for op in (ops._fwd_op, ops._bwd_op))
    fwd_args = (q, k, v, None, True, None, None, 0.0, None, 1, None, False, None)
    with torch.no_grad():
        out, lse = fwd_op(*fwd_args)
    dout = torch.randn_like(out)
    bwd_args = (dout, None, q, k, v, out, lse, None, True, None, None, 0.0, None, False, None)
    rows = {}
    with torch.no_grad():
        rows["fwd op (torch.ops, no_grad)"] = per_call_us(lambda: fwd_op(*fwd_args))
        rows["fwd impl (direct)"] = per_call_us(lambda: ops._fwd_impl(*fwd_args))
        rows["bwd op (torch.ops, no_grad)"] = per_call_us(lambda: bwd_op(*bwd_args))
        rows["bwd impl (direct)"] = per_call_us(lambda: ops._bwd_impl(*bwd_args))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        rows["SDPA forward (no_grad)"] = per_call_us(
            lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True))
    # forward + backward through autograd, as an eager training step calls them (ours: flash_attn_func)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    qtg, ktg, vtg = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))

    def ours_step():
        iface.flash_attn_func(qg, kg, vg, causal=True)[0].backward(dout)

    def sdpa_step():
        torch.nn.functional.scaled_dot_product_attention(qtg, ktg, vtg, is_causal=True, enable_gqa=True).backward(
            dout.transpose(1, 2))

    rows["fwd+bwd autograd, ours"] = per_call_us(ours_step)
    rows["fwd+bwd autograd, SDPA"] = per_call_us(sdpa_step)
    if BREAKDOWN:
        rows.update(breakdown(iface, ours_step, (qg, kg, vg), (qtg, ktg, vtg), dout))
    for name, us in rows.items():
        print(f"{label:6s} {name:30s} {us:7.1f} us/call", flush=True)
    if PROFILE:
        import cProfile
        import io
        import pstats

        for name, fn in (("fwd op", lambda: fwd_op(*fwd_args)), ("bwd op", lambda: bwd_op(*bwd_args)),
                         ("fwd+bwd autograd", ours_step)):
            prof = cProfile.Profile()
            with torch.set_grad_enabled(name.endswith("autograd")):
                prof.enable()
                for _ in range(300):
                    fn()
                prof.disable()
            torch.cuda.synchronize()
            for key in ("tottime", "cumulative"):
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(28)
                rows[f"profile {name} {key}"] = buf.getvalue()
                print(f"== {label} {name} by {key}\n" + "\n".join(
                    line[:190] for line in buf.getvalue().splitlines()[6:40]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--profile", action="store_true", help="cProfile 300 calls of each op (the tree's package)")
    ap.add_argument("--tree-only", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="time the eager fwd+bwd call's parts (the tree's)")
    args = ap.parse_args()
    global PROFILE, BREAKDOWN
    PROFILE, BREAKDOWN = args.profile, args.breakdown
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from client_transformers import REPO_ID, set_local_kernels, set_offline

    report = {"device": torch.cuda.get_device_name()}
    sys.path.insert(0, str(ROOT / "torch-ext"))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        report["tree"] = probe("tree", importlib.import_module("flash_attn_4_sm120.interface"))
        if args.tree_only:
            if args.out:
                Path(args.out).write_text(json.dumps(report, indent=1))
            return 0
        set_offline(True)
        set_local_kernels(str(ROOT), [REPO_ID])
        fa = __import__("kernels").get_kernel(REPO_ID, version=1)
        report["kernels"] = probe("kernels", importlib.import_module(fa.__name__ + ".interface"))
        report["tree_again"] = probe("tree", importlib.import_module("flash_attn_4_sm120.interface"))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
