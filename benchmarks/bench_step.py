"""The training step, end to end, with each attention in the same process, steps alternated (a script, not a
test): the training check's models (``tools/train_check.py``) built once per attention, then timed in blocks of
``--block`` steps that take the attentions in turn, so that a slow phase of the host (frequency, another tenant;
the transformers Llama step is host-bound) lands on every attention rather than on the one timed during it.

Models: ``llama`` (transformers, eager, GQA 8/2, head_dim 128, this bundle through ``kernels``), ``llama_compiled``
(the same model's forward and loss under ``torch.compile``, graph breaks allowed: transformers' own code decides
where they fall) and ``plain`` (the plain GPT under ``torch.compile(fullgraph=True)``); attentions ``ours``,
``sdpa_sm120`` (SDPA with the backend order it takes on an SM120: FA2 where FA2 runs, else the memory-efficient
kernel, as for the explicit mask transformers builds while torch.compile traces; ``train_check.sdpa_backend``),
``sdpa_fa2`` (SDPA held to its flash backend: FA2; it refuses the compiled transformers model's mask, so that model
runs without it) and ``sdpa`` (the H100's default: cuDNN's wgmma kernels, a ceiling no mma.sync kernel is a peer
of). Per step: CUDA-event time (as ``train_check.py``), and the host's time to issue the step; a step whose issue
time is near its event time is host-bound (the GPU waits on Python). Per attention also the step's kernels by GPU
time (one profiled step: which attention kernels ran, and their share of the GPU's work).

    source .kit_client/device-setup.sh &&
    python3 benchmarks/bench_step.py --out $OUT/step.json [--models llama plain] [--seq 2048 --batch 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

ATTENTIONS = ("ours", "sdpa_sm120", "sdpa_fa2", "sdpa")
#: (model, attention) pairs that cannot run: SDPA's flash backend refuses the boolean mask transformers builds
#: while torch.compile traces its model
REFUSED = {("llama_compiled", "sdpa_fa2")}


def own_code(fn, tag: str):
    """``fn`` with a code object of its own (named after ``tag``): torch.compile keeps its graphs per code object
    and does not tell two models of one structure apart by their weights, so two attentions whose models differ
    only in SDPA's backend order (fixed while tracing) would otherwise share the first one's graph."""
    import types

    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def hf_step(impl: str, ckpt: Path, compiled: bool = False, tag: str = "", mode: Optional[str] = None):
    """A step function of the transformers model at ``ckpt`` with attention ``impl`` (its ``model`` attribute:
    the model); ``compiled``: its forward and loss under ``torch.compile`` (the backward follows the compiled
    graphs), as a trainer's ``torch_compile`` option runs it, its graphs its own under ``tag`` (``own_code``),
    ``mode`` torch.compile's (``reduce-overhead``: the graphs replayed as CUDA graphs)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = dict(dtype=torch.bfloat16, attn_implementation=impl)
    if impl.count("/"):
        kwargs["allow_all_kernels"] = True
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), **kwargs).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

    def loss_of(ids, labels):
        return model(input_ids=ids, labels=labels).loss

    loss_fn = torch.compile(own_code(loss_of, tag), mode=mode) if compiled else loss_of

    def step(ids, labels):
        loss_fn(ids, labels).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step.model = model
    return step


def plain_step(attention: str, mode: Optional[str] = None):
    from client_transformers import REPO_ID

    return compiled_plain_step(__import__("kernels").get_kernel(REPO_ID, version=1) if attention == "ours" else None,
                               attention, mode)


def compiled_plain_step(fa, tag: str = "", mode: Optional[str] = None):
    """A step function of the plain GPT under ``torch.compile(fullgraph=True)`` with attention through the module
    ``fa`` (``flash_attn_func``), or SDPA with ``fa=None``; AdamW; its graphs its own under ``tag``
    (``own_code``); ``mode``: torch.compile's."""
    import torch

    import train_check

    model = train_check.plain_model(fa)

    def forward(ids, labels):
        return model(ids, labels)

    compiled = torch.compile(own_code(forward, tag), fullgraph=True, mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

    def step(ids, labels):
        compiled(ids, labels).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def client_setup(seq: int, batch: int) -> None:
    """The training check's batch shape, transformers and the hub offline, and this checkout's build (and the FA3
    alias) as the local kernels ``kernels.get_kernel`` loads."""
    import train_check
    from client_transformers import REPO_ID, VLLM_FA3_ID, set_local_kernels, set_offline

    train_check.SEQ, train_check.BATCH = seq, batch
    set_offline(True)
    set_local_kernels(str(ROOT), [REPO_ID, VLLM_FA3_ID])


def compile_without_caches() -> None:
    """Turn torch.compile's on-disk autograd and FX graph caches off for this process. SDPA picks its kernel while
    a graph is traced, under the run's backend order, but those caches key a graph before that pick: a graph one
    attention compiled was served to another (seen on the H100: its default order ran the memory-efficient
    kernels, SM120's order cuDNN's). So every step compiles its own graphs."""
    import torch._functorch.config
    import torch._inductor.config

    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.fx_graph_cache = False


def time_alternated(steps: dict, contexts: dict, data: list, warmup: int, rounds: int, block: int) -> dict:
    """Per attention: median CUDA-event ms per step and median host issue ms per step, over ``rounds`` blocks of
    ``block`` steps each, the attentions in turn (their order rotated each round)."""
    import torch

    names = list(steps)
    for name in names:
        with contexts[name]():
            for i in range(warmup):
                steps[name](*data[i % len(data)])
    torch.cuda.synchronize()
    events = {name: [] for name in names}
    issue = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            with contexts[name]():
                for i in range(block):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0 = time.perf_counter()
                    start.record()
                    steps[name](*data[(r * block + i) % len(data)])
                    end.record()
                    issue[name].append((time.perf_counter() - t0) * 1e3)
                    events[name].append((start, end))
        torch.cuda.synchronize()
    return {name: {"step_ms": statistics.median(s.elapsed_time(e) for s, e in events[name]),
                   "issue_ms": statistics.median(issue[name]), "steps": len(events[name])} for name in names}


def step_kernels(step, data: list, context, top: int = 8) -> dict:
    """One step of ``step`` under torch.profiler (after the warm-up): the GPU time of its kernels in all, their
    launches, the ``top`` kernels by GPU time (name, ms, calls) and the ``top`` host operations by host time
    (their children's included: name, ms, calls), where a host-bound step's time goes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with context(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(*data[0])
        torch.cuda.synchronize()
    events = prof.key_averages()
    gpu = sorted(((e.key, e.device_time_total / 1e3, e.count) for e in events
                  if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA), key=lambda r: -r[1])
    host = sorted(((e.key, e.cpu_time_total / 1e3, e.count) for e in events
                   if e.device_type == torch.autograd.DeviceType.CPU), key=lambda r: -r[1])

    def rows(entries):
        return [{"name": n[:160], "ms": round(ms, 4), "calls": c} for n, ms, c in entries[:top]]
    return {"gpu_ms": sum(r[1] for r in gpu), "launches": sum(r[2] for r in gpu), "top": rows(gpu),
            "host_top": rows(host), "graph_launches": sum(e.count for e in events if e.key == "cudaGraphLaunch")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out")
    ap.add_argument("--models", nargs="*", default=["llama", "plain"])
    ap.add_argument("--impls", nargs="*", default=list(ATTENTIONS))
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--compile-mode",
                    help="torch.compile's mode for the compiled models (reduce-overhead: CUDA graphs)")
    args = ap.parse_args()
    import torch

    import train_check
    from client_transformers import REPO_ID, versions

    client_setup(args.seq, args.batch)
    compile_without_caches()
    data = list(train_check.batches(20, "cuda"))
    contexts = {name: (lambda name=name: train_check.sdpa_backend(name)) for name in args.impls}
    report = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "versions": versions(), "compile_mode": args.compile_mode, "seq": args.seq, "batch": args.batch,
              "rounds": args.rounds, "block": args.block, "models": {}}
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            steps = {}
            impls = [name for name in args.impls if (model, name) not in REFUSED]
            if model in ("llama", "llama_compiled"):
                ckpt = train_check.hf_checkpoint("llama", Path(work))
                torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
                for name in impls:
                    with contexts[name]():
                        steps[name] = hf_step(REPO_ID if name == "ours" else "sdpa", ckpt,
                                              compiled=model == "llama_compiled", tag=name,
                                              mode=args.compile_mode)
            else:
                for name in impls:
                    with contexts[name]():
                        steps[name] = plain_step(name, args.compile_mode)
            runs = time_alternated(steps, {n: contexts[n] for n in steps}, data, args.warmup, args.rounds,
                                   args.block)
            for name in steps:
                runs[name]["kernels"] = step_kernels(steps[name], data, contexts[name])
            if "ours" in runs:
                for name, r in runs.items():
                    r["ours_speedup"] = r["step_ms"] / runs["ours"]["step_ms"]
            report["models"][model] = runs
            for name, r in runs.items():
                kernels = r["kernels"]
                print(f"{model:6s} {name:10s} step {r['step_ms']:7.2f} ms  issue {r['issue_ms']:7.2f} ms  "
                      f"ours x{r.get('ours_speedup', 0):.3f}  GPU {kernels['gpu_ms']:7.2f} ms", flush=True)
                print(f"    {kernels['launches']} kernel launches, {kernels['graph_launches']} graph launches",
                      flush=True)
                for row in kernels["top"][:3] + kernels["host_top"]:
                    print(f"    {row['ms']:8.3f} ms {row['calls']:4d}x {row['name'][:110]}", flush=True)
            del steps
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
