"""The feature manifest: schema, the behaviour of require/check_combination per entry, and doc drift.

Every capability group and every conflict in ``manifest.json`` gets its own parametrized case (named
by its id). The validator and the CONFLICTS_LOG checker are also fed broken inputs, so a check that
silently accepts everything fails here. CPU only, stdlib + pytest.
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

#: What is implemented today. Change it in the same commit that flips a status in manifest.json.
IMPLEMENTED_TODAY = {"forward", "causal", "gqa", "return_lse", "compile_cache", "conformance_gate",
                     "sliding_window", "softcap", "learnable_sink", "varlen",
                     "head_dim_any", "head_dim_256", "head_dim_v_differs", "tma_ws_forward", "pack_gqa",
                     "split_kv", "combine", "paged_kv", "kvcache_api", "backward", "deterministic_backward",
                     "score_mod", "block_sparsity", "dropout"}


def _involved(conflict: dict) -> list[str]:
    return [*conflict["features"], *conflict.get("conditions", [])]


def _names(conflict: dict) -> list[str]:
    return [FEATURES[i]["name"] for i in conflict["features"]] + [
        CONDITIONS[i]["name"] for i in conflict.get("conditions", [])
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


def test_ids_are_unique():
    ids = [f["id"] for f in DATA["features"]] + [c["id"] for c in DATA["conditions"]]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    conflict_ids = [c["id"] for c in DATA["conflicts"]]
    assert len(conflict_ids) == len(set(conflict_ids))


def test_statuses_and_resolutions_are_valid():
    assert {f["status"] for f in DATA["features"]} <= set(manifest.STATUSES)
    assert {c["resolution"] for c in DATA["conflicts"]} <= set(manifest.RESOLUTIONS)


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


def test_forward_envelope():
    env = FEATURES["forward"]["envelope"]
    assert env["dtypes"] == ["bfloat16", "float16"]
    assert "8, 256" in env["head_dims"] and "differ" in env["head_dim_v"]
    assert env["masks"] == ["none", "causal", "local window (left, right)"]


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
        assert f["envelope"], "an implemented feature states its envelope"
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
        own = {c["message"] for c in DATA["conflicts"] if c["resolution"] == "refused" and fid in c["features"]}
        assert refusal in own | {message}


# ------------------------------------------------------------------------------------ per-conflict behaviour


@pytest.mark.parametrize("conflict", DATA["conflicts"], ids=[c["id"] for c in DATA["conflicts"]])
def test_conflict_resolves_as_recorded(conflict):
    for i in conflict["features"]:
        assert i in FEATURES, f"unknown feature {i}"
    for i in conflict.get("conditions", []):
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
        assert conflict.get("variant") if conflict["resolution"] == "routed" else conflict.get("note")


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
    by_id = {c["id"]: c for c in DATA["conflicts"]}
    assert _refusal(["forward", "backward", "fp8"]) == by_id["fp8+backward"]["message"]
    assert by_id["head_dim_256+smem_101376"]["resolution"] == "routed"
    manifest.check_combination(["forward", "head_dim_256"])


def test_load_returns_a_copy():
    data = manifest.load()
    data["features"][0]["status"] = "planned"
    data["conflicts"].clear()
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


def test_feature_matrix_lists_every_entry():
    md = manifest.feature_matrix_markdown()
    for f in DATA["features"]:
        row = next(line for line in md.splitlines() if f"(`{f['id']}`)" in line)
        assert f["status"] in row
    for c in DATA["conflicts"]:
        row = next(line for line in md.splitlines() if f"(`{c['id']}`)" in line)
        assert f"| {c['resolution']} |" in row
    assert "(`paged_kv+split_kv`)" not in manifest.feature_matrix_markdown(interactions=False)


# ---------------------------------------------------------------------------------------- docs in the repo


def test_conflicts_log_matches_the_manifest():
    log = (ROOT / "CONFLICTS_LOG.md").read_text(encoding="utf-8")
    assert gen_docs.check_conflicts_log(log, DATA) == []
    body = gen_docs.render_conflicts_log(DATA, manifest.feature_matrix_markdown(interactions=False))
    assert gen_docs.replace_region(log, gen_docs.LOG_MARKERS, body) == log, "run python tools/gen_docs.py"


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


def _mutate_duplicate_feature(d):
    d["features"].append(copy.deepcopy(d["features"][0]))


def _mutate_unknown_feature(d):
    d["conflicts"][0]["features"].append("warp_drive")


def _mutate_bad_status(d):
    d["features"][0]["status"] = "beta"


def _mutate_alternative_not_in_message(d):
    _first(d["conflicts"], lambda c: c["resolution"] == "refused")["alternative"] = "use a bigger GPU"


def _mutate_message_not_naming_features(d):
    c = _first(d["conflicts"], lambda c: c["id"] == "fp8+backward")
    c["message"] = f"this is not yet available in {VERSION}; use torch SDPA."
    c["alternative"] = "use torch SDPA"


def _mutate_supported_with_planned(d):
    c = _first(d["conflicts"], lambda c: c["id"] == "fp8+backward")
    c["resolution"] = "supported"
    c["note"] = "works"
    del c["message"], c["alternative"]


def _mutate_planned_without_message(d):
    del _first(d["features"], lambda f: f["status"] == "planned")["message"]


def _mutate_implemented_without_envelope(d):
    del _first(d["features"], lambda f: f["status"] == "implemented")["envelope"]


def _mutate_routed_without_variant(d):
    c = _first(d["conflicts"], lambda c: c["id"] == "causal+gqa")
    c["resolution"] = "routed"


def _mutate_typo_key(d):
    d["conflicts"][0]["resolutoin"] = "refused"


def _mutate_since_in_future(d):
    d["conflicts"][0]["since"] = "99.0.0"


def _mutate_duplicate_involved_set(d):
    c = copy.deepcopy(d["conflicts"][2])
    c["id"] = "same+members"
    d["conflicts"].append(c)


def _mutate_upstream_url(d):
    _first(d["features"], lambda f: f["upstream"])["upstream"]["number"] += 1


def _mutate_planned_message_without_version(d):
    f = _first(d["features"], lambda f: f["status"] == "planned")
    f["message"] = f["message"].replace(VERSION, "this version")


def _mutate_feature_lands_without_message_update(d):
    f = _first(d["features"], lambda f: f["id"] == "stmatrix_tma_o")
    f.update(status="implemented", since=VERSION, envelope={"epilogue": "stmatrix + TMA store"})
    del f["message"], f["alternative"]


MUTATIONS = {
    "duplicate-feature-id": (_mutate_duplicate_feature, "duplicate id"),
    "conflict-names-unknown-feature": (_mutate_unknown_feature, "unknown feature 'warp_drive'"),
    "invalid-status": (_mutate_bad_status, "status must be one of"),
    "alternative-missing-from-message": (_mutate_alternative_not_in_message, "does not name the alternative"),
    "message-does-not-name-combination": (_mutate_message_not_naming_features, "message does not name 'FP8'"),
    "supported-while-feature-planned": (_mutate_supported_with_planned, "it can only be refused"),
    "planned-feature-without-message": (_mutate_planned_without_message, "needs message and alternative"),
    "implemented-feature-without-envelope": (_mutate_implemented_without_envelope, "envelope"),
    "routed-without-variant": (_mutate_routed_without_variant, "names its variant"),
    "misspelled-key": (_mutate_typo_key, "unknown key 'resolutoin'"),
    "since-newer-than-bundle": (_mutate_since_in_future, "newer than bundle_version"),
    "two-conflicts-same-members": (_mutate_duplicate_involved_set, "same features and conditions"),
    "upstream-url-mismatch": (_mutate_upstream_url, "does not match"),
    "planned-message-without-version": (_mutate_planned_message_without_version, "which version"),
    "feature-lands-but-conflict-message-not-updated": (
        _mutate_feature_lands_without_message_update,
        "conflict stmatrix_tma_o+split_kv: message says a feature is not available",
    ),
}


@pytest.mark.parametrize("name", list(MUTATIONS), ids=list(MUTATIONS))
def test_validator_catches(name):
    mutate, expected = MUTATIONS[name]
    data = copy.deepcopy(DATA)
    mutate(data)
    errors = gen_docs.validate_manifest(data, manifest.STATUSES, manifest.RESOLUTIONS)
    assert any(expected in e for e in errors), errors


LOG_MUTATIONS = {
    "resolution-changed": (lambda t: t.replace("- Resolution: **refused**", "- Resolution: **supported**", 1),
                           "logged as supported"),
    "section-missing": (lambda t: t.replace("### `fp8+softcap`", "### fp8 and softcap"), "fp8+softcap is missing"),
    "stale-section": (lambda t: t + "\n### `old+thing`: gone\n\n- Resolution: **refused**\n", "old+thing is not"),
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
    assert "old table" not in text and "(`paged_kv+split_kv`)" in text
    assert (scratch_repo / "CONFLICTS_LOG.md").is_file()
    assert _run(scratch_repo, "check")[0] == 0
    assert _run(scratch_repo, "write")[0] == 0
    assert readme.read_text() == text  # idempotent


def test_gen_docs_check_fails_when_the_manifest_moves(scratch_repo):
    assert _run(scratch_repo, "write")[0] == 0
    path = scratch_repo / "torch-ext" / "flash_attn_4_sm120" / "manifest.json"
    data = json.loads(path.read_text())
    data["conflicts"][0]["rationale"] += " Edited."
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
