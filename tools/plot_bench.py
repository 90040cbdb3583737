"""Plot a forward or backward benchmark result (``benchmarks/bench_fwd.py`` / ``bench_bwd.py --out``) as a
grouped bar chart PNG.

    python tools/plot_bench.py benchmarks/results/fwd_h100_2026-11-25.json [--out chart.png]
    python tools/plot_bench.py benchmarks/results/bwd_h100_2026-11-27.json

A backward result (rows whose implementations hold ``bwd`` timings) gets one panel per occupancy it was
measured at, backward TFLOPS per case.

Input: ``{device, date, dtype?, rows: [{case, seqlen_q, results: {impl: {tflops, kv_gbps, ms}}}]}``.
Output (default: the input's path with ``.png``): one group of bars per case, this bundle first and then
each peer in the order ``tools/gen_perf.py`` lists them (others after, by first appearance). Compute
cases show TFLOPS (window cases: the nominal causal FLOPs, as bench_fwd.py counts them, with a
footnote); decode cases (``seqlen_q == 1``, the rule gen_perf uses) show K/V GB/s on a second
panel. The title names the device and the date. A peer missing from a case leaves a gap.

matplotlib is a development dependency only (requirements-dev.txt); nothing in the package imports it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_perf import PEERS  # noqa: E402  (one list of peer names for the README table and the chart)

#: Bar colours: this bundle stands out; peers muted; the H100-only ceiling hatched.
COLORS = {"ours": "#d62728", "ours_deterministic": "#ff9896", "sdpa_flash_fa2": "#1f77b4", "fa4_sm120_path": "#7f7f7f",
          "sdpa_cudnn": "#c7c7c7"}
HATCHES = {"sdpa_cudnn": "//"}
_FALLBACK_COLORS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")


def implementations(rows: list[dict]) -> list[str]:
    """Every implementation key in the rows: gen_perf's order first, then any other by first appearance."""
    seen = [impl for row in rows for impl in row["results"]]
    known = [impl for impl, _ in PEERS if impl in seen]
    return known + [impl for impl in dict.fromkeys(seen) if impl not in known]


def label(impl: str) -> str:
    return dict(PEERS).get(impl, {"ours_deterministic": "this bundle, deterministic"}.get(impl, impl))


#: bench_bwd.py's occupancy keys and panel titles
BWD_PANELS = (("results", "SM120 occupancy"), ("results_h100", "H100 occupancy"))


def is_backward(result: dict) -> bool:
    return any("bwd" in r for row in result["rows"] for key, _ in BWD_PANELS for r in row.get(key, {}).values())


def backward_panels(result: dict) -> list[tuple[str, list[dict]]]:
    """(title, rows with ``results: {impl: {tflops}}`` of the backward alone) per occupancy measured."""
    panels = []
    for key, title in BWD_PANELS:
        rows = [{"case": row["case"], "results": {impl: {"tflops": r["bwd"]["tflops"]} for impl, r in row[key].items()
                                                  if "tflops" in r.get("bwd", {})}}
                for row in result["rows"] if key in row]
        if rows:
            panels.append((title, rows))
    return panels


def split_rows(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(compute rows, decode rows)."""
    decode = [r for r in rows if r.get("seqlen_q") == 1]
    return [r for r in rows if r.get("seqlen_q") != 1], decode


def _bars(ax, rows: list[dict], impls: list[str], metric: str, ylabel: str) -> None:
    n = len(impls)
    width = 0.8 / n
    top = max((r["results"][i][metric] for r in rows for i in impls if metric in r["results"].get(i, {})), default=1)
    fallback = iter(_FALLBACK_COLORS * 4)
    colors = {i: COLORS.get(i) or next(fallback) for i in impls}
    for j, impl in enumerate(impls):
        xs, ys = [], []
        for x, row in enumerate(rows):
            value = row["results"].get(impl, {}).get(metric)
            if value is not None:
                xs.append(x + (j - (n - 1) / 2) * width)
                ys.append(value)
        bars = ax.bar(xs, ys, width, label=label(impl), color=colors[impl], hatch=HATCHES.get(impl),
                      edgecolor="#404040" if impl in HATCHES else None, linewidth=0.4)
        ax.bar_label(bars, fmt="%.0f", fontsize=6, rotation=90, padding=2)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["case"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top * 1.15)  # room for the value labels
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def plot(result: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    if not rows:
        raise ValueError("the result has no rows")
    if is_backward(result):
        return _plot_backward(result, out, plt)
    compute, decode = split_rows(rows)
    impls = implementations(rows)
    panels = [(r, m, y) for r, m, y in ((compute, "tflops", "TFLOPS"), (decode, "kv_gbps", "K/V read, GB/s")) if r]
    fig, axes = plt.subplots(1, len(panels), figsize=(3 + 1.0 * len(rows) + 0.4 * len(impls), 5.2),
                             gridspec_kw={"width_ratios": [max(len(r), 1.6) for r, _, _ in panels]}, squeeze=False)
    for ax, (panel_rows, metric, ylabel) in zip(axes[0], panels):
        _bars(ax, panel_rows, impls, metric, ylabel)
    if decode and compute:
        axes[0][-1].set_title("decode (one query row)", fontsize=9)
    dtype = f", {result['dtype']}" if result.get("dtype") else ""
    fig.suptitle(f"Attention forward{dtype}: {result.get('device', 'unknown device')}, {result.get('date', 'undated')}",
                 fontsize=11)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(impls), fontsize=8,
               frameon=False)
    notes = []
    if any(r.get("window_left") is not None for r in compute):
        notes.append("window rows: nominal causal FLOPs / time (blocks outside the window are skipped, "
                     "so this exceeds the MMA rate)")
    if notes:
        fig.text(0.005, 0.005, "; ".join(notes), fontsize=7, color="#404040", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.02 if notes else 0, 1, 0.92))
    save_chart(fig, out, 100)
    plt.close(fig)
    return out


def save_chart(fig, out: Path, dpi: int) -> None:
    """``fig`` as a 64-colour palette PNG: the charts are flat colours and text, a third of the RGB file's size
    (the device carries the repository whole, within 64 MiB with the kit)."""
    from PIL import Image  # matplotlib's own dependency

    fig.savefig(out, dpi=dpi)
    with Image.open(out) as im:
        chart = im.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    chart.save(out, optimize=True)


def _plot_backward(result: dict, out: Path, plt) -> Path:
    panels = backward_panels(result)
    impls = list(dict.fromkeys(i for _, rows in panels for row in rows for i in row["results"]))
    known = [i for i in ("ours", "ours_deterministic", *[p for p, _ in PEERS]) if i in impls]
    impls = list(dict.fromkeys(known + impls))
    fig, axes = plt.subplots(1, len(panels), figsize=(2 + 1.4 * sum(len(r) for _, r in panels), 5.2), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels):
        _bars(ax, rows, impls, "tflops", "backward TFLOPS")
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"Attention backward, {result.get('dtype', 'bf16')}: {result.get('device', 'unknown device')}, "
                 f"{result.get('date', 'undated')}", fontsize=11)
    # legend from the panel with the most bars (an implementation with no bar in a panel has no real handle)
    ax_full = max(axes[0], key=lambda a: sum(len(c) for c in a.containers))
    handles, labels = ax_full.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(impls), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    save_chart(fig, out, 90)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", type=Path, help="benchmark JSON (benchmarks/results/fwd_*.json)")
    ap.add_argument("--out", type=Path, help="PNG to write (default: the result's path with .png)")
    args = ap.parse_args(argv)
    out = args.out or args.result.with_suffix(".png")
    plot(json.loads(args.result.read_text()), out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
