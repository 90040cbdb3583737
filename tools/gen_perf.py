"""Regenerate the README performance tables from committed benchmark results (benchmarks/results): the
forward table (bench_fwd.py), the serving table (bench_serving.py), the backward table (bench_bwd.py) and the
score / mask mods table (bench_flex.py).

    python tools/gen_perf.py [--result benchmarks/results/fwd_h100_2026-11-25.json]
                             [--serving-result benchmarks/results/serving_h100_2026-11-25.json]
                             [--bwd-result benchmarks/results/bwd_h100_2026-11-27.json]
                             [--flex-result benchmarks/results/flex_h100_2026-11-26.json] [--check]
"""

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "results" / "fwd_h100_2026-11-25.json"
SERVING_DEFAULT = ROOT / "benchmarks" / "results" / "serving_h100_2026-11-25.json"
BEGIN, END = "<!-- perf-table:begin -->", "<!-- perf-table:end -->"
SERVING_BEGIN, SERVING_END = "<!-- serving-table:begin -->", "<!-- serving-table:end -->"
BWD_DEFAULT = ROOT / "benchmarks" / "results" / "bwd_h100_2026-11-27.json"
BWD_BEGIN, BWD_END = "<!-- bwd-table:begin -->", "<!-- bwd-table:end -->"
FLEX_DEFAULT = ROOT / "benchmarks" / "results" / "flex_h100_2026-11-26.json"
FLEX_BEGIN, FLEX_END = "<!-- flex-table:begin -->", "<!-- flex-table:end -->"
DROPOUT_DEFAULT = ROOT / "benchmarks" / "results" / "dropout_h100_2026-11-27.json"
DROPOUT_BEGIN, DROPOUT_END = "<!-- dropout-table:begin -->", "<!-- dropout-table:end -->"
BWD_IMPLS = [("ours", "this bundle"), ("ours_deterministic", "this bundle, deterministic"),
             ("sdpa_flash_fa2", "SDPA flash (FA2)"), ("fa4_sm120_path", "FA4 b36, SM120 path"),
             ("sdpa_cudnn", "SDPA cuDNN (wgmma)")]
PEERS = [("ours", "this bundle"), ("sdpa_flash_fa2", "SDPA flash (FA2)"), ("fa4_sm120_path", "FA4 b36, SM120 path"),
         ("sdpa_cudnn", "SDPA cuDNN (wgmma, H100 ceiling)")]
#: Peers of the issue's targets (same instruction class as ours) and their ratio columns; cuDNN's wgmma is not one.
RATIO_PEERS = {"sdpa_flash_fa2": "ours / FA2", "fa4_sm120_path": "ours / FA4 SM120 path"}


#: Result keys of bench_fwd.py's two occupancies, with the heading each table gets (older results have only
#: ``results``, measured at the H100's own occupancy).
OCCUPANCIES = {
    "results": "At an SM120's CTAs per SM (100 KB of shared memory per SM): ours padded by the package, "
               "FA2 and upstream through the CUDA context's cache preference (benchmarks/occupancy.py). "
               "What an RTX 5090 / RTX PRO 6000 runs; cuDNN (wgmma) is not an SM120 peer and is not timed here.",
    "results_h100": "At the H100's own occupancy (228 KB per SM: two 64-99 KB CTAs of any of these kernels share "
                    "an SM and hide each other's softmax, which no SM120 part can do).",
}


def _ratio(results: dict, key: str, peer: str):
    ours, other = results.get("ours", {}), results.get(peer, {})
    return ours[key] / other[key] if key in ours and key in other else None


def _geomean(values: list) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def _one_table(result: dict, field: str) -> list:
    lines = ["| case | " + " | ".join([name for _, name in PEERS] + list(RATIO_PEERS.values())) + " |",
             "|---" * (len(PEERS) + len(RATIO_PEERS) + 1) + "|"]
    small = {peer: [] for peer in RATIO_PEERS}  # ratios of the head_dim <= 128 cases
    for row in result["rows"]:
        results = row.get(field, {})
        decode = row["seqlen_q"] == 1
        key = "kv_gbps" if decode else "tflops"

        def cell(impl):
            r = results.get(impl, {})
            return f"{r[key]:.0f}" if key in r else "n/a"

        ratios = []
        for peer in RATIO_PEERS:
            r = _ratio(results, key, peer)
            ratios.append(f"{r:.2f}×" if r else "n/a")
            if r and max(row["head_dim"], row["head_dim_v"]) <= 128 and row["window_left"] is None:
                small[peer].append(r)
        lines.append(f"| {row['case']}{' (GB/s)' if decode else ''} | " + " | ".join(cell(i) for i, _ in PEERS)
                     + " | " + " | ".join(ratios) + " |")
    lines += ["", "Geometric mean of the ratios over the head_dim <= 128 cases (window excluded): "
              + ", ".join(f"{_geomean(v):.2f}× vs {dict(PEERS)[p]} ({len(v)} cases)" for p, v in small.items() if v) + "."]
    return lines


def table(result: dict, source: str) -> str:
    lines = [f"Forward, bf16, {result['device']}, {result['date']} (`{source}`). TFLOPS = 2·B·Hq·Sq·Sk·(D+Dv) (×0.5 causal; window rows use the nominal causal FLOPs); "
             "decode rows show K/V GB/s. Ratios = ours / peer, same run."]
    fields = [f for f in OCCUPANCIES if any(f in row for row in result["rows"])]
    for field in fields:
        if len(fields) > 1:
            lines += ["", f"**{OCCUPANCIES[field]}**"]
        lines += [""] + _one_table(result, field)
    return "\n".join(lines)


def _eager_graph(results: dict, label: str, field: str) -> str:
    """"eager / graph" figures of one implementation, "-" where it did not run."""
    cells = []
    for mode in ("eager", "graph"):
        r = results.get(f"{label} {mode}", {})
        cells.append(f"{r[field]:.0f}" if field in r else "-")
    return " / ".join(cells)


def serving_table(result: dict, source: str) -> str:
    """The serving table: per case, eager / graph-replayed K/V GB/s (TFLOPS for prefill) of ours dense, paged
    (every page size measured), the KV-cache API with its append, and the peers on dense K/V."""
    lines = [f"`python benchmarks/bench_serving.py` ({result['device']}, {result['date']}, SM120 occupancy for every "
             f"kernel, `{source}`): effective K/V GB/s (K and V bytes read once / time; chunked prefill in TFLOPS), "
             f"eager / replayed from a CUDA graph. The device copies at {result['copy_gbps']:.0f} GB/s (read + write). "
             "Paged rows read the same keys through shuffled pages; `kvcache16` is `flash_attn_with_kvcache` over "
             "the page-16 cache, appending the step's keys before attending; the peers read dense K/V (none of them "
             "takes this bundle's page table; SDPA runs seqlen_q < seqlen_k without its top-left causal mask); FlashInfer "
             "reads the page-16 caches (fa2 backend, the one it runs on SM120; eager times its `run` with the step's `plan` made once, as an engine plans once per step for every layer).",
             "", "| case | ours dense | ours paged (page size) | ours kvcache16 + append | SDPA FA2 | "
                 "upstream SM120 path | FlashInfer paged16 | paged16 / dense (graph) |", "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        res = row["results"]
        field = "tflops" if row["seqlen_q"] > 64 else "kv_gbps"
        paged = sorted({k.split()[1] for k in res if k.startswith("ours paged")}, key=lambda p: (p != "paged16", p))
        paged_cells = "; ".join(f"p{p.removeprefix('paged')} {_eager_graph(res, 'ours ' + p, field)}" for p in paged)
        ratio = "-"
        if field in res.get("ours paged16 graph", {}) and field in res.get("ours dense graph", {}):
            ratio = f"{res['ours paged16 graph'][field] / res['ours dense graph'][field]:.2f}"
        lines.append(f"| {row['case']} | {_eager_graph(res, 'ours dense', field)} | {paged_cells or '-'} | "
                     f"{_eager_graph(res, 'ours kvcache16 append', field)} | {_eager_graph(res, 'sdpa_flash_fa2', field)} | "
                     f"{_eager_graph(res, 'fa4_sm120_path', field)} | {_eager_graph(res, 'flashinfer paged16', field)} | "
                     f"{ratio} |")
    return "\n".join(lines)


def bwd_table(result: dict, source: str) -> str:
    """Backward TFLOPS (and forward + backward in parentheses) per case and occupancy, with the ratios to FA2 and
    to upstream's SM120 path and the deterministic mode's time over the default's."""
    lines = [f"Backward, bf16, {result['device']}, {result['date']} (`{source}`). TFLOPS = 2.5 × the forward's "
             "FLOPs (backward) and 3.5 × (forward + backward, in parentheses); ratios = ours / peer, same run; "
             "det. cost = deterministic time / default time. A peer that cannot run at an SM120's occupancy (FA2's "
             "144 KB d128 tile, upstream at d256) shows n/a there."]
    for field in [f for f in OCCUPANCIES if any(f in row for row in result["rows"])]:
        lines += ["", f"**{OCCUPANCIES[field]}**", "",
                  "| case | " + " | ".join(name for _, name in BWD_IMPLS)
                  + " | ours / FA2 | ours / FA4 SM120 path | det. cost |", "|---" * (len(BWD_IMPLS) + 4) + "|"]
        for row in result["rows"]:
            res = row.get(field, {})

            def tf(impl, part):
                return res.get(impl, {}).get(part, {}).get("tflops")

            cells = [f"{tf(i, 'bwd'):.0f} ({tf(i, 'fwd_bwd'):.0f})" if tf(i, "bwd") and tf(i, "fwd_bwd") else "n/a"
                     for i, _ in BWD_IMPLS]
            ratios = [f"{tf('ours', 'bwd') / tf(p, 'bwd'):.2f}×" if tf("ours", "bwd") and tf(p, "bwd") else "n/a"
                      for p in ("sdpa_flash_fa2", "fa4_sm120_path")]
            det = (f"{tf('ours', 'bwd') / tf('ours_deterministic', 'bwd'):.2f}×"
                   if tf("ours", "bwd") and tf("ours_deterministic", "bwd") else "n/a")
            lines.append(f"| {row['case']} | " + " | ".join(cells + ratios + [det]) + " |")
    return "\n".join(lines)


def _rows_at(result: dict, field: str) -> list:
    """The result's rows timed at the occupancy ``field`` names (a row may carry one occupancy only)."""
    return [row for row in result["rows"] if field in row]


def flex_table(result: dict, source: str) -> str:
    """Milliseconds of the mods cases (forward; forward + backward in parentheses) per occupancy, ours against
    torch FlexAttention (compiled) where it runs there."""
    flexes = [i for i in ("flex_attention", "flex_attention_sm120")
              if any(i in row.get(f, {}) for row in result["rows"] for f in OCCUPANCIES)]
    names = {"flex_attention": "FlexAttention, its tiles", "flex_attention_sm120": "FlexAttention, SM120 tiles"}
    lines = [f"Score / mask mods and block sparsity, bf16, {result['device']}, {result['date']} (`{source}`). "
             "Milliseconds, forward (forward + backward; - where a part did not run); ratios = "
             "FlexAttention's time / ours, same run. FlexAttention (compiled) runs with its own tiles for the "
             "device (128-161 KB of shared memory: n/a at an SM120's occupancy) and with torch's sm_120 tiles "
             "(`bench_flex.SM120_FLEX_OPTIONS`, within 99 KB)."]
    for field in [f for f in OCCUPANCIES if any(f in row for row in result["rows"])]:
        lines += ["", f"**{OCCUPANCIES[field]}**", "", "| case | shape (b, s, hq, hkv, d) | this bundle | "
                  + " | ".join(names[i] for i in flexes) + " | " + " | ".join(f"{names[i]} / ours" for i in flexes)
                  + " |", "|---" * (3 + 2 * len(flexes)) + "|"]
        for row in _rows_at(result, field):
            res = row[field]

            def ms(impl, part):
                return res.get(impl, {}).get(part, {}).get("ms")

            def pair(impl):  # "fwd (fwd_bwd)", "-" for a part that did not run
                if not ms(impl, "fwd") and not ms(impl, "fwd_bwd"):
                    return "n/a"
                return " ".join(f"{ms(impl, p):.2f}" if ms(impl, p) else "-" for p in ("fwd", "fwd_bwd")).replace(
                    " ", " (", 1) + ")"

            def ratio(impl, part):
                mine, theirs = ms("ours", part), ms(impl, part)
                return f"{theirs / mine:.2f}×" if mine and theirs else "-"

            cells = [pair(i) for i in ("ours", *flexes)]
            cells += [f"{ratio(i, 'fwd')} ({ratio(i, 'fwd_bwd')})" if ms(i, "fwd") or ms(i, "fwd_bwd") else "n/a"
                      for i in flexes]
            shape = ", ".join(str(x) for x in row["shape"])
            lines.append(f"| {row['case']} | {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dropout_table(result: dict, source: str) -> str:
    """Milliseconds with and without dropout (forward; forward + backward in parentheses) per occupancy, ours and FA2
    (SDPA flash), and the cost of dropout: the time with it over the time without, same run."""
    impls = (("ours", "ours"), ("ours_dropout", f"ours, p={result['rows'][0]['dropout_p']}"),
             ("sdpa_flash_fa2", "FA2"), ("sdpa_flash_fa2_dropout", f"FA2, p={result['rows'][0]['dropout_p']}"))
    lines = [f"Dropout, bf16, {result['device']}, {result['date']} (`{source}`). Milliseconds, forward (forward + "
             "backward; - where a part did not run: FA2's backward has no SM120-occupancy emulation); cost = time "
             "with dropout / without, same implementation, same run (the issue's target: forward + backward <= 1.25x)."]
    for field in [f for f in OCCUPANCIES if any(f in row for row in result["rows"])]:
        lines += ["", f"**{OCCUPANCIES[field]}**", "", "| case | shape (b, s, hq, hkv, d) | "
                  + " | ".join(name for _, name in impls) + " | cost, ours | cost, FA2 |", "|---" * 8 + "|"]
        for row in _rows_at(result, field):
            res = row[field]

            def ms(impl, part):
                return res.get(impl, {}).get(part, {}).get("ms")

            def pair(impl):
                return " ".join(f"{ms(impl, p):.2f}" if ms(impl, p) else "-" for p in ("fwd", "fwd_bwd")).replace(
                    " ", " (", 1) + ")"

            def cost(a, b):
                parts = [f"{ms(b, p) / ms(a, p):.2f}×" if ms(a, p) and ms(b, p) else "-" for p in ("fwd", "fwd_bwd")]
                return f"{parts[0]} ({parts[1]})"

            shape = ", ".join(str(x) for x in row["shape"])
            lines.append(f"| {row['case']} | {shape} | " + " | ".join(pair(i) for i, _ in impls)
                         + f" | {cost('ours', 'ours_dropout')} | {cost('sdpa_flash_fa2', 'sdpa_flash_fa2_dropout')} |")
    return "\n".join(lines)


def _replace(body: str, begin: str, end: str, text: str) -> str:
    start, stop = body.index(begin) + len(begin), body.index(end)
    return body[:start] + "\n" + text + "\n" + body[stop:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--result", default=str(DEFAULT))
    ap.add_argument("--serving-result", default=str(SERVING_DEFAULT))
    ap.add_argument("--bwd-result", default=str(BWD_DEFAULT))
    ap.add_argument("--flex-result", default=str(FLEX_DEFAULT))
    ap.add_argument("--dropout-result", default=str(DROPOUT_DEFAULT))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    readme = ROOT / "README.md"
    body = readme.read_text()
    new = body
    for path, begin, end, make in ((Path(args.result), BEGIN, END, table),
                                   (Path(args.serving_result), SERVING_BEGIN, SERVING_END, serving_table),
                                   (Path(args.bwd_result), BWD_BEGIN, BWD_END, bwd_table),
                                   (Path(args.flex_result), FLEX_BEGIN, FLEX_END, flex_table),
                                   (Path(args.dropout_result), DROPOUT_BEGIN, DROPOUT_END, dropout_table)):
        new = _replace(new, begin, end, make(json.loads(path.read_text()), path.relative_to(ROOT).as_posix()))
    if args.check:
        sys.exit(0 if new == body else 1)
    readme.write_text(new)


if __name__ == "__main__":
    main()
