"""The forward's mods path on the CPU: the spec and parameters a call with score_mod / mask_mod
gets, the combinations refused, the tile selection, and the gate's cases."""

import dataclasses

import pytest
import torch

import flash_attn_4_sm120 as fa
from flash_attn_4_sm120 import compiler, conformance, flex, flex_examples, validation
from flash_attn_4_sm120.bwd_config import bwd_config_problems
from flash_attn_4_sm120.config import select_fwd_config
from flash_attn_4_sm120.execution_model import SM120
from flash_attn_4_sm120.problem import FwdParams, FwdSpec

ALIBI, CAUSAL = flex_examples.alibi(8), flex_examples.causal()


def _call(spec=None, needs_grad=False, **mods):
    spec = spec or FwdSpec("bf16", 128, 128, causal=False)
    params = FwdParams(softmax_scale=0.125, scale_log2=0.125 * 1.4426950408889634, softcap_scale=0.0,
                       window_left=0, window_right=0, sink=None)
    full = dict(score_mod=None, mask_mod=None, score_mod_bwd=None, aux_tensors=None, aux_scalars=None) | mods
    return validation.with_mods(spec, params, full, needs_grad)


def test_score_mod_moves_the_scale_before_the_mod():
    spec, params = _call(score_mod=ALIBI.score_mod)
    assert spec.mods is not None and spec.mods.score_mod and spec.mods.mask_mod is None
    assert params.softcap_scale == 0.125 and abs(params.scale_log2 - 1.4426950408889634) < 1e-12


def test_mask_mod_alone_keeps_the_scale():
    spec, params = _call(mask_mod=CAUSAL.mask_mod)
    assert spec.mods.mask_mod and params.scale_log2 == 0.125 * 1.4426950408889634 and params.softcap_scale == 0.0


def test_no_mods_no_change():
    spec, _ = _call()
    assert spec.mods is None


@pytest.mark.parametrize("spec, mods, match", [
    (FwdSpec("bf16", 128, 128, causal=True), dict(mask_mod=CAUSAL.mask_mod), "mask_mod replaces the causal flag"),
    (FwdSpec("bf16", 128, 128, causal=False, local=True), dict(mask_mod=CAUSAL.mask_mod),
     "mask_mod replaces window_size"),
    (FwdSpec("bf16", 128, 128, causal=False, local=True), dict(mask_mod=CAUSAL.mask_mod, score_mod=ALIBI.score_mod),
     "mask_mod replaces window_size"),
    (FwdSpec("bf16", 128, 128, causal=False, softcap=True), dict(score_mod=ALIBI.score_mod), "fold the cap"),
], ids=["causal", "window", "window-both-mods", "softcap"])
def test_refused_combinations(spec, mods, match):
    with pytest.raises(NotImplementedError, match=match):
        _call(spec, **mods)


@pytest.mark.parametrize("spec", [FwdSpec("bf16", 128, 128, causal=True),
                                  FwdSpec("bf16", 128, 128, causal=False, local=True)], ids=["causal", "window"])
def test_a_score_mod_alone_keeps_causal_and_windows(spec):
    """Only a mask_mod replaces the flags' mask; a score_mod modifies the scores the flags leave visible."""
    out, _ = _call(spec, score_mod=ALIBI.score_mod)
    assert out.mods.score_mod and (out.causal, out.local) == (spec.causal, spec.local)


def test_the_backward_of_mods_is_supported():
    spec, _ = _call(needs_grad=True, score_mod=ALIBI.score_mod, score_mod_bwd=ALIBI.score_mod_bwd)
    assert spec.mods.score_mod_bwd
    assert _call(needs_grad=True, mask_mod=CAUSAL.mask_mod)[0].mods.mask_mod


def test_a_score_mod_gradient_needs_its_derivative_rule():
    with pytest.raises(ValueError, match="score_mod_bwd"):
        _call(needs_grad=True, score_mod=ALIBI.score_mod)


def test_score_mod_selects_a_backward_tile_with_room_for_the_pre_mod_scores():
    from flash_attn_4_sm120.bwd_config import BWD_TABLE_FALLBACK, select_bwd_config
    from flash_attn_4_sm120.problem import BwdSpec

    key = _call(score_mod=ALIBI.score_mod, score_mod_bwd=ALIBI.score_mod_bwd)[0].mods
    mask_key = _call(mask_mod=CAUSAL.mask_mod)[0].mods
    assert select_bwd_config(BwdSpec("bf16", 64, 64, False, mods=key), SM120) == BWD_TABLE_FALLBACK[64]
    assert select_bwd_config(BwdSpec("bf16", 128, 128, False, mods=key), SM120) == BWD_TABLE_FALLBACK[128]
    assert select_bwd_config(BwdSpec("bf16", 64, 64, False, mods=mask_key), SM120).tile_n == 128  # heavy entry


def test_public_api_takes_mods_through_validation():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    for entry in (fa.flash_attn_func, fa.flash_attn_varlen_func):
        with pytest.raises(ValueError, match="CUDA tensors"):  # accepted; only the device is wrong
            entry(q, q, q, score_mod=ALIBI.score_mod, score_mod_bwd=ALIBI.score_mod_bwd)


def test_mods_take_a_64_row_tile_where_the_class_entry_has_no_registers_to_spare():
    key = _call(score_mod=ALIBI.score_mod)[0].mods
    d64 = select_fwd_config(FwdSpec("bf16", 64, 64, False, mods=key), SM120)
    assert d64.tile_m == 64 and d64 != select_fwd_config(FwdSpec("bf16", 64, 64, False), SM120)
    aux = flex_examples.relative_bias(torch.zeros(8, 65))
    aux_key = flex.ModKey.of(score_mod=aux.score_mod, aux_tensors=aux.aux_tensors)
    d128_aux = select_fwd_config(FwdSpec("bf16", 128, 128, False, mods=aux_key), SM120)  # aux addresses at 32 rows
    assert d128_aux.tile_m // d128_aux.num_warps == 16
    d96 = select_fwd_config(FwdSpec("bf16", 96, 96, False, mods=key), SM120)  # a 64-key S tile at 32 rows
    assert d96.tile_m // d96.num_warps == 16 and d96 != select_fwd_config(FwdSpec("bf16", 96, 96, False), SM120)
    assert select_fwd_config(FwdSpec("bf16", 128, 128, False, mods=key), SM120) == \
        select_fwd_config(FwdSpec("bf16", 128, 128, False), SM120)


def test_gate_cases_cover_every_example_and_mainloop_kind():
    cases = conformance.flex_cases(SM120)
    names = [c.name for c in cases]
    # per example 5 forward, 3 backward; the two heaviest at 5 more classes (forward, backward but the sink's)
    # and 3 split / paged forwards
    assert len(names) == len(set(names)) == (8 * len(flex_examples.gate_examples()) + 2 * (5 + 4 + 1 + 3)
                                             + 3 * len(flex_examples.aux_gate_examples()))
    assert {c.spec.head_dim for c in cases} == {64, 96, 128, 192, 256} and any(c.spec.dtype == "fp16" for c in cases)
    assert any(getattr(c.spec, "page_size", 0) for c in cases) and any(getattr(c.spec, "split_kv", 0) for c in cases)
    assert any(c.config.persistent for c in cases) and any(c.spec.pack_gqa for c in cases)
    assert any(c.spec.varlen_q for c in cases) and sum(c.subset_ci for c in cases) == 1
    for c in cases:
        if isinstance(c, conformance.BwdCase):
            # the role split takes mask_mods (in its S warp group), never a score_mod
            assert not (c.config.role_split and c.spec.mods.score_mod is not None), c.name
            assert not bwd_config_problems(c.spec, c.config, SM120), c.name
        else:
            assert not compiler.fwd_kernel_class(c.config).can_implement(c.spec, c.config, SM120), c.name


def test_spec_with_mods_is_a_distinct_compile_key():
    key = _call(score_mod=ALIBI.score_mod)[0].mods
    plain = FwdSpec("bf16", 128, 128, False)
    assert dataclasses.replace(plain, mods=key) != plain and hash(dataclasses.replace(plain, mods=key))


def test_aux_scalars_become_runtime_arguments():
    """aux_scalars: Python numbers and cutlass numerics, their types in the key and their values in the kernels'
    scalar slots after the aux tensors' (``compiler.aux_args``); too many, an integer past Int32 and other types
    raise."""
    import cutlass

    ex = flex_examples.combined(flex_examples.softcap_scalar(20.0), flex_examples.window_scalar(64, slot=1))
    spec, params = _call(score_mod=ex.score_mod, mask_mod=ex.mask_mod,
                         aux_scalars=(2.5, 7, True, cutlass.Float32(0.5)))
    assert spec.mods.aux_scalars == ("float", "int", "bool", "Float32")
    assert params.aux == (2.5, 7, True, 0.5) and type(params.aux[3]) is float
    slopes = torch.zeros(8)
    _, params = _call(score_mod=ex.score_mod, aux_tensors=[slopes], aux_scalars=(cutlass.Int32(3),))
    slots = compiler.aux_args(params.aux)
    assert len(slots) == compiler.MAX_AUX_TENSORS + compiler.MAX_AUX_SCALARS
    assert slots[0] is slopes and slots[1:4] == (None,) * 3 and slots[4:] == (3, None, None, None)
    assert compiler.aux_args(()) == (None,) * 8
    with pytest.raises(ValueError, match="at most 4 aux_scalars"):
        _call(score_mod=ex.score_mod, aux_scalars=(1, 2, 3, 4, 5))
    with pytest.raises(ValueError, match="fit an Int32"):
        _call(score_mod=ex.score_mod, aux_scalars=(2 ** 31,))
    with pytest.raises(ValueError, match="aux_scalars hold"):
        _call(score_mod=ex.score_mod, aux_scalars=(cutlass.Int64(3),))
    keys = {_call(score_mod=ex.score_mod, aux_scalars=(c,))[0].mods for c in (1.0, 2.0, 30.0)}
    assert len(keys) == 1  # values are not part of the compile key
