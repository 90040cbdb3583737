"""The execution model: SM numbers live only here; dispatch and compile targets stay separate."""

import dataclasses

import pytest

from flash_attn_4_sm120 import execution_model as em


def test_sm120_contract():
    m = em.SM120
    assert m.smem_per_cta == 101376 and m.compile_target == "sm_120a" and m.primary
    assert not m.has_wgmma and not m.has_tmem and not m.tma_multicast
    assert m.has_tma and m.has_setmaxnreg and m.mma is em.MmaKind.MMA_SYNC_F16


def test_every_model_keeps_the_sm120_smem_limit():
    # An H100 has 227 KB, an A100 163 KB: kernels must still see the model's 99 KB.
    assert {m.smem_per_cta for m in em.MODELS} == {101376}


def test_smem_limit_matches_cutlass():
    cutlass_memory = pytest.importorskip("cutlass.memory")
    assert cutlass_memory.get_smem_capacity_in_bytes("sm_120") == em.SM120_SMEM_PER_CTA


@pytest.mark.parametrize("arch, name", [("sm_120", "sm120"), ("sm_120a", "sm120"), ("12.1", "sm121"),
                                        ("sm_90a", "sm90"), ("86", "sm80"), ("sm_89", "sm89")])
def test_arch_strings(arch, name):
    assert em.model_for_arch_string(arch).name == name


@pytest.mark.parametrize("cap", [(10, 0), (7, 5), (11, 0)])
def test_unsupported_capability_is_a_clear_error(cap):
    with pytest.raises(em.UnsupportedDeviceError, match="cannot run the SM120 execution model"):
        em.model_for_capability(*cap)


def test_no_gpu_is_a_clear_error_at_call_time():
    with pytest.raises(em.UnsupportedDeviceError, match="no CUDA GPU"):
        em.resolve_dispatch_model(None, None)


def test_dispatch_override_and_compile_override_are_independent():
    m = em.resolve_dispatch_model((9, 0), "sm_120")
    assert m is em.SM120
    assert em.resolve_compile_target(m, None) == "sm_120a"
    assert em.resolve_compile_target(em.SM90, "sm_120a") == "sm_120a"
    assert em.resolve_dispatch_model((9, 0), None) is em.SM90


def test_models_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        em.SM120.smem_per_cta = 232448


def test_declared_capabilities_cover_primary_parts_first():
    caps = em.declared_cuda_capabilities()
    assert caps[:2] == ["12.0", "12.1"] and "9.0" in caps and len(set(caps)) == len(caps)


# Shared memory per SM of the parts the occupancy rule sees (torch: shared_memory_per_multiprocessor /
# shared_memory_per_block_optin): an H100 (228 KB / 227 KB) and an SM120 part (100 KB / 99 KB).
H100_SMEM = (233472, 232448)
SM120_SMEM = (102400, 101376)


@pytest.mark.parametrize("smem, ctas", [(100352, 1), (66560, 1), (50177, 1), (50176, 2), (49152, 2), (43008, 2), (33792, 2),
                                        (32768, 3)])
def test_ctas_per_sm_by_shared_memory(smem, ctas):
    # 100 KB per SM, 1 KB reserved per CTA: a CTA of up to 49 KB fits twice, one byte more once.
    assert em.SM120.ctas_per_sm(smem) == ctas


@pytest.mark.parametrize("smem", [100352, 66560, 49152, 43008, 33792, 8192])
def test_occupancy_padding_gives_a_larger_part_the_models_ctas_per_sm(smem):
    static = 1024
    dyn = em.SM120.occupancy_launch_smem(smem, static, *H100_SMEM)
    assert dyn >= smem - static  # never less than the kernel needs
    assert dyn + static <= H100_SMEM[1]  # within the part's per-CTA opt-in limit
    per_sm = H100_SMEM[0] // (dyn + static + em.SMEM_RESERVED_PER_CTA)
    assert per_sm == em.SM120.ctas_per_sm(smem)


@pytest.mark.parametrize("model", em.MODELS, ids=lambda m: m.name)
def test_no_padding_on_a_part_no_larger_than_the_model(model):
    # A real SM120 (or Ada, 100 KB) launches exactly what the kernel declares: same cache key as precompile.
    assert model.occupancy_launch_smem(66560, 1024, *SM120_SMEM) == 0


def test_every_model_keeps_the_sm120_smem_per_sm():
    assert {m.smem_per_sm for m in em.MODELS} == {em.SM120_SMEM_PER_SM}
