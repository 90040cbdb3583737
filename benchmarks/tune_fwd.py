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

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
from flash_attn_4_sm120.compiler import compile_fwd  # noqa: E402
from flash_attn_4_sm120.config import TABLE_PATH, FwdConfig, candidate_fwd_configs, fwd_smem_bytes, STATIC_SMEM_BYTES  # noqa: E402
from flash_attn_4_sm120.interface import dispatch_model  # noqa: E402
from flash_attn_4_sm120.problem import FwdSpec  # noqa: E402
from timing import median_ms  # noqa: E402

# (batch, seqlen, heads_q, heads_kv) per head dim: long and short sequences
SHAPES = {64: [(4, 4096, 16, 16), (16, 1024, 16, 16)], 128: [(4, 4096, 32, 8), (16, 1024, 32, 8)],
          96: [(4, 4096, 16, 16)], 192: [(2, 4096, 16, 16)], 256: [(2, 4096, 8, 8)]}


#: Shared memory per SM: SM120 parts (RTX 5090 / RTX PRO 6000 / GB10) and the H100 the device has;
#: each CTA also takes a 1 KB system reservation.
SM120_SMEM_PER_SM, H100_SMEM_PER_SM, RESERVED_PER_CTA = 100 * 1024, 228 * 1024, 1024
H100_MAX_DYNAMIC_SMEM = 227 * 1024 - STATIC_SMEM_BYTES


def sm120_launch_smem(smem: int) -> int:
    """Dynamic smem to launch a kernel of ``smem`` bytes with on the H100 so that as many of its CTAs
    share an SM as on an SM120 part (registers permitting). The H100 runs two 96 KB CTAs per SM, the
    SM120 one, and two independent CTAs hide each other's softmax: without this the tuner rewards
    occupancy the real part does not have."""
    fixed = STATIC_SMEM_BYTES + RESERVED_PER_CTA  # the static section and the system reservation
    per_sm = max(1, SM120_SMEM_PER_SM // (smem + fixed))
    return max(smem, min(H100_SMEM_PER_SM // per_sm - fixed, H100_MAX_DYNAMIC_SMEM))


def parse_config(text: str) -> FwdConfig:
    """``TM,TN,WARPS,STAGES,QREG[,MAINLOOP[,PREFETCH[,OVERLAP[,PINGPONG[,PERSISTENT[,MBARRIER_RELEASE]]]]]]`` -> FwdConfig."""
    knobs = text.split(",")
    return FwdConfig(*map(int, knobs[:4]), q_in_regs=knobs[4:5] == ["1"], mainloop=(knobs[5:] or ["cp_async"])[0],
                     frag_prefetch=knobs[6:7] != ["0"], overlap=knobs[7:8] == ["1"], pingpong=knobs[8:9] == ["1"],
                     persistent=knobs[9:10] == ["1"], mbarrier_release=knobs[10:11] == ["1"])


def dense_launch(fn, b: int, s: int, hq: int, hkv: int, d: int, num_sms: int):
    """Random bf16 inputs of shape (b, s, heads, d) and a no-argument launch of the compiled forward
    ``fn`` on them (softmax scale d^-1/2, no window, softcap, sink or varlen): (run, (q, k, v, out))."""
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda")
    o = torch.empty_like(q)
    lse = torch.empty(b, hq, s, dtype=torch.float32, device="cuda")
    scale_log2 = d ** -0.5 / math.log(2.0)
    return (lambda: fn(q, k, v, o, lse, scale_log2, 1.0, 0, 0, None, None, None, None, None, s, 1, num_sms)), (q, k, v, o)


def select(tune_path: str, conformance_path: str) -> dict:
    """Best conforming candidate per (head_dim, causal) -> fwd_table.json."""
    from flash_attn_4_sm120.compiler import Case

    tune = json.loads(Path(tune_path).read_text())
    conf = json.loads(Path(conformance_path).read_text())
    passed = {r["name"] for r in conf["configs"] if not r["violations"]}
    table = {}
    for rec in tune["records"]:
        if not rec.get("correct"):
            continue
        cfg = FwdConfig(**rec["config"])
        names = [Case(FwdSpec(dt, rec["head_dim"], rec["head_dim"], rec["causal"]), cfg).name for dt in ("bf16", "fp16")]
        if not all(n in passed for n in names):
            continue
        key = f"d{rec['head_dim']}_{'causal' if rec['causal'] else 'full'}"
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
    ap.add_argument("--config", action="append", default=[], metavar="TM,TN,WARPS,STAGES,QREG[,MAINLOOP[,PREFETCH[,OVERLAP[,PINGPONG[,PERSISTENT[,MBARRIER_RELEASE]]]]]]",
                    help="time these configs instead of the candidates (exploration; the predicate is not applied)")
    ap.add_argument("--causal", choices=("both", "full", "causal"), default="both")
    ap.add_argument("--sm120-smem", action="store_true",
                    help="launch each config with the shared memory that gives it an SM120's CTAs per SM "
                         "(sm120_launch_smem): what the table would pick on the real part")
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
    for d, causal in itertools.product(args.head_dims, masks):
        spec = FwdSpec("bf16", d, d, causal)
        best = None
        for cfg in explicit or candidate_fwd_configs(spec, model):
            try:
                smem = sm120_launch_smem(fwd_smem_bytes(spec, cfg)) if args.sm120_smem else 0
                fn = compile_fwd(spec, cfg, model, target, launch_smem=smem)
            except Exception as e:  # record and move on: a config that does not build never wins
                records.append({"head_dim": d, "causal": causal, "config": cfg.__dict__, "error": str(e)[:300]})
                continue
            tflops, ok = [], True
            for b, s, hq, hkv in SHAPES[d]:
                run, (q, k, v, o) = dense_launch(fn, b, s, hq, hkv, d, num_sms)
                run()
                ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=causal, enable_gqa=hq != hkv).transpose(1, 2)
                err = (o.float() - ref.float()).abs().max().item()
                if not err < 0.05:
                    ok = False
                ms = median_ms(run)
                tflops.append(4 * b * hq * s * s * d * (0.5 if causal else 1.0) / ms / 1e9)
            geo = math.exp(sum(map(math.log, tflops)) / len(tflops))
            records.append({"head_dim": d, "causal": causal, "config": cfg.__dict__, "tflops": tflops,
                            "geomean": geo, "correct": ok})
            print(f"d={d} causal={causal} {cfg} -> {[round(t) for t in tflops]} geo={geo:.0f} ok={ok}", flush=True)
            if ok and (best is None or geo > best[0]):
                best = (geo, cfg)
        if best:
            table[f"d{d}_{'causal' if causal else 'full'}"] = {**best[1].__dict__, "geomean_tflops": round(best[0], 1)}
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "model": model.name, "target": target, "sm120_smem": args.sm120_smem, "table": table, "records": records}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
