"""The opt-in varlen metadata check (``metadata.py``) on CPU tensors: each rule names the bad entry."""

import pytest
import torch

from flash_attn_4_sm120.metadata import CHECK_ENV, check_requested, check_varlen_metadata


def _i32(*xs):
    return torch.tensor(xs, dtype=torch.int32)


Q = torch.empty(10, 2, 8)  # packed: 10 rows
K = torch.empty(12, 2, 8)
QD = torch.empty(3, 6, 2, 8)  # dense: batch 3, seqlen 6


def _check(q=Q, k=K, cu_q=_i32(0, 4, 10), cu_k=_i32(0, 5, 12), used_q=None, used_k=None, max_q=None, max_k=None):
    check_varlen_metadata(q, k, cu_q, cu_k, used_q, used_k, max_q, max_k)


def test_good_metadata_passes():
    _check(used_q=_i32(4, 5), used_k=_i32(0, 7), max_q=6, max_k=7)
    _check(q=QD, k=torch.empty(3, 9, 2, 8), cu_q=None, cu_k=None, used_q=_i32(6, 0, 2), used_k=_i32(9, 9, 1),
           max_q=6, max_k=9)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param({"cu_q": _i32(-1, 4, 10)}, r"cu_seqlens_q\[0\] = -1 is negative", id="negative-start"),
        pytest.param({"cu_k": _i32(0, 9, 5)}, r"cu_seqlens_k\[2\] = 5 < cu_seqlens_k\[1\] = 9", id="decreasing"),
        pytest.param({"cu_q": _i32(0, 4, 11)}, r"cu_seqlens_q\[2\] = 11 exceeds the 10 rows", id="past-the-end"),
        pytest.param({"used_k": _i32(6, 1)}, r"seqused_k\[0\] = 6 is outside \[0, 5\]", id="seqused-past-cu"),
        pytest.param({"used_q": _i32(0, -2)}, r"seqused_q\[1\] = -2", id="seqused-negative"),
        pytest.param({"q": QD, "cu_q": None, "used_q": _i32(1, 7, 2)}, r"seqused_q\[1\] = 7 is outside \[0, 6\]",
                     id="seqused-past-dense-seqlen"),
        pytest.param({"max_q": 5}, r"max_seqlen_q = 5 but sequence 1 has 6", id="max-seqlen-too-small"),
        pytest.param({"max_k": 6, "used_k": _i32(5, 7)}, r"max_seqlen_k = 6 but sequence 1 has 7",
                     id="max-seqlen-below-seqused"),
    ],
)
def test_bad_entries_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _check(**kwargs)


@pytest.mark.parametrize("arg, env, expected", [(None, "", False), (None, "1", True), (None, "0", False),
                                                (False, "1", False), (True, "", True), (None, "yes", True)])
def test_opt_in_by_argument_or_environment(monkeypatch, arg, env, expected):
    monkeypatch.setenv(CHECK_ENV, env)
    assert check_requested(arg) is expected
