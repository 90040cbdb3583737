"""FP8 K/V on the host (no GPU): the config predicate and table over every head dim, the shared-memory formula, the
copy rule, and the refusals that name the combination. The numerics on a device are ``test_fp8_gpu.py``'s."""

import dataclasses

import pytest
import torch

import flash_attn_4_sm120 as fa
from flash_attn_4_sm120 import config
from flash_attn_4_sm120.execution_model import SM120
from flash_attn_4_sm120.problem import FwdSpec

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _spec(d, dv=None, **kw):
    base = dict(dtype="bf16", head_dim=d, head_dim_v=dv or d, causal=True, kv_dtype="e4m3")
    base.update(kw)
    return FwdSpec(**base)


LAYOUTS = {
    "decode_paged": dict(seqused_k=True, page_size=16, pack_gqa=True, split_kv=True),
    "decode_dense": dict(seqused_k=True, pack_gqa=True, split_kv=True),
    "prefill": dict(causal=False),
    "chunked_prefill": dict(varlen_q=True, seqused_k=True, page_size=16),
    "varlen": dict(varlen_q=True, varlen_k=True),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_head_dim_has_a_valid_fp8_config(layout):
    """Every head dim (and a head_dim_v that differs) selects a valid FP8 tile within the model's shared memory."""
    for d in range(8, 257, 8):
        for dv in {d, max(8, d // 16 * 8)}:
            spec = _spec(d, dv, **LAYOUTS[layout])
            cfg = config.select_fwd_config(spec, SM120)
            assert not config.fwd_config_problems(spec, cfg, SM120)
            assert config.fwd_smem_bytes(spec, cfg) + config.STATIC_SMEM_BYTES <= SM120.smem_per_cta


def test_smem_formula_counts_the_staging():
    spec = _spec(128)
    cfg = config.FwdConfig(tile_m=64, tile_n=32, num_warps=4, num_stages=6)
    bf16 = dataclasses.replace(spec, kv_dtype=None)
    two_stage = dataclasses.replace(cfg, num_stages=2)
    assert config.fwd_smem_bytes(spec, cfg) == config.fwd_smem_bytes(bf16, two_stage) + 2 * 6 * 32 * 128


def test_fp8_predicate_names_the_mainloop():
    spec = _spec(128)
    for cfg in (config.FwdConfig(tile_m=128, tile_n=64, num_warps=8, mainloop="tma"),
                config.FwdConfig(tile_m=64, tile_n=32, num_stages=2, overlap=True),
                config.FwdConfig(tile_m=64, tile_n=32, num_stages=1),
                config.FwdConfig(tile_m=64, tile_n=16, num_stages=config.FP8_KV_MAX_STAGES + 1)):
        problems = config.fwd_config_problems(spec, cfg, SM120)
        assert any("FP8 K/V" in p for p in problems), (cfg, problems)


def test_copy_rule():
    """16-byte vectors where the head dims allow and the thread rows tile the block, else 8-byte ones."""
    cfg = config.FwdConfig(tile_m=64, tile_n=32, num_warps=4, num_stages=6)
    assert config.fp8_kv_copy(_spec(128), cfg) == (16, 8)
    assert config.fp8_kv_copy(_spec(40), cfg)[0] == 8  # 40 is no multiple of 16
    assert config.fp8_kv_copy(_spec(64), dataclasses.replace(cfg, tile_n=16))[0] == 8  # 32 rows a pass


def _fp8(*shape):
    return torch.zeros(*shape).to(E4M3)


def test_refusals_name_the_combination():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    k = v = _fp8(1, 4, 2, 64)
    with pytest.raises(NotImplementedError, match="FP8 K/V have no backward"):
        fa.flash_attn_func(q, k, v)
    with pytest.raises(NotImplementedError, match="score_mod"):
        fa.flash_attn_func(q.detach(), k, v, score_mod=lambda s, b, h, i, j: s)
    with pytest.raises(ValueError, match="k_descale / v_descale scale FP8 inputs"):
        fa.flash_attn_func(q.detach(), q.detach(), q.detach(), k_descale=torch.ones(1, 2))
    with pytest.raises(ValueError, match="q_descale scales an FP8 q"):
        fa.flash_attn_func(q.detach(), k, v, q_descale=torch.ones(1, 2))
    with pytest.raises(TypeError, match="an FP8 q needs FP8 K/V"):
        fa.flash_attn_func(_fp8(1, 4, 2, 64), q.detach(), q.detach())


def test_kvcache_new_rows_for_fp8_caches_come_in_qs_dtype():
    """New keys / values go into an FP8 cache quantized from q's 16-bit dtype (``AppendSpec.cache_dtype``)."""
    q = torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16)
    cache = _fp8(2, 32, 2, 64)
    for new in (torch.zeros(2, 1, 2, 64, dtype=torch.float16), _fp8(2, 1, 2, 64)):
        with pytest.raises(TypeError, match="k / v must be torch.bfloat16"):
            fa.flash_attn_with_kvcache(q, cache, cache, new, new, cache_seqlens=torch.zeros(2, dtype=torch.int32))


def test_no_backward_spec_for_fp8():
    """Every backward path (autograd, the backward ops, the low-level ``flash_attn_bwd``) builds a ``BwdSpec``."""
    from flash_attn_4_sm120.problem import BwdSpec

    with pytest.raises(NotImplementedError, match="FP8 K/V"):
        BwdSpec.of(_spec(128))


@pytest.mark.parametrize("d", [64, 96, 128, 192])
@pytest.mark.parametrize("seqlen_q,group", [(1, 4), (1, 16), (4, 4), (2, 16), (1, 32), (100, 4)])
@pytest.mark.parametrize("pack_gqa", [True, False])
def test_all_e4m3_decode_runs_the_fp8_kv_decode_tile(d, seqlen_q, group, pack_gqa, monkeypatch):
    """Packed all-e4m3 rows that fit the FP8 K/V decode tile run it with q widened to bf16 (exactly); longer rows,
    unpacked calls and head dims without a decode tile keep the e4m3 q and the FP8 MMAs."""
    from flash_attn_4_sm120.execution_model import DISPATCH_ENV
    from flash_attn_4_sm120.fp8 import decode_widened

    monkeypatch.setenv(DISPATCH_ENV, "sm_120")
    from flash_attn_4_sm120.problem import FwdShape

    spec = _spec(d, fp8_mma=True, pack_gqa=pack_gqa, seqused_k=True, page_size=16)
    shape = FwdShape(2, seqlen_q, 4096, 8 * group, 8)
    q = torch.zeros(2, seqlen_q, 8 * group, d, dtype=E4M3)
    q2, spec2 = decode_widened(q, spec, shape)
    entry = config.decode_entry(dataclasses.replace(spec, fp8_mma=False), SM120)
    widened = pack_gqa and entry is not None and seqlen_q * group <= entry.tile_m
    assert widened == (spec2.fp8_mma is False)
    assert q2.dtype == (torch.bfloat16 if widened else E4M3)
    assert widened == (pack_gqa and d <= 128 and seqlen_q * group <= 16)  # the table's decode tiles: d64-d128
    if widened:
        assert torch.equal(q2.float(), q.float())
        assert config.choose_fwd_config(spec2, SM120, seqlen_q * group, seqlen_q, 4096).warps_on_keys
