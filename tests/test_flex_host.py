"""Host side of flex attention (flex.py): the compile identity of score_mod / mask_mod callables."""

import math

import pytest
import torch

from flash_attn_4_sm120 import flex
from flash_attn_4_sm120.flex import ModKey, callable_key

SLOPE = 0.5


def _alibi_like(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
    return score - SLOPE * (q_idx - kv_idx)


def _make_bias(c):
    def bias(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return score + c
    return bias


def _helper(x):
    return x * 2


def _uses_helper(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
    return _helper(score)


def test_same_mod_same_key_and_stable():
    assert callable_key(_alibi_like) == callable_key(_alibi_like)
    assert callable_key(_make_bias(1.0)) == callable_key(_make_bias(1.0))


def test_captured_values_change_the_key():
    assert callable_key(_make_bias(1.0)) != callable_key(_make_bias(2.0))
    # an int and a float of the same value trace differently (Int32 vs Float32 constants)
    assert callable_key(_make_bias(1)) != callable_key(_make_bias(1.0))


def test_a_global_the_mod_reads_is_part_of_the_key(monkeypatch):
    before = callable_key(_alibi_like)
    monkeypatch.setattr(__import__(__name__), "SLOPE", 0.25)
    assert callable_key(_alibi_like) != before


def test_a_helper_function_is_keyed_by_its_own_code(monkeypatch):
    before = callable_key(_uses_helper)
    monkeypatch.setattr(__import__(__name__), "_helper", lambda x: x * 3)
    assert callable_key(_uses_helper) != before


def test_different_code_differs_even_with_one_name():
    a = lambda score, b, h, q, k, s, aux: score + 1  # noqa: E731
    b = lambda score, b, h, q, k, s, aux: score + 2  # noqa: E731
    assert callable_key(a) != callable_key(b)


def test_vec_size_is_part_of_the_key():
    def wide(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return score
    k1 = callable_key(wide)
    wide.__vec_size__ = 2
    assert callable_key(wide) != k1


def test_a_captured_tensor_is_refused_naming_it():
    t = torch.zeros(3)

    def reads_tensor(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return score + t[0]
    with pytest.raises(ValueError, match="'t' captured by .*aux_tensors"):
        callable_key(reads_tensor)


def test_modules_and_math_functions_are_fine():
    def uses_math(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return score * math.log2(math.e)
    assert len(callable_key(uses_math)) == 24


def test_not_a_function():
    with pytest.raises(TypeError, match="Python function"):
        callable_key(max)


def test_recursive_helpers_terminate():
    def f(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return f(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors)
    assert callable_key(f)


def test_modkey_of():
    assert ModKey.of() is None
    k = ModKey.of(score_mod=_alibi_like, aux_tensors=[torch.zeros(4, dtype=torch.float32)], aux_scalars=(1.5,))
    assert k.score_mod and k.mask_mod is None and k.aux_tensors == (("float32", 1),) and k.aux_scalars == ("float",)
    assert ModKey.of(score_mod=_alibi_like) == ModKey.of(score_mod=_alibi_like)
    assert ModKey.of(score_mod=_alibi_like) != ModKey.of(mask_mod=_alibi_like)


@pytest.mark.parametrize("kwargs, match", [
    (dict(aux_tensors=[torch.zeros(1)]), "pass a mod too"),
    (dict(score_mod_bwd=_alibi_like), "pass score_mod too"),
    (dict(score_mod=_alibi_like, aux_scalars=("x",)), "aux_scalars hold"),
])
def test_modkey_refusals(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModKey.of(**kwargs)


def test_vec_size_limits():
    def m(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return score
    m.__vec_size__ = 4
    with pytest.raises(ValueError, match="1 or 2"):
        ModKey.of(score_mod=m)


def test_source_is_read_once(monkeypatch):
    callable_key(_alibi_like)
    monkeypatch.setattr(flex.inspect, "getsource", lambda fn: (_ for _ in ()).throw(AssertionError("re-read")))
    callable_key(_alibi_like)


def test_reads_batch_head_sees_which_index_arguments_a_mod_loads():
    """The block-sparse refinement evaluates a mask_mod per batch / head only where its code reads them; anything
    it cannot see through counts as a read."""
    from flash_attn_4_sm120 import flex_examples

    def plain(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return kv_idx <= q_idx

    def per_batch(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return (kv_idx <= q_idx) & (b == 0)

    def closure_over_head(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        pick = lambda: h  # noqa: E731
        return kv_idx <= q_idx + pick()

    def star(*args):
        return args[2] >= args[3]

    class Masker:
        def __call__(self, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            return kv_idx <= q_idx

        def method(self, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
            return (kv_idx <= q_idx) & (h == 1)

    assert flex.reads_batch_head(plain) == (False, False)
    assert flex.reads_batch_head(per_batch) == (True, False)
    assert flex.reads_batch_head(closure_over_head) == (False, True)
    assert flex.reads_batch_head(star) == (True, True)
    assert flex.reads_batch_head(Masker()) == (True, True)
    assert flex.reads_batch_head(Masker().method) == (False, True)
    assert flex.reads_batch_head(flex_examples.chunked_local(64).mask_mod) == (False, False)
