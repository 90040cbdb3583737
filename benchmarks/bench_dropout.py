"""Dropout benchmark: ours with ``dropout_p=0.1`` against ours without dropout (the target:
forward + backward <= 1.25x) and against FA2 (PyTorch SDPA's flash backend) with and without the same dropout, forward
and forward + backward, in one run (a script, not a test).

Cases (bf16, GQA 32/8 heads, batch 4 x 4096 tokens, as ``bench_flex``): head dims 64, 128 and 256, causal and not.
Timing: ``timing.median_ms``; ``--occupancy`` as ``bench_fwd`` (sm120: ours padded by the package, FA2 through the
context's cache preference where that reaches an SM120's CTAs per SM). TFLOPS count the visible share of the square
(causal 1/2; x3.5 forward + backward): dropout does not change the work.

    python benchmarks/bench_dropout.py --out results.json [--occupancy both|sm120|h100] [--cases d128]
        [--shape 2x3000x16x4] [--head-dims 80 96]

``--shape`` / ``--head-dims`` time shapes off that grid (their case names carry the shape).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench_fwd import (fa, fwd_and_grad_parts, save_result, select_impls, time_parts, training_args,  # noqa: E402
                       training_inputs)  # (puts torch-ext on the path)

P = 0.1
#: (batch, seqlen, heads_q, heads_kv)
SHAPE = (4, 4096, 32, 8)
PEERS = ("sdpa_flash_fa2", "sdpa_flash_fa2_dropout")


def ours(p: float, causal: bool):
    def run(q, k, v):
        return fa.flash_attn_func(q, k, v, causal=causal, dropout_p=p, dropout_seed=1234 if p else None)[0]
    return run


def fa2(p: float, causal: bool):
    def run(q, k, v):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, dropout_p=p,
                                                  enable_gqa=True).transpose(1, 2)
    return run


def _shape_args(ap) -> None:
    ap.add_argument("--shape", default="x".join(map(str, SHAPE)), help="batch x seqlen x heads_q x heads_kv")
    ap.add_argument("--head-dims", nargs="*", type=int, default=[64, 128, 256])


def main():
    args = training_args(_shape_args)
    occupancies = args.occupancies
    model = fa.dispatch_model(torch.device("cuda"))
    shape = tuple(int(x) for x in args.shape.split("x"))
    b, s, hq, hkv = shape
    rows = []
    for d in args.head_dims:
        for causal in (False, True):
            name = f"d{d} {'causal' if causal else 'full'}" + ("" if shape == SHAPE else f" {args.shape}")
            if args.cases and not any(c in name for c in args.cases):
                continue
            parts = fwd_and_grad_parts(*training_inputs(b, s, s, hq, hkv, d, d))
            impls = {"ours": ours(0.0, causal), "ours_dropout": ours(P, causal),
                     "sdpa_flash_fa2": fa2(0.0, causal), "sdpa_flash_fa2_dropout": fa2(P, causal)}
            impls = select_impls(impls, args.impls)
            flops = 4 * b * hq * s * s * d * (0.5 if causal else 1.0)
            row = {"case": name, "shape": [b, s, hq, hkv, d], "causal": causal, "dropout_p": P}
            time_parts(row, impls, parts, occupancies, model, flops, PEERS)
            for occ in occupancies:
                res = row["results" if occ == "sm120" else "results_h100"]
                cells = [f"{i}=" + "/".join(f"{r[p]['ms']:.2f}" if "ms" in r.get(p, {}) else "-"
                                            for p in ("fwd", "fwd_bwd")) + "ms" for i, r in res.items()]
                base, drop = res.get("ours", {}), res.get("ours_dropout", {})
                ratio = {p: drop[p]["ms"] / base[p]["ms"] for p in ("fwd", "fwd_bwd")
                         if "ms" in drop.get(p, {}) and "ms" in base.get(p, {})}
                row.setdefault("dropout_cost", {})[occ] = ratio
                print(f"{name:12s} [{occ}] fwd/fwd+bwd " + " ".join(cells)
                      + " | dropout x" + "/".join(f"{r:.3f}" for r in ratio.values()), flush=True)
            rows.append(row)
            if args.out:
                save_result(args.out, occupancies, rows)


if __name__ == "__main__":
    main()
