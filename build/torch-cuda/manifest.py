"""What this bundle implements, and how each feature interaction resolves (reads ``manifest.json``).

``manifest.json`` ships inside the package (schema 2) and is the single source for:
  * ``features``: id, name, title, status (``implemented`` or ``planned``), since, upstream (the PR it
    comes from, or null for the bundle's own), api (the public functions and arguments), limits (the
    supported envelope), a note of at most 300 characters and a summary of at most 120 (the README row);
    a planned feature carries the refusal ``message`` users see and its ``alternative``;
  * ``conditions``: facts about a call that change how features interact (``seqlen_q_gt_seqlen_k``, ...);
    an ``implicit`` condition holds for every call (the 99 KB shared-memory budget);
  * ``interactions``: a set of features (plus conditions), its ``resolution`` (``supported``, ``routed``
    to a named ``variant``, or ``refused`` with the exact ``message`` and an ``alternative``) and a
    ``reason`` of at most 200 characters.

The public API checks calls against it:
  1. ``require(feature_id)`` raises ``NotImplementedError(message)`` unless the feature is implemented.
  2. ``check_combination(ids)`` raises the message of the most specific ``refused`` interaction whose
     features and conditions are all present (most features first, then most conditions, then file
     order), then calls ``require`` on every feature id.
Unknown ids raise ``KeyError``: they are bugs in the caller, not user errors.

Stdlib only and importable on its own (``tools/gen_docs.py`` and the tests load it by path). The JSON
is read once, on first use; strings may contain ``{version}``, replaced by the manifest's
``bundle_version``.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Iterable

MANIFEST_PATH = Path(__file__).with_name("manifest.json")
STATUSES = ("implemented", "planned")
RESOLUTIONS = ("supported", "routed", "refused")


def _render(value, version: str):
    if isinstance(value, str):
        return value.replace("{version}", version)
    if isinstance(value, list):
        return [_render(v, version) for v in value]
    if isinstance(value, dict):
        return {k: _render(v, version) for k, v in value.items()}
    return value


@lru_cache(maxsize=None)
def _data() -> dict:
    raw = json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))
    return _render(raw, raw["bundle_version"])


@lru_cache(maxsize=None)
def _index() -> tuple[dict, dict, frozenset, tuple]:
    data = _data()
    features = {f["id"]: f for f in data["features"]}
    conditions = {c["id"]: c for c in data["conditions"]}
    implicit = frozenset(c["id"] for c in data["conditions"] if c.get("implicit"))
    refused = []
    for order, c in enumerate(data["interactions"]):
        if c["resolution"] == "refused":
            conds = c.get("conditions", [])
            involved = frozenset(c["features"]) | frozenset(conds)
            refused.append(((-len(c["features"]), -len(conds), order), involved, c["message"]))
    refused.sort(key=lambda r: r[0])
    return features, conditions, implicit, tuple((inv, msg) for _, inv, msg in refused)


def load() -> dict:
    """The whole manifest with ``{version}`` rendered (a copy: mutating it changes nothing here)."""
    return copy.deepcopy(_data())


def _feature(feature_id: str) -> dict:
    features = _index()[0]
    try:
        return features[feature_id]
    except KeyError:
        raise KeyError(f"unknown feature id {feature_id!r}; known: {', '.join(features)}") from None


def feature(feature_id: str) -> dict:
    """The manifest entry of one capability group (a copy)."""
    return copy.deepcopy(_feature(feature_id))


def is_implemented(feature_id: str) -> bool:
    return _feature(feature_id)["status"] == "implemented"


def require(feature_id: str) -> None:
    """Raise ``NotImplementedError`` with the manifest's message unless ``feature_id`` is implemented."""
    f = _feature(feature_id)
    if f["status"] != "implemented":
        raise NotImplementedError(f["message"])


def check_combination(feature_ids: Iterable[str]) -> None:
    """Refuse a call using ``feature_ids`` (feature ids plus condition ids that hold for it).

    Raises the message of the most specific refused interaction contained in the call, else the message
    of the first planned feature (in the caller's order).
    """
    ids = list(dict.fromkeys(feature_ids))
    features, conditions, implicit, refused = _index()
    unknown = [i for i in ids if i not in features and i not in conditions]
    if unknown:
        known = ", ".join([*features, *conditions])
        raise KeyError(f"unknown feature or condition id(s) {', '.join(map(repr, unknown))}; known: {known}")
    present = frozenset(ids) | implicit
    for involved, message in refused:
        if involved <= present:
            raise NotImplementedError(message)
    for i in ids:
        if i in features:
            require(i)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def upstream_link(f: dict) -> str:
    """Markdown link to the PR a feature comes from, or ``bundle`` for the bundle's own features."""
    up = f.get("upstream")
    if not up:
        return "bundle"
    return f"[{up['repo'].split('/')[1]} #{up['number']}]({up['url']})"


def feature_matrix_markdown() -> str:
    """The README feature matrix: one row per feature (title and id, status, since, upstream, summary),
    then a link to CONFLICTS_LOG.md, which lists the interactions."""
    data = _data()
    lines = [
        f"Status in {data['bundle']} {data['bundle_version']}, generated from "
        "`torch-ext/flash_attn_4_sm120/manifest.json` by `tools/gen_docs.py`.",
        "",
        "| Feature (`id`) | Status | Since | Upstream | Summary |",
        "|---|---|---|---|---|",
    ]
    for f in data["features"]:
        since = f.get("since") or "-"
        lines.append(f"| {_cell(f['title'])} (`{f['id']}`) | {f['status']} | {since} | {upstream_link(f)} "
                     f"| {_cell(f['summary'])} |")
    lines += ["", "How features combine (supported, routed or refused, and why) is in "
              "[CONFLICTS_LOG.md](CONFLICTS_LOG.md); `fa.manifest.feature(id)` gives a feature's API and limits."]
    return "\n".join(lines) + "\n"
