"""The shipped Hub variant (``build/torch-cuda``) is current, valid and loadable by ``kernels``.

Checks, all CPU-only:
  * build/ is byte-identical to a fresh ``tools/build_variant.py`` run on torch-ext (not stale);
  * the generator is reproducible and names each distinct build differently;
  * ``--check`` reports stale output and a regular run repairs it;
  * metadata.json parses with the kernels wheel's own parser and its digest matches the files;
  * build.toml validates with the wheel's own parser and agrees with metadata.json;
  * declared CUDA archs agree across build.toml, metadata.json and execution_model;
  * every shipped module imports only relatively within the package, plus stdlib / torch / the
    Python dependencies metadata.json declares (what the Hub loader can satisfy).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from kernels._rust import Backend, Build, Digest, DigestAlgorithm, Metadata

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "torch-ext" / "flash_attn_4_sm120"
VARIANT = REPO / "build" / "torch-cuda"
TOOL = REPO / "tools" / "build_variant.py"
REGENERATE = "python tools/build_variant.py  (or: make build)"

#: Import names a declared python-depends entry provides. ``cuda`` is cuda-python, which
#: nvidia-cutlass-dsl installs and whose bindings the CuTe DSL runtime uses.
DEPENDENCY_IMPORTS = {
    "nvidia-cutlass-dsl": {"cutlass", "cuda"},
    "tvm-ffi": {"tvm_ffi"},
    "einops": {"einops"},
}


def run_tool(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def tree_differences(expected: dict[str, bytes], actual: dict[str, bytes]) -> list[str]:
    return (
        [f"missing in build/: {p}" for p in expected.keys() - actual.keys()]
        + [f"not generated (stale): {p}" for p in actual.keys() - expected.keys()]
        + [f"content differs: {p}" for p in expected.keys() & actual.keys() if expected[p] != actual[p]]
    )


def build_toml() -> dict:
    with open(REPO / "build.toml", "rb") as f:
        return tomllib.load(f)


def module_constant(path: Path, name: str):
    """A top-level ``NAME = <literal>`` from a module, read without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no top-level {name} = <literal>")


@pytest.fixture(scope="module")
def variant() -> Path:
    if not (VARIANT / "metadata.json").is_file():
        pytest.fail(f"{VARIANT}/metadata.json does not exist; generate the variant with: {REGENERATE}")
    return VARIANT


@pytest.fixture(scope="module")
def metadata(variant) -> Metadata:
    return Metadata.read_from_file(variant / "metadata.json")


# -- freshness and reproducibility -------------------------------------------------------------


def test_build_matches_source(variant, tmp_path):
    fresh = tmp_path / "torch-cuda"
    result = run_tool("--out", fresh)
    assert result.returncode == 0, result.stderr
    problems = tree_differences(tree(fresh), tree(variant))
    assert not problems, (
        "build/torch-cuda is stale against torch-ext/flash_attn_4_sm120 (or build.toml):\n  "
        + "\n  ".join(sorted(problems))
        + f"\nRegenerate it with: {REGENERATE}"
    )


def test_generation_is_reproducible_and_location_independent(tmp_path):
    # Same bytes from two copies of the source at different paths -> byte-identical variants.
    copies = [tmp_path / "a" / "pkg", tmp_path / "b" / "elsewhere" / "pkg"]
    outs = [tmp_path / "out_a", tmp_path / "out_b"]
    for src, out in zip(copies, outs):
        shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        assert run_tool("--source", src, "--out", out).returncode == 0
    assert tree(outs[0]) == tree(outs[1])


def test_changed_source_gets_a_new_build_id(tmp_path):
    src = tmp_path / "pkg"
    shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    assert run_tool("--source", src, "--out", tmp_path / "one").returncode == 0
    with open(src / "_version.py", "a") as f:
        f.write("# one more byte of source\n")
    assert run_tool("--source", src, "--out", tmp_path / "two").returncode == 0
    ids = [json.loads((tmp_path / d / "metadata.json").read_text())["id"] for d in ("one", "two")]
    assert ids[0] != ids[1]


def test_check_mode_reports_stale_output_and_write_repairs_it(tmp_path):
    out = tmp_path / "torch-cuda"
    assert run_tool("--out", out).returncode == 0
    expected = tree(out)

    (out / "leftover_module.py").write_text("x = 1\n")  # a file deleted from the source since
    (out / "_version.py").write_text("__version__ = 'edited by hand'\n")
    (out / "metadata.json").unlink()
    # Bytecode caches are not part of the variant and must not count as differences.
    (out / "__pycache__").mkdir(exist_ok=True)
    (out / "__pycache__" / "junk.cpython-311.pyc").write_bytes(b"\0")

    check = run_tool("--out", out, "--check")
    assert check.returncode == 1
    for expected_line in ("leftover_module.py", "_version.py", "metadata.json", "python tools/build_variant.py"):
        assert expected_line in check.stderr
    assert "junk" not in check.stderr

    assert run_tool("--out", out).returncode == 0
    assert tree_differences(expected, tree(out)) == []
    assert run_tool("--out", out, "--check").returncode == 0


# -- metadata.json and build.toml --------------------------------------------------------------


def test_metadata_fields(metadata, variant):
    general = build_toml()["general"]
    assert str(metadata.name) == general["name"]
    assert metadata.version == general["version"] == module_constant(SOURCE / "_version.py", "KERNEL_VERSION")
    assert metadata.license == general["license"]
    assert str(metadata.kernels_minver) == "0.17.0"
    assert metadata.backend.backend_type == Backend.CUDA
    assert metadata.python_depends == general.get("python-depends", []) + general["cuda"]["python-depends"]
    assert set(metadata.python_depends) == {"nvidia-cutlass-dsl", "tvm-ffi"}
    # The id is the sys.modules name kernels uses and the torch.library namespace: both per build.
    assert re.fullmatch(r"_flash_attn_4_sm120_cuda_[0-9a-f]{7}", metadata.id), metadata.id
    assert module_constant(variant / "_ops.py", "OPS_NAMESPACE") == metadata.id
    assert module_constant(SOURCE / "_ops.py", "OPS_NAMESPACE") != metadata.id


def test_metadata_digest_matches_files(metadata, variant):
    assert metadata.digest is not None and metadata.digest.algorithm == DigestAlgorithm.SHA256
    # Raises DigestValidationError listing every missing / unknown / changed file.
    metadata.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, variant))


def test_metadata_python_depends_accepted_by_loader(metadata):
    from kernels.backends import _backend
    from kernels.python_deps import validate_dependencies

    # The loader's own check: every entry is on its allowlist for this backend and importable here.
    validate_dependencies(metadata.name.python_name, metadata.python_depends, _backend())


def test_build_toml_validates_with_kernel_builder_parser():
    build = Build.open(REPO)
    assert build.general.backends == [Backend.CUDA]
    assert build.all_kernel_depends(Backend.CUDA) == []


def test_build_toml_hub_settings():
    cfg = build_toml()
    assert cfg["general"]["edition"] == 5
    assert cfg["general"]["hub"] == {"repo-id": "sm120-kernels/flash-attn-4-sm120", "branch": f"v{cfg['general']['version']}"}


def test_declared_archs_agree(metadata):
    from flash_attn_4_sm120.execution_model import declared_cuda_capabilities

    declared = declared_cuda_capabilities()
    toml_archs = build_toml()["torch-noarch"]["cuda_capabilities"]
    assert len(set(declared)) == len(declared), f"duplicate capabilities in execution_model: {declared}"
    assert sorted(toml_archs) == sorted(declared), "build.toml [torch-noarch] cuda_capabilities != declared_cuda_capabilities()"
    assert metadata.backend.archs == toml_archs, f"metadata.json archs are stale; run {REGENERATE}"


# -- imports of the shipped modules -------------------------------------------------------------


def import_violations(package_root: Path, allowed_top_level: set[str], forbidden: set[str]) -> list[str]:
    """Imports in ``package_root/**.py`` that would break when the directory is loaded by ``kernels``.

    The root is imported as a package named after the build id, so: relative imports must stay inside
    it and name modules that exist; absolute imports may only name ``allowed_top_level`` modules
    (``forbidden`` names, e.g. the package's own import name, are reported specifically).
    Imports inside functions (lazy ``import cutlass``) are checked too.
    """
    problems = []
    for path in sorted(package_root.rglob("*.py")):
        rel = path.relative_to(package_root)
        depth = len(rel.parts) - 1  # number of enclosing sub-packages below the root
        imports = [n for n in ast.walk(ast.parse(path.read_text(), filename=str(path))) if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in imports:
            where = f"{rel}:{node.lineno}"
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                problems += _relative_import_problems(path, node, depth, where)
            else:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                for top in sorted({n.split(".", 1)[0] for n in names}):
                    if top in forbidden:
                        problems.append(f"{where}: absolute import of {top!r}; use a relative import (`from . import ...`)")
                    elif top not in allowed_top_level:
                        problems.append(f"{where}: imports {top!r}, which is neither stdlib, torch, nor a declared python-depends")
    return problems


def _relative_import_problems(path: Path, node: ast.ImportFrom, depth: int, where: str) -> list[str]:
    if node.level - 1 > depth:
        return [f"{where}: relative import climbs out of the package (level {node.level})"]
    if not node.module:
        return []  # `from . import name`: name may be a submodule or an attribute of the package
    base = path.parents[node.level - 1]
    target = base.joinpath(*node.module.split("."))
    if target.with_suffix(".py").is_file() or (target / "__init__.py").is_file():
        return []
    return [f"{where}: relative import of missing module {'.' * node.level}{node.module}"]


def allowed_imports(python_depends: list[str]) -> set[str]:
    provided = set().union(*(DEPENDENCY_IMPORTS.get(dep, set()) for dep in python_depends))
    return set(sys.stdlib_module_names) | {"torch"} | provided


def test_shipped_modules_import_only_what_the_loader_provides(metadata, variant):
    problems = import_violations(variant, allowed_imports(metadata.python_depends), forbidden={"flash_attn_4_sm120"})
    assert not problems, "imports that break loading from the Hub:\n  " + "\n  ".join(problems)


#: Import names a user of this bundle very likely has installed. In clone-style use
#: (``sys.path.insert(0, "build/torch-cuda")``) every top-level module of the variant root becomes
#: importable by its bare name, so e.g. a ``kernels/`` sub-package hides Hugging Face's ``kernels``
#: library from everything imported afterwards (transformers imports it for kernelize()).
ECOSYSTEM_MODULES = {
    "kernels", "torch", "cutlass", "cuda", "tvm_ffi", "einops", "huggingface_hub", "transformers",
    "triton", "numpy", "flash_attn", "quack", "pytest", "setuptools",
}


def test_variant_root_shadows_no_common_module(variant):
    top_level = {p.stem for p in variant.glob("*.py")} | {p.name for p in variant.iterdir() if (p / "__init__.py").is_file()}
    # The compat package is the one bare name this layout is meant to provide.
    top_level -= {"__init__", "flash_attn_4_sm120"}
    shadowed = sorted(top_level & (set(sys.stdlib_module_names) | ECOSYSTEM_MODULES))
    assert not shadowed, (
        f"build/torch-cuda top-level names {shadowed} shadow stdlib/installed modules when build/torch-cuda is on "
        "sys.path (clone-style use); rename them in torch-ext/flash_attn_4_sm120 (e.g. with a leading underscore)"
    )


def test_import_scanner_flags_violations(tmp_path):
    # The scanner must be able to fail: one file per kind of violation, plus legal imports.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import os\nfrom . import sub\nfrom .sub import ok\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "ok.py").write_text("import torch\nfrom ..sub import ok\n\ndef f():\n    import cutlass\n")
    (pkg / "sub" / "bad.py").write_text(
        "from ... import outside\nfrom .missing import x\nimport flash_attn_4_sm120\n\ndef g():\n    import numpy\n    import einops\n"
    )
    problems = import_violations(pkg, allowed_imports(["nvidia-cutlass-dsl"]), forbidden={"flash_attn_4_sm120"})
    joined = "\n".join(problems)
    assert all(p.startswith("sub/bad.py") for p in problems), joined
    for needle in ("climbs out", "missing module .missing", "'flash_attn_4_sm120'", "'numpy'", "'einops'"):
        assert needle in joined
    assert len(problems) == 5, joined
