"""Generate the performance tables of README.md and docs/performance.md from kept benchmark results.

    python tools/gen_perf.py [--check] [--fwd PATH] [--bwd PATH] [--serving PATH] [--flex PATH] [--dropout PATH]
                             [--step PATH] [--step-graphs PATH] [--host PATH] [--bwd-sweep PATH]

Each table sits between a pair of markers, ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``; everything outside the
markers is hand-written and left alone. README.md gets one short table per area (``perf-fwd``, ``perf-bwd``,
``perf-serving``, ``perf-flex``); docs/performance.md gets every table in full (``perf-fwd-full``,
``perf-bwd-full``, ``perf-serving-full``, ``perf-flex-full``, ``perf-dropout-full``, ``perf-step-full``). Every
table names its device, date and result file. ``--check`` writes nothing and exits 1 when a region is stale
(or a file lacks its markers).

The result files are those of ``benchmarks/bench_fwd.py``, ``bench_bwd.py``, ``bench_serving.py``,
``bench_flex.py``, ``bench_dropout.py`` and ``bench_step.py`` (see benchmarks/README.md). A result may carry
measurements at two occupancies: ``results`` (an SM120's CTAs per SM, what the target parts run) and
``results_h100`` (the H100's own).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"

DEFAULTS = {
    "fwd": RESULTS / "fwd_h100_2026-11-25.json",
    "bwd": RESULTS / "bwd_h100_2026-11-27.json",
    "serving": RESULTS / "serving_h100_2026-11-25.json",
    "flex": RESULTS / "flex_h100_2026-11-26.json",
    "dropout": RESULTS / "dropout_h100_2026-11-27.json",
    "step": RESULTS / "step_h200_2026-11-28.json",
    "step_graphs": RESULTS / "step_cudagraphs_h200_2026-11-28.json",
    "step_eager": RESULTS / "step_eager_h200_2026-11-29.json",
    "fp8": RESULTS / "bench_fp8_h200_2026-11-29.json",
    "mla": RESULTS / "bench_mla_h200_2026-11-29.json",
    "host": RESULTS / "overhead_h200_2026-11-29.json",
    "bwd_sweep": RESULTS / "bwd_sweep_h200_2026-11-29.json",
}

#: Forward peers in table order (``tools/plot_bench.py`` draws its bars in the same order).
PEERS = [("ours", "this bundle"), ("sdpa_flash_fa2", "SDPA flash (FA2)"), ("fa4_sm120_path", "FA4 b36, SM120 path"),
         ("sdpa_cudnn", "SDPA cuDNN (wgmma, H100 ceiling)")]
#: Peers of the same instruction class as ours (mma.sync), with their ratio columns; cuDNN's wgmma is not one.
RATIO_PEERS = {"sdpa_flash_fa2": "ours / FA2", "fa4_sm120_path": "ours / FA4 SM120 path"}
BWD_IMPLS = [("ours", "this bundle"), ("ours_deterministic", "this bundle, deterministic"),
             ("sdpa_flash_fa2", "SDPA flash (FA2)"), ("fa4_sm120_path", "FA4 b36, SM120 path"),
             ("sdpa_cudnn", "SDPA cuDNN (wgmma)")]

#: Result keys of the two occupancies and the heading each full table gets.
OCCUPANCIES = {
    "results": "At an SM120's CTAs per SM (100 KB of shared memory per SM): ours padded by the package, FA2 and "
               "upstream through the CUDA context's cache preference (benchmarks/occupancy.py). What an RTX 5090 / "
               "RTX PRO 6000 runs; cuDNN (wgmma) is not an SM120 peer and is not timed here.",
    "results_h100": "At the H100's own occupancy (228 KB per SM: two 64-99 KB CTAs of any of these kernels share "
                    "an SM and hide each other's softmax, which no SM120 part can do).",
}

#: Rows of the short README tables of the flex results (all rows when none of these is present).
FLEX_SUMMARY_CASES = ("causal flag", "causal mask_mod + block sparse", "documents of 512 (mask_mod + block sparse)",
                      "documents of 512 (varlen)", "prefix-LM 1024 + block sparse", "random 25% blocks (block sparse)")


# ----------------------------------------------------------------------------------------------------------- helpers

def _geomean(values: list) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def _fmt(x, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "n/a"


def _header(columns: list) -> list:
    return ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]


def _source(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _occupancy_fields(result: dict) -> list:
    return [f for f in OCCUPANCIES if any(f in row for row in result["rows"])]


# ----------------------------------------------------------------------------------------------------------- forward

def _fwd_key(row: dict) -> str:
    """Decode rows (one query) are judged by K/V bandwidth, the rest by TFLOPS."""
    return "kv_gbps" if row["seqlen_q"] == 1 else "tflops"


def _fwd_value(row: dict, field: str, impl: str):
    return row.get(field, {}).get(impl, {}).get(_fwd_key(row))


def _fwd_geomeans(result: dict, field: str) -> str:
    small = {peer: [] for peer in RATIO_PEERS}
    for row in result["rows"]:
        if max(row["head_dim"], row["head_dim_v"]) > 128 or row.get("window_left") is not None:
            continue
        for peer in RATIO_PEERS:
            ours, other = _fwd_value(row, field, "ours"), _fwd_value(row, field, peer)
            if ours and other:
                small[peer].append(ours / other)
    parts = [f"{_geomean(v):.2f}× {RATIO_PEERS[p].split(' / ')[1]} ({len(v)} cases)" for p, v in small.items() if v]
    return "Geometric mean of ours / peer over the head_dim <= 128 cases (windows excluded): " + ", ".join(parts) + "."


def _fwd_rows(result: dict, field: str, rows: list, peers: list) -> list:
    lines = _header(["case"] + [name for _, name in peers] + list(RATIO_PEERS.values()))
    for row in rows:
        unit = " (GB/s)" if _fwd_key(row) == "kv_gbps" else ""
        cells = [_fmt(_fwd_value(row, field, impl)) for impl, _ in peers]
        ratios = [_ratio(_fwd_value(row, field, "ours"), _fwd_value(row, field, p)) for p in RATIO_PEERS]
        lines.append(f"| {row['case']}{unit} | " + " | ".join(cells + ratios) + " |")
    return lines


def fwd_full(result: dict, source: str) -> str:
    lines = [f"Forward, bf16, {result['device']}, {result['date']} (`{source}`). TFLOPS = 2·B·Hq·Sq·Sk·(D+Dv), "
             "×0.5 causal (window rows use the causal FLOPs, so a window shows as a higher rate); decode rows show "
             "K/V GB/s. Rows starting with \"m\" are the generalization matrix (`bench_fwd.py --matrix`). Ratios = "
             "ours / peer, same run."]
    fields = _occupancy_fields(result)
    for field in fields:
        peers = [p for p in PEERS if any(p[0] in row.get(field, {}) and _fwd_value(row, field, p[0])
                                         for row in result["rows"])]
        lines += ["", f"**{OCCUPANCIES[field]}**", ""] + _fwd_rows(result, field, result["rows"], peers)
        lines += ["", _fwd_geomeans(result, field)]
    return "\n".join(lines)


def fwd_summary(result: dict, source: str) -> str:
    field = "results" if "results" in _occupancy_fields(result) else _occupancy_fields(result)[0]
    rows = [row for row in result["rows"] if not row["case"].startswith("m ")] or result["rows"]
    peers = [p for p in PEERS if p[0] != "sdpa_cudnn"]
    lines = [f"Forward, bf16, TFLOPS (decode: K/V GB/s), {result['device']} at an SM120's CTAs per SM, "
             f"{result['date']} (`{source}`):", ""]
    lines += _fwd_rows(result, field, rows, peers)
    lines += ["", _fwd_geomeans(result, field).replace("head_dim <= 128 cases", "head_dim <= 128 cases of the full "
                                                       "matrix")]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- backward

def _bwd_tflops(row: dict, field: str, impl: str, part: str = "bwd"):
    return row.get(field, {}).get(impl, {}).get(part, {}).get("tflops")


def bwd_full(result: dict, source: str) -> str:
    lines = [f"Backward, bf16, {result['device']}, {result['date']} (`{source}`). TFLOPS = 2.5 × the forward's FLOPs "
             "(backward) and 3.5 × (forward + backward, in parentheses); ratios = ours / peer, same run; det. cost = "
             "deterministic time / default time. A peer that cannot run at an SM120's occupancy (FA2's 144 KB d128 "
             "tile, upstream at d256) shows n/a there."]
    for field in _occupancy_fields(result):
        lines += ["", f"**{OCCUPANCIES[field]}**", ""]
        lines += _header(["case"] + [name for _, name in BWD_IMPLS] + ["ours / FA2", "ours / FA4 SM120 path",
                                                                        "det. cost"])
        for row in result["rows"]:
            cells = []
            for impl, _ in BWD_IMPLS:
                b, fb = _bwd_tflops(row, field, impl), _bwd_tflops(row, field, impl, "fwd_bwd")
                cells.append(f"{b:.0f} ({fb:.0f})" if b and fb else "n/a")
            ours = _bwd_tflops(row, field, "ours")
            cells += [_ratio(ours, _bwd_tflops(row, field, p)) for p in ("sdpa_flash_fa2", "fa4_sm120_path")]
            cells.append(_ratio(ours, _bwd_tflops(row, field, "ours_deterministic")))
            lines.append(f"| {row['case']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bwd_summary(result: dict, source: str) -> str:
    fields = _occupancy_fields(result)
    sm120 = "results" if "results" in fields else fields[0]
    h100 = "results_h100" if "results_h100" in fields else None
    lines = [f"Backward, bf16, TFLOPS (2.5 × the forward's FLOPs), {result['device']}, {result['date']} "
             f"(`{source}`). Ours and upstream's SM120 path at an SM120's CTAs per SM; FA2's d128 tile needs 144 KB "
             "and runs only at the H100's own occupancy, so its ratio is taken there, ours at the same occupancy.",
             ""]
    columns = ["case", "this bundle", "deterministic", "FA4 b36, SM120 path", "ours / FA4 SM120 path"]
    if h100:
        columns.append("ours / FA2 (H100 occupancy)")
    lines += _header(columns)
    for row in result["rows"]:
        ours = _bwd_tflops(row, sm120, "ours")
        cells = [_fmt(ours), _fmt(_bwd_tflops(row, sm120, "ours_deterministic")),
                 _fmt(_bwd_tflops(row, sm120, "fa4_sm120_path")),
                 _ratio(ours, _bwd_tflops(row, sm120, "fa4_sm120_path"))]
        if h100:
            cells.append(_ratio(_bwd_tflops(row, h100, "ours"), _bwd_tflops(row, h100, "sdpa_flash_fa2")))
        lines.append(f"| {row['case']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------- serving

def _serving_field(row: dict) -> str:
    return "tflops" if row["seqlen_q"] > 64 else "kv_gbps"


def _eager_graph(results: dict, label: str, field: str) -> str:
    """"eager / graph" figures of one implementation, "-" where it did not run."""
    cells = []
    for mode in ("eager", "graph"):
        r = results.get(f"{label} {mode}", {})
        cells.append(f"{r[field]:.0f}" if field in r else "-")
    return " / ".join(cells)


def _graph(results: dict, label: str, field: str):
    return results.get(f"{label} graph", {}).get(field)


def _serving_caption(result: dict, source: str) -> str:
    return (f"`benchmarks/bench_serving.py`, bf16, {result['device']}, {result['date']}, every kernel at an SM120's "
            f"CTAs per SM (`{source}`). Effective K/V GB/s (K and V bytes read once / time; chunked prefill in "
            f"TFLOPS). The device copies at {result['copy_gbps']:.0f} GB/s (read + write). Paged rows read the same "
            "keys through shuffled pages; `kvcache16` is `flash_attn_with_kvcache` over the page-16 cache, appending "
            "the step's keys before attending. SDPA and upstream read dense K/V (neither takes a page table; SDPA runs "
            "seqlen_q < seqlen_k without its top-left causal mask); FlashInfer (fa2 backend, the one it runs on SM120) "
            "reads the page-16 caches.")


def serving_full(result: dict, source: str) -> str:
    lines = [_serving_caption(result, source) + " Cells: eager / replayed from a CUDA graph (FlashInfer's eager time "
             "is its `run` with the step's `plan` made once, as an engine plans once per step for every layer).", ""]
    lines += _header(["case", "ours dense", "ours paged (page size)", "ours kvcache16 + append", "SDPA FA2",
                      "upstream SM120 path", "FlashInfer paged16", "paged16 / dense (graph)"])
    for row in result["rows"]:
        res, field = row["results"], _serving_field(row)
        paged = sorted({k.split()[1] for k in res if k.startswith("ours paged")}, key=lambda p: (p != "paged16", p))
        paged_cells = "; ".join(f"p{p.removeprefix('paged')} {_eager_graph(res, 'ours ' + p, field)}" for p in paged)
        ratio = _graph(res, "ours paged16", field), _graph(res, "ours dense", field)
        lines.append(f"| {row['case']} | {_eager_graph(res, 'ours dense', field)} | {paged_cells or '-'} | "
                     f"{_eager_graph(res, 'ours kvcache16 append', field)} | "
                     f"{_eager_graph(res, 'sdpa_flash_fa2', field)} | {_eager_graph(res, 'fa4_sm120_path', field)} | "
                     f"{_eager_graph(res, 'flashinfer paged16', field)} | "
                     f"{f'{ratio[0] / ratio[1]:.2f}' if all(ratio) else '-'} |")
    return "\n".join(lines)


def serving_summary(result: dict, source: str) -> str:
    lines = [f"Serving, bf16, replayed from CUDA graphs, K/V GB/s (chunked prefill: TFLOPS), {result['device']} at an "
             f"SM120's CTAs per SM, {result['date']} (`{source}`):", ""]
    lines += _header(["case", "ours dense", "ours paged16", "ours kvcache16 + append", "SDPA FA2",
                      "FlashInfer paged16", "ours paged16 / FlashInfer"])
    for row in result["rows"]:
        res, field = row["results"], _serving_field(row)
        paged, fi = _graph(res, "ours paged16", field), _graph(res, "flashinfer paged16", field)
        cells = [_fmt(_graph(res, label, field)).replace("n/a", "-") for label in
                 ("ours dense", "ours paged16", "ours kvcache16 append", "sdpa_flash_fa2", "flashinfer paged16")]
        lines.append(f"| {row['case']} | " + " | ".join(cells + [_ratio(paged, fi)]) + " |")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------- flex and dropout

def _ms(res: dict, impl: str, part: str):
    return res.get(impl, {}).get(part, {}).get("ms")


def _pair(res: dict, impl: str) -> str:
    """"fwd (fwd_bwd)" milliseconds, "-" for a part that did not run, "n/a" when neither did."""
    if not _ms(res, impl, "fwd") and not _ms(res, impl, "fwd_bwd"):
        return "n/a"
    fwd, both = (f"{_ms(res, impl, p):.2f}" if _ms(res, impl, p) else "-" for p in ("fwd", "fwd_bwd"))
    return f"{fwd} ({both})"


def _flex_impls(result: dict) -> list:
    names = {"flex_attention": "FlexAttention, its tiles", "flex_attention_sm120": "FlexAttention, SM120 tiles"}
    present = [i for i in names if any(i in row.get(f, {}) for row in result["rows"] for f in OCCUPANCIES)]
    return [(i, names[i]) for i in present]


def flex_full(result: dict, source: str) -> str:
    flexes = _flex_impls(result)
    lines = [f"Score / mask mods and block sparsity, bf16, {result['device']}, {result['date']} (`{source}`). "
             "Milliseconds, forward (forward + backward; - where a part did not run); ratios = FlexAttention's "
             "time / ours, same run. FlexAttention (compiled) runs with its own tiles for the device (128-161 KB of "
             "shared memory: n/a at an SM120's occupancy) and with torch's sm_120 tiles "
             "(`bench_flex.SM120_FLEX_OPTIONS`, within 99 KB)."]
    for field in _occupancy_fields(result):
        lines += ["", f"**{OCCUPANCIES[field]}**", ""]
        lines += _header(["case", "shape (b, s, hq, hkv, d)", "this bundle"] + [n for _, n in flexes]
                         + [f"{n} / ours" for _, n in flexes])
        for row in (r for r in result["rows"] if field in r):
            res = row[field]
            cells = [_pair(res, i) for i in ("ours", *(i for i, _ in flexes))]
            for impl, _ in flexes:
                if not _ms(res, impl, "fwd") and not _ms(res, impl, "fwd_bwd"):
                    cells.append("n/a")
                    continue
                r = [(f"{_ms(res, impl, p) / _ms(res, 'ours', p):.2f}×" if _ms(res, impl, p) and _ms(res, "ours", p)
                      else "-") for p in ("fwd", "fwd_bwd")]
                cells.append(f"{r[0]} ({r[1]})")
            lines.append(f"| {row['case']} | {', '.join(map(str, row['shape']))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _dropout_label(result: dict) -> str:
    return f"p={result['rows'][0]['dropout_p']}"


def dropout_full(result: dict, source: str) -> str:
    p = _dropout_label(result)
    impls = (("ours", "ours"), ("ours_dropout", f"ours, {p}"), ("sdpa_flash_fa2", "FA2"),
             ("sdpa_flash_fa2_dropout", f"FA2, {p}"))
    lines = [f"Dropout, bf16, {result['device']}, {result['date']} (`{source}`). Milliseconds, forward (forward + "
             "backward; - where a part did not run: FA2's backward cannot be held to an SM120's occupancy); cost = "
             "time with dropout / without, same implementation, same run."]
    for field in _occupancy_fields(result):
        lines += ["", f"**{OCCUPANCIES[field]}**", ""]
        lines += _header(["case", "shape (b, s, hq, hkv, d)"] + [n for _, n in impls] + ["cost, ours", "cost, FA2"])
        for row in (r for r in result["rows"] if field in r):
            res = row[field]

            def cost(a, b):
                parts = [f"{_ms(res, b, q) / _ms(res, a, q):.2f}×" if _ms(res, a, q) and _ms(res, b, q) else "-"
                         for q in ("fwd", "fwd_bwd")]
                return f"{parts[0]} ({parts[1]})"

            lines.append(f"| {row['case']} | {', '.join(map(str, row['shape']))} | "
                         + " | ".join(_pair(res, i) for i, _ in impls)
                         + f" | {cost('ours', 'ours_dropout')} | {cost('sdpa_flash_fa2', 'sdpa_flash_fa2_dropout')} |")
    return "\n".join(lines)


def flex_summary(flex: dict, flex_source: str, dropout: dict, dropout_source: str) -> str:
    """Two short tables at an SM120's occupancy: forward + backward of the mods cases against FlexAttention on
    torch's sm_120 tiles, and the cost of dropout on the benchmark's grid (4 x 4096) rows."""
    field = "results"
    rows = [r for r in flex["rows"] if field in r and r["case"] in FLEX_SUMMARY_CASES] or \
        [r for r in flex["rows"] if field in r]
    lines = [f"Mods and block sparsity, bf16, forward + backward milliseconds, {flex['device']} at an SM120's CTAs "
             f"per SM, {flex['date']} (`{flex_source}`; shape 4 x 4096, 32/8 heads, d128):", ""]
    lines += _header(["case", "this bundle", "FlexAttention (compiled, sm_120 tiles)", "FlexAttention / ours"])
    for row in rows:
        res = row[field]
        ours, flx = _ms(res, "ours", "fwd_bwd"), _ms(res, "flex_attention_sm120", "fwd_bwd")
        lines.append(f"| {row['case']} | {_fmt(ours, 2)} | {_fmt(flx, 2)} | {_ratio(flx, ours)} |")
    grid = [r for r in dropout["rows"] if field in r and r["shape"][:2] == [4, 4096]] or \
        [r for r in dropout["rows"] if field in r]
    lines += ["", f"Dropout ({_dropout_label(dropout)}), forward + backward milliseconds, {dropout['device']} at an "
              f"SM120's CTAs per SM, {dropout['date']} (`{dropout_source}`; 4 x 4096, 32/8 heads):", ""]
    lines += _header(["case", "without dropout", "with dropout", "cost"])
    for row in grid:
        res = row[field]
        a, b = _ms(res, "ours", "fwd_bwd"), _ms(res, "ours_dropout", "fwd_bwd")
        lines.append(f"| {row['case']} | {_fmt(a, 2)} | {_fmt(b, 2)} | {_ratio(b, a)} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ training step

STEP_MODELS = {
    "llama_compiled": "transformers Llama, forward + loss under `torch.compile`",
    "llama": "transformers Llama, eager",
    "plain": "plain GPT, `torch.compile(fullgraph=True)`",
}


def step_full(step: dict, step_source: str, graphs: dict, graphs_source: str, eager: dict, eager_source: str) -> str:
    """Training-step milliseconds of every model and shape in the three ``bench_step.py`` results (compiled,
    eager, CUDA graphs), ours against SDPA
    in the backend order an SM120 takes (``sdpa_sm120``) and the H100's default order (``sdpa``: cuDNN's wgmma
    kernels), with GPU-busy milliseconds of a profiled step in parentheses."""
    lines = [f"Training step, bf16, {step['device']}, {step['date']} (`{step_source}`, `{graphs_source}`; the "
             f"eager rows {eager['date']}, `{eager_source}`). Step "
             "milliseconds, GPU-busy milliseconds of one profiled step in parentheses. `sdpa_sm120`: SDPA in the "
             "backend order torch takes on an SM120 (FA2 where it runs, else the memory-efficient kernel, which a "
             "compiled transformers model's explicit mask selects); `sdpa`: the H100's default order (cuDNN's wgmma "
             "kernels first: a ceiling, not a peer). Models: 4 layers, 512 wide, GQA 8/2, d128.", ""]
    lines += _header(["model", "tokens", "ours", "`sdpa_sm120`", "`sdpa` (cuDNN)", "ours vs `sdpa_sm120`"])
    for result, suffix in ((step, ""), (eager, ""), (graphs, ", CUDA graphs (`mode=\"reduce-overhead\"`)")):
        for run in result["runs"].values():
            tokens = f"{run['batch']} x {run['seq']}"
            for model, impls in run["models"].items():
                def cell(impl):
                    r = impls.get(impl)
                    return f"{r['step_ms']:.2f} ({r['kernels']['gpu_ms']:.2f})" if r else "n/a"

                ours, peer = impls.get("ours", {}).get("step_ms"), impls.get("sdpa_sm120", {}).get("step_ms")
                lines.append(f"| {STEP_MODELS.get(model, model)}{suffix} | {tokens} | {cell('ours')} | "
                             f"{cell('sdpa_sm120')} | {cell('sdpa')} | {_ratio(peer, ours)} |")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------------- main

FP8_LABELS = ("ours bf16 dense", "ours fp8 dense", "ours all-fp8 dense", "ours bf16 paged16", "ours fp8 paged16",
              "flashinfer bf16 paged16", "flashinfer fp8 paged16")
FP8_PREFILL_LABELS = ("ours bf16", "ours fp8 kv", "ours all fp8", "sdpa_flash_fa2 bf16")


def fp8_full(result: dict, source: str) -> str:
    """The FP8-KV decode table (``bench_fp8.py``): microseconds per call replayed from a CUDA graph and the K/V bytes'
    fraction of the copy bandwidth, then the ratios that count, and the accuracy line."""
    lines = [f"`benchmarks/bench_fp8.py`, {result['device']}, {result['date']}, every call replayed from a CUDA graph "
             f"at an SM120's CTAs per SM (`{source}`). Cells: microseconds per call (the K/V bytes read over the call's "
             f"time as a fraction of the device's {result['copy_gbps']:.0f} GB/s copy rate). FP8 K/V are e4m3 beside a "
             "bf16 q (all-fp8: an e4m3 q too; rows that fit the 16-row decode tile run it with q widened, the rest both "
             "GEMMs as FP8 MMAs, which the H200 emulates); FlashInfer runs its fa2 decode on the same page-16 caches.",
             ""]
    lines += _header(["case", *FP8_LABELS, "fp8 / bf16 (dense, paged16)", "fp8 / FlashInfer fp8 (paged16)"])
    for row in result["rows"]:
        res = row["results"]
        cells = [f"{res[k]['ms'] * 1e3:.1f} ({res[k]['copy_fraction']:.2f})" if "ms" in res.get(k, {}) else "-"
                 for k in FP8_LABELS]
        ratio = " / ".join(_fmt(row.get(f"fp8_over_bf16_{k}"), 2) for k in ("dense", "paged16"))
        lines.append(f"| {row['case']} | " + " | ".join(cells)
                     + f" | {ratio} | {_fmt(row.get('fp8_over_flashinfer_fp8_paged16'), 2)} |")
    if result.get("prefill"):
        lines += ["", "Prefill, eager at an SM120's CTAs per SM, TFLOPS (causal: half the square); all-fp8 = q, k, v "
                  "e4m3 with FP8 MMAs, timed here through the H200's emulation of FP8 mma.sync (two f16 HMMAs and FADDs "
                  "per m16n8k32), not an SM120's QMMA:", ""]
        lines += _header(["case", *FP8_PREFILL_LABELS, "fp8 kv / bf16", "all fp8 / bf16"])
        for row in result["prefill"]:
            res = row["results"]
            cells = [_fmt(res.get(k, {}).get("tflops"), 0) for k in FP8_PREFILL_LABELS]
            lines.append(f"| {row['case']} | " + " | ".join(cells) + f" | {_fmt(row.get('fp8_kv_over_bf16'), 2)} | "
                         f"{_fmt(row.get('all_fp8_over_bf16'), 2)} |")
    acc = result.get("accuracy")
    if acc:
        pub = acc["fa3_published_rmse"]
        all_fp8 = (f", {acc['ours_all_fp8_rmse']:.2e} all-FP8 (e4m3 q, k, v and P)" if "ours_all_fp8_rmse" in acc
                   else "")
        lines += ["", f"Accuracy on FlashAttention-3's outlier inputs ({acc['distribution']}, {acc['shape']}): RMSE "
                  f"against fp32 {acc['ours_fp8_kv_rmse']:.2e} with e4m3 K/V (per-(batch, KV head) amax scales)"
                  f"{all_fp8}, {acc['ours_bf16_rmse']:.2e} in bf16; FlashAttention-3 publishes {pub['fa3_fp8']:.1e} "
                  f"for its all-FP8 kernel (block quantization and incoherent processing) and "
                  f"{pub['baseline_fp8_per_tensor']:.1e} for per-tensor FP8."]
    return "\n".join(lines)


def mla_full(result: dict, source: str) -> str:
    """MLA decode (``bench_mla.py``): microseconds per graph replay and the latent + rope cache bytes' fraction of
    the copy bandwidth; then head-dim-512 prefill TFLOPS against SDPA."""
    def cell(r):
        return f"{r['ms'] * 1e3:.1f} ({r['copy_fraction']:.2f})" if "ms" in r else "-"

    fi = any("flashinfer_mla" in row["results"] for row in result["decode"])
    lines = [f"`benchmarks/bench_mla.py`, {result['device']}, {result['date']}, at an SM120's CTAs per SM, every call "
             f"replayed from a CUDA graph (`{source}`). Cells: microseconds per call (the latent + rope cache bytes read "
             f"over the call's time as a fraction of the device's {result['copy_gbps']:.0f} GB/s copy rate); one "
             "latent head, 512 + 64 columns, every query head packed."
             + (" FlashInfer: its MLA decode (fa2 backend, on the tile it picks on an SM120, "
                   "`probes/stage_flashinfer.sh`) over the same page-64 caches." if fi else "")
             + " SDPA runs the same attention as 576 / 512-wide GQA; only its math backend takes these head dims "
             "(`-`: no kernel, or out of memory).", ""]
    lines += _header(["case", "ours dense", "ours page 64", *(["FlashInfer page 64", "ours / FlashInfer"] if fi else []),
                      "SDPA math"])
    for row in result["decode"]:
        res = row["results"]
        peer = [cell(res.get("flashinfer_mla", {})), _fmt(row.get("ours_paged_over_flashinfer"), 2)] if fi else []
        lines.append(" | ".join([f"| {row['case']}", cell(res.get("ours dense", {})), cell(res.get("ours paged64", {})),
                                 *peer, cell(res.get("sdpa_math", {}))]) + " |")
    lines += ["", "Head dim 512 prefill, eager at an SM120's CTAs per SM, TFLOPS (causal: half the square):", ""]
    lines += _header(["case", "ours", "SDPA memory-efficient", "SDPA math", "ours / best SDPA"])
    for row in result["prefill"]:
        res = row["results"]
        cells = [_fmt(res.get(k, {}).get("tflops")) for k in ("ours", "sdpa_efficient", "sdpa_math")]
        lines.append(f"| {row['case']} | " + " | ".join(cells) + f" | {_fmt(row.get('ours_over_best_sdpa'), 2)} |")
    return "\n".join(lines)


#: (label, our row, SDPA's row) of the host-time table: each of our calls beside what an SDPA user runs for it.
HOST_ROWS = [
    ("forward, plain", "flash_attn_func, unsplit", "torch SDPA flash"),
    ("forward, split-KV", "flash_attn_func, split", "torch SDPA flash"),
    ("forward, low-level `flash_attn_fwd(out=, lse=)`", "flash_attn_fwd(out=, lse=), unsplit", "torch SDPA flash"),
    ("forward, first call of its shape (no plan)", "flash_attn_func, unsplit, no plan", "torch SDPA flash"),
    ("paged varlen forward", "flash_attn_varlen_func, paged", "torch SDPA flash"),
    ("KV-cache step, paged", "flash_attn_with_kvcache, paged", "torch SDPA flash"),
    ("KV-cache step + append", "flash_attn_with_kvcache, paged + append", "torch SDPA flash + cache append"),
    ("KV-cache step + append + rotary", "flash_attn_with_kvcache, paged + append + rotary",
     "torch SDPA flash + cache append + rotary"),
    ("training forward, inputs requiring grad", "train: flash_attn_func fwd alone (inputs require grad)",
     "train: torch SDPA flash fwd alone (inputs require grad)"),
    ("training forward + backward (autograd)", "train: flash_attn_func fwd + bwd (autograd)",
     "train: torch SDPA flash fwd + bwd (autograd)"),
    ("the same, q / k / v transposed views", "train: flash_attn_func fwd + bwd, transposed q/k/v",
     "train: torch SDPA flash fwd + bwd (autograd)"),
]


def host_full(result: dict, source: str) -> str:
    """Host microseconds per call (``overhead.py``): ours beside SDPA's for the same work, same run."""
    us = result["host_us"]
    lines = [f"`benchmarks/overhead.py`, {result['device']} host, {result['date']} (`{source}`): microseconds of host "
             "time per call over back-to-back calls, the median of 7 rounds that take the rows in turn; decode shapes "
             "(4 x 2048 keys, 32 / 8 heads, d128) and, for training, 2 x 128 causal 8 / 2 heads.", ""]
    lines += _header(["call", "ours", "SDPA (torch ops for the same work)", "ours / SDPA"])
    for label, ours, sdpa in HOST_ROWS:
        if ours in us and sdpa in us:
            lines.append(f"| {label} | {us[ours]:.0f} | {us[sdpa]:.0f} | {us[ours] / us[sdpa]:.2f} |")
    return "\n".join(lines)


def bwd_sweep_full(result: dict, source: str) -> str:
    """The backward off its grid (``sweep_bwd.py``): per head dim, ours over each peer (min and geometric mean over the
    swept shapes) and the deterministic mode's cost (max)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sweep_bwd import ratios

    entries = ratios(result["rows"])
    lines = [f"`benchmarks/sweep_bwd.py`, {result['device']}, {result['date']}, at an SM120's CTAs per SM "
             f"(`{source}`): {len(entries)} shapes, head dims 72-224 x GQA 1-16 x 500-8192 tokens. Cells: min / "
             "geometric mean of ours' backward speed over the peer's (n: shapes it ran), and the deterministic "
             "mode's time over the default's (max). Upstream's SM120 path runs to d160; FA2 at an SM120's occupancy "
             "to d96.", ""]
    lines += _header(["head dims", "shapes", "ours / FA4 SM120 path", "ours / FA2", "deterministic cost (max)"])

    def cell(values):
        return f"{min(values):.2f} / {_geomean(values):.2f} (n={len(values)})" if values else "n/a"

    def row(label, part):
        up = [e["over_fa4_sm120_path"] for e in part if "over_fa4_sm120_path" in e]
        fa2 = [e["over_sdpa_flash_fa2"] for e in part if "over_sdpa_flash_fa2" in e]
        det = [e["deterministic_cost"] for e in part if "deterministic_cost" in e]
        return f"| {label} | {len(part)} | {cell(up)} | {cell(fa2)} | {_fmt(max(det) if det else None, 2)} |"

    for lo, hi in ((72, 96), (104, 128), (136, 160), (168, 192), (200, 224)):
        lines.append(row(f"d{lo}-d{hi}", [e for e in entries if lo <= e["head_dim"] <= hi]))
    lines.append(row("all", entries))
    return "\n".join(lines)


def regions(paths: dict) -> dict:
    """{file: {marker name: table text}} from the result files in ``paths``."""
    data = {name: json.loads(path.read_text()) for name, path in paths.items()}
    src = {name: _source(path) for name, path in paths.items()}
    return {
        README: {
            "perf-fwd": fwd_summary(data["fwd"], src["fwd"]),
            "perf-bwd": bwd_summary(data["bwd"], src["bwd"]),
            "perf-serving": serving_summary(data["serving"], src["serving"]),
            "perf-flex": flex_summary(data["flex"], src["flex"], data["dropout"], src["dropout"]),
        },
        PERFORMANCE: {
            "perf-fwd-full": fwd_full(data["fwd"], src["fwd"]),
            "perf-bwd-full": bwd_full(data["bwd"], src["bwd"]),
            "perf-serving-full": serving_full(data["serving"], src["serving"]),
            "perf-flex-full": flex_full(data["flex"], src["flex"]),
            "perf-dropout-full": dropout_full(data["dropout"], src["dropout"]),
            "perf-step-full": step_full(data["step"], src["step"], data["step_graphs"], src["step_graphs"],
                                       data["step_eager"], src["step_eager"]),
            "perf-fp8-full": fp8_full(data["fp8"], src["fp8"]),
            "perf-mla-full": mla_full(data["mla"], src["mla"]),
            "perf-host-full": host_full(data["host"], src["host"]),
            "perf-bwd-sweep-full": bwd_sweep_full(data["bwd_sweep"], src["bwd_sweep"]),
        },
    }


def replace_region(body: str, name: str, text: str) -> str:
    """``body`` with the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` replaced by ``text``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in body or end not in body:
        raise KeyError(f"markers {begin} / {end} not found")
    start, stop = body.index(begin) + len(begin), body.index(end)
    return body[:start] + "\n" + text + "\n" + body[stop:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, path in DEFAULTS.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=Path, default=path, help=f"default: {_source(path)}")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a table is stale")
    args = ap.parse_args(argv)
    paths = {name: getattr(args, name).resolve() for name in DEFAULTS}
    stale = []
    for path, tables in regions(paths).items():
        body = path.read_text()
        new = body
        for name, text in tables.items():
            try:
                new = replace_region(new, name, text)
            except KeyError as e:
                print(f"gen_perf: {_source(path)}: {e.args[0]}", file=sys.stderr)
                return 1
        if new != body:
            stale.append(_source(path))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"gen_perf: stale tables in {', '.join(stale)}: run python tools/gen_perf.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
