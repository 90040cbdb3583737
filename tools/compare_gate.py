"""Compare two sets of conformance-gate reports config by config.

    python tools/compare_gate.py --base BASE.json [BASE2.json.gz ...] --new NEW.json [NEW2.json ...] [--json OUT]

Each side is one or more report files written by ``tools/conformance.py --json`` (plain or gzipped); shards of
one run are merged, and configs are matched by name. For every config present on both sides the script
compares whether the gate passed (``ok``) and what the compiled kernels cost: registers (``regs``,
``regs_cubin``), spills (``spill_stores``, ``spill_loads``), stack, shared memory (``smem_bytes``,
``smem_dynamic``, ``smem_static``), the count of every SASS instruction family, and each kernel entry's
registers, spills, stack and static shared memory (as a multiset: entry names carry module paths, which a file
move changes without changing the code).

It prints how many configs were compared, how many are identical, each differing config with what differs,
and the configs found on one side only. ``--json OUT`` saves the comparison. Exit status: 0 when every
config on both sides is identical and none is missing, 1 otherwise (2: unreadable input). ``--partial``: the new
side is a spot check (``tools/conformance.py --only ...``), so configs found only in the base do not count.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

#: Per-config fields compared as they are.
FIELDS = ("ok", "regs", "regs_cubin", "spill_stores", "spill_loads", "stack", "smem_bytes", "smem_dynamic",
          "smem_static")
#: Per-kernel-entry fields compared (as a sorted multiset of tuples).
KERNEL_FIELDS = ("regs", "regs_cubin", "spill_stores", "spill_loads", "stack", "static_smem")


def load_reports(paths: Iterable[str]) -> tuple[dict, list]:
    """(configs by name, the files' headers) of report files, gzipped or not. A name found twice with
    different contents is an error: shards of one run do not overlap."""
    configs: dict = {}
    headers = []
    for path in paths:
        p = Path(path)
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt") as f:
            doc = json.load(f)
        headers.append({"file": str(p), **{k: doc.get(k) for k in ("target", "ptxas", "ptxas_flags", "ok")},
                        "configs": len(doc.get("configs", []))})
        for c in doc.get("configs", []):
            name = c["name"]
            if name in configs and diff_config(configs[name], c):
                raise ValueError(f"{name} appears twice with different results (in {path} and an earlier file)")
            configs[name] = c
    return configs, headers


def _kernels(c: dict) -> list:
    return sorted(tuple(k.get(f) for f in KERNEL_FIELDS) for k in c.get("kernels", []))


def diff_config(base: dict, new: dict) -> dict:
    """What differs between one config's two reports: {field: [base, new]}, {"families": {family: [base,
    new]}}, {"kernels": [base entries, new entries]}; empty when identical."""
    out: dict = {}
    for f in FIELDS:
        if base.get(f) != new.get(f):
            out[f] = [base.get(f), new.get(f)]
    fb, fn = base.get("families") or {}, new.get("families") or {}
    fam = {k: [fb.get(k, 0), fn.get(k, 0)] for k in sorted(set(fb) | set(fn)) if fb.get(k, 0) != fn.get(k, 0)}
    if fam:
        out["families"] = fam
    kb, kn = _kernels(base), _kernels(new)
    if kb != kn:
        out["kernels"] = [[dict(zip(KERNEL_FIELDS, k)) for k in kb], [dict(zip(KERNEL_FIELDS, k)) for k in kn]]
    return out


def compare(base: dict, new: dict) -> dict:
    """The comparison of two merged report sets (``load_reports``)."""
    common = sorted(set(base) & set(new))
    differing = {}
    for name in common:
        d = diff_config(base[name], new[name])
        if d:
            differing[name] = d
    return {
        "compared": len(common),
        "identical": len(common) - len(differing),
        "differing": differing,
        "only_base": sorted(set(base) - set(new)),
        "only_new": sorted(set(new) - set(base)),
    }


def _describe(d: dict) -> str:
    parts = [f"{f} {v[0]} -> {v[1]}" for f, v in d.items() if f not in ("families", "kernels")]
    if "families" in d:
        parts.append("families " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in d["families"].items()))
    if "kernels" in d:
        parts.append("kernel entries differ")
    return "; ".join(parts)


def format_summary(result: dict, limit: Optional[int] = None, show_only_base: bool = True) -> str:
    lines = [f"configs compared: {result['compared']}",
             f"identical:        {result['identical']}",
             f"differing:        {len(result['differing'])}",
             f"only in base:     {len(result['only_base'])}",
             f"only in new:      {len(result['only_new'])}"]
    items = list(result["differing"].items())
    for name, d in items[:limit]:
        lines.append(f"  DIFF {name}: {_describe(d)}")
    if limit is not None and len(items) > limit:
        lines.append(f"  ... {len(items) - limit} more differing configs (see --json)")
    for side in ("only_base", "only_new") if show_only_base else ("only_new",):
        names = result[side]
        shown = names if limit is None else names[:limit]
        for name in shown:
            lines.append(f"  {side.replace('_', ' ').upper()}: {name}")
        if len(shown) < len(names):
            lines.append(f"  ... {len(names) - len(shown)} more {side.replace('_', ' ')}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/compare_gate.py",
                                description="Compare conformance-gate reports (registers, spills, shared memory, "
                                            "SASS instruction families) config by config.")
    p.add_argument("--base", nargs="+", required=True, metavar="REPORT", help="report files of the reference run")
    p.add_argument("--new", nargs="+", required=True, metavar="REPORT", help="report files of the run to check")
    p.add_argument("--json", metavar="OUT", help="write the comparison (with the inputs' headers) as JSON")
    p.add_argument("--partial", action="store_true",
                   help="the new reports cover a subset (a spot check): configs only in the base are not a difference")
    p.add_argument("--limit", type=int, default=50, help="differing / missing configs listed (default %(default)s; "
                                                          "0: all)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        base, base_headers = load_reports(args.base)
        new, new_headers = load_reports(args.new)
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_gate: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    result = compare(base, new)
    print(format_summary(result, args.limit or None, show_only_base=not args.partial))
    same = not result["differing"] and not result["only_new"] and (args.partial or not result["only_base"])
    print("IDENTICAL" if same else "DIFFERENT")
    if args.json:
        doc = {"base": base_headers, "new": new_headers, "fields": list(FIELDS), "kernel_fields": list(KERNEL_FIELDS),
               "partial": args.partial, "identical_overall": same, **result}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
