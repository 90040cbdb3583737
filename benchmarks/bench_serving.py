"""Serving benchmark: decode, speculative decode and chunked prefill, dense and paged K/V, against the
peers, eager and replayed from a CUDA graph (a script, not a test).

Peers: PyTorch SDPA flash (FA2) and cuDNN, upstream flash-attn-4 forced onto its SM120 path
(``bench_fwd.upstream_fa4``), all on dense K/V (none of them reads a page table); FlashInfer on the same
page-16 caches when it is installed (``flashinfer_paged``). SDPA runs seqlen_q <
seqlen_k without its (top-left) causal mask. Occupancy and timing as
in ``bench_fwd.py``: every kernel at an SM120's CTAs per SM (ours padded by the package, the peers through
the cache preference), median of CUDA-event timings of back-to-back calls.

Figures: effective K/V bandwidth (the bytes of the K and V rows the call reads once, over its time) and
its fraction of the device's copy bandwidth (a device-to-device copy of 2 GiB, read + write bytes, in the
same run); prefill cases also in TFLOPS. ``eager``: the Python call per step; ``graph``: one call captured
in a CUDA graph and replayed (the host cost gone). Paged cases use page tables whose pages are shuffled
over a pool, so no two consecutive pages are adjacent in memory.

    python benchmarks/bench_serving.py --out results.json [--cases SUBSTR ...]
"""

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fwd import OCCUPANCY_METHOD, sdpa, timed, upstream_fa4  # noqa: E402  (sets upstream's env first)

import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

import flash_attn_4_sm120 as fa  # noqa: E402
from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV  # noqa: E402
from occupancy import cache_preference  # noqa: E402
from timing import median_ms  # noqa: E402

# (name, batch, seqlen_q, cached keys, heads_q, heads_kv, head_dim, page sizes of the paged variants)
CASES = [
    ("decode 1x8192 64/8 d64", 1, 1, 8192, 64, 8, 64, (16, 1)),
    ("decode 1x32768 32/8 d128", 1, 1, 32768, 32, 8, 128, (16, 1, 64)),
    ("decode 16x8192 32/8 d128", 16, 1, 8192, 32, 8, 128, (16, 1, 64)),
    ("decode 64x2048 32/8 d128", 64, 1, 2048, 32, 8, 128, (16,)),
    ("decode 8x4096 16/4 d256", 8, 1, 4096, 16, 4, 256, (16,)),
    ("spec-decode 16x(4,8192) 32/8 d128", 16, 4, 8192, 32, 8, 128, (16,)),
    ("chunked prefill 4x(512,4096+512) 32/8 d128", 4, 512, 4096 + 512, 32, 8, 128, (16,)),
]


def paged(k, v, page_size, seed=0):
    """(k_cache, v_cache, page_table): the rows of dense k / v (batch, seqlen, heads, d) cut into pages
    placed at shuffled positions of a pool."""
    b, s, h, d = k.shape
    per_seq = -(-s // page_size)
    g = torch.Generator(device="cpu").manual_seed(seed)
    perm = torch.randperm(b * per_seq, generator=g).cuda()
    pad = per_seq * page_size - s

    def pool(x):
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).reshape(b * per_seq, page_size, h, x.shape[-1])
        out = torch.empty_like(x)
        out[perm] = x
        return out

    return pool(k), pool(v), perm.view(b, per_seq).to(torch.int32)


def flashinfer_and_workspace():
    """(the flashinfer module, a 256 MiB workspace) for a FlashInfer wrapper; None when FlashInfer is not installed
    (``probes/stage_flashinfer.sh`` stages it)."""
    try:
        import flashinfer
    except Exception as e:  # not installed here: reported, not fatal
        print(f"flashinfer unavailable: {e}")
        return None
    return flashinfer, torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")


def flashinfer_paged():
    """FlashInfer (flashinfer-python, the paged attention vLLM runs on consumer Blackwell) over the same paged
    caches (its NHD layout is this bundle's (num_pages, page_size, heads_kv, d)): ``make(q, k_cache, v_cache,
    table, seqlen_k, page_size, causal)`` plans a decode wrapper (seqlen_q 1) or a prefill wrapper (causal
    bottom-right) on FlashInfer's fa2 backend, the one it runs on SM120 (its fa3 backend is SM90 wgmma), and
    returns the call; None when FlashInfer is not installed (``probes/stage_flashinfer.sh`` stages it)."""
    staged = flashinfer_and_workspace()
    if staged is None:
        return None
    flashinfer, workspace = staged

    def make(q, kc, vc, table, seqlen_k, page_size, causal):
        b, sq, hq, d = q.shape
        hkv, per_seq = kc.shape[2], table.shape[1]
        indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * per_seq
        indices = table.flatten().contiguous()
        last = torch.full((b,), seqlen_k - (per_seq - 1) * page_size, dtype=torch.int32, device="cuda")
        types = dict(q_data_type=q.dtype, kv_data_type=kc.dtype)
        if sq == 1:
            # vLLM's rule: tensor cores (the fa2 prefill kernel) for query groups above 4, else the CUDA-core decode
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=hq // hkv > 4,
                                                              backend="fa2")
            w.plan(indptr, indices, last, hq, hkv, d, page_size, **types)
            q1 = q[:, 0]
            return lambda: w.run(q1, (kc, vc))
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        qo_indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * sq
        w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, page_size, causal=causal, **types)
        packed = q.reshape(b * sq, hq, d)
        return lambda: w.run(packed, (kc, vc))

    return make


def copy_gbps() -> float:
    """Device-to-device copy bandwidth, read + write bytes per second, of 2 GiB."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / median_ms(lambda: dst.copy_(src), iters=5) / 1e6


def graphed(call):
    """``call`` captured once in a CUDA graph; returns the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def time_impl(impl, call, mode, model, emulation):
    """Median ms at SM120 occupancy, the call eager or replayed from a graph captured under it (a peer's
    graph under the cache preference its eager run chose: the profiler does not see inside a graph)."""
    if mode == "eager":
        return timed(impl, call, "sm120", model, emulation)
    if impl == "ours":  # the package reads the occupancy mode when it plans (at capture)
        with mock.patch.dict(os.environ, {OCCUPANCY_ENV: "model"}):
            return {"ms": median_ms(graphed(call))}
    pref = emulation.get(impl, {}).get("pref")
    if pref is None:
        return {"skipped": "no SM120 occupancy for this peer (see its eager row)"}
    with cache_preference(pref):
        return {"ms": median_ms(graphed(call))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", nargs="*", help="only the cases whose names contain one of these strings")
    args = ap.parse_args()
    model = fa.dispatch_model(torch.device("cuda"))
    copy = copy_gbps()
    print(f"device copy bandwidth {copy:.0f} GB/s", flush=True)
    peers = {"sdpa_flash_fa2": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    up = upstream_fa4()
    if up is not None:
        peers["fa4_sm120_path"] = up
    fi = flashinfer_paged()
    rows = []
    for name, b, sq, sk, hq, hkv, d, page_sizes in CASES:
        if args.cases and not any(s in name for s in args.cases):
            continue
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        causal = sq > 1
        kv_bytes = b * sk * hkv * 2 * d * 2
        flops = 4 * b * hq * sq * sk * d  # (q rows see nearly every cached key: no causal halving)
        calls = {"ours dense": lambda: fa.flash_attn_func(q, k, v, causal=causal)}
        for p in page_sizes:
            kc, vc, table = paged(k, v, p)
            used = torch.full((b,), sk, dtype=torch.int32, device="cuda")
            calls[f"ours paged{p}"] = (lambda kc=kc, vc=vc, table=table, used=used: fa.flash_attn_varlen_func(
                q, kc, vc, seqused_k=used, page_table=table, causal=causal))
            if p == 16 and fi is not None:  # the serving peer on the same paged caches
                try:
                    calls["flashinfer paged16"] = fi(q, kc, vc, table, sk, p, causal)
                except Exception as e:
                    print(f"flashinfer plan failed for {name}: {type(e).__name__}: {str(e)[:200]}")
            if p == 16 and sq <= 8:  # the KV-cache API: the step's sq keys appended, then attended with the rest
                kn, vn = k[:, sk - sq:].clone(), v[:, sk - sq:].clone()
                calls["ours kvcache16 append"] = (lambda kc=kc, vc=vc, table=table, kn=kn, vn=vn, lens=used - sq:
                                                  fa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens,
                                                                             block_table=table, causal=causal))
        for peer, fn in peers.items():
            # SDPA's is_causal aligns the diagonal top-left: with seqlen_q < seqlen_k its rows would see
            # only the first keys. Its rows see every key instead (94-100% of the causal work here).
            peer_causal = causal and (peer == "fa4_sm120_path" or sq == sk)
            calls[peer] = (lambda fn=fn, c=peer_causal: fn(q, k, v, c, None))
        row = {"case": name, "batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads_q": hq, "heads_kv": hkv,
               "head_dim": d, "causal": causal, "kv_bytes": kv_bytes, "results": {}, "emulation": {}}
        for label, call in calls.items():
            impl = "ours" if label.startswith("ours") else label.split()[0]
            for mode in ("eager", "graph"):
                try:
                    r = time_impl(impl, call, mode, model, row["emulation"])
                except Exception as e:
                    r = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                if "ms" in r:
                    r.update(kv_gbps=kv_bytes / r["ms"] / 1e6, tflops=flops / r["ms"] / 1e9)
                    r["copy_fraction"] = r["kv_gbps"] / copy
                row["results"][f"{label} {mode}"] = r
        cells = [f"{k}={r['kv_gbps']:.0f}" if "ms" in r else f"{k}=-" for k, r in row["results"].items()]
        print(f"{name}: " + " ".join(cells), flush=True)
        rows.append(row)
        result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                  "torch": torch.__version__, "bundle_version": fa.__version__, "dtype": "bf16",
                  "copy_gbps": copy, "method": OCCUPANCY_METHOD, "rows": rows}
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
