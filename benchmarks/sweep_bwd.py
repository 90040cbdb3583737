"""The backward off its benchmark grid (a script, not a test): head dims 72-224 in steps of 8, GQA ratios 1-16 and
lengths 500-8192, at an SM120's CTAs per SM, ours (and its deterministic mode) beside FA2 (SDPA flash) and upstream's
SM120 path in the same run.

The grid is a covering design, not the full product: every head dim meets every GQA ratio at one length and every
length at one ratio, the length and the ratio rotating with the head dim, so each (ratio, length) pair appears at
several head dims and every head dim at every ratio and length (``sweep_cases``). About 16k query tokens per case
(batch x length), 32 query heads (28 at ratio 7), causal on every other head dim.

Compiles first (``--jobs`` processes, each running a share of the cases once, untimed, so the disk compile caches
hold every kernel), then times the backward in this process (``bench_bwd.run_cases``) and saves after every row. An
``--out`` that exists is resumed: its rows are kept and its cases skipped, so the 200 cases can be spread over
several device calls (``--head-dims`` picks a share).
``--plot`` draws a saved sweep: ours / upstream and ours / FA2 backward speed by head dim (one marker per GQA ratio,
one colour per length), and the deterministic mode's cost, against the targets (1.0x and 1.3x).

    python benchmarks/sweep_bwd.py --out bwd_sweep.json [--jobs 12] [--head-dims 72 80] [--impls ours ...]
    python benchmarks/sweep_bwd.py --plot benchmarks/results/bwd_sweep_h200_<date>.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HEAD_DIMS = tuple(range(72, 232, 8))
RATIOS = (1, 2, 4, 7, 8, 16)
LENGTHS = (500, 1000, 2048, 4096, 8192)
TOKENS = 16384
#: the swept implementations: ours, its deterministic mode and the two peers the targets name
IMPLS = ("ours", "ours_deterministic", "sdpa_flash_fa2", "fa4_sm120_path")


def heads(ratio: int) -> tuple[int, int]:
    """(query heads, KV heads) at a GQA ratio: 32 query heads, or 28 where 32 is not a multiple of the ratio."""
    hq = 32 if 32 % ratio == 0 else 4 * ratio
    return hq, hq // ratio


def sweep_cases(head_dims=HEAD_DIMS) -> list[tuple]:
    """bench_bwd cases (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, d, dv, causal) of the covering design."""
    cases = []
    for d in head_dims:
        i = HEAD_DIMS.index(d) if d in HEAD_DIMS else (d - HEAD_DIMS[0]) // 8  # the rotation of the whole design
        length, ratio, causal = LENGTHS[i % len(LENGTHS)], RATIOS[i % len(RATIOS)], i % 2 == 1
        shapes = [(r, length) for r in RATIOS] + [(ratio, n) for n in LENGTHS if n != length]
        for r, n in shapes:
            hq, hkv = heads(r)
            b = max(1, TOKENS // n)
            name = f"d{d}_{b}x{n}_{hq}/{hkv}" + ("_causal" if causal else "")
            cases.append((name, b, n, n, hq, hkv, d, d, causal))
    return cases


def ratios(rows: list[dict]) -> list[dict]:
    """Per row: ours' backward speed over each peer's, and the deterministic mode's time over the default's."""
    out = []
    for row in rows:
        res = row.get("results", {})
        ms = {impl: r["bwd"]["ms"] for impl, r in res.items() if "ms" in r.get("bwd", {})}
        if "ours" not in ms:
            continue
        entry = {k: row[k] for k in ("case", "head_dim", "seqlen_q", "heads_q", "heads_kv", "causal")}
        for peer in ("fa4_sm120_path", "sdpa_flash_fa2"):
            if peer in ms:
                entry[f"over_{peer}"] = ms[peer] / ms["ours"]
        if "ours_deterministic" in ms:
            entry["deterministic_cost"] = ms["ours_deterministic"] / ms["ours"]
        out.append(entry)
    return out


def plot(path: Path, out: Path = None) -> Path:
    """The sweep's PNG (default: the JSON's path with .png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = json.loads(Path(path).read_text())
    entries = ratios(result["rows"])
    panels = [("over_fa4_sm120_path", "ours / upstream SM120 path", 1.0),
              ("over_sdpa_flash_fa2", "ours / FA2 (SDPA flash)", 1.0),
              ("deterministic_cost", "deterministic / default time", 1.3)]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    markers = dict(zip(RATIOS, "o^sDvP"))
    colors = dict(zip(LENGTHS, ("#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd")))
    for ax, (key, title, target) in zip(axes, panels):
        for e in entries:
            if key in e:
                ratio = e["heads_q"] // e["heads_kv"]
                color = colors.get(e["seqlen_q"], "k")
                ax.scatter(e["head_dim"], e[key], marker=markers.get(ratio, "x"), edgecolors=color,
                           facecolors="none" if e["causal"] else color, s=28)
        ax.axhline(target, color="k", lw=0.8, ls="--")
        ax.set_title(title)
        ax.set_xlabel("head dim")
    for r, m in markers.items():
        axes[0].scatter([], [], marker=m, color="k", label=f"GQA {r}:1")
    for n, c in colors.items():
        axes[0].scatter([], [], marker="o", color=c, label=f"{n} tokens")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"backward at an SM120's CTAs per SM, {result['device']}, {result['date']} (hollow: causal)")
    out = Path(out) if out else Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--head-dims", type=int, nargs="*", default=list(HEAD_DIMS))
    ap.add_argument("--impls", nargs="*", default=list(IMPLS))
    ap.add_argument("--jobs", type=int, default=12, help="processes compiling before the timed run")
    ap.add_argument("--plot", help="draw a saved sweep instead of running one")
    ap.add_argument("--warm", help=argparse.SUPPRESS)  # "i/n": run every n-th case from i once, untimed
    args = ap.parse_args()
    if args.plot:
        print(plot(Path(args.plot)))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    from bench_bwd import peers_and_ours, run_cases
    from bench_fwd import training_inputs

    done = json.loads(Path(args.out).read_text())["rows"] if args.out and Path(args.out).exists() else []
    cases = [c for c in sweep_cases(args.head_dims) if c[0] not in {r["case"] for r in done}]
    impls = peers_and_ours(args.impls)
    if args.warm:
        i, n = map(int, args.warm.split("/"))
        for name, b, sq, sk, hq, hkv, d, dv, causal in cases[i::n]:
            q, k, v, dout = training_inputs(b, sq, sk, hq, hkv, d, dv)
            for fn in impls.values():
                try:
                    torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout)
                except Exception as e:  # noqa: BLE001  (a peer that cannot run a case: the timed run reports it)
                    print(f"{name}: {type(e).__name__}: {str(e)[:120]}")
        return
    dims = ["--head-dims", *map(str, args.head_dims), "--impls", *args.impls]
    warming = [subprocess.Popen([sys.executable, __file__, "--warm", f"{i}/{args.jobs}", *dims])
               for i in range(args.jobs)]
    for proc in warming:
        proc.wait()
    run_cases(cases, impls, ("sm120",), args.out, fwd_bwd=False, rows=done,
              sweep="benchmarks/sweep_bwd.py covering design")


if __name__ == "__main__":
    main()
