"""Backward benchmark: ours against FA2 (SDPA flash), cuDNN and upstream flash-attn-4 on its SM120 path.

Times the backward alone (``torch.autograd.grad`` of a forward kept alive with ``retain_graph``) and the
forward + backward, with ``timing.median_ms`` and the occupancy rules of ``bench_fwd`` (``--occupancy``:
sm120 = every kernel at an SM120's CTAs per SM, h100 = the H100's own). TFLOPS use the house convention:
backward = 2.5x the forward's 4 * b * h * sq * sk * d (half with causal), forward + backward = 3.5x.

    python benchmarks/bench_bwd.py --out results.json [--cases d128] [--occupancy both|sm120|h100] [--impls ours ...]
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from bench_fwd import (OCCUPANCY_METHOD, fa, save_result, select_impls, time_parts, training_args,  # noqa: E402
                       training_inputs, upstream_fa4)  # (sets FLASH_ATTENTION_ARCH first)
from torch.nn.attention import SDPBackend, sdpa_kernel

#: (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, d, dv, causal)
CASES = [
    ("d64_4x4096_32/8", 4, 4096, 4096, 32, 8, 64, 64, False),
    ("d64_4x4096_32/8_causal", 4, 4096, 4096, 32, 8, 64, 64, True),
    ("d96_4x4096_32/8", 4, 4096, 4096, 32, 8, 96, 96, False),
    ("d96_4x4096_32/8_causal", 4, 4096, 4096, 32, 8, 96, 96, True),
    ("d128_4x4096_32/8", 4, 4096, 4096, 32, 8, 128, 128, False),
    ("d128_4x4096_32/8_causal", 4, 4096, 4096, 32, 8, 128, 128, True),
    ("d128_8x2048_16/16_causal", 8, 2048, 2048, 16, 16, 128, 128, True),
    ("d192x128_2x4096_16/16_causal", 2, 4096, 4096, 16, 16, 192, 128, True),
    ("d256_2x4096_16/16_causal", 2, 4096, 4096, 16, 16, 256, 256, True),
    # training-sized GQA with few KV heads (the backward's group split: bwd_schedule.bwd_group_split)
    ("d128_4x2048_8/2_causal", 4, 2048, 2048, 8, 2, 128, 128, True),
    ("d128_2x4096_16/4_causal", 2, 4096, 4096, 16, 4, 128, 128, True),
]


def ours(q, k, v, causal):
    return fa.flash_attn_func(q, k, v, causal=causal)[0]


def ours_deterministic(q, k, v, causal):
    return fa.flash_attn_func(q, k, v, causal=causal, deterministic=True)[0]


def sdpa(backend):
    def run(q, k, v, causal):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=kt.shape[1] != qt.shape[1])
        return out.transpose(1, 2)
    return run


def upstream():
    up = upstream_fa4()
    if up is None:
        return None

    def run(q, k, v, causal):
        out = up(q, k, v, causal, None)
        return out[0] if isinstance(out, tuple) else out
    return run


def peers_and_ours(names=None) -> dict:
    """The implementations a backward benchmark times (``--impls`` names, all when None): ours (and its deterministic
    mode), FA2 and cuDNN through SDPA, and upstream's SM120 path when installed."""
    impls = {"ours": ours, "ours_deterministic": ours_deterministic, "sdpa_flash_fa2": sdpa(SDPBackend.FLASH_ATTENTION),
             "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    up = upstream()
    if up is not None:
        impls["fa4_sm120_path"] = up
    return select_impls(impls, names)


def run_cases(cases, impls: dict, occupancies, out=None, fwd_bwd: bool = True, rows=(), **extra) -> list:
    """Rows of ``cases`` ((name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, d, dv, causal) tuples): each
    implementation's backward (and, with ``fwd_bwd``, forward + backward) at each occupancy, printed as they come and
    saved to ``out`` after every row, after ``rows`` (an earlier run's), with ``extra`` in the header."""
    model = fa.dispatch_model(torch.device("cuda"))
    rows = list(rows)
    for name, b, sq, sk, hq, hkv, d, dv, causal in cases:
        q, k, v, dout = training_inputs(b, sq, sk, hq, hkv, d, dv)
        fwd_flops = 2 * b * hq * sq * sk * (d + dv) * (0.5 if causal else 1.0)
        row = {"case": name, "batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads_q": hq, "heads_kv": hkv,
               "head_dim": d, "head_dim_v": dv, "causal": causal}
        parts = {"bwd": (lambda fn: functools.partial(torch.autograd.grad, fn(q, k, v, causal), (q, k, v), dout,
                                                      retain_graph=True), 2.5)}
        if fwd_bwd:
            parts["fwd_bwd"] = (lambda fn: lambda: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout), 3.5)
        time_parts(row, impls, parts, occupancies, model, fwd_flops)
        for occ in occupancies:
            key = "results" if occ == "sm120" else "results_h100"
            cells = [f"{i}=" + "/".join(f"{r[p]['tflops']:.0f}" if "tflops" in r.get(p, {}) else "-" for p in parts)
                     for i, r in row[key].items()]
            print(f"{name:30s} [{occ}] {'/'.join(parts)} TFLOPS " + " ".join(cells), flush=True)
        rows.append(row)
        if out:
            save_result(out, occupancies, rows, method=OCCUPANCY_METHOD, **extra)
    return rows


def main():
    args = training_args()
    cases = [c for c in CASES if not args.cases or any(s in c[0] for s in args.cases)]
    run_cases(cases, peers_and_ours(args.impls), args.occupancies, args.out)


if __name__ == "__main__":
    main()
