"""Backward tile tuner: time every conforming candidate config of the backward main kernel per head-dim
class at the SM120 model's occupancy, with FA2 (SDPA flash) in the same run, and print the best.

    python benchmarks/tune_bwd.py --conformance results/conformance_bwd_candidates_sm120a_<date>.json[.gz] \
        --out tune_bwd.json [--classes 128 64] [--jobs 12] [--limit N] [--role-split any|only|none]
        [--min-ctas-per-sm 2]

Candidates come from ``bwd_config.candidate_bwd_configs`` (every warp split of each class's candidate
tiles), kept only where the sm_120a conformance JSON (``tools/conformance.py --subset candidates``) says
they conform (no spills). Each is run through the public API with ``bwd_config.BWD_TABLE`` patched for
its class, so the preprocess and postprocess run too; the kernels compile first in ``--jobs`` spawned
processes into the disk cache. The table stays what ``bwd_config.py`` says: this script only reports.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gzip
import json
import multiprocessing
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))

#: (class, batch, seqlen, heads_q, heads_kv, causal): one timing shape per class, a few ms per backward
SHAPES = {64: (2, 4096, 16, 4, True), 96: (2, 4096, 16, 4, True), 128: (2, 4096, 16, 4, False),
          160: (2, 4096, 8, 8, True), 192: (2, 4096, 8, 8, True), 256: (2, 4096, 8, 8, True)}


def _use(cfg, cls):
    from flash_attn_4_sm120 import backward, bwd_config

    bwd_config.BWD_TABLE[cls] = cfg
    backward.clear_caches()


def warm_grad(out_fn, leaves, dout) -> str:
    """Run ``out_fn()`` and its backward once (compiling the kernels of the patched table): "ok", or the error
    named in a line (a config that cannot run is reported, not raised, by the tuner and the probes)."""
    import torch

    try:
        torch.autograd.grad(out_fn(), leaves, dout)
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:200]}"


def _inputs(cls, causal_override=None):
    import torch

    b, s, hq, hkv, causal = SHAPES[cls]
    if causal_override is not None:
        causal = causal_override
    torch.manual_seed(0)
    q = torch.randn(b, s, hq, cls, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(b, s, hkv, cls, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(b, s, hkv, cls, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dout = torch.randn(b, s, hq, cls, dtype=torch.bfloat16, device="cuda")
    flops = 2.5 * 4 * b * hq * s * s * cls * (0.5 if causal else 1.0)
    return q, k, v, dout, causal, flops


def _warm(item) -> str:
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.bwd_config import BwdConfig

    cls, cfg_dict = item
    cfg = BwdConfig(**cfg_dict)
    _use(cfg, cls)
    q, k, v, dout, causal, _ = _inputs(cls)
    q, k, v, dout = (t[:, :256].detach().requires_grad_(t.requires_grad) for t in (q, k, v, dout))
    return warm_grad(lambda: fa.flash_attn_func(q, k, v, causal=causal)[0], (q, k, v), dout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conformance", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--classes", nargs="*", type=int, default=[64, 96, 128, 160, 192, 256])
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--limit", type=int, default=0, help="at most this many candidates per class (fewest registers)")
    ap.add_argument("--role-split", choices=("any", "only", "none"), default="any",
                    help="keep role-split candidates only, or none of them (the table entry is always timed)")
    ap.add_argument("--min-ctas-per-sm", type=int, default=1,
                    help="keep candidates the SM120 model runs at least this many CTAs per SM of (by shared memory)")
    args = ap.parse_args()

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.bwd_config import BWD_TABLE, bwd_smem_bytes, candidate_bwd_configs
    from flash_attn_4_sm120.config import STATIC_SMEM_BYTES
    from flash_attn_4_sm120.conformance import BwdCase
    from flash_attn_4_sm120.problem import BwdSpec
    from timing import median_ms

    raw = Path(args.conformance).read_bytes()
    conf = json.loads(gzip.decompress(raw) if args.conformance.endswith(".gz") else raw)
    verdict = {r["name"]: r for r in conf["configs"]}
    model = fa.dispatch_model(torch.device("cuda"))
    plan = []
    for cls in args.classes:
        spec = BwdSpec("bf16", cls, cls, causal=SHAPES[cls][4])
        found = []
        for cfg in candidate_bwd_configs(spec, model):
            r = verdict.get(BwdCase(BwdSpec("bf16", cls, cls, causal=True), cfg).name)
            keep = {"any": True, "only": cfg.role_split, "none": not cfg.role_split}[args.role_split]
            keep = keep and model.ctas_per_sm(bwd_smem_bytes(spec, cfg) + STATIC_SMEM_BYTES) >= args.min_ctas_per_sm
            if keep and r is not None and not r["violations"]:
                found.append((r["regs"] or 0, cfg))
        found.sort(key=lambda x: x[0])
        if args.limit:
            found = found[:args.limit]
        if BWD_TABLE[cls] not in [c for _, c in found]:
            found.insert(0, (0, BWD_TABLE[cls]))
        plan += [(cls, cfg) for _, cfg in found]
    print(f"{len(plan)} candidates; compiling in {args.jobs} processes", flush=True)
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        warm = list(pool.imap(_warm, [(cls, asdict(cfg)) for cls, cfg in plan]))
    rows = []
    table = dict(BWD_TABLE)
    for cls in args.classes:
        q, k, v, dout, causal, flops = _inputs(cls)

        def fa2():
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)
            return o.transpose(1, 2)
        out = fa2()
        fa2_ms = median_ms(functools.partial(torch.autograd.grad, out, (q, k, v), dout, retain_graph=True))
        print(f"d{cls} {SHAPES[cls]} FA2 bwd {flops / fa2_ms / 1e9:.0f} TFLOPS", flush=True)
        for (c, cfg), w in zip(plan, warm):
            if c != cls:
                continue
            row = {"class": cls, "config": asdict(cfg), "table": cfg == table[cls], "fa2_ms": fa2_ms}
            if w != "ok":
                row["error"] = w
            else:
                _use(cfg, cls)
                out = fa.flash_attn_func(q, k, v, causal=causal)[0]
                ms = median_ms(functools.partial(torch.autograd.grad, out, (q, k, v), dout, retain_graph=True))
                row.update(ms=ms, tflops=flops / ms / 1e9, vs_fa2=fa2_ms / ms)
            rows.append(row)
            print(f"  {'*' if row['table'] else ' '} {cfg}: " +
                  (f"{row['tflops']:.0f} TFLOPS {row['vs_fa2']:.2f}x FA2" if "ms" in row else row["error"]), flush=True)
        _use(table[cls], cls)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "date": datetime.date.today().isoformat(), "shapes": SHAPES,
                                              "occupancy": "sm120 (package default)", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
