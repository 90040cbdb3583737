"""precompile: spec enumeration, the API's refusals, and a cache filled on this CPU that a fresh process loads.

CPU-only except the one ``gpu`` test. Everything that compiles runs in fresh interpreters with a private
``FA4_SM120_CACHE_DIR`` (the process-wide default cache resolves its directory once); the in-process tests
only reach the checks, which run before anything compiles.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import flash_attn_4_sm120.compiler as compiler
import flash_attn_4_sm120.manifest as manifest
from flash_attn_4_sm120.execution_model import SM120, UnsupportedDeviceError
from flash_attn_4_sm120.precompile import fwd_specs, main, precompile
from flash_attn_4_sm120.problem import FwdSpec, validate_fwd

TORCH_EXT = Path(__file__).resolve().parents[1] / "torch-ext"
_OVERRIDES = ("FA4_SM120_DISPATCH_ARCH", "FA4_SM120_COMPILE_TARGET", "FA4_SM120_DISK_CACHE")


@pytest.fixture
def no_compile(monkeypatch):
    """The checks must refuse before anything is compiled."""
    def refuse(*args, **kwargs):
        raise AssertionError("get_fwd_kernel was called for a refused spec")

    monkeypatch.setattr(compiler, "get_fwd_kernel", refuse)


# -- specs -----------------------------------------------------------------------------------------


def test_fwd_specs_is_the_product_in_order_without_duplicates():
    specs = fwd_specs(("bf16", torch.float16, "bfloat16"), (64, 128), (False, True))
    assert [(s.dtype, s.head_dim, s.causal) for s in specs] == [
        ("bf16", 64, False), ("bf16", 64, True), ("bf16", 128, False), ("bf16", 128, True),
        ("fp16", 64, False), ("fp16", 64, True), ("fp16", 128, False), ("fp16", 128, True),
    ]
    # The spec the API derives from a dense call: no window, softcap or sink.
    assert specs[0] == FwdSpec(dtype="bf16", head_dim=64, head_dim_v=64, causal=False)


def test_fwd_specs_scalars_and_head_dim_v():
    assert fwd_specs("fp16", 192, True, head_dim_v=128) == [FwdSpec("fp16", 192, 128, True)]
    assert fwd_specs(torch.bfloat16, (128,), False, head_dim_v=(64, 128)) == [
        FwdSpec("bf16", 128, 64, False), FwdSpec("bf16", 128, 128, False)]


@pytest.mark.parametrize("kwargs, error", [
    (dict(dtypes=("fp32",)), TypeError),
    (dict(dtypes=(torch.float32,)), TypeError),
    (dict(head_dims=(64.0,)), TypeError),
    (dict(causal=("yes",)), TypeError),
], ids=["fp32-name", "fp32-dtype", "float-head-dim", "causal-string"])
def test_fwd_specs_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        fwd_specs(**kwargs)


# -- refusals: the API's exceptions, before any compile ----------------------------------------------


@pytest.mark.parametrize("head_dim, head_dim_v", [(12, 12), (520, 520), (100, 100), (64, 12), (0, 0)],
                         ids=["d12", "d520", "d100", "dv12", "d0"])
def test_head_dims_the_api_rejects_raise_its_value_error(head_dim, head_dim_v, no_compile):
    q = torch.zeros(1, 1, 1, head_dim, dtype=torch.bfloat16)
    v = torch.zeros(1, 1, 1, head_dim_v, dtype=torch.bfloat16)
    with pytest.raises(ValueError) as api:
        validate_fwd(q, q, v, None, False)  # head dims are checked before the device
    with pytest.raises(ValueError) as ours:
        precompile(head_dims=(64, head_dim), head_dim_v=head_dim_v if head_dim_v != head_dim else None,
                   causal=False, model=SM120)
    # The same rule in the same words; the API names the tensor (q, v), precompile the argument.
    assert str(ours.value).split(": ", 1)[1] == str(api.value).split(": ", 1)[1]
    assert str(ours.value).startswith(f"head_dim {head_dim}:" if head_dim % 8 or not 8 <= head_dim <= 256
                                      else f"head_dim_v {head_dim_v}:")


@pytest.fixture
def planned(monkeypatch, tmp_path):
    """``planned(feature_id)``: a manifest in which that feature is not implemented; returns its message."""
    def make(feature_id: str) -> str:
        data = json.loads(manifest.MANIFEST_PATH.read_text())
        [feature] = [f for f in data["features"] if f["id"] == feature_id]
        feature.update(status="planned", message=f"{feature_id} is not available in this test",
                       alternative="none")
        path = tmp_path / "manifest.json"
        path.write_text(json.dumps(data))
        monkeypatch.setattr(manifest, "MANIFEST_PATH", path)
        manifest._data.cache_clear()
        manifest._index.cache_clear()
        return feature["message"]

    yield make
    manifest._data.cache_clear()  # before monkeypatch restores the path: the next use reads the real file
    manifest._index.cache_clear()


@pytest.mark.parametrize("feature_id, kwargs", [
    ("head_dim_any", dict(head_dims=(64, 96))),
    ("head_dim_256", dict(head_dims=(128, 256))),
    ("head_dim_v_differs", dict(head_dims=(128,), head_dim_v=64)),
    ("causal", dict(head_dims=(128,), causal=(False, True))),
], ids=["head_dim_any", "head_dim_256", "head_dim_v_differs", "causal"])
def test_a_planned_feature_raises_the_manifests_message(planned, no_compile, feature_id, kwargs):
    message = planned(feature_id)
    with pytest.raises(NotImplementedError) as e:
        precompile(model=SM120, **kwargs)
    assert str(e.value) == message
    with pytest.raises(NotImplementedError) as api:
        manifest.require(feature_id)
    assert str(api.value) == message


def test_cli_refused_spec_exits_2(no_compile, capsys):
    assert main(["--arch", "sm_120", "--head-dims", "12"]) == 2
    assert "ValueError: head_dim 12:" in capsys.readouterr().err


def test_cli_unknown_arch_exits_2(no_compile, capsys):
    assert main(["--arch", "sm_100"]) == 2
    assert "cannot run the SM120 execution model" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when there is no GPU")
def test_without_a_gpu_the_model_must_be_named(monkeypatch, no_compile):
    monkeypatch.delenv("FA4_SM120_DISPATCH_ARCH", raising=False)
    with pytest.raises(UnsupportedDeviceError, match="execution_model.SM120"):
        precompile()


# -- a cache filled here, loaded by a fresh process ----------------------------------------------------


def child_env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _OVERRIDES}
    # torch-ext first; keep the rest of the path (a kit that installs cutlass-dsl with --target puts it there)
    path = os.pathsep.join(p for p in (str(TORCH_EXT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, FA4_SM120_CACHE_DIR=str(tmp_path / "cache"),
               HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    return env


_WARM = textwrap.dedent(
    """
    import dataclasses, json
    from flash_attn_4_sm120 import execution_model
    from flash_attn_4_sm120.compile_cache import default_cache
    from flash_attn_4_sm120.precompile import precompile
    results = precompile(head_dims=(64,), causal=True, model=execution_model.SM120, target="sm_120a")
    print("RESULT " + json.dumps({"results": results, "stats": dataclasses.asdict(default_cache().stats)}))
    """
)


@pytest.mark.check
def test_cpu_precompile_is_a_disk_hit_in_a_fresh_process(tmp_path):
    env = child_env(tmp_path)
    cold_json = tmp_path / "cold.json"
    cold = subprocess.run(
        [sys.executable, "-m", "flash_attn_4_sm120.precompile", "--arch", "sm_120", "--target", "sm_120a",
         "--dtypes", "bf16", "--head-dims", "64", "--causal", "true", "--json", str(cold_json)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert cold.returncode == 0, cold.stderr[-3000:]
    cold_results = json.loads(cold_json.read_text())["results"]  # one per tile candidate of the spec
    for c in cold_results:
        assert (c["name"], c["model"], c["target"], c["source"], c["on_disk"]) == (
            "fwd_bf16_d64x64_causal", "sm120", "sm_120a", "compile", True)
    assert "fwd_bf16_d64x64_causal" in cold.stdout and "compile" in cold.stdout

    warm = subprocess.run([sys.executable, "-c", _WARM], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert warm.returncode == 0, warm.stderr[-3000:]
    [line] = [ln for ln in warm.stdout.splitlines() if ln.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))
    assert len(out["results"]) == len(cold_results)
    for w, c in zip(out["results"], cold_results):
        assert (w["name"], w["config"], w["source"], w["on_disk"]) == (c["name"], c["config"], "disk", True)
    assert out["stats"]["compiles"] == 0 and out["stats"]["disk_hits"] == len(cold_results)
    assert out["stats"]["disk_errors"] == 0
    entries = list((tmp_path / "cache").rglob("*.o"))
    assert len(entries) == len(cold_results), entries


def test_import_has_no_side_effects(tmp_path):
    code = textwrap.dedent(
        """
        import os, sys
        import flash_attn_4_sm120
        before = dict(os.environ)
        import flash_attn_4_sm120.precompile
        assert dict(os.environ) == before, "environment changed"
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("cutlass", "tvm_ffi"))
        assert not heavy, heavy
        """
    )
    subprocess.run([sys.executable, "-c", code], env=child_env(tmp_path), cwd=tmp_path, check=True, timeout=120)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- on a GPU: the precompiled kernel is the one the API call uses -------------------------------------


@pytest.mark.gpu
def test_precompiled_kernel_serves_the_api_call_without_compiling():
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.compile_cache import default_cache

    results = precompile(dtypes=("bf16",), head_dims=(128,), causal=True)  # the spec's tile candidates
    assert results and all(r["source"] in ("memory", "disk", "compile") for r in results)
    stats = default_cache().stats
    before = dataclasses.replace(stats)
    # a prefill-length query (seqlen_q < 128 packs, MHA included: the --decode variants serve those)
    q, k, v = (torch.randn(1, 313, 2, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    fa.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    assert (stats.compiles, stats.disk_hits) == (before.compiles, before.disk_hits)
    assert stats.memory_hits == before.memory_hits + 1


def test_decode_adds_packed_split_variants_and_the_combine(monkeypatch):
    """--decode: each spec's packed-GQA / split-KV variants and one combine kernel per (dtype, dv)."""
    loaded = []
    monkeypatch.setattr(compiler, "get_fwd_kernel", lambda spec, *a: loaded.append(spec))
    monkeypatch.setattr(compiler, "get_combine_kernel", lambda spec, *a: loaded.append(spec))
    results = precompile(dtypes=("bf16",), head_dims=(128,), causal=(False, True), model=SM120,
                         target="sm_120a", decode=True)
    names = list(dict.fromkeys(r["name"] for r in results))  # a spec's tile candidates share its name
    assert names == ["fwd_bf16_d128x128_full", "fwd_bf16_d128x128_causal",
                     "fwd_bf16_d128x128_full_packgqa", "fwd_bf16_d128x128_full_splitkv",
                     "fwd_bf16_d128x128_full_packgqa_splitkv", "fwd_bf16_d128x128_causal_packgqa",
                     "fwd_bf16_d128x128_causal_splitkv", "fwd_bf16_d128x128_causal_packgqa_splitkv",
                     "combine_bf16_dv128"]
    assert len(loaded) == len(results) and results[-1]["config"] == {}


@pytest.mark.gpu
def test_decode_precompile_serves_split_and_packed_decode_without_compiling():
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.compile_cache import default_cache

    precompile(dtypes=("bf16",), head_dims=(128,), causal=False, decode=True)
    before = default_cache().stats.compiles
    q = torch.randn(2, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(2, 8192, 8, 128, dtype=torch.bfloat16, device="cuda")
    fa.flash_attn_func(q, kv, kv)  # packed GQA, split automatically
    fa.flash_attn_func(q, kv, kv, num_splits=1)  # packed GQA, one split
    q = torch.randn(2, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
    fa.flash_attn_func(q, kv, kv)  # MHA decode: split, not packed
    torch.cuda.synchronize()
    assert default_cache().stats.compiles == before


def test_precompile_keys_ignore_a_gpu_that_is_not_the_models(monkeypatch):
    """A build box compiling for sm_120 uses the SM120's own launch (no padding), whatever GPU it has."""
    import torch

    from flash_attn_4_sm120 import execution_model, launch, precompile as pc

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def unsupported(device):
        raise execution_model.UnsupportedDeviceError("compute capability 10.0 cannot run the SM120 execution model")

    monkeypatch.setattr(launch, "dispatch_model", unsupported)
    assert pc._device_smem_for(execution_model.SM120) is None
    monkeypatch.setattr(launch, "dispatch_model", lambda device: execution_model.SM90)
    assert pc._device_smem_for(execution_model.SM120) is None
