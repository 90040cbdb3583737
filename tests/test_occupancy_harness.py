"""The benchmark's SM120-occupancy harness (benchmarks/occupancy.py): which cache preference gives a peer's
kernel an SM120's CTAs per SM on the H100. Pure logic; the mechanism itself was checked with ncu on the device
(benchmarks/results/carveout_probe_h100_2026-11-23.json.gz)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import occupancy  # noqa: E402

from flash_attn_4_sm120.execution_model import SM120  # noqa: E402


@pytest.mark.parametrize("smem, regs, threads, per_sm, threads_per_sm, want", [
    (65536, 255, 128, 102400, 1536, 1),    # FA2 d=128 on an SM120
    (65536, 255, 128, 233472, 2048, 2),    # ... on an H100, no preference
    (49152, 255, 128, 102400, 1536, 2),    # FA2 d=64: two on both parts
    (41984, 168, 128, 233472, 2048, 3),    # ours d=64 causal on an H100: 3, registers and smem
    (131072, 255, 128, 102400, 1536, 0),   # upstream d=256 cannot launch on an SM120
    (0, 32, 1024, 102400, 1536, 1),        # threads bind: one 1024-thread CTA per SM120 SM
])
def test_ctas_per_sm(smem, regs, threads, per_sm, threads_per_sm, want):
    assert occupancy.ctas_per_sm(smem, regs, threads, per_sm, threads_per_sm) == want


def _kernel(smem, regs=255, threads=128, us=100.0):
    return {"name": "k", "us": us, "smem": smem, "regs": regs, "threads": threads}


@pytest.mark.parametrize("smem, pref", [(65536, "l1"), (98304, "l1"), (81920, "l1"), (49152, "none"),
                                        (131072, None)])
def test_faithful_preference(monkeypatch, smem, pref):
    # the longest kernel decides (a short combine kernel beside a split decode does not)
    monkeypatch.setattr(occupancy, "kernel_launches", lambda fn: [_kernel(1024, us=5.0), _kernel(smem)])
    info = occupancy.faithful_preference(None, SM120)
    assert info["pref"] == pref
    if pref is not None:
        assert info["h100_ctas_per_sm"][pref] == info["sm120_ctas_per_sm"]


def test_no_kernel_seen(monkeypatch):
    monkeypatch.setattr(occupancy, "kernel_launches", lambda fn: [])
    assert occupancy.faithful_preference(None, SM120)["pref"] is None
