"""The training check's host logic (tools/train_check.py) on the CPU: the copy-task batches and the pass rule."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import train_check  # noqa: E402


def _run(first, tail, n=100):
    return {"losses": [first] * 10 + [tail] * (n - 10), "step_ms": 1.0}


def test_batches_are_a_copy_task_and_repeat():
    a = list(train_check.batches(3, "cpu", seed=5))
    b = list(train_check.batches(3, "cpu", seed=5))
    p = train_check.PERIOD
    for (ids, labels), (ids2, _) in zip(a, b):
        assert ids.shape == (train_check.BATCH, train_check.SEQ)
        assert (ids[:, p:] == ids[:, :-p]).all() and len(set(ids[0, :p].tolist())) > p // 2
        assert (labels[:, :p] == -100).all() and (labels[:, p:] == ids[:, p:]).all()
        assert (ids == ids2).all()
        assert ids.min() >= 3 and ids.max() < train_check.VOCAB


def test_rule_passes_within_the_baselines_spread():
    runs = {"ours": _run(6.0, 1.03), "sdpa": _run(6.0, 1.00), "eager": _run(6.0, 1.02)}
    assert train_check.check("m", runs, "ours", "sdpa", "eager") == []


@pytest.mark.parametrize("runs, why", [
    ({"ours": _run(6.0, 1.10), "sdpa": _run(6.0, 1.00), "eager": _run(6.0, 1.01)}, "> "),
    ({"ours": _run(6.0, 5.00), "sdpa": _run(6.0, 1.00), "eager": _run(6.0, 1.01)}, "did not fall"),
    ({"ours": {"error": "RuntimeError: boom"}, "sdpa": _run(6.0, 1.0), "eager": _run(6.0, 1.0)}, "boom"),
], ids=["gap", "no-learning", "error"])
def test_rule_fails(runs, why):
    failures = train_check.check("m", runs, "ours", "sdpa", "eager")
    assert failures and any(why in f for f in failures)


def test_single_baseline_uses_two_percent():
    assert train_check.check("m", {"ours": _run(6.0, 1.015), "eager": _run(6.0, 1.0)}, "ours", "eager", None) == []
    assert train_check.check("m", {"ours": _run(6.0, 1.05), "eager": _run(6.0, 1.0)}, "ours", "eager", None)
