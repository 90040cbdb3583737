"""Probe (issue 18): what programmatic dependent launch buys decode, and where the paged d=64 gap comes from.

Three questions, one run, every figure replayed from a CUDA graph at SM120 occupancy (K/V GB/s):
* PDL on / off: the same calls with the execution model as shipped (``has_pdl``) and a copy of it without
  PDL (its own name, so its own kernels), interleaved over rounds. Split decode has two kernels (split
  forward, combine), the KV-cache call with an append two or three; a lone kernel should not move.
* page order: decode over page-16 caches whose pages are shuffled over the pool (bench_serving's layout)
  against the same pages in order (the table an identity), against dense K/V.
* read ceiling: the bandwidth of reading the 16 x 8192 K/V once (a sum reduction, read-only), next to the
  device-to-device copy's, the two roofs a decode stream has.
* the paged prologue: dense K/V read through ``seqused_k`` and page-16 K/V without it, to separate the two
  dependent loads a paged split waits on before its first K block (the length, then the page index).
* SMs in use: 16/4-head d=128 decode over 8192 keys at 32, 33 and 34 sequences (128, 132 and 136 one-CTA
  tiles on 132 SMs, unsplit): whether a decode stream is bound per SM (132 tiles faster than 128) or by DRAM.
* where a split decode's time goes: per-kernel device time (profiler, eager calls) of 1 x 32768.

    python benchmarks/explore/pdl_decode.py --out result.json
"""

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "torch-ext"))

import torch  # noqa: E402

import flash_attn_4_sm120 as fa  # noqa: E402
from flash_attn_4_sm120 import combine, interface, kvcache  # noqa: E402
from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV  # noqa: E402
from bench_serving import copy_gbps, graphed, paged  # noqa: E402
from timing import median_ms  # noqa: E402

ROUNDS = 5


def without_pdl():
    """A patch context: the dispatch model's copy without PDL, under its own name (own kernels, own plans)."""
    orig = interface._model_and_target

    def model_and_target(*args):
        model, target = orig(*args)
        return dataclasses.replace(model, name=model.name + "-nopdl", has_pdl=False), target

    patches = [mock.patch.object(mod, "_model_and_target", model_and_target) for mod in (interface, kvcache, combine)]

    class Ctx:
        def __enter__(self):
            for p in patches:
                p.start()
            interface._PLANS.clear()

        def __exit__(self, *exc):
            for p in patches:
                p.stop()
            interface._PLANS.clear()

    return Ctx()


class Shipped:
    def __enter__(self):
        interface._PLANS.clear()

    def __exit__(self, *exc):
        interface._PLANS.clear()


def in_order(k, v, page_size):
    """Page-``page_size`` caches holding dense k / v's rows with pages in order (identity table)."""
    b, s, h, d = k.shape
    per_seq = s // page_size
    table = torch.arange(b * per_seq, dtype=torch.int32, device=k.device).view(b, per_seq)
    return k.reshape(b * per_seq, page_size, h, d), v.reshape(b * per_seq, page_size, h, v.shape[-1]), table


def decode_calls(b, sk, hq, hkv, d):
    torch.manual_seed(0)
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    used = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    kc, vc, table = paged(k, v, 16)
    ko, vo, table_o = in_order(k, v, 16)
    kn, vn = k[:, sk - 1:].clone(), v[:, sk - 1:].clone()
    calls = {
        "dense": lambda: fa.flash_attn_func(q, k, v),
        "dense seqused": lambda: fa.flash_attn_varlen_func(q, k, v, seqused_k=used),
        "paged16 no seqused": lambda: fa.flash_attn_varlen_func(q, kc, vc, page_table=table),
        "paged16 shuffled": lambda: fa.flash_attn_varlen_func(q, kc, vc, seqused_k=used, page_table=table),
        "paged16 in order": lambda: fa.flash_attn_varlen_func(q, ko, vo, seqused_k=used, page_table=table_o),
        "kvcache16 append": lambda: fa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=used - 1,
                                                               block_table=table),
    }
    return calls, 2 * k.numel() * 2


def kernel_times(call, n=20):
    """{kernel name: mean device us per call} of ``n`` eager calls (profiler)."""
    from torch.profiler import ProfilerActivity, profile
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            out[e.key[:80]] = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) / n
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    cases = [("1x8192 64/8 d64", 1, 8192, 64, 8, 64), ("1x32768 32/8 d128", 1, 32768, 32, 8, 128),
             ("16x8192 32/8 d128", 16, 8192, 32, 8, 128), ("8x4096 16/4 d256", 8, 4096, 16, 4, 256)]
    sm_cases = [(f"{b}x8192 16/4 d128", b, 8192, 16, 4, 128) for b in (32, 33, 34)]
    variants = {"pdl": Shipped, "no pdl": without_pdl}
    replays, sizes, alive, breakdown = {}, {}, [], {}
    for name, b, sk, hq, hkv, d in cases + sm_cases:
        calls, sizes[name] = decode_calls(b, sk, hq, hkv, d)
        alive.append(calls)  # a graph holds no reference to the tensors it reads: the closures keep them
        if (name, b, sk, hq, hkv, d) in sm_cases:
            calls = {"dense": calls["dense"]}
        for vname, ctx in variants.items():
            if (name, b, sk, hq, hkv, d) in sm_cases and vname != "pdl":
                continue
            with ctx(), mock.patch.dict(os.environ, {OCCUPANCY_ENV: "model"}):
                for label, call in calls.items():
                    replays[(name, label, vname)] = graphed(call)
                    if name.startswith("1x32768") and label in ("dense", "kvcache16 append"):
                        breakdown[f"{label} {vname}"] = kernel_times(call)
    # read-only roof: the 16 x 8192 case's K and V summed (fp32 accumulation), one graph
    k = torch.randn(16, 8192, 8, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    read_bytes = 2 * k.numel() * 2
    ceiling = graphed(lambda: (k.sum(dtype=torch.float32), v.sum(dtype=torch.float32)))
    times = {key: [] for key in replays}
    roof = []
    for _ in range(ROUNDS):
        for key, replay in replays.items():
            times[key].append(median_ms(replay, iters=20, reps=3))
        roof.append(median_ms(ceiling, iters=20, reps=3))
    rows = []
    for (name, label, vname), ts in times.items():
        ms = statistics.median(ts)
        rows.append({"case": name, "call": label, "variant": vname, "ms": ms, "kv_gbps": sizes[name] / ms / 1e6})
        print(f"{name:20s} {label:18s} {vname:7s} {ms * 1e3:8.1f} us {sizes[name] / ms / 1e6:7.0f} GB/s", flush=True)
    read = read_bytes / statistics.median(roof) / 1e6
    copy = copy_gbps()
    print(f"read-only roof (sum of K and V, 537 MB) {read:.0f} GB/s; copy {copy:.0f} GB/s")
    for label, kernels in breakdown.items():
        print(f"1x32768 {label}: " + "; ".join(f"{k} {us:.1f} us" for k, us in kernels.items()))
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "bundle_version": fa.__version__, "rounds": ROUNDS, "read_roof_gbps": read, "copy_gbps": copy,
              "kernel_us_1x32768": breakdown, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
