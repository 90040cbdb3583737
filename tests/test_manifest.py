"""The feature manifest: schema, length limits, the behaviour of require/check_combination per entry, and doc drift.

Every feature and every interaction in ``manifest.json`` gets its own parametrized case (named by its
id). The validator and the CONFLICTS_LOG checker are also fed broken inputs, so a check that silently
accepts everything fails here. CPU only, stdlib + pytest.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import io
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "torch-ext" / "flash_attn_4_sm120"


def _load_by_path(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_docs = _load_by_path("_gen_docs_under_test", ROOT / "tools" / "gen_docs.py")
manifest = gen_docs.load_manifest_module(ROOT)
DATA = manifest.load()
VERSION = DATA["bundle_version"]
FEATURES = {f["id"]: f for f in DATA["features"]}
CONDITIONS = {c["id"]: c for c in DATA["conditions"]}
IMPLICIT = {c["id"] for c in DATA["conditions"] if c["implicit"]}
INTERACTIONS = DATA["interactions"]
INTERACTION_IDS = [c["id"] for c in INTERACTIONS]

#: What is implemented today. Change it in the same commit that flips a status in manifest.json.
IMPLEMENTED_TODAY = {"forward", "causal", "gqa", "return_lse", "compile_cache", "conformance_gate", "head_dim_512", "mla",
                     "sliding_window", "softcap", "learnable_sink", "varlen",
                     "head_dim_any", "head_dim_256", "head_dim_v_differs", "tma_ws_forward", "pack_gqa",
                     "split_kv", "combine", "paged_kv", "kvcache_api", "backward", "deterministic_backward",
                     "score_mod", "block_sparsity", "dropout", "fp8", "scheduler_metadata",
                     "batch_invariant"}


def _involved(interaction: dict) -> list[str]:
    return [*interaction["features"], *interaction["conditions"]]


def _names(interaction: dict) -> list[str]:
    return [FEATURES[i]["name"] for i in interaction["features"]] + [
        CONDITIONS[i]["name"] for i in interaction["conditions"]
    ]


def _refusal(ids) -> str | None:
    """The message check_combination raises for ``ids``, or None."""
    try:
        manifest.check_combination(ids)
    except NotImplementedError as e:
        return str(e)
    return None


# ------------------------------------------------------------------------------------------------ schema


def test_schema_is_valid():
    assert gen_docs.validate_manifest(DATA, manifest.STATUSES, manifest.RESOLUTIONS) == []


def test_schema_version_is_2():
    assert DATA["schema_version"] == 2 == gen_docs.SCHEMA_VERSION
    assert set(DATA) == {"schema_version", "bundle", "bundle_version", "about", "features", "conditions",
                         "interactions"}


def test_ids_are_unique():
    ids = [f["id"] for f in DATA["features"]] + [c["id"] for c in DATA["conditions"]]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(INTERACTION_IDS) == len(set(INTERACTION_IDS))


def test_statuses_and_resolutions_are_valid():
    assert {f["status"] for f in DATA["features"]} <= set(manifest.STATUSES)
    assert {c["resolution"] for c in INTERACTIONS} <= set(manifest.RESOLUTIONS)


@pytest.mark.parametrize("fid", list(FEATURES), ids=list(FEATURES))
def test_feature_text_is_within_its_limits(fid):
    f = FEATURES[fid]
    assert 0 < len(f["note"]) <= 300, len(f["note"])
    assert 0 < len(f["summary"]) <= 120, len(f["summary"])
    assert len(f["title"]) <= gen_docs.TITLE_MAX
    for item in f["api"] + f["limits"]:
        assert len(item) <= gen_docs.ITEM_MAX, item
    if f["status"] == "implemented":
        assert f["api"] and f["limits"] and gen_docs._SEMVER.match(f["since"])
    else:
        assert f["since"] is None and f["message"] and f["alternative"]


@pytest.mark.parametrize("interaction", INTERACTIONS, ids=INTERACTION_IDS)
def test_interaction_reason_is_within_its_limit(interaction):
    assert 0 < len(interaction["reason"]) <= 200, len(interaction["reason"])
    assert ("variant" in interaction) == (interaction["resolution"] == "routed")
    assert ("message" in interaction) == ("alternative" in interaction) == (interaction["resolution"] == "refused")


def test_manifest_has_no_process_words():
    raw = (PKG / "manifest.json").read_text(encoding="utf-8")
    assert gen_docs.PROCESS_WORDS.findall(raw) == []
    for text in ("tuned in session 41", "see issue 20", "session44.sh part 5", "until 2026-11-27",  # process-words: example
                 "previously 1.3x", "Sessions 33 and 37"):  # process-words: example
        assert gen_docs.PROCESS_WORDS.search(text), text
    for text in ("flash-attention #2336", "head dims 8-256", "101376 bytes", "192/128"):
        assert not gen_docs.PROCESS_WORDS.search(text), text


def test_bundle_version_matches_the_package():
    tree = ast.parse((PKG / "_version.py").read_text(encoding="utf-8"))
    versions = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets)
    ]
    assert versions == [VERSION]


def test_implemented_features_are_exactly_todays():
    assert {f["id"] for f in DATA["features"] if f["status"] == "implemented"} == IMPLEMENTED_TODAY


def test_forward_limits():
    limits = " ".join(FEATURES["forward"]["limits"])
    assert "bfloat16, float16" in limits and "multiples of 8 in [8, 256]" in limits and "101376" in limits
    assert any("flash_attn_func" in a for a in FEATURES["forward"]["api"])


def test_upstream_references_are_the_bundled_prs():
    refs = {f["id"]: (f["upstream"]["repo"], f["upstream"]["number"]) for f in DATA["features"] if f["upstream"]}
    fa = "Dao-AILab/flash-attention"
    assert refs == {
        "forward": (fa, 2329), "backward": (fa, 2330), "varlen": (fa, 2333), "split_kv": (fa, 2336),
        "paged_kv": (fa, 2348), "tma_ws_forward": (fa, 2349), "block_sparsity": (fa, 2389),
        "dropout": (fa, 2439), "pack_gqa": (fa, 2484), "stmatrix_tma_o": (fa, 2553),
        "fp8": ("NVIDIA/cutlass", 3030),
    }


def test_strings_are_rendered_with_the_version():
    raw = json.loads((PKG / "manifest.json").read_text(encoding="utf-8"))
    assert "{version}" in json.dumps(raw)
    assert "{version}" not in json.dumps(DATA)


# ------------------------------------------------------------------------------------- per-feature behaviour


@pytest.mark.parametrize("fid", list(FEATURES), ids=list(FEATURES))
def test_feature_follows_its_status(fid):
    f = FEATURES[fid]
    assert manifest.feature(fid) == f
    if f["status"] == "implemented":
        assert manifest.is_implemented(fid)
        manifest.require(fid)
        manifest.check_combination(["forward", fid])
        assert f["api"] and f["limits"], "an implemented feature states its api and limits"
    else:
        assert not manifest.is_implemented(fid)
        with pytest.raises(NotImplementedError) as excinfo:
            manifest.require(fid)
        message = str(excinfo.value)
        assert message == f["message"]
        assert "not yet available" in message and VERSION in message
        assert f["alternative"] in message
        assert f["name"].lower() in message.lower()
        # Combined with the forward it is still refused: by its own message or a conflict naming it.
        refusal = _refusal(["forward", fid])
        own = {c["message"] for c in INTERACTIONS if c["resolution"] == "refused" and fid in c["features"]}
        assert refusal in own | {message}


# -------------------------------------------------------------------------------- per-interaction behaviour


@pytest.mark.parametrize("conflict", INTERACTIONS, ids=INTERACTION_IDS)
def test_interaction_resolves_as_recorded(conflict):
    for i in conflict["features"]:
        assert i in FEATURES, f"unknown feature {i}"
    for i in conflict["conditions"]:
        assert i in CONDITIONS, f"unknown condition {i}"
    explicit = [i for i in _involved(conflict) if i not in IMPLICIT]
    planned = [i for i in conflict["features"] if FEATURES[i]["status"] == "planned"]
    if conflict["resolution"] == "refused":
        message = conflict["message"]
        assert _refusal(explicit) == message
        assert _refusal(list(reversed(_involved(conflict)))) == message
        assert _refusal(iter(explicit)) == message
        assert conflict["alternative"] in message
        for name in _names(conflict):
            assert name.lower() in message.lower(), f"message does not name {name!r}"
        # Drop any one member: this conflict no longer applies (another refusal may still).
        for dropped in explicit:
            assert _refusal([i for i in explicit if i != dropped]) != message, f"still refused without {dropped}"
    else:
        assert not planned, f"{conflict['resolution']} although {planned} is planned"
        manifest.check_combination(explicit)
        manifest.check_combination(["forward", *explicit])
        assert conflict["reason"] and (conflict["resolution"] != "routed" or conflict["variant"])


# ---------------------------------------------------------------------------------------- API edge cases


def test_unknown_ids_raise_key_error():
    with pytest.raises(KeyError, match="no_such_feature"):
        manifest.require("no_such_feature")
    with pytest.raises(KeyError, match="no_such_feature"):
        manifest.is_implemented("no_such_feature")
    with pytest.raises(KeyError, match="no_such_feature"):
        manifest.feature("no_such_feature")
    with pytest.raises(KeyError, match="no_such_feature"):
        manifest.check_combination(["forward", "no_such_feature"])


def test_conditions_are_not_features():
    with pytest.raises(KeyError):
        manifest.require("seqlen_q_gt_seqlen_k")


def test_todays_forward_calls_pass():
    manifest.check_combination([])
    manifest.check_combination(["forward", "causal", "gqa", "return_lse", "seqlen_q_gt_seqlen_k", "mqa"])
    manifest.check_combination(["forward", "forward", "causal"])


def test_specific_conflict_wins_over_generic_refusal():
    # fp8 + backward is refused with its own message, not fp8's generic one; head_dim_256
    # alone is routed (tile_m 64 fits the implicit 99 KB condition) and passes.
    by_id = {c["id"]: c for c in INTERACTIONS}
    assert _refusal(["forward", "backward", "fp8"]) == by_id["fp8+backward"]["message"]
    assert by_id["head_dim_256+smem_101376"]["resolution"] == "routed"
    manifest.check_combination(["forward", "head_dim_256"])


def test_load_returns_a_copy():
    data = manifest.load()
    data["features"][0]["status"] = "planned"
    data["interactions"].clear()
    assert manifest.load() == DATA
    assert manifest.is_implemented("forward")


def test_manifest_module_is_stdlib_only():
    tree = ast.parse((PKG / "manifest.py").read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "manifest.py must load on its own (tools load it by path)"
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_package_import_reads_the_same_manifest():
    from flash_attn_4_sm120 import manifest as pkg_manifest

    assert Path(pkg_manifest.MANIFEST_PATH).resolve() == (PKG / "manifest.json").resolve()
    assert pkg_manifest.load() == DATA


def _ids_used_by_package() -> list[tuple[str, str]]:
    pattern = re.compile(r"""manifest\.(?:require|is_implemented|feature)\(\s*["']([^"']+)["']""")
    found = []
    for path in sorted(PKG.rglob("*.py")):
        for fid in pattern.findall(path.read_text(encoding="utf-8")):
            found.append((str(path.relative_to(PKG)), fid))
    return found


@pytest.mark.parametrize("where,fid", _ids_used_by_package(), ids=lambda v: str(v))
def test_ids_used_by_the_package_exist(where, fid):
    assert fid in FEATURES, f"{where} asks the manifest for unknown feature {fid!r}"


def test_feature_matrix_has_one_short_row_per_feature():
    md = manifest.feature_matrix_markdown()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "(`" in line][1:]  # after the header
    assert len(rows) == len(FEATURES)
    for f, row in zip(DATA["features"], rows):
        assert f"(`{f['id']}`) | {f['status']} | {f['since'] or '-'} |" in row
        assert row.endswith(f"| {f['summary']} |")
        assert len(row) <= 400
    assert not any("+" in c["id"] and f"(`{c['id']}`)" in md for c in INTERACTIONS), "interactions stay out"
    assert "[CONFLICTS_LOG.md](CONFLICTS_LOG.md)" in md


# ---------------------------------------------------------------------------------------- docs in the repo


def test_conflicts_log_matches_the_manifest():
    log = (ROOT / "CONFLICTS_LOG.md").read_text(encoding="utf-8")
    assert gen_docs.check_conflicts_log(log, DATA) == []
    body = gen_docs.render_conflicts_log(DATA, manifest.upstream_link)
    assert gen_docs.replace_region(log, gen_docs.LOG_MARKERS, body) == log, "run python tools/gen_docs.py"


def test_conflicts_log_reads_in_one_sitting():
    log = (ROOT / "CONFLICTS_LOG.md").read_text(encoding="utf-8")
    assert len(log.splitlines()) <= 250
    for c in INTERACTIONS:
        assert f"(`{c['id']}`)" in log
        if c["resolution"] == "refused":
            assert f'- Message: "{c["message"]}"' in log and f"- Instead: {c['alternative']}." in log


def test_gen_docs_check_passes_on_the_repository():
    rc, _, err = _run(ROOT, "check")
    assert rc == 0, err


def test_readme_feature_matrix_is_up_to_date():
    readme_path = ROOT / "README.md"
    if not readme_path.is_file():
        pytest.skip("README.md does not exist yet")
    readme = readme_path.read_text(encoding="utf-8")
    updated = gen_docs.replace_region(readme, gen_docs.README_MARKERS, manifest.feature_matrix_markdown())
    if updated is None:
        pytest.skip("README.md has no <!-- feature-matrix:begin/end --> markers yet")
    assert updated == readme, "run python tools/gen_docs.py"


# ------------------------------------------------------------------------- the checks can fail (mutations)


def _first(kind: str, pred) -> dict:
    return next(x for x in kind if pred(x))


def _refused(d, cid="fp8+backward") -> dict:
    return _first(d["interactions"], lambda c: c["id"] == cid)


def _mutate_duplicate_feature(d):
    d["features"].append(copy.deepcopy(d["features"][0]))


def _mutate_unknown_feature(d):
    d["interactions"][0]["features"].append("warp_drive")


def _mutate_bad_status(d):
    d["features"][0]["status"] = "beta"


def _mutate_alternative_not_in_message(d):
    _first(d["interactions"], lambda c: c["resolution"] == "refused")["alternative"] = "use a bigger GPU"


def _mutate_message_not_naming_features(d):
    c = _refused(d)
    c["message"] = f"this is not yet available in {VERSION}; use torch SDPA."
    c["alternative"] = "use torch SDPA"


def _mutate_supported_with_planned(d):
    c = _refused(d, "stmatrix_tma_o+split_kv")
    c["resolution"] = "supported"
    del c["message"], c["alternative"]


def _mutate_planned_without_message(d):
    del _first(d["features"], lambda f: f["status"] == "planned")["message"]


def _mutate_implemented_without_limits(d):
    _first(d["features"], lambda f: f["status"] == "implemented")["limits"] = []


def _mutate_routed_without_variant(d):
    _first(d["interactions"], lambda c: c["id"] == "causal+gqa")["resolution"] = "routed"


def _mutate_variant_on_supported(d):
    _first(d["interactions"], lambda c: c["id"] == "causal+gqa")["variant"] = "somewhere"


def _mutate_typo_key(d):
    d["interactions"][0]["resolutoin"] = "refused"


def _mutate_since_in_future(d):
    d["features"][0]["since"] = "99.0.0"


def _mutate_planned_with_since(d):
    _first(d["features"], lambda f: f["status"] == "planned")["since"] = VERSION


def _mutate_duplicate_involved_set(d):
    c = copy.deepcopy(d["interactions"][2])
    c["id"] = "same+members"
    d["interactions"].append(c)


def _mutate_upstream_url(d):
    _first(d["features"], lambda f: f["upstream"])["upstream"]["number"] += 1


def _mutate_planned_message_without_version(d):
    f = _first(d["features"], lambda f: f["status"] == "planned")
    f["message"] = f["message"].replace(VERSION, "this version")


def _mutate_feature_lands_without_message_update(d):
    f = _first(d["features"], lambda f: f["id"] == "stmatrix_tma_o")
    f.update(status="implemented", since=VERSION, api=["internal"], limits=["every forward"])
    del f["message"], f["alternative"]


def _mutate_long_note(d):
    d["features"][0]["note"] = "x" * 301


def _mutate_long_summary(d):
    d["features"][0]["summary"] = "x" * 121


def _mutate_long_reason(d):
    d["interactions"][0]["reason"] = "x" * 201


def _mutate_long_limit(d):
    d["features"][0]["limits"].append("y" * 161)


def _mutate_process_word(d):
    d["features"][0]["note"] = "Tuned in session 41 on the H100."  # process-words: example


def _mutate_dated_history(d):
    d["interactions"][0]["reason"] = "Aligned this way since 2026-11-24."  # process-words: example


def _mutate_conditions_missing(d):
    del d["interactions"][0]["conditions"]


def _mutate_old_schema(d):
    d["schema_version"] = 1


MUTATIONS = {
    "duplicate-feature-id": (_mutate_duplicate_feature, "duplicate id"),
    "interaction-names-unknown-feature": (_mutate_unknown_feature, "unknown feature 'warp_drive'"),
    "invalid-status": (_mutate_bad_status, "status must be one of"),
    "alternative-missing-from-message": (_mutate_alternative_not_in_message, "does not name the alternative"),
    "message-does-not-name-combination": (_mutate_message_not_naming_features, "message does not name 'FP8'"),
    "supported-while-feature-planned": (_mutate_supported_with_planned, "it can only be refused"),
    "planned-feature-without-message": (_mutate_planned_without_message, "needs message and alternative"),
    "implemented-feature-without-limits": (_mutate_implemented_without_limits, "states its limits"),
    "routed-without-variant": (_mutate_routed_without_variant, "variant must be a non-empty string"),
    "variant-on-supported": (_mutate_variant_on_supported, "only a routed interaction names a variant"),
    "misspelled-key": (_mutate_typo_key, "unknown key 'resolutoin'"),
    "since-newer-than-bundle": (_mutate_since_in_future, "newer than bundle_version"),
    "planned-with-since": (_mutate_planned_with_since, "a planned feature has since null"),
    "two-interactions-same-members": (_mutate_duplicate_involved_set, "same features and conditions"),
    "upstream-url-mismatch": (_mutate_upstream_url, "does not match"),
    "planned-message-without-version": (_mutate_planned_message_without_version, "which version"),
    "feature-lands-but-refusal-message-not-updated": (
        _mutate_feature_lands_without_message_update,
        "interaction stmatrix_tma_o+split_kv: message says a feature is not available",
    ),
    "note-over-300": (_mutate_long_note, "note is 301 characters, at most 300"),
    "summary-over-120": (_mutate_long_summary, "summary is 121 characters, at most 120"),
    "reason-over-200": (_mutate_long_reason, "reason is 201 characters, at most 200"),
    "limit-entry-too-long": (_mutate_long_limit, "a limits entry is 161 characters"),
    "process-word": (_mutate_process_word, "process word 'session 41'"),  # process-words: example
    "dated-history": (_mutate_dated_history, "process word '2026-11-24'"),  # process-words: example
    "conditions-not-a-list": (_mutate_conditions_missing, "conditions must be a list"),
    "old-schema-version": (_mutate_old_schema, "schema_version must be 2"),
}


@pytest.mark.parametrize("name", list(MUTATIONS), ids=list(MUTATIONS))
def test_validator_catches(name):
    mutate, expected = MUTATIONS[name]
    data = copy.deepcopy(DATA)
    mutate(data)
    errors = gen_docs.validate_manifest(data, manifest.STATUSES, manifest.RESOLUTIONS)
    assert any(expected in e for e in errors), errors


LOG_MUTATIONS = {
    "resolution-changed": (lambda t: t.replace("(`causal+gqa`) | supported |", "(`causal+gqa`) | routed: x |"),
                           "causal+gqa is logged as routed"),
    "row-missing": (lambda t: t.replace("(`fp8+softcap`)", "(fp8 and softcap)"), "interaction fp8+softcap is missing"),
    "stale-row": (lambda t: t + "\n| a × b (`old+thing`) | supported | gone |\n", "row old+thing is not"),
    "section-missing": (lambda t: t.replace("### `block_sparsity+varlen`", "### block sparsity and varlen"),
                        "refused interaction block_sparsity+varlen has no section"),
    "message-edited": (lambda t: t.replace("train in bfloat16 or float16.", "train in float32.", 1),
                       "fp8+backward message differs"),
}


@pytest.mark.parametrize("name", list(LOG_MUTATIONS), ids=list(LOG_MUTATIONS))
def test_conflicts_log_check_catches(name):
    mutate, expected = LOG_MUTATIONS[name]
    log = (ROOT / "CONFLICTS_LOG.md").read_text(encoding="utf-8")
    mutated = mutate(log)
    assert mutated != log
    problems = gen_docs.check_conflicts_log(mutated, DATA)
    assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------------------- gen_docs end to end


@pytest.fixture
def scratch_repo(tmp_path):
    """A minimal checkout: the manifest and nothing else."""
    dest = tmp_path / "torch-ext" / "flash_attn_4_sm120"
    dest.mkdir(parents=True)
    for name in ("manifest.json", "manifest.py"):
        shutil.copy(PKG / name, dest / name)
    return tmp_path


def _run(root: Path, mode: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = gen_docs.run(root, mode, out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_gen_docs_writes_then_checks_clean(scratch_repo):
    readme = scratch_repo / "README.md"
    readme.write_text(
        "# Title\n\nintro\n\n<!-- feature-matrix:begin -->\nold table\n<!-- feature-matrix:end -->\n\noutro\n"
    )
    rc, _, err = _run(scratch_repo, "check")
    assert rc == 1 and "README.md: feature-matrix region is stale" in err and "CONFLICTS_LOG.md does not exist" in err

    assert _run(scratch_repo, "write")[0] == 0
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n\n<!-- feature-matrix:begin -->\n")
    assert text.endswith("<!-- feature-matrix:end -->\n\noutro\n")
    assert "old table" not in text and "(`split_kv`)" in text and "(`paged_kv+split_kv`)" not in text
    log = (scratch_repo / "CONFLICTS_LOG.md").read_text()
    assert "(`paged_kv+split_kv`)" in log and len(log.splitlines()) <= 250
    assert _run(scratch_repo, "check")[0] == 0
    assert _run(scratch_repo, "write")[0] == 0
    assert readme.read_text() == text  # idempotent


def test_gen_docs_check_fails_when_the_manifest_moves(scratch_repo):
    assert _run(scratch_repo, "write")[0] == 0
    path = scratch_repo / "torch-ext" / "flash_attn_4_sm120" / "manifest.json"
    data = json.loads(path.read_text())
    data["interactions"][0]["reason"] += " Edited."
    path.write_text(json.dumps(data, indent=2))
    rc, _, err = _run(scratch_repo, "check")
    assert rc == 1 and "generated region is stale" in err


def test_gen_docs_refuses_an_invalid_manifest(scratch_repo):
    path = scratch_repo / "torch-ext" / "flash_attn_4_sm120" / "manifest.json"
    data = json.loads(path.read_text())
    data["features"][0]["status"] = "beta"
    path.write_text(json.dumps(data, indent=2))
    rc, _, err = _run(scratch_repo, "write")
    assert rc == 1 and "status must be one of" in err
    assert not (scratch_repo / "CONFLICTS_LOG.md").exists()


def test_gen_docs_without_readme_prints_the_matrix(scratch_repo):
    rc, out, err = _run(scratch_repo, "write")
    assert rc == 0 and out == manifest.feature_matrix_markdown()
    assert "README.md does not exist" in err and not (scratch_repo / "README.md").exists()
    rc, out, err = _run(scratch_repo, "check")
    assert rc == 0 and "README check skipped" in err


def test_gen_docs_leaves_a_readme_without_markers_alone(scratch_repo):
    readme = scratch_repo / "README.md"
    readme.write_text("# Title\n")
    rc, out, err = _run(scratch_repo, "write")
    assert rc == 0 and readme.read_text() == "# Title\n" and "no feature-matrix markers" in err
    assert out == manifest.feature_matrix_markdown()
