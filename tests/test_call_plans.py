"""Remembered launch plans (``launch._PLANS``): a repeated call skips validation and dispatch. The key
must cover everything validation and dispatch read, and calls it cannot describe are never remembered."""

import numpy as np
import pytest
import torch

import flash_attn_4_sm120 as fa
from flash_attn_4_sm120 import custom_ops, launch, validation
from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV
from reference import attention_grads_ref, attention_ref, varlen_batch


def _qkv(device="cpu", b=2, sq=5, sk=9, hq=4, hkv=2, d=64, dtype=torch.bfloat16):
    return (torch.randn(b, sq, hq, d, dtype=dtype, device=device), torch.randn(b, sk, hkv, d, dtype=dtype, device=device),
            torch.randn(b, sk, hkv, d, dtype=dtype, device=device))


def _key(q, k, v, sink=None, scale=None, softcap=0.0, window=(None, None), causal=False):
    return launch.call_key((q, k, v, sink), (scale, softcap, *window), ("dense", causal, None, None))


def test_equal_calls_share_a_key_and_every_checked_fact_changes_it(monkeypatch):
    q, k, v = _qkv()
    key = _key(q, k, v)
    assert key is not None and key == _key(*(t.clone() for t in (q, k, v)))
    others = [
        _key(*_qkv(sk=10)),  # a shape
        _key(*_qkv(dtype=torch.float16)),  # a dtype
        _key(q, k, v, scale=0.5),
        _key(q, k, v, softcap=30.0),
        _key(q, k, v, window=(8, 0)),
        _key(q, k, v, causal=True),
        _key(q, k, v, sink=torch.zeros(4)),
        launch.call_key((q, k, v, None), (None, 0.0, None, None), ("dense", False, 2, None)),  # num_splits
        launch.call_key((q, k, v, None), (None, 0.0, None, None), ("varlen", False, None, None)),
    ]
    monkeypatch.setenv(OCCUPANCY_ENV, "device")  # the environment dispatch reads
    others.append(_key(q, k, v))
    assert None not in others and key not in others and len(set(others)) == len(others)


@pytest.mark.parametrize("make", [
    pytest.param(lambda q, k, v: (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v, None, None),
                 id="last-dim-strided"),
    pytest.param(lambda q, k, v: (torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape), k, v, None, None),
                 id="misaligned"),
    pytest.param(lambda q, k, v: ("q", k, v, None, None), id="not-a-tensor"),
    pytest.param(lambda q, k, v: (q, k, v, [0.0] * 4, None), id="sink-not-a-tensor"),
    pytest.param(lambda q, k, v: (q, k, v, None, np.float32(0.1)), id="numpy-scale"),
    pytest.param(lambda q, k, v: (q, k, v, None, torch.tensor(0.1)), id="tensor-scale"),
])
def test_calls_it_cannot_describe_get_no_key(make):
    q, k, v, sink, scale = make(*_qkv())
    assert _key(q, k, v, sink=sink, scale=scale) is None


def test_a_view_the_kernels_read_in_place_gets_a_key_of_its_strides():
    """(batch, heads, seqlen, d) transposed to (batch, seqlen, heads, d), as transformers passes q / k / v: read in
    place (``kernel_layout``), remembered under its strides, apart from the contiguous layout's key."""
    q, k, v = _qkv()
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    key = _key(qt, kt, vt)
    assert key is not None and key != _key(q, k, v) and key == _key(*(t.transpose(1, 2).contiguous().transpose(1, 2)
                                                                       for t in (q, k, v)))
    odd = torch.empty(2, 5, 4, 72, dtype=q.dtype)[..., :64]  # rows of 72 elements: 16-byte multiples, read in place
    assert _key(odd, k, v) is not None and _key(odd, k, v) != key
    odd = torch.empty(2, 5, 4, 68, dtype=q.dtype)[..., :64]  # rows of 68 elements (136 bytes): copied first
    assert _key(odd, k, v) is None


@pytest.mark.parametrize("window", [(torch.tensor(3), 0), (np.int64(3), 0), (True, 0)], ids=["tensor", "numpy", "bool"])
def test_window_entries_other_than_int_or_none_get_no_key(window):
    assert _key(*_qkv(), window=window) is None


def test_a_refused_call_is_not_remembered():
    launch._PLANS.clear()
    with pytest.raises(ValueError, match="CUDA tensors"):
        fa.flash_attn_func(*_qkv())
    assert not launch._PLANS


# -- on the GPU ------------------------------------------------------------------------------------


def _count_validations(monkeypatch):
    calls = []
    for name in ("validate_fwd", "validate_varlen"):
        real = getattr(validation, name)
        monkeypatch.setattr(validation, name, lambda *a, _real=real, **kw: (calls.append(1), _real(*a, **kw))[1])
    return calls


@pytest.mark.gpu
@pytest.mark.parametrize("features", [
    pytest.param({}, id="plain"),
    pytest.param({"causal": True, "softcap": 20.0}, id="causal-softcap"),
    pytest.param({"window_size": (16, -2)}, id="window"),
    pytest.param({"learnable_sink": "sink"}, id="sink"),
    pytest.param({"num_splits": 3}, id="split3"),
])
def test_a_repeated_call_runs_its_plan_with_the_same_result(monkeypatch, features):
    monkeypatch.setattr(launch, "_PLANS", {})
    validations = _count_validations(monkeypatch)
    torch.manual_seed(0)
    q, k, v = _qkv("cuda", b=3, sq=70, sk=301, hq=6, hkv=2, d=96)
    features = dict(features)
    if features.get("learnable_sink") == "sink":
        features["learnable_sink"] = torch.randn(6, device="cuda")
    first, lse1 = fa.flash_attn_func(q, k, v, return_lse=True, **features)
    second, lse2 = fa.flash_attn_func(q, k, v, return_lse=True, **features)
    assert len(validations) == 1 and len(launch._PLANS) == 1
    assert torch.equal(first, second) and torch.equal(lse1, lse2)
    # new tensors of the same shapes (another layer): the plan runs on them
    q2, k2, v2 = (torch.randn_like(t) for t in (q, k, v))
    sink = features.pop("learnable_sink", None)
    if sink is not None:
        sink = torch.randn_like(sink)
    out, lse = fa.flash_attn_func(q2, k2, v2, return_lse=True, learnable_sink=sink, **features)
    assert len(validations) == 1
    ref, lse_ref = attention_ref(q2, k2, v2, None, features.get("causal", False),
                                 window_size=features.get("window_size", (None, None)),
                                 softcap=features.get("softcap", 0.0), learnable_sink=sink)
    pt, _ = attention_ref(q2, k2, v2, None, features.get("causal", False),
                          window_size=features.get("window_size", (None, None)), softcap=features.get("softcap", 0.0),
                          learnable_sink=sink, upcast=False)
    assert (out.float() - ref.float()).abs().max() <= 2 * (pt.float() - ref.float()).abs().max() + 1e-5
    fin = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), fin) and (lse[fin] - lse_ref[fin]).abs().max() <= 1e-3


@pytest.mark.gpu
def test_what_dispatch_reads_makes_a_new_plan(monkeypatch):
    monkeypatch.setattr(launch, "_PLANS", {})
    validations = _count_validations(monkeypatch)
    q, k, v = _qkv("cuda", sq=64, sk=200)
    fa.flash_attn_func(q, k, v)
    fa.flash_attn_func(q, k, v, causal=True)
    fa.flash_attn_func(q, k[:, :199].contiguous(), v[:, :199].contiguous())
    monkeypatch.setenv(OCCUPANCY_ENV, "device")
    fa.flash_attn_func(q, k, v)
    assert len(validations) == 4 and len(launch._PLANS) == 4
    fa.flash_attn_func(q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v)  # copied first: never remembered
    assert len(validations) == 5 and len(launch._PLANS) == 4
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # read in place: remembered under its strides
    out = fa.flash_attn_func(strided, k, v)[0]
    assert torch.equal(out, fa.flash_attn_func(strided, k, v)[0]) and torch.equal(out, fa.flash_attn_func(q, k, v)[0])
    assert len(validations) == 6 and len(launch._PLANS) == 5


@pytest.mark.gpu
def test_the_low_level_forward_remembers_its_calls_and_checks_the_outputs_given(monkeypatch):
    """``flash_attn_fwd`` replays its plan (into the ``out`` / ``lse`` given, each checked against the plan's shapes);
    another dtype, stride or sink makes a new one."""
    monkeypatch.setattr(launch, "_PLANS", {})
    validations = _count_validations(monkeypatch)
    q, k, v = _qkv("cuda", b=2, sq=40, sk=130, hq=4, hkv=2, d=64)
    out, lse = fa.flash_attn_fwd(q, k, v, causal=True)
    out2, lse2 = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
    fa.flash_attn_fwd(q, k, v, causal=True, out=out2, lse=lse2)
    assert len(validations) == 1 and torch.equal(out, out2) and torch.equal(lse, lse2)
    with pytest.raises(ValueError, match="out"):
        fa.flash_attn_fwd(q, k, v, causal=True, out=out2[:, :-1])
    assert torch.equal(out, fa.flash_attn_func(q, k, v, causal=True)[0])
    q16, k16, v16 = (t.half() for t in (q, k, v))
    assert fa.flash_attn_fwd(q16, k16, v16, causal=True)[0].dtype == torch.float16
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.equal(fa.flash_attn_fwd(strided, k, v, causal=True)[0], out)
    sink = torch.randn(4, device="cuda")
    with_sink = fa.flash_attn_fwd(q, k, v, causal=True, learnable_sink=sink)[0]
    assert not torch.equal(with_sink, out)
    assert torch.equal(fa.flash_attn_fwd(q, k, v, causal=True, learnable_sink=sink)[0], with_sink)
    assert len(validations) == 5 and len(launch._PLANS) == 5  # fwd x4 plans + flash_attn_func's


@pytest.mark.gpu
def test_gradients_and_misses_of_metadata_take_the_checked_path(monkeypatch):
    monkeypatch.setattr(launch, "_PLANS", {})
    validations = _count_validations(monkeypatch)
    q, k, v, cu_q, cu_k = varlen_batch([5, 0, 33], [40, 7, 64], 4, 2, 64)
    for _ in range(2):  # the maxima not given: read from the device, never remembered
        fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert len(validations) == 2 and not launch._PLANS
    for _ in range(2):
        out, lse = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=33,
                                             max_seqlen_k=64, return_lse=True)
    assert len(validations) == 3 and len(launch._PLANS) == 1
    ref, _ = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True)
    assert torch.equal(out, ref)
    for _ in range(2):  # the host metadata check runs on every call that asks for it
        fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=33, max_seqlen_k=64,
                                  check_metadata=True)
    assert len(validations) == 6
    qg = q.clone().requires_grad_()
    # a gradient goes through autograd from the remembered plan: no validation
    fa.flash_attn_varlen_func(qg, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=33,
                              max_seqlen_k=64)[0].sum().backward()
    assert qg.grad is not None and len(validations) == 6


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("features", [
    pytest.param({"causal": True}, id="causal"),
    pytest.param({"learnable_sink": "sink", "window_size": (40, 0)}, id="sink-window"),
    pytest.param({"softcap": 15.0, "varlen": True}, id="varlen-softcap"),
])
def test_a_repeated_training_call_runs_its_plan_with_the_same_gradients(monkeypatch, features, layout):
    """A training step's repeated calls (every layer) skip validation and dispatch: the forward through autograd
    from the remembered plan, the backward's launch decisions memoized (``backward.bwd_launch``); the gradients
    of the second call are the first's bit for bit (deterministic mode) and match the fp32 reference."""
    monkeypatch.setattr(launch, "_PLANS", {})
    validations = _count_validations(monkeypatch)
    torch.manual_seed(0)
    features = dict(features)
    varlen = features.pop("varlen", False)
    sink = torch.randn(6, device="cuda", requires_grad=True) if features.pop("learnable_sink", None) else None
    if varlen:
        q, k, v, cu_q, cu_k = varlen_batch([70, 0, 45], [131, 9, 64], 6, 2, 64)
        extra = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=70, max_seqlen_k=131)
        entry = fa.flash_attn_varlen_func
    else:
        q, k, v = _qkv("cuda", b=2, sq=70, sk=131, hq=6, hkv=2, d=64)
        extra, entry = {}, fa.flash_attn_func
    if layout == "transposed":  # (batch, heads, seqlen, d) storage, as a transformers attention layer passes it
        q, k, v = (t.transpose(-2, -3).contiguous().transpose(-2, -3) for t in (q, k, v))
    dout = torch.randn(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device="cuda")

    def grads(q, k, v):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = entry(*leaves, deterministic=True, learnable_sink=sink, **features, **extra)[0]
        return (out, *torch.autograd.grad(out, leaves + ([sink] if sink is not None else []), dout))

    first = grads(q, k, v)
    second = grads(q, k, v)
    assert len(validations) == 1 and len(launch._PLANS) == 1
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    if varlen:  # the same sequences through the checked path (the varlen backward's own tests hold it to fp32)
        monkeypatch.setattr(launch, "_PLANS", {})
        for a, b in zip(first, grads(*(t.contiguous() for t in (q, k, v)))):
            assert torch.equal(a, b)
        return
    ref_features = dict(features, learnable_sink=sink.detach() if sink is not None else None)
    ref = attention_grads_ref(q, k, v, dout, True, **dict(ref_features))
    pt = attention_grads_ref(q, k, v, dout, False, **dict(ref_features))
    for name, g, r, p in zip(("dq", "dk", "dv", "dsink"), first[1:], ref, pt):
        if r is not None:
            err, pt_err = ((x.float() - r.float()).abs().max().item() for x in (g, p))
            assert err <= 2 * pt_err + 2e-3, f"{name}: {err:.3e} > 2 * {pt_err:.3e} + 2e-3"


@pytest.mark.gpu
def test_the_custom_ops_remember_their_calls(monkeypatch):
    """The forward and backward ops (what a ``torch.compile`` graph calls every step) validate a repeated call
    once, and give what the checked eager entries give, bit for bit (deterministic backward)."""
    monkeypatch.setattr(launch, "_PLANS", {})
    validations = _count_validations(monkeypatch)
    torch.manual_seed(0)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2)
               for t in _qkv("cuda", b=2, sq=70, sk=131, hq=6, hkv=2, d=64))
    sink = torch.randn(6, device="cuda")
    fwd_args = (None, True, 32, 0, 0.0, sink, 0, None, True, None)
    outs = [custom_ops._fwd_op(q, k, v, *fwd_args) for _ in range(2)]
    assert len(validations) == 1
    out, lse = outs[0]
    assert torch.equal(out, outs[1][0]) and torch.equal(lse, outs[1][1])
    ref_out, ref_lse = fa.flash_attn_func(q, k, v, causal=True, window_size=(32, 0), learnable_sink=sink,
                                          return_lse=True)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    dout = torch.randn_like(out)
    grads = [custom_ops._bwd_op(dout, None, q, k, v, out, lse, None, True, 32, 0, 0.0, sink, True, None)
             for _ in range(2)]
    assert len(validations) == 3  # flash_attn_func above, then the backward op once
    ref = fa.flash_attn_bwd(dout, q, k, v, out, lse, causal=True, window_size=(32, 0), learnable_sink=sink,
                            deterministic=True)
    for a, b, r in zip(*grads, ref):
        assert torch.equal(a, b) and torch.equal(a, r)


@pytest.mark.gpu
def test_the_varlen_ops_remember_their_calls(monkeypatch):
    monkeypatch.setattr(launch, "_PLANS", {})
    validations = _count_validations(monkeypatch)
    torch.manual_seed(0)
    q, k, v, cu_q, cu_k = varlen_batch([70, 0, 45], [131, 9, 64], 6, 2, 64)
    fwd_args = (cu_q, cu_k, None, None, 70, 131, None, True, None, None, 10.0, None, 0, None, None, None, True, None)
    outs = [custom_ops._varlen_op(q, k, v, *fwd_args) for _ in range(2)]
    assert len(validations) == 1
    out, lse = outs[0]
    assert torch.equal(out, outs[1][0]) and torch.equal(lse, outs[1][1])
    dout = torch.randn_like(out)
    bwd_args = (cu_q, cu_k, None, None, 70, 131, None, True, None, None, 10.0, None, True, None)
    grads = [custom_ops._varlen_bwd_op(dout, None, q, k, v, out, lse, *bwd_args) for _ in range(2)]
    assert len(validations) == 2
    monkeypatch.setattr(launch, "_PLANS", {})  # the checked path, every call validated
    ref_out, ref_lse = custom_ops._varlen_op(q, k, v, cu_q, cu_k, None, None, None, None, None, True, None, None, 10.0,
                                             None, 0, None, None, None, True, None)
    ref = custom_ops._varlen_bwd_op(dout, None, q, k, v, out, lse, cu_q, cu_k, None, None, None, None, None, True,
                                    None, None, 10.0, None, True, None)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    for a, b, r in zip(*grads, ref):
        assert torch.equal(a, b) and torch.equal(a, r)
