"""Regenerate the README performance table from a committed benchmark result (benchmarks/results).

    python tools/gen_perf.py [--result benchmarks/results/fwd_h100_2026-11-22_s6.json] [--check]
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "results" / "fwd_h100_2026-11-22_s6.json"
BEGIN, END = "<!-- perf-table:begin -->", "<!-- perf-table:end -->"
PEERS = [("ours", "this bundle"), ("sdpa_flash_fa2", "SDPA flash (FA2)"), ("fa4_sm120_path", "FA4 b36, SM120 path"),
         ("sdpa_cudnn", "SDPA cuDNN (wgmma, H100 ceiling)")]


def table(result: dict, source: str) -> str:
    lines = [f"Forward, bf16, {result['device']}, {result['date']} (`{source}`). TFLOPS = 2·B·Hq·Sq·Sk·(D+Dv) (×0.5 causal; window rows use the nominal causal FLOPs); "
             "decode rows show K/V GB/s. Ratio = ours / SDPA flash (FA2), same run.", "",
             "| case | " + " | ".join(name for _, name in PEERS) + " | ours / FA2 |",
             "|---" * (len(PEERS) + 2) + "|"]
    for row in result["rows"]:
        decode = row["seqlen_q"] == 1
        key = "kv_gbps" if decode else "tflops"

        def cell(impl):
            r = row["results"].get(impl, {})
            return f"{r[key]:.0f}" if key in r else "n/a"

        ours, fa2 = row["results"].get("ours", {}), row["results"].get("sdpa_flash_fa2", {})
        ratio = f"{ours[key] / fa2[key]:.2f}×" if key in ours and key in fa2 else "n/a"
        lines.append(f"| {row['case']}{' (GB/s)' if decode else ''} | " + " | ".join(cell(i) for i, _ in PEERS) + f" | {ratio} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--result", default=str(DEFAULT))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    path = Path(args.result)
    text = table(json.loads(path.read_text()), path.relative_to(ROOT).as_posix())
    readme = ROOT / "README.md"
    body = readme.read_text()
    start, end = body.index(BEGIN) + len(BEGIN), body.index(END)
    new = body[:start] + "\n" + text + "\n" + body[end:]
    if args.check:
        sys.exit(0 if new == body else 1)
    readme.write_text(new)


if __name__ == "__main__":
    main()
