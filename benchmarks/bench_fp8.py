"""FP8 K/V benchmark: decode over an e4m3 cache against the bundle's own bf16 decode and FlashInfer's FP8-KV decode
in the same run, replayed from CUDA graphs at an SM120's CTAs per SM (a script, not a test), plus the accuracy of
FP8 K/V on inputs with outlier entries.

Speed: keys per second (batch x cached keys over the call's time) and the K/V bytes read per second, as a fraction
of the device's copy bandwidth (``bench_serving.copy_gbps``), for the bundle's bf16 and FP8 K/V over dense and
page-16 caches, and FlashInfer's fa2 decode (bf16 and e4m3 K/V, the same page-16 caches) when it is staged
(``probes/stage_flashinfer.sh``). Timing as in ``bench_serving.py`` (``time_impl``: the median of CUDA-event
timings of graph replays; ours with the package's occupancy padding, FlashInfer under the cache preference its
eager run chose).

All-FP8 prefill (q, k, v e4m3: FP8 MMAs, P in e4m3) beside the bundle's bf16 and FP8-K/V prefill and SDPA's FA2,
eager at SM120 occupancy, in TFLOPS (``prefill``); the H100 / H200 emulate FP8 mma.sync, so these rows time the
emulation (the SM120 projection is docs/performance.md's).

Accuracy: FlashAttention-3's test distribution (entries N(0, 1), plus N(0, 100) on 0.1% of them), K/V quantized
per (batch, KV head) by amax, q bf16: the RMSE of the FP8-K/V output against the fp32 attention of the unquantized
inputs, beside the bf16 output's RMSE and FlashAttention-3's published figures for its all-FP8 kernel.

    python benchmarks/bench_fp8.py --out results.json
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import OCCUPANCY_METHOD, copy_gbps, flashinfer_paged, paged, time_impl  # noqa: E402

import torch  # noqa: E402

import flash_attn_4_sm120 as fa  # noqa: E402

E4M3 = torch.float8_e4m3fn
# (name, batch, seqlen_q, cached keys, heads_q, heads_kv, head_dim)
CASES = [
    ("decode 1x32768 32/8 d128", 1, 1, 32768, 32, 8, 128),
    ("decode 16x8192 32/8 d128", 16, 1, 8192, 32, 8, 128),
    ("decode 64x2048 32/8 d128", 64, 1, 2048, 32, 8, 128),
    ("decode 4x16384 64/8 d64", 4, 1, 16384, 64, 8, 64),
    ("decode 8x4096 16/4 d256", 8, 1, 4096, 16, 4, 256),
    ("decode 32x3000 28/4 d128", 32, 1, 3000, 28, 4, 128),
    ("spec-decode 16x(4,8192) 32/8 d128", 16, 4, 8192, 32, 8, 128),
]
#: all-FP8 prefill (name, batch, seqlen, heads_q, heads_kv, head_dim, causal)
PREFILL_CASES = [
    ("prefill 4x4096 32/8 d128 causal", 4, 4096, 32, 8, 128, True),
    ("prefill 4x4096 32/8 d128 full", 4, 4096, 32, 8, 128, False),
    ("prefill 2x8192 16/16 d64 causal", 2, 8192, 16, 16, 64, True),
]
#: FlashAttention-3's accuracy table (Shah et al., 2024, Table 3): RMSE against an fp32 reference on its outlier
#: distribution, for its all-FP8 kernel (block quantization + incoherent processing) and a per-tensor FP8 baseline
FA3_PUBLISHED_RMSE = {"fa3_fp8": 9.1e-3, "baseline_fp8_per_tensor": 2.4e-2, "fa3_fp16": 1.9e-4}


def quantize(x):
    """(FP8 x, fp32 (batch, heads_kv) descale) by amax per (batch, KV head)."""
    d = (x.float().abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-12)
    return (x.float() / d[:, None, :, None]).to(E4M3), d


def accuracy(seed=0):
    """RMSE of FP8-K/V and bf16 outputs against the fp32 attention of FlashAttention-3's outlier inputs."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, s, h, d = 4, 2048, 16, 128

    def sample():
        x = torch.randn(b, s, h, d, device="cuda", generator=g)
        outliers = torch.rand(b, s, h, d, device="cuda", generator=g) < 1e-3
        return x + outliers * torch.randn(b, s, h, d, device="cuda", generator=g) * 10.0

    q, k, v = sample(), sample(), sample()
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    k8, kd = quantize(k)
    v8, vd = quantize(v)
    q8, qd = quantize(q)  # (h = heads_kv here: MHA)
    fp8, _ = fa.flash_attn_func(q.bfloat16(), k8, v8, k_descale=kd, v_descale=vd)
    all_fp8, _ = fa.flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    bf16, _ = fa.flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16())

    def rmse(o):
        return ((o.float() - ref) ** 2).mean().sqrt().item()

    return {"shape": [b, s, h, d], "distribution": "N(0,1) + N(0,100) on 0.1% of entries, q/k/v alike",
            "scales": "amax per (batch, head), e4m3",
            "ours_fp8_kv_rmse": rmse(fp8), "ours_all_fp8_rmse": rmse(all_fp8), "ours_bf16_rmse": rmse(bf16),
            "fp8_kv_vs_bf16_max_abs": (fp8.float() - bf16.float()).abs().max().item(),
            "fa3_published_rmse": FA3_PUBLISHED_RMSE,
            "note": "FP8 K/V keeps q bf16 and P 16-bit (K/V widened exactly); all-FP8 runs both GEMMs as FP8 MMAs "
                    "with P in e4m3, as FlashAttention-3's figures do (its kernel adds block quantization and "
                    "incoherent processing)"}


def prefill(model):
    """All-FP8 prefill (FP8 MMAs) beside the bundle's bf16 and FP8-K/V prefill and SDPA's FA2, eager at SM120
    occupancy: TFLOPS (causal: half the square). The H100 / H200 have no FP8 mma.sync: ptxas lowers each m16n8k32
    to two f16 HMMAs and FADDs (``probes/mma_peak.py``), so the all-FP8 rows here time that lowering, not an
    SM120's QMMA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for name, b, s, hq, hkv, d, causal in PREFILL_CASES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for h in (hq, hkv, hkv))
        k8, kd = quantize(k)
        v8, vd = quantize(v)
        q8 = q.to(E4M3)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

        def sdpa_flash():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                                        enable_gqa=hq != hkv)

        calls = {
            "ours bf16": lambda: fa.flash_attn_func(q, k, v, causal=causal),
            "ours fp8 kv": lambda: fa.flash_attn_func(q, k8, v8, causal=causal, k_descale=kd, v_descale=vd),
            "ours all fp8": lambda: fa.flash_attn_func(q8, k8, v8, causal=causal, k_descale=kd, v_descale=vd),
            "sdpa_flash_fa2 bf16": sdpa_flash,
        }
        flops = 4 * b * hq * s * s * d / (2 if causal else 1)
        row = {"case": name, "batch": b, "seqlen": s, "heads_q": hq, "heads_kv": hkv, "head_dim": d,
               "causal": causal, "results": {}, "emulation": {}}
        for label, call in calls.items():
            impl = "ours" if label.startswith("ours") else label.split()[0]
            try:
                r = time_impl(impl, call, "eager", model, row["emulation"])
            except Exception as e:
                r = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            if "ms" in r:
                r["tflops"] = flops / r["ms"] / 1e9
            row["results"][label] = r
        res = row["results"]
        for label in ("ours fp8 kv", "ours all fp8"):
            if "ms" in res.get(label, {}) and "ms" in res.get("ours bf16", {}):
                row[f"{label.split(' ', 1)[1].replace(' ', '_')}_over_bf16"] = res["ours bf16"]["ms"] / res[label]["ms"]
        print(f"{name}: " + " ".join(f"{k}={r['tflops']:.0f}TF" if "ms" in r else f"{k}=-" for k, r in res.items()),
              flush=True)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", nargs="*", help="only the cases whose names contain one of these strings")
    args = ap.parse_args()
    model = fa.dispatch_model(torch.device("cuda"))
    copy = copy_gbps()
    print(f"device copy bandwidth {copy:.0f} GB/s", flush=True)
    fi = flashinfer_paged()
    rows = []
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "torch": torch.__version__, "bundle_version": fa.__version__, "copy_gbps": copy,
              "method": OCCUPANCY_METHOD + "; every call replayed from a CUDA graph", "rows": rows}
    for name, b, sq, sk, hq, hkv, d in CASES:
        if args.cases and not any(s in name for s in args.cases):
            continue
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        k8, kd = quantize(k)
        v8, vd = quantize(v)
        causal = sq > 1
        used = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        kc, vc, table = paged(k, v, 16)
        kc8, vc8 = kc.to(E4M3), vc.to(E4M3)  # standard-normal entries sit inside e4m3's range at scale 1
        q8 = q.to(E4M3)
        one = torch.ones((b, hkv), device="cuda")
        calls = {
            "ours bf16 dense": lambda: fa.flash_attn_func(q, k, v, causal=causal),
            "ours fp8 dense": lambda: fa.flash_attn_func(q, k8, v8, causal=causal, k_descale=kd, v_descale=vd),
            # an e4m3 q too: decode rows that fit the decode tile run it with q widened (fp8.decode_widened), longer
            # ones both GEMMs as FP8 MMAs (emulated on the H100 / H200)
            "ours all-fp8 dense": lambda: fa.flash_attn_func(q8, k8, v8, causal=causal, k_descale=kd, v_descale=vd),
            "ours bf16 paged16": lambda: fa.flash_attn_varlen_func(q, kc, vc, seqused_k=used, page_table=table,
                                                                   causal=causal),
            "ours fp8 paged16": lambda: fa.flash_attn_varlen_func(q, kc8, vc8, seqused_k=used, page_table=table,
                                                                  causal=causal, k_descale=one, v_descale=one),
        }
        if fi is not None:
            for label, caches in (("flashinfer bf16 paged16", (kc, vc)), ("flashinfer fp8 paged16", (kc8, vc8))):
                try:
                    calls[label] = fi(q, *caches, table, sk, 16, causal)
                except Exception as e:
                    print(f"{label} plan failed for {name}: {type(e).__name__}: {str(e)[:200]}")
        row = {"case": name, "batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads_q": hq, "heads_kv": hkv,
               "head_dim": d, "causal": causal, "results": {}, "emulation": {}}
        for label, call in calls.items():
            impl = "ours" if label.startswith("ours") else label.split()[0]
            try:
                r = time_impl(impl, call, "graph", model, row["emulation"]) if impl == "ours" else \
                    _peer_graph(impl, call, model, row["emulation"])
            except Exception as e:
                r = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            if "ms" in r:
                kv_bytes = b * sk * hkv * 2 * d * (1 if "fp8" in label else 2)
                r.update(keys_per_s=b * sk / r["ms"] * 1e3, kv_gbps=kv_bytes / r["ms"] / 1e6)
                r["copy_fraction"] = r["kv_gbps"] / copy
            row["results"][label] = r
        res = row["results"]
        for layout in ("dense", "paged16"):
            a, c = res.get(f"ours fp8 {layout}", {}), res.get(f"ours bf16 {layout}", {})
            if "ms" in a and "ms" in c:
                row[f"fp8_over_bf16_{layout}"] = c["ms"] / a["ms"]
        a, c = res.get("ours fp8 paged16", {}), res.get("flashinfer fp8 paged16", {})
        if "ms" in a and "ms" in c:
            row["fp8_over_flashinfer_fp8_paged16"] = c["ms"] / a["ms"]
        print(f"{name}: " + " ".join(f"{k}={r['ms'] * 1e3:.1f}us({r['copy_fraction']:.2f})" if "ms" in r else
                                     f"{k}=-" for k, r in res.items())
              + "".join(f" {k}={v:.2f}" for k, v in row.items() if k.startswith("fp8_over")), flush=True)
        rows.append(row)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
    if not args.cases or any("prefill" in c for c in args.cases):
        result["prefill"] = prefill(model)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
    result["accuracy"] = accuracy()
    print(json.dumps(result["accuracy"], indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


def _peer_graph(impl, call, model, emulation):
    """A peer's graph replay at SM120 occupancy: its eager run first picks the cache preference
    (``time_impl``'s rule)."""
    time_impl(impl, call, "eager", model, emulation)
    return time_impl(impl, call, "graph", model, emulation)


if __name__ == "__main__":
    main()
