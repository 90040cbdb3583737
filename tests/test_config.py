"""The tile table and the one validity predicate."""

import pytest

from flash_attn_4_sm120 import config
from flash_attn_4_sm120.execution_model import MODELS, SM120
from flash_attn_4_sm120.problem import FwdSpec


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_every_dispatchable_config_passes_the_predicate(model):
    pairs = config.dispatchable_fwd(model)
    assert len(pairs) == 8  # 2 dtypes x 2 head dims x 2 masks
    for spec, cfg in pairs:
        assert config.fwd_config_problems(spec, cfg, model) == ()


def test_table_records_device_and_date():
    import json

    data = json.loads(config.TABLE_PATH.read_text())
    assert data["device"] and data["date"] and set(data["table"]) == {"d64_full", "d64_causal", "d128_full", "d128_causal"}


@pytest.mark.parametrize(
    "cfg, fragment",
    [
        pytest.param(config.FwdConfig(128, 128, 8, 2), "exceeds 101376", id="smem"),
        pytest.param(config.FwdConfig(128, 64, 4, 2), "accumulator registers", id="registers"),
        pytest.param(config.FwdConfig(96, 64, 4, 2), "multiple of 64", id="rows-per-warp"),
        pytest.param(config.FwdConfig(64, 40, 4, 2), "tile_n=40", id="tile-n"),
        pytest.param(config.FwdConfig(64, 64, 4, 5), "num_stages=5", id="stages"),
    ],
)
def test_predicate_names_each_problem(cfg, fragment):
    spec = FwdSpec("bf16", 128, 128, True)
    problems = config.fwd_config_problems(spec, cfg, SM120)
    assert any(fragment in p for p in problems), problems


def test_static_smem_counts_against_the_budget():
    # 100352 B of dynamic smem + the 1024 B static section is exactly the 101376 B limit.
    spec = FwdSpec("bf16", 64, 64, False)
    cfg = config.FwdConfig(64, 64, 4, 3)
    assert config.fwd_smem_bytes(spec, cfg) + config.STATIC_SMEM_BYTES <= SM120.smem_per_cta
