"""tools/plot_bench.py on the CPU: forward and backward results become PNG charts."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import plot_bench  # noqa: E402


def _bwd_result():
    def res(*tf):
        return {impl: {"bwd": {"tflops": t}, "fwd_bwd": {"tflops": t}} for impl, t in zip(
            ("ours", "ours_deterministic", "sdpa_flash_fa2"), tf)}
    return {"device": "test", "date": "2026-11-25", "rows": [
        {"case": "a", "results": res(200, 160), "results_h100": res(210, 170, 300)},
        {"case": "b", "results": res(150, 120), "results_h100": res(150, 121, 200)}]}


def test_backward_result_is_detected_and_has_a_panel_per_occupancy():
    result = _bwd_result()
    assert plot_bench.is_backward(result)
    panels = plot_bench.backward_panels(result)
    assert [t for t, _ in panels] == ["SM120 occupancy", "H100 occupancy"]
    assert panels[1][1][0]["results"]["sdpa_flash_fa2"] == {"tflops": 300}
    assert not plot_bench.is_backward({"rows": [{"case": "f", "seqlen_q": 128, "results": {"ours": {"tflops": 1}}}]})


def test_charts_are_written(tmp_path):
    out = plot_bench.plot(_bwd_result(), tmp_path / "bwd.png")
    assert out.stat().st_size > 1000
    fwd = {"device": "test", "date": "d", "rows": [
        {"case": "c", "seqlen_q": 128, "results": {"ours": {"tflops": 300}, "sdpa_flash_fa2": {"tflops": 250}}},
        {"case": "decode", "seqlen_q": 1, "results": {"ours": {"kv_gbps": 3000}}}]}
    assert plot_bench.plot(fwd, tmp_path / "fwd.png").stat().st_size > 1000
