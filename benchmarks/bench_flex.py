"""Score / mask mods benchmark (issue 20): ours with score_mod / mask_mod against the same attention without
mods (the flags' kernels) and against torch FlexAttention (compiled), forward and forward + backward, in one
run (a script, not a test).

Cases (bf16, GQA): causal as a mask_mod against ``causal=True`` (the issue's "within 10%": a mask_mod visits
every key block until block sparsity lands, ``causal=True`` skips the upper triangle); ALiBi as a score_mod
with the causal flag; documents of fixed length, causal inside (``flex_examples.chunked_local``) against the
same batch as varlen (``cu_seqlens``, the dense equivalent that skips everything across documents); a prefix-LM
mask. FlexAttention builds its block mask once per case (``create_block_mask``, outside the
timing) and skips empty blocks, which our mask_mod path does not yet.

Timing: ``timing.median_ms``; ``--occupancy`` as ``bench_fwd`` (sm120: ours padded by the package, FlexAttention's
Triton kernels through the context's cache preference where that reaches an SM120's CTAs per SM, else skipped).
TFLOPS use the unmasked causal count (``4 b h s^2 d / 2``; x2.5 backward, x3.5 forward + backward) for every
causal-like case, the full square for the others, so a case's columns compare directly.

    python benchmarks/bench_flex.py --out results.json [--occupancy both|sm120|h100] [--cases causal alibi]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from bench_fwd import fa, time_parts  # noqa: E402  (puts torch-ext on the path)
from flash_attn_4_sm120 import flex_examples as fx  # noqa: E402

#: the SM120-occupancy peers here (FlexAttention's Triton kernels, through the cache preference)
PEERS = ("flex_attention",)
#: (batch, seqlen, heads_q, heads_kv, head_dim)
SHAPE = (4, 4096, 32, 8, 128)
DOC_LEN = 512


def cases() -> list[tuple[str, dict, fx.Example, bool]]:
    """(name, our keyword arguments, the example FlexAttention mirrors, causal-like FLOP count)."""
    causal, alibi = fx.causal(), fx.alibi(SHAPE[2])
    docs = fx.chunked_local(DOC_LEN)  # documents of DOC_LEN tokens, causal inside: chunked-local attention
    return [
        ("causal flag", dict(causal=True), causal, True),
        ("causal mask_mod", dict(mask_mod=causal.mask_mod), causal, True),
        ("alibi score_mod + causal flag", dict(causal=True, score_mod=alibi.score_mod,
                                               score_mod_bwd=alibi.score_mod_bwd),
         fx.combined(alibi, causal), True),
        (f"documents of {DOC_LEN} (mask_mod)", dict(mask_mod=docs.mask_mod), docs, True),
        (f"documents of {DOC_LEN} (varlen)", dict(causal=True, varlen_docs=DOC_LEN), docs, True),
        ("prefix-LM 1024", dict(mask_mod=fx.prefix_lm(1024).mask_mod), fx.prefix_lm(1024), True),
    ]


def ours_call(kwargs: dict):
    kwargs = dict(kwargs)
    docs = kwargs.pop("varlen_docs", None)

    def run(q, k, v):
        if docs is None:
            return fa.flash_attn_func(q, k, v, **kwargs)[0]
        b, s = q.shape[:2]
        cu = torch.arange(0, b * s + 1, docs, dtype=torch.int32, device=q.device)
        flat = (t.reshape(b * s, *t.shape[2:]) for t in (q, k, v))
        return fa.flash_attn_varlen_func(*flat, cu, cu, docs, docs, **kwargs)[0].view(q.shape[:-1] + v.shape[-1:])
    return run


def flex_call(ex: fx.Example, s: int):
    """torch FlexAttention (compiled) with the example's torch twin as score_mod / mask_mod."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = None
    if ex.torch_mask is not None:
        block_mask = create_block_mask(lambda b, h, q, k: ex.torch_mask(b, h, q, k, s, s), None, None, s, s,
                                       device="cuda")
    def score_mod(score, b, h, q, k):
        return ex.torch_score(score, b, h, q, k, s, s)

    def run(q, k, v):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        out = compiled(qt, kt, vt, score_mod=score_mod if ex.torch_score is not None else None,
                       block_mask=block_mask, enable_gqa=kt.shape[1] != qt.shape[1])
        return out.transpose(1, 2)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--cases", nargs="*")
    ap.add_argument("--occupancy", choices=("both", "sm120", "h100"), default="both")
    args = ap.parse_args()
    occupancies = ("sm120", "h100") if args.occupancy == "both" else (args.occupancy,)
    model = fa.dispatch_model(torch.device("cuda"))
    b, s, hq, hkv, d = SHAPE
    torch.manual_seed(0)
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dout = torch.randn_like(q)

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(q, k, v)
        return run

    parts = {"fwd": (forward, 1.0),
             "fwd_bwd": (lambda fn: lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout), 3.5)}
    rows = []
    for name, kwargs, ex, causal_like in cases():
        if args.cases and not any(c in name for c in args.cases):
            continue
        flops = 4 * b * hq * s * s * d * (0.5 if causal_like else 1.0)
        impls = {"ours": ours_call(kwargs)}
        if "varlen_docs" not in kwargs:
            impls["flex_attention"] = flex_call(ex, s)
        row = {"case": name, "shape": list(SHAPE)}
        time_parts(row, impls, parts, occupancies, model, flops, PEERS)
        for occ in occupancies:
            key = "results" if occ == "sm120" else "results_h100"
            cells = [f"{i}=" + "/".join(f"{r[p]['ms']:.2f}" if "ms" in r.get(p, {}) else "-" for p in ("fwd", "fwd_bwd"))
                     + "ms" for i, r in row[key].items()]
            print(f"{name:36s} [{occ}] fwd/fwd+bwd " + " ".join(cells), flush=True)
        rows.append(row)
        if args.out:
            Path(args.out).write_text(json.dumps(
                {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                 "torch": torch.__version__, "bundle_version": fa.__version__, "dtype": "bf16",
                 "occupancies": occupancies, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
