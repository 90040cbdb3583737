"""Every way users load this bundle works on the shipped ``build/torch-cuda`` (offline, CPU-only).

Paths covered:
  (a) ``LOCAL_KERNELS=<org/name>=<repo root>`` + ``kernels.get_kernel(..., version=1)``
  (b) a local Hub on 127.0.0.1 (``support.local_hub``): ``version=1``, ``revision="v1.0.0"`` (tag),
      ``revision=<sha>``, ``kernels lock`` + ``get_locked_kernel``; then, with the cache warmed the
      documented way (``hf download``, ``snapshot_download``), the same loads plus ``load_kernel``
      with ``HF_HUB_OFFLINE=1`` and no request reaching the Hub
  (c) ``kernels.get_local_kernel(Path)`` on the repo root and on the variant directory
  (d) clone-style ``sys.path.insert(0, "build/torch-cuda"); import flash_attn_4_sm120``
  (e) two different builds loaded side by side in one process

Each scenario runs in a fresh interpreter: huggingface_hub reads HF_ENDPOINT / HF_HUB_OFFLINE at
import, kernels caches loaded variants per process, and a loaded build registers torch ops. With no
GPU, kernels skips the arch check, so these tests run anywhere; the GPU path is covered elsewhere.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.local_hub import LocalHub, repo_from_variant

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "torch-ext" / "flash_attn_4_sm120"
VARIANT = REPO / "build" / "torch-cuda"
REPO_ID = "sm120-kernels/flash-attn-4-sm120"
#: Nothing listens on the discard port: a scenario that must not touch the Hub fails fast if it does.
UNREACHABLE_HUB = "http://127.0.0.1:9"
MARKER = "@@LOADER-RESULT@@"

# Runs first in every scenario: loads are attempted one by one and each result (a description of
# the module, or the traceback) is reported as JSON, so one failing path doesn't hide the others.
PRELUDE = f"""
import importlib, json, os, sys, traceback
from pathlib import Path
RESULTS = {{}}

def describe(m):
    return {{
        "name": m.__name__,
        "file": os.path.abspath(m.__file__),
        "version": getattr(m, "__version__", None),
        "has_flash_attn_func": callable(getattr(m, "flash_attn_func", None)),
        "ops_namespace": importlib.import_module(m.__name__ + "._ops").OPS_NAMESPACE,
    }}

def attempt(label, load):
    try:
        RESULTS[label] = {{"module": describe(load())}}
    except Exception:
        RESULTS[label] = {{"error": traceback.format_exc()}}

def finish(**extra):
    print({MARKER!r} + json.dumps({{**RESULTS, **extra}}))
"""


# -- helpers ----------------------------------------------------------------------------------


def module_version(version_file: Path) -> str:
    """``__version__`` as a module file assigns it (the last assignment wins, as at import)."""
    values = [
        ast.literal_eval(node.value)
        for node in ast.parse(version_file.read_text()).body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
    ]
    assert values, f"{version_file} defines no __version__"
    return values[-1]


def build_id(variant: Path) -> str:
    return json.loads((variant / "metadata.json").read_text())["id"]


def scenario_env(home: Path, **overrides: str) -> dict[str, str]:
    """A clean environment: own HF cache, no token, no inherited Hub/kernels settings."""
    drop_prefixes = ("HF_", "HUGGING_FACE_", "KERNELS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop_prefixes) and k != "LOCAL_KERNELS"}
    # Keep PYTHONPATH (the device machine puts its packages there) minus the source tree, so that
    # `import flash_attn_4_sm120` can only mean what the scenario sets up.
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO / "torch-ext"]
    env["PYTHONPATH"] = os.pathsep.join(keep)
    # No bytecode: scenarios import straight from build/torch-cuda in the repo and must not litter it.
    env.update(HF_HOME=str(home), HF_ENDPOINT=UNREACHABLE_HUB, PYTHONDONTWRITEBYTECODE="1")
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env.update(overrides)
    return env


def run_python(code: str, env: dict[str, str], cwd: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=180,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    assert proc.returncode == 0 and lines, f"scenario crashed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len(MARKER):])


def loaded(results: dict, label: str) -> dict:
    assert "error" not in results[label], f"{label} failed to load:\n{results[label]['error']}"
    return results[label]["module"]


def assert_is_build(module: dict, *, init_file: Path, name: str, namespace: str) -> None:
    """The module is the given build, imported from the given file, with the public surface."""
    assert module["file"] == os.path.abspath(init_file)
    assert module["name"] == name
    assert module["ops_namespace"] == namespace
    assert module["version"] == module_version(Path(init_file).parent / "_version.py")
    assert module["has_flash_attn_func"], "flash_attn_func is missing or not callable"


@pytest.fixture(scope="module")
def shipped_id() -> str:
    if not (VARIANT / "metadata.json").is_file():
        pytest.fail(f"{VARIANT} has no metadata.json; generate it with: python tools/build_variant.py")
    return build_id(VARIANT)


# -- (a) LOCAL_KERNELS, (c) get_local_kernel, (d) clone-style ----------------------------------


def test_local_kernels_override(tmp_path, shipped_id):
    results = run_python(
        f"""
        import kernels
        attempt("get_kernel", lambda: kernels.get_kernel({REPO_ID!r}, version=1))
        finish()
        """,
        scenario_env(tmp_path, LOCAL_KERNELS=f"{REPO_ID}={REPO}"),
        cwd=tmp_path,
    )
    assert_is_build(loaded(results, "get_kernel"), init_file=VARIANT / "__init__.py", name=shipped_id, namespace=shipped_id)


def test_get_local_kernel(tmp_path, shipped_id):
    results = run_python(
        f"""
        import kernels
        attempt("repo_root", lambda: kernels.get_local_kernel(Path({str(REPO)!r})))
        attempt("variant_dir", lambda: kernels.get_local_kernel(Path({str(VARIANT)!r})))
        finish()
        """,
        scenario_env(tmp_path),
        cwd=tmp_path,
    )
    for label in ("repo_root", "variant_dir"):
        assert_is_build(loaded(results, label), init_file=VARIANT / "__init__.py", name=shipped_id, namespace=shipped_id)


def test_clone_style_import(tmp_path, shipped_id):
    results = run_python(
        """
        sys.path.insert(0, "build/torch-cuda")
        attempt("import", lambda: importlib.import_module("flash_attn_4_sm120"))
        import flash_attn_4_sm120
        import flash_attn_4_sm120.execution_model as em
        from flash_attn_4_sm120 import flash_attn_func
        finish(
            submodule_file=os.path.abspath(em.__file__),
            submodule_is_attribute=flash_attn_4_sm120.execution_model is em,
            copies=sorted(n for n in sys.modules if n.endswith(".execution_model")),
            # Hugging Face's `kernels` must still be the one imported afterwards (transformers uses it).
            hf_kernels_has_get_kernel=hasattr(importlib.import_module("kernels"), "get_kernel"),
        )
        """,
        scenario_env(tmp_path),
        cwd=REPO,
    )
    # The compat package hands over the variant root itself, so the build (not torch-ext) is what runs.
    assert_is_build(loaded(results, "import"), init_file=VARIANT / "__init__.py", name="flash_attn_4_sm120", namespace=shipped_id)
    assert results["submodule_file"] == str(VARIANT / "execution_model.py")
    assert results["submodule_is_attribute"]
    assert results["copies"] == ["flash_attn_4_sm120.execution_model"], "a submodule was imported twice"
    assert results["hf_kernels_has_get_kernel"], "`import kernels` after the sys.path insert finds build/torch-cuda/kernels"


# -- (e) two builds in one process ----------------------------------------------------------------


def test_two_builds_in_one_process(tmp_path, shipped_id):
    # A second build: same package, different source bytes (a local version suffix).
    src = tmp_path / "src" / "flash_attn_4_sm120"
    shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    second_version = module_version(SOURCE / "_version.py") + "+second"
    with open(src / "_version.py", "a") as f:
        f.write(f"__version__ = {second_version!r}\n")
    second_repo = tmp_path / "second"
    tool = subprocess.run(
        [sys.executable, str(REPO / "tools" / "build_variant.py"), "--source", str(src), "--out", str(second_repo / "build" / "torch-cuda")],
        capture_output=True, text=True, timeout=60,
    )
    assert tool.returncode == 0, tool.stderr
    second_id = build_id(second_repo / "build" / "torch-cuda")
    assert second_id != shipped_id

    results = run_python(
        f"""
        import kernels
        attempt("first", lambda: kernels.get_kernel({REPO_ID!r}, version=1))
        attempt("second", lambda: kernels.get_local_kernel(Path({str(second_repo)!r})))
        first, second = (sys.modules.get(RESULTS[k].get("module", {{}}).get("name")) for k in ("first", "second"))
        finish(
            both_registered=first is not None and second is not None,
            distinct_functions=first is not None and second is not None and first.flash_attn_func is not second.flash_attn_func,
        )
        """,
        scenario_env(tmp_path / "home", LOCAL_KERNELS=f"{REPO_ID}={REPO}"),
        cwd=tmp_path,
    )
    first, second = loaded(results, "first"), loaded(results, "second")
    assert_is_build(first, init_file=VARIANT / "__init__.py", name=shipped_id, namespace=shipped_id)
    second_init = second_repo / "build" / "torch-cuda" / "__init__.py"
    assert_is_build(second, init_file=second_init, name=second_id, namespace=second_id)
    assert second["version"] == second_version != first["version"]
    assert results["both_registered"] and results["distinct_functions"]


# -- (b) a local Hub, online then offline -----------------------------------------------------------


@pytest.fixture(scope="module")
def hub_session(tmp_path_factory, shipped_id):
    """Run the online and offline scenarios against one local Hub and one HF cache."""
    tmp = tmp_path_factory.mktemp("hub").resolve()
    home = tmp / "hf_home"
    project = tmp / "consumer"
    project.mkdir()
    # A consumer project pinning the kernel the documented way; `kernels lock` resolves it to a sha.
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "consumer"\nversion = "0.1.0"\n\n[tool.kernels.dependencies]\n"{REPO_ID}" = 1\n'
    )
    lockfile = project / "kernels.lock"
    repo = repo_from_variant(REPO_ID, VARIANT)
    sha = repo.branches["v1"]

    with LocalHub(repo) as hub:
        online_env = scenario_env(home, HF_ENDPOINT=hub.endpoint)
        online = run_python(
            f"""
            import kernels, tomllib
            from kernels._rust import KernelDependency, KernelVersion
            from kernels.hf_hub import _get_hf_api
            from kernels.locking import extract_dependency_locks

            def kernels_lock(project):
                # What `kernels lock <project>` does (kernels/cli/lock.py), minus the CLI package, whose
                # import needs sigstore (absent on the device machine's kernels install).
                deps = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["kernels"]["dependencies"]
                locks = extract_dependency_locks(
                    [KernelDependency(repo_id=r, version=KernelVersion.Version(v)) for r, v in deps.items()], api=_get_hf_api()
                )
                (project / "kernels.lock").write_text(locks.to_json())

            attempt("version", lambda: kernels.get_kernel({REPO_ID!r}, version=1))
            attempt("tag", lambda: kernels.get_kernel({REPO_ID!r}, revision="v1.0.0"))
            attempt("sha", lambda: kernels.get_kernel({REPO_ID!r}, revision={sha!r}))
            # main holds only the card (kernel-builder's layout): there is nothing to load there.
            attempt("main", lambda: kernels.get_kernel({REPO_ID!r}, revision="main"))
            kernels_lock(Path({str(project)!r}))
            attempt("locked", lambda: kernels.get_locked_kernel({REPO_ID!r}, lockfile=Path({str(lockfile)!r})))
            # Warm the cache for offline use (a get_kernel download alone does not suffice in 0.17.2).
            import huggingface_hub
            huggingface_hub.snapshot_download({REPO_ID!r}, repo_type="kernel", revision="v1.0.0")
            finish()
            """,
            online_env,
            cwd=tmp,
        )
        # The other documented warm-up: the `hf` CLI, for the version branch.
        hf = subprocess.run(
            [sys.executable, "-m", "huggingface_hub.cli.hf", "download", REPO_ID, "--repo-type", "kernel", "--revision", "v1"],
            env=online_env, cwd=tmp, capture_output=True, text=True, timeout=120,
        )
        online_requests = list(hub.requests)

        offline = run_python(
            f"""
            import kernels
            lock = Path({str(lockfile)!r})
            attempt("version", lambda: kernels.get_kernel({REPO_ID!r}, version=1))
            attempt("tag", lambda: kernels.get_kernel({REPO_ID!r}, revision="v1.0.0"))
            attempt("sha", lambda: kernels.get_kernel({REPO_ID!r}, revision={sha!r}))
            attempt("load_kernel", lambda: kernels.load_kernel({REPO_ID!r}, lockfile=lock))
            attempt("locked", lambda: kernels.get_locked_kernel({REPO_ID!r}, lockfile=lock))
            finish()
            """,
            scenario_env(home, HF_ENDPOINT=hub.endpoint, HF_HUB_OFFLINE="1"),
            cwd=tmp,
        )
        offline_requests = hub.requests[len(online_requests):]

    snapshot_init = home / "hub" / f"kernels--{REPO_ID.replace('/', '--')}" / "snapshots" / sha / "build" / "torch-cuda" / "__init__.py"
    return {
        "online": online, "offline": offline, "hf_cli": hf, "sha": sha, "lockfile": lockfile,
        "online_requests": online_requests, "offline_requests": offline_requests,
        "snapshot_init": snapshot_init, "id": shipped_id,
    }


@pytest.mark.check
@pytest.mark.parametrize("label", ["version", "tag", "sha", "locked"])
def test_hub_online(hub_session, label):
    assert_is_build(
        loaded(hub_session["online"], label),
        init_file=hub_session["snapshot_init"], name=hub_session["id"], namespace=hub_session["id"],
    )


@pytest.mark.check
def test_hub_online_checks_publisher_trust(hub_session):
    # kernels asks the Hub whether the org is a trusted publisher before downloading anything.
    assert any("/api/organizations/sm120-kernels/overview" in r for r in hub_session["online_requests"])


@pytest.mark.check
def test_hub_main_branch_has_no_build(hub_session):
    # Proves the revision is honoured: `main` exists but has no build/ folder, so listing it 404s.
    error = hub_session["online"]["main"].get("error", "")
    assert "EntryNotFoundError" in error and "'build' does not exist" in error, hub_session["online"]["main"]


@pytest.mark.check
def test_kernels_lock_pins_the_v1_commit(hub_session):
    from kernels._rust import KernelLocks

    locks = KernelLocks.from_json(hub_session["lockfile"].read_text())
    assert [(dep.repo_id, lock.commit) for dep, lock in locks.items()] == [(REPO_ID, hub_session["sha"])]


@pytest.mark.check
def test_hf_download_cli_warms_the_cache(hub_session):
    hf = hub_session["hf_cli"]
    assert hf.returncode == 0, hf.stderr
    assert hub_session["snapshot_init"].is_file()


@pytest.mark.check
@pytest.mark.parametrize("label", ["version", "tag", "sha", "load_kernel", "locked"])
def test_hub_offline_from_cache(hub_session, label):
    assert_is_build(
        loaded(hub_session["offline"], label),
        init_file=hub_session["snapshot_init"], name=hub_session["id"], namespace=hub_session["id"],
    )


@pytest.mark.check
def test_hub_offline_makes_no_requests(hub_session):
    assert hub_session["offline_requests"] == []
