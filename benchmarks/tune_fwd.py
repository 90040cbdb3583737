"""Tune the forward tile table on the device: time every valid candidate config per (head_dim, causal).

Two steps:
1. On the device: every candidate (``config.candidate_fwd_configs``) is compiled, checked against SDPA
   (a wrong config never wins) and timed (median of CUDA events) on representative shapes:
       python benchmarks/tune_fwd.py --out tune.json [--head-dims 64 128]
2. Anywhere: pick, per (head_dim, causal), the best geometric mean among the candidates that the
   SM120 conformance gate passed for BOTH dtypes (no spills, smem, HMMA only) and write the table the
   dispatcher reads:
       python tools/conformance.py --subset candidates --json conf.json
       python benchmarks/tune_fwd.py --select tune.json --conformance conf.json
"""

import argparse
import datetime
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
from flash_attn_4_sm120.compiler import aux_args, sparse_args, get_fwd_kernel  # noqa: E402
from flash_attn_4_sm120.config import TABLE_PATH, FwdConfig, candidate_fwd_configs, occupancy_launch_smem, tile_band  # noqa: E402
from flash_attn_4_sm120.launch import device_smem, dispatch_model  # noqa: E402
from flash_attn_4_sm120.problem import FwdSpec  # noqa: E402
from timing import median_ms  # noqa: E402

# (batch, seqlen, heads_q, heads_kv) per head dim: long and short sequences
SHAPES = {64: [(4, 4096, 16, 16), (16, 1024, 16, 16)], 128: [(4, 4096, 32, 8), (16, 1024, 32, 8)],
          96: [(4, 4096, 16, 16)], 192: [(2, 4096, 16, 16)], 256: [(2, 4096, 8, 8)]}
#: head dims between the classes' own: MHA at 2048, GQA 32:8 at 4096 and a short odd batch (the shapes of
#: bench_fwd.matrix_cases), so a class boundary is placed by what the dims inside it measure
BETWEEN = [(4, 2048, 32, 32), (2, 4096, 32, 8), (12, 777, 24, 8)]


def shapes_for(d: int) -> list:
    return SHAPES.get(d, BETWEEN)


def launch_smem(spec: FwdSpec, cfg: FwdConfig, device_occupancy: bool) -> int:
    """Dynamic smem the API launches ``cfg`` with here (``config.occupancy_launch_smem``: padded to the
    model's CTAs per SM on the H100, whose two co-resident CTAs would hide each other's softmax where an
    SM120 runs one); 0 with ``device_occupancy`` (the part's own occupancy: measurement only)."""
    if device_occupancy:
        return 0
    model = dispatch_model(torch.device("cuda"))
    return occupancy_launch_smem(spec, cfg, model, device_smem(torch.cuda.current_device(), "model"))


def _warm(job) -> str:
    """Compile one (spec, config, model, target, launch_smem) into the disk compile cache (a worker)."""
    try:
        get_fwd_kernel(*job)
        return ""
    except Exception as e:  # the main process records it when it compiles the same config
        return f"{job[1]}: {str(e)[:200]}"


def warm_disk_cache(jobs: list, workers: int) -> None:
    """Compile every job in ``workers`` processes first: the timing loop then loads from disk (the device has 16
    cores; one compile takes 10-20 s)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for err in pool.imap_unordered(_warm, jobs):
            if err:
                print("warm-up:", err, flush=True)


def parse_config(text: str) -> FwdConfig:
    """``TM,TN,WARPS,STAGES,QREG[,MAINLOOP[,PREFETCH[,OVERLAP[,PINGPONG[,PERSISTENT[,MBARRIER_RELEASE[,MASK_SELECT]]]]]]]`` -> FwdConfig."""
    knobs = text.split(",")
    return FwdConfig(*map(int, knobs[:4]), q_in_regs=knobs[4:5] == ["1"], mainloop=(knobs[5:] or ["cp_async"])[0],
                     frag_prefetch=knobs[6:7] != ["0"], overlap=knobs[7:8] == ["1"], pingpong=knobs[8:9] == ["1"],
                     persistent=knobs[9:10] == ["1"], mbarrier_release=knobs[10:11] == ["1"],
                     mask_select=knobs[11:12] != ["0"])


def dense_launch(fn, b: int, s: int, hq: int, hkv: int, d: int, num_sms: int, dv: Optional[int] = None):
    """Random bf16 inputs of shape (b, s, heads, d) (V and O: ``dv``, default d) and a no-argument launch of
    the compiled forward ``fn`` on them (softmax scale d^-1/2, no window, softcap, sink or varlen):
    (run, (q, k, v, out))."""
    dv = dv or d
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, s, hkv, dv, dtype=torch.bfloat16, device="cuda")
    o = torch.empty(b, s, hq, dv, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(b, hq, s, dtype=torch.float32, device="cuda")
    scale_log2 = d ** -0.5 / math.log(2.0)
    band = tile_band(torch.cuda.get_device_properties(0).L2_cache_size, s, d, dv, hq // hkv)  # as the API (causal)
    return (lambda: fn(q, k, v, o, lse, scale_log2, 1.0, 0, 0, None, None, None, None, None, None, s, 1, num_sms, band,
                       *aux_args(), *sparse_args(), None, None, None)), (q, k, v, o)  # rng, K / V descales


def tuned_key(d: int, dv: int, causal: bool) -> str:
    """The table key a tuned (head_dim, head_dim_v, causal) result fills: the class-style key when the head dims
    agree, the exact-head-dims key (``config.exact_key``) when they differ."""
    mask = "causal" if causal else "full"
    return f"d{d}_{mask}" if dv == d else f"d{d}x{dv}_{mask}"


def select(tune_path: str, conformance_path: str) -> dict:
    """Best conforming candidate per (head_dim, causal) -> fwd_table.json."""
    from flash_attn_4_sm120.conformance import Case

    tune = json.loads(Path(tune_path).read_text())
    conf = json.loads(Path(conformance_path).read_text())
    passed = {r["name"] for r in conf["configs"] if not r["violations"]}
    table = {}
    for rec in tune["records"]:
        if not rec.get("correct"):
            continue
        cfg = FwdConfig(**rec["config"])
        dv = rec.get("head_dim_v", rec["head_dim"])
        names = [Case(FwdSpec(dt, rec["head_dim"], dv, rec["causal"]), cfg).name for dt in ("bf16", "fp16")]
        if not all(n in passed for n in names):
            continue
        key = tuned_key(rec["head_dim"], dv, rec["causal"])
        if key not in table or rec["geomean"] > table[key][0]:
            table[key] = (rec["geomean"], cfg)
    out = {"device": tune["device"], "date": tune["date"], "model": tune["model"],
           "source": f"benchmarks/tune_fwd.py --select {Path(tune_path).name} (gate: {conf['target']})",
           "table": {k: {**v[1].__dict__, "geomean_tflops": round(v[0], 1)} for k, v in sorted(table.items())}}
    TABLE_PATH.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--select", metavar="TUNE_JSON")
    ap.add_argument("--conformance", metavar="GATE_JSON")
    ap.add_argument("--config", action="append", default=[], metavar="TM,TN,WARPS,STAGES,QREG[,MAINLOOP[,PREFETCH[,OVERLAP[,PINGPONG[,PERSISTENT[,MBARRIER_RELEASE[,MASK_SELECT]]]]]]]",
                    help="time these configs instead of the candidates (exploration; the predicate is not applied)")
    ap.add_argument("--head-dim-v", type=int, help="V's head dim when it differs from Q/K's (e.g. 192/128)")
    ap.add_argument("--causal", choices=("both", "full", "causal"), default="both")
    ap.add_argument("--device-occupancy", action="store_true",
                    help="launch each config as compiled (the H100's own CTAs per SM) instead of padded to the "
                         "SM120 model's, as the API launches it (measurement only)")
    ap.add_argument("--jobs", type=int, default=1, help="compile the configs in this many processes first")
    args = ap.parse_args()
    if args.select:
        print(json.dumps(select(args.select, args.conformance), indent=1))
        return
    model = dispatch_model(torch.device("cuda"))
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    target = model.compile_target
    records, table = [], {}
    masks = {"both": (False, True), "full": (False,), "causal": (True,)}[args.causal]
    explicit = [parse_config(text) for text in args.config]
    plan = [(FwdSpec("bf16", d, args.head_dim_v or d, causal), explicit or None) for d, causal in itertools.product(args.head_dims, masks)]
    plan = [(spec, cfgs or candidate_fwd_configs(spec, model)) for spec, cfgs in plan]
    jobs = [(spec, cfg, model, target, launch_smem(spec, cfg, args.device_occupancy)) for spec, cfgs in plan for cfg in cfgs]
    if args.jobs > 1:
        warm_disk_cache(jobs, args.jobs)
    jobs = iter(jobs)
    for spec, cfgs in plan:
        d, dv, causal = spec.head_dim, spec.head_dim_v, spec.causal
        best = None
        for cfg in cfgs:
            try:
                fn = get_fwd_kernel(*next(jobs))
            except Exception as e:  # record and move on: a config that does not build never wins
                records.append({"head_dim": d, "causal": causal, "config": cfg.__dict__, "error": str(e)[:300]})
                continue
            tflops, ok = [], True
            for b, s, hq, hkv in shapes_for(d):
                run, (q, k, v, o) = dense_launch(fn, b, s, hq, hkv, d, num_sms, dv)
                run()
                ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=causal, enable_gqa=hq != hkv).transpose(1, 2)
                err = (o.float() - ref.float()).abs().max().item()
                if not err < 0.05:
                    ok = False
                ms = median_ms(run)
                tflops.append(2 * b * hq * s * s * (d + dv) * (0.5 if causal else 1.0) / ms / 1e9)
            geo = math.exp(sum(map(math.log, tflops)) / len(tflops))
            records.append({"head_dim": d, "head_dim_v": dv, "causal": causal, "config": cfg.__dict__, "tflops": tflops,
                            "geomean": geo, "correct": ok})
            print(f"d={d}/{dv} causal={causal} {cfg} -> {[round(t) for t in tflops]} geo={geo:.0f} ok={ok}", flush=True)
            if ok and (best is None or geo > best[0]):
                best = (geo, cfg)
        if best:
            table[tuned_key(d, dv, causal)] = {**best[1].__dict__, "geomean_tflops": round(best[0], 1)}
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "model": model.name, "target": target, "occupancy": "device" if args.device_occupancy else "model", "table": table, "records": records}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
