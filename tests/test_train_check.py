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


def test_plain_model_baselines_are_the_same_attention():
    """The plain model's two baselines (SDPA and the written-out attention) compute the same causal GQA
    attention: the second baseline bounds bf16 noise only if it is the same function (a missing mask, a wrong
    scale or head grouping would show here)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    q = torch.randn(2, 37, 8, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 37, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    sdpa = train_check.causal_attention(q, k, v).float()
    eager = train_check.causal_attention(q, k, v, eager=True).float()
    assert (sdpa - eager).abs().max() < 0.03
    # the check has teeth: the non-causal result differs far beyond that
    full = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                            enable_gqa=True).transpose(1, 2).float()
    assert (full - eager).abs().max() > 0.3
    seq, batch = train_check.SEQ, train_check.BATCH
    train_check.SEQ, train_check.BATCH = 64, 2
    try:
        ids, labels = next(train_check.batches(1, "cpu"))
        loss = train_check.plain_model(None, eager=True, device="cpu")(ids, labels).item()
    finally:
        train_check.SEQ, train_check.BATCH = seq, batch
    assert 5.0 < loss < 8.0  # about ln(512) at initialization


def test_sdpa_orders_name_every_backend_once():
    """Each SDPA run's order (``sdpa_backend``) names real backends; ``sdpa_sm120`` is torch's order where cuDNN is
    not preferred (flash, memory-efficient, math, cuDNN) and ``sdpa`` puts cuDNN first, as torch does on the H100."""
    from torch.nn.attention import SDPBackend

    for name, order in train_check.SDPA_ORDERS.items():
        backends = [getattr(SDPBackend, b) for b in order]
        assert len(set(backends)) == len(backends), name
    assert train_check.SDPA_ORDERS["sdpa_sm120"][:2] == ("FLASH_ATTENTION", "EFFICIENT_ATTENTION")
    assert train_check.SDPA_ORDERS["sdpa"][0] == "CUDNN_ATTENTION"
    assert train_check.sdpa_backend("eager") is not None  # other runs: a null context, no device touched


def test_own_code_gives_each_step_its_own_code_object():
    """torch.compile keeps graphs per code object: two tags give two code objects that compute the same thing."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_step

    scale = 3

    def f(x, y=2):
        return x * scale + y

    a, b = bench_step.own_code(f, "a"), bench_step.own_code(f, "b")
    assert a.__code__ is not b.__code__ and a.__code__ is not f.__code__
    assert a(1) == b(1) == f(1) == 5 and a(1, y=0) == 3
