#!/usr/bin/env python3
"""Regenerate (or check) the docs derived from ``torch-ext/flash_attn_4_sm120/manifest.json``.

What it maintains:
  * ``README.md``: only the region between ``<!-- feature-matrix:begin -->`` and
    ``<!-- feature-matrix:end -->``: one row per feature (``manifest.feature_matrix_markdown()``) and a
    link to CONFLICTS_LOG.md. The rest of the README is hand-written. Without a README, or without the
    markers, the matrix goes to stdout instead.
  * ``CONFLICTS_LOG.md``: the region between ``<!-- conflicts-log:begin -->`` and
    ``<!-- conflicts-log:end -->``: the features (status, API, limits, note), the conditions, one table
    of every interaction with its resolution and reason, then each refused combination with its exact
    message and alternative. Text outside the markers is hand-written and kept.

Algorithm:
  1. Load ``manifest.py`` by path (stdlib only, no package import) and validate the manifest
     (``validate_manifest``: schema 2, length limits, no process words); any error stops here.
  2. Render both regions.
  3. Write them (default), print the matrix (``--stdout``), or compare (``--check``): the check parses
     CONFLICTS_LOG.md and reports every interaction that is missing, stale, or logged with another
     resolution or message, then compares both regions byte for byte. Exit status 1 on any drift.

Usage:  python tools/gen_docs.py [--check | --stdout] [--root REPO]

Stdlib only.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parent.parent
MANIFEST_DIR = Path("torch-ext") / "flash_attn_4_sm120"
README_MARKERS = ("<!-- feature-matrix:begin -->", "<!-- feature-matrix:end -->")
LOG_MARKERS = ("<!-- conflicts-log:begin -->", "<!-- conflicts-log:end -->")

LOG_SKELETON = f"""# Conflicts log

How the features of this bundle combine. Each interaction is `supported` (the features work together as
described), `routed` (the call runs a named variant) or `refused` (the call raises `NotImplementedError`
with the exact message below, which names what to do instead).

Generated from `torch-ext/flash_attn_4_sm120/manifest.json`, which ships in the package: the public API
checks every call with `manifest.check_combination()`, and `fa.manifest.load()` returns the same data.
Edit the manifest, then run `python tools/gen_docs.py`; `python tools/gen_docs.py --check` fails on drift.

{LOG_MARKERS[0]}
{LOG_MARKERS[1]}
"""

SCHEMA_VERSION = 2
NOTE_MAX, SUMMARY_MAX, REASON_MAX = 300, 120, 200
TITLE_MAX, ITEM_MAX, ITEMS_MAX, VARIANT_MAX = 60, 160, 6, 120

#: Numbered work sessions (also in a script name), this repository's issues (upstream ones are written
#: "#1234" or linked) and numbered parts of a run: refused in every tracked text (tests/test_repo_text.py).
PROCESS_WORD_CORE = r"sessions? ?\d+|issues? \d+|parts? \d+"
#: Words that tell how the code got here rather than what it is (they belong in git log); the manifest also
#: carries no dates and no before/after wording.
PROCESS_WORDS = re.compile(
    r"\b(?:" + PROCESS_WORD_CORE + r"|\d{4}-\d{2}-\d{2}|formerly|previously|no longer|used to)\b",
    re.IGNORECASE,
)

_SEMVER = re.compile(r"^\d+\.\d+\.\d+$")
_FEATURE_ID = re.compile(r"^[a-z][a-z0-9_]*$")
_INTERACTION_ID = re.compile(r"^[a-z][a-z0-9_+]*$")
_PLACEHOLDER = re.compile(r"\{[A-Za-z_]+\}")
_NOT_ON_ITS_OWN = re.compile(r"not available (on its own )?yet|available on its own yet")

_TOP_KEYS = {"schema_version", "bundle", "bundle_version", "about", "features", "conditions", "interactions"}
_FEATURE_KEYS = {"id", "name", "title", "status", "since", "upstream", "api", "limits", "note", "summary",
                 "message", "alternative"}
_FEATURE_REQUIRED = _FEATURE_KEYS - {"message", "alternative"}
_CONDITION_KEYS = {"id", "name", "description", "implicit"}
_INTERACTION_KEYS = {"id", "features", "conditions", "resolution", "reason", "variant", "message", "alternative"}


def load_manifest_module(root: Path = REPO_ROOT) -> ModuleType:
    """``manifest.py`` of the checkout at ``root``, loaded by path under a name unique to that path."""
    path = root / MANIFEST_DIR / "manifest.py"
    name = "_fa4_sm120_manifest_" + re.sub(r"\W", "_", str(path.resolve()))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def _strings(value, where: str = ""):
    """(path, string) for every string in a JSON value."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, list):
        for n, v in enumerate(value):
            yield from _strings(v, f"{where}[{n}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{where}.{k}" if where else k)


def validate_manifest(data: dict, statuses=("implemented", "planned"),
                      resolutions=("supported", "routed", "refused")) -> list[str]:
    """Every schema problem in a loaded (``{version}``-rendered) manifest, as readable strings."""
    errors: list[str] = []
    err = errors.append
    for key in sorted(set(data) - _TOP_KEYS):
        err(f"top level: unknown key {key!r}")
    if data.get("schema_version") != SCHEMA_VERSION:
        err(f"schema_version must be {SCHEMA_VERSION}, got {data.get('schema_version')!r}")
    version = data.get("bundle_version", "")
    if not _SEMVER.match(str(version)):
        err(f"bundle_version must look like 1.2.3, got {version!r}")
        version = "0.0.0"
    for where, s in _strings(data):
        for ph in _PLACEHOLDER.findall(s):
            err(f"{where}: unrendered placeholder {ph}")
        m = PROCESS_WORDS.search(s)
        if m:
            err(f"{where}: process word {m.group(0)!r} (say what is true now; history belongs in git log)")

    def short(where: str, key: str, text, limit: int) -> None:
        if not isinstance(text, str) or not text.strip():
            err(f"{where}: {key} must be a non-empty string")
        elif len(text) > limit:
            err(f"{where}: {key} is {len(text)} characters, at most {limit}")

    def since_ok(where: str, since) -> None:
        if not _SEMVER.match(str(since)):
            err(f"{where}: since must look like 1.2.3, got {since!r}")
        elif _version_tuple(since) > _version_tuple(version):
            err(f"{where}: since {since} is newer than bundle_version {version}")

    def names_in(where: str, message: str, names: list[str]) -> None:
        for n in names:
            if n.lower() not in message.lower():
                err(f"{where}: message does not name {n!r}: {message!r}")

    def refusal_ok(where: str, item: dict, names: list[str], must_name_version: bool) -> None:
        message, alt = item.get("message", ""), item.get("alternative", "")
        if not message or not alt:
            err(f"{where}: a refusal needs message and alternative")
            return
        if alt not in message:
            err(f"{where}: message does not name the alternative {alt!r}")
        if must_name_version and version not in message:
            err(f"{where}: message does not say which version lacks it ({version})")
        names_in(where, message, names)

    seen: set[str] = set()
    features: dict[str, dict] = {}
    for f in data.get("features", []):
        fid = f.get("id", "?")
        where = f"feature {fid}"
        for key in sorted(set(f) - _FEATURE_KEYS):
            err(f"{where}: unknown key {key!r}")
        for key in sorted(_FEATURE_REQUIRED - set(f)):
            err(f"{where}: missing {key}")
        if not _FEATURE_ID.match(str(fid)):
            err(f"{where}: id must match {_FEATURE_ID.pattern}")
        if fid in seen:
            err(f"{where}: duplicate id")
        seen.add(fid)
        features[fid] = f
        if not f.get("name"):
            err(f"{where}: missing name")
        short(where, "title", f.get("title"), TITLE_MAX)
        short(where, "note", f.get("note"), NOTE_MAX)
        short(where, "summary", f.get("summary"), SUMMARY_MAX)
        up = f.get("upstream")
        if up is not None:
            if not (isinstance(up, dict) and up.get("repo") and isinstance(up.get("number"), int)):
                err(f"{where}: upstream is null (the bundle's own) or has repo and an integer number")
            elif up.get("url") != f"https://github.com/{up['repo']}/pull/{up['number']}":
                err(f"{where}: upstream url {up.get('url')!r} does not match {up['repo']} #{up['number']}")
            elif set(up) != {"repo", "number", "url"}:
                err(f"{where}: upstream has exactly repo, number and url")
        for key in ("api", "limits"):
            items = f.get(key)
            if not isinstance(items, list) or not all(isinstance(x, str) and x.strip() for x in items):
                err(f"{where}: {key} must be a list of non-empty strings")
                continue
            if len(items) > ITEMS_MAX:
                err(f"{where}: {key} has {len(items)} entries, at most {ITEMS_MAX}")
            for x in items:
                if len(x) > ITEM_MAX:
                    err(f"{where}: a {key} entry is {len(x)} characters, at most {ITEM_MAX}: {x[:50]!r}...")
        status = f.get("status")
        if status not in statuses:
            err(f"{where}: status must be one of {statuses}, got {status!r}")
        elif status == "implemented":
            since_ok(where, f.get("since"))
            for key in ("api", "limits"):
                if not f.get(key):
                    err(f"{where}: an implemented feature states its {key}")
            for key in ("message", "alternative"):
                if key in f:
                    err(f"{where}: an implemented feature has no {key}")
        else:
            if f.get("since") is not None:
                err(f"{where}: a planned feature has since null")
            refusal_ok(where, f, [f.get("name", fid)], must_name_version=True)

    conditions: dict[str, dict] = {}
    for c in data.get("conditions", []):
        cid = c.get("id", "?")
        where = f"condition {cid}"
        for key in sorted(set(c) - _CONDITION_KEYS):
            err(f"{where}: unknown key {key!r}")
        if not _FEATURE_ID.match(str(cid)):
            err(f"{where}: id must match {_FEATURE_ID.pattern}")
        if cid in seen:
            err(f"{where}: duplicate id (feature and condition ids share one namespace)")
        seen.add(cid)
        conditions[cid] = c
        if not c.get("name") or not c.get("description"):
            err(f"{where}: needs name and description")
        if not isinstance(c.get("implicit"), bool):
            err(f"{where}: implicit must be true or false")

    interaction_ids: set[str] = set()
    involved_sets: dict[frozenset, str] = {}
    for c in data.get("interactions", []):
        cid = c.get("id", "?")
        where = f"interaction {cid}"
        for key in sorted(set(c) - _INTERACTION_KEYS):
            err(f"{where}: unknown key {key!r}")
        if not _INTERACTION_ID.match(str(cid)):
            err(f"{where}: id must match {_INTERACTION_ID.pattern}")
        if cid in interaction_ids:
            err(f"{where}: duplicate id")
        interaction_ids.add(cid)
        if not isinstance(c.get("conditions"), list):
            err(f"{where}: conditions must be a list (empty when none)")
        fids, cids = list(c.get("features", [])), list(c.get("conditions") or [])
        if not fids:
            err(f"{where}: involves no feature")
        if len(fids) + len(cids) < 2:
            err(f"{where}: an interaction involves at least two features or conditions")
        if len(set(fids)) != len(fids) or len(set(cids)) != len(cids):
            err(f"{where}: lists a feature or condition twice")
        for i in fids:
            if i not in features:
                err(f"{where}: references unknown feature {i!r}")
        for i in cids:
            if i not in conditions:
                err(f"{where}: references unknown condition {i!r}")
        key = frozenset(fids) | frozenset(cids)
        if key in involved_sets:
            err(f"{where}: same features and conditions as interaction {involved_sets[key]}")
        involved_sets.setdefault(key, cid)
        short(where, "reason", c.get("reason"), REASON_MAX)
        planned = [i for i in fids if i in features and features[i].get("status") != "implemented"]
        resolution = c.get("resolution")
        if resolution not in resolutions:
            err(f"{where}: resolution must be one of {resolutions}, got {resolution!r}")
            continue
        if resolution == "routed":
            short(where, "variant", c.get("variant"), VARIANT_MAX)
        elif "variant" in c:
            err(f"{where}: only a routed interaction names a variant")
        if resolution == "refused":
            names = [features[i]["name"] for i in fids if i in features]
            names += [conditions[i]["name"] for i in cids if i in conditions]
            refusal_ok(where, c, names, must_name_version=bool(planned))
            message = c.get("message", "")
            # The "(neither is available on its own yet)" asides must stay true as features land.
            if "neither is available on its own yet" in message and len(planned) != len(fids):
                err(f"{where}: message says neither is available, but some involved features are implemented")
            elif _NOT_ON_ITS_OWN.search(message) and not planned:
                err(f"{where}: message says a feature is not available, but all involved features are implemented")
        else:
            if planned:
                err(f"{where}: {resolution}, but {', '.join(planned)} is planned: it can only be refused")
            for key in ("message", "alternative"):
                if key in c:
                    err(f"{where}: a {resolution} interaction has no {key}")
    return errors


# ---------------------------------------------------------------------------------------------- rendering


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _names(c: dict, data: dict) -> list[str]:
    features = {f["id"]: f for f in data["features"]}
    conditions = {x["id"]: x for x in data["conditions"]}
    return [features[i]["name"] for i in c["features"]] + [conditions[i]["name"] for i in c["conditions"]]


def _resolution_cell(c: dict) -> str:
    if c["resolution"] == "routed":
        return f"routed: {_cell(c['variant'])}"
    if c["resolution"] == "refused":
        return f"[refused](#{c['id'].replace('+', '')})"
    return "supported"


def render_conflicts_log(data: dict, upstream_link) -> str:
    """The generated region of CONFLICTS_LOG.md (without the markers)."""
    out = [
        "",
        f"## Features ({data['bundle']} {data['bundle_version']})",
        "",
        "| Feature (`id`) | Status | Upstream | API | Limits | Note |",
        "|---|---|---|---|---|---|",
    ]
    for f in data["features"]:
        status = f"{f['status']} ({f['since']})" if f.get("since") else f["status"]
        api = "; ".join(f["api"]) or "-"
        limits = "; ".join(f["limits"]) or "-"
        out.append(f"| {_cell(f['title'])} (`{f['id']}`) | {status} | {upstream_link(f)} | {_cell(api)} "
                   f"| {_cell(limits)} | {_cell(f['note'])} |")
    out += [
        "",
        "## Conditions",
        "",
        "Facts about a call that change how features interact; the API passes the ones that hold to",
        "`check_combination` (implicit ones hold for every call).",
        "",
    ]
    for x in data["conditions"]:
        out.append(f"- `{x['id']}` ({x['name']}): {x['description']}")
    refused = [c for c in data["interactions"] if c["resolution"] == "refused"]
    counts = {r: sum(c["resolution"] == r for c in data["interactions"]) for r in ("supported", "routed", "refused")}
    out += [
        "",
        "## Interactions",
        "",
        f"{len(data['interactions'])} interactions: {counts['supported']} supported, {counts['routed']} routed, "
        f"{counts['refused']} refused.",
        "",
        "| Interaction (`id`) | Resolution | Reason |",
        "|---|---|---|",
    ]
    for c in data["interactions"]:
        out.append(f"| {_cell(' × '.join(_names(c, data)))} (`{c['id']}`) | {_resolution_cell(c)} "
                   f"| {_cell(c['reason'])} |")
    out += [
        "",
        "## Refused combinations",
        "",
        "Each raises `NotImplementedError` with exactly this message.",
        "",
    ]
    for c in refused:
        out += [
            f"### `{c['id']}`",
            f"- Message: \"{c['message']}\"",
            f"- Instead: {c['alternative']}.",
        ]
    return "\n".join(out)


def split_region(text: str, markers: tuple[str, str]):
    """(before including begin marker, body, end marker onwards), or None without both markers."""
    begin, end = markers
    i = text.find(begin)
    j = text.find(end, i + len(begin)) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    return text[: i + len(begin)], text[i + len(begin): j], text[j:]


def replace_region(text: str, markers: tuple[str, str], body: str):
    parts = split_region(text, markers)
    if parts is None:
        return None
    return parts[0] + "\n" + body.rstrip("\n") + "\n" + parts[2]


_ROW = re.compile(r"^\| .*? \(`([a-z0-9_+]+)`\) \| (supported|routed|\[refused\]|[a-z]+)", re.MULTILINE)
_HEADING = re.compile(r"^### `([^`]+)`", re.MULTILINE)
_MESSAGE = re.compile(r"^- Message: \"(.*)\"$", re.MULTILINE)


def check_conflicts_log(text: str, data: dict) -> list[str]:
    """Drift between CONFLICTS_LOG.md and the manifest: interactions, resolutions, refusal messages."""
    problems: list[str] = []
    ids = [c["id"] for c in data["interactions"]]
    logged: dict[str, str] = {}
    for m in _ROW.finditer(text):
        if "+" in m.group(1):  # interaction rows; feature ids have no '+'
            if m.group(1) in logged:
                problems.append(f"CONFLICTS_LOG.md: interaction {m.group(1)} has two rows")
            logged[m.group(1)] = m.group(2).strip("[]")
    for stale in sorted(set(logged) - set(ids)):
        problems.append(f"CONFLICTS_LOG.md: row {stale} is not an interaction in the manifest")
    heads = list(_HEADING.finditer(text))
    sections: dict[str, str] = {}
    for n, m in enumerate(heads):
        stop = heads[n + 1].start() if n + 1 < len(heads) else len(text)
        sections[m.group(1)] = text[m.end(): stop]
    refused = {c["id"] for c in data["interactions"] if c["resolution"] == "refused"}
    for stale in sorted(set(sections) - refused):
        problems.append(f"CONFLICTS_LOG.md: section {stale} is not a refused interaction in the manifest")
    for c in data["interactions"]:
        if c["id"] not in logged:
            problems.append(f"CONFLICTS_LOG.md: interaction {c['id']} is missing")
        elif logged[c["id"]] != c["resolution"]:
            problems.append(f"CONFLICTS_LOG.md: {c['id']} is logged as {logged[c['id']]}, "
                            f"manifest says {c['resolution']}")
        if c["resolution"] == "refused":
            body = sections.get(c["id"])
            m = _MESSAGE.search(body) if body is not None else None
            if body is None:
                problems.append(f"CONFLICTS_LOG.md: refused interaction {c['id']} has no section")
            elif not m or m.group(1) != c["message"]:
                problems.append(f"CONFLICTS_LOG.md: {c['id']} message differs from the manifest's")
    return problems


# ---------------------------------------------------------------------------------------------- CLI


def run(root: Path, mode: str, out=sys.stdout, err=sys.stderr) -> int:
    """``mode`` is ``write``, ``check`` or ``stdout``. Returns the exit status."""
    manifest = load_manifest_module(root)
    data = manifest.load()
    errors = validate_manifest(data, manifest.STATUSES, manifest.RESOLUTIONS)
    if errors:
        for e in errors:
            print(f"manifest.json: {e}", file=err)
        return 1
    matrix = manifest.feature_matrix_markdown()
    if mode == "stdout":
        out.write(matrix)
        return 0

    problems: list[str] = []
    readme_path, log_path = root / "README.md", root / "CONFLICTS_LOG.md"
    readme = readme_path.read_text(encoding="utf-8") if readme_path.is_file() else None
    new_readme = replace_region(readme, README_MARKERS, matrix) if readme is not None else None
    if new_readme is None:
        why = "README.md does not exist" if readme is None else "README.md has no feature-matrix markers"
        if mode == "check":
            print(f"gen_docs: README check skipped: {why}", file=err)
        else:
            print(f"gen_docs: {why}; the feature matrix follows on stdout", file=err)
            out.write(matrix)

    log = log_path.read_text(encoding="utf-8") if log_path.is_file() else None
    log_body = render_conflicts_log(data, manifest.upstream_link)
    new_log = replace_region(log if log is not None else LOG_SKELETON, LOG_MARKERS, log_body)

    if mode == "check":
        if log is None:
            problems.append("CONFLICTS_LOG.md does not exist")
        else:
            problems += check_conflicts_log(log, data)
            if new_log is None:
                problems.append(f"CONFLICTS_LOG.md lacks the markers {LOG_MARKERS[0]} ... {LOG_MARKERS[1]}")
            elif new_log != log:
                problems.append("CONFLICTS_LOG.md: generated region is stale")
        if new_readme is not None and new_readme != readme:
            problems.append("README.md: feature-matrix region is stale")
        for p in problems:
            print(p, file=err)
        if problems:
            print("gen_docs: run `python tools/gen_docs.py` to regenerate", file=err)
            return 1
        return 0

    if new_log is None:
        print(f"gen_docs: CONFLICTS_LOG.md lacks the markers {LOG_MARKERS[0]} ... {LOG_MARKERS[1]}", file=err)
        return 1
    if new_log != log:
        log_path.write_text(new_log, encoding="utf-8")
        print(f"gen_docs: wrote {log_path}", file=err)
    if new_readme is not None and new_readme != readme:
        readme_path.write_text(new_readme, encoding="utf-8")
        print(f"gen_docs: wrote {readme_path}", file=err)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="write nothing; exit 1 if the docs drifted")
    group.add_argument("--stdout", action="store_true", help="print the README feature matrix; write nothing")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    mode = "check" if args.check else "stdout" if args.stdout else "write"
    return run(args.root, mode)


if __name__ == "__main__":
    sys.exit(main())
