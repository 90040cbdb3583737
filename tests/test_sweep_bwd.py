"""benchmarks/sweep_bwd.py on the CPU: the covering design's cases and the sweep's chart from a result."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sweep_bwd  # noqa: E402


def test_every_head_dim_meets_every_ratio_and_length():
    cases = sweep_bwd.sweep_cases()
    assert len({c[0] for c in cases}) == len(cases)
    for d in sweep_bwd.HEAD_DIMS:
        mine = [c for c in cases if c[6] == d]
        assert {c[4] // c[5] for c in mine} == set(sweep_bwd.RATIOS)
        assert {c[2] for c in mine} == set(sweep_bwd.LENGTHS)
        assert all(c[4] % c[5] == 0 and c[1] * c[2] <= sweep_bwd.TOKENS + c[2] for c in mine)
    # every (ratio, length) pair is measured somewhere, and both masks at every ratio
    assert {(c[4] // c[5], c[2]) for c in cases} == {(r, n) for r in sweep_bwd.RATIOS for n in sweep_bwd.LENGTHS}
    assert {(c[4] // c[5], c[8]) for c in cases} == {(r, m) for r in sweep_bwd.RATIOS for m in (False, True)}


def test_ratios_and_chart(tmp_path):
    def row(case, d, ours, det, fa2, up):
        res = {"ours": ours, "ours_deterministic": det, "sdpa_flash_fa2": fa2, "fa4_sm120_path": up}
        return {"case": case, "head_dim": d, "seqlen_q": 500, "heads_q": 32, "heads_kv": 8, "causal": d > 80,
                "results": {k: ({"bwd": {"ms": v}} if v else {"error": "x"}) for k, v in res.items()}}
    rows = [row("a", 72, 1.0, 1.2, 1.5, 2.0), row("b", 88, 2.0, 2.2, 1.0, None)]
    entries = sweep_bwd.ratios(rows)
    assert entries[0]["over_fa4_sm120_path"] == 2.0 and entries[0]["deterministic_cost"] == 1.2
    assert "over_fa4_sm120_path" not in entries[1] and entries[1]["over_sdpa_flash_fa2"] == 0.5
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"device": "test", "date": "2026-11-29", "rows": rows}))
    assert sweep_bwd.plot(path).stat().st_size > 1000
