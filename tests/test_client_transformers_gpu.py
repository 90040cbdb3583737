"""transformers 5.20 as a client: tiny Llama and gpt-oss models on this bundle through ``kernels`` (GPU).

Runs the check functions of ``tools/client_transformers.py`` (its docstring has the rules and the device
command): logits of the bf16 model on the bundle against an fp32 eager reference, within twice the bf16
baseline's error, with and without padding; greedy generation equal to the baseline's up to bf16 ties; and
calls counted on the loaded module. llama loads ``attn_implementation="sm120-kernels/flash-attn-4-sm120"``;
gpt-oss, which replaces flash kernels outside its ``_compatible_flash_implementations``, goes through a
``LOCAL_KERNELS`` alias of a name it accepts.

Needs transformers >= 5.20 (the devkit's trimmed copy on PYTHONPATH) and kernels >= 0.17.2, < 0.18;
skipped otherwise, and without CUDA (the ``gpu`` marker).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "client_transformers.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("client_transformers", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool(tmp_path_factory):
    module = _load_tool()
    problem = module.requirements_problem("cuda")
    if problem is not None:
        pytest.skip(problem)
    env = module.environment(module.Options())
    if env.get("arch_listed") is False:
        pytest.fail(f"build/torch-cuda/metadata.json backend.archs {env['metadata_archs']} lacks "
                    f"{env['capability']}: kernels refuses the build on this GPU")
    module._test_workdir = tmp_path_factory.mktemp("client_transformers")
    return module


def _options(tool, name):
    return tool.Options(device="cuda", workdir=str(tool._test_workdir / name))


def _assert_passed(report):
    assert report["passed"], json.dumps(report, indent=1, default=str)


def test_llama(tool):
    report = tool.check_llama(_options(tool, "llama"))
    _assert_passed(report)
    assert report["attn_implementation_resolved"] == tool.REPO_ID
    assert report["calls_total"]["flash_attn_func"] > 0 and report["calls_total"]["flash_attn_varlen_func"] > 0


@pytest.mark.parametrize("route", ["vllm-fa3-alias", "fa4-alias"])
def test_gpt_oss(tool, route):
    report = tool.check_gpt_oss(_options(tool, f"gpt_oss_{route}"), route=route)
    if report.get("skipped"):
        pytest.skip(report["skipped"])
    _assert_passed(report)
    # Sliding layers get (w - 1, w - 1) with causal=True: w keys under FlashAttention-4's convention.
    w = report["sliding_window"]
    assert repr((w - 1, w - 1)) in report["call_arguments"]["window_size_values"]
    assert report["window_sensitivity_ref"] > 0
