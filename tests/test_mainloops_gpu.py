"""Every mainloop variant (cp.async, TMA, TMA warp-specialized) against the fp32 reference, on the
configs the tuner may pick for them (run on the device; skipped without CUDA).

The table decides which variant a shape runs; this file makes sure each one is correct wherever it
could be chosen: 32 and 16 rows per warp, padded head dims (TMA zero-fills columns), partial last key
blocks (TMA zero-fills rows), windows, softcap, sink, GQA, seqlen_q > seqlen_k.
"""

import pytest
import torch

from test_fwd_gpu import _run_and_check

pytestmark = pytest.mark.gpu

#: "tma_mbarrier": the plain TMA step with its stages handed back on per-warp empty mbarriers
MAINLOOPS = ["cp_async", "tma", "tma_mbarrier", "tma_ws"]
CONFIGS = [  # (dtype, head_dim, head_dim_v, tile_m, tile_n, warps, stages)
    pytest.param((torch.bfloat16, 128, 128, 128, 48, 4, 2), id="bf16-d128-m128n48"),
    pytest.param((torch.float16, 128, 128, 128, 64, 4, 2), id="fp16-d128-m128n64"),
    pytest.param((torch.bfloat16, 64, 64, 128, 64, 4, 3), id="bf16-d64-m128n64s3"),
    pytest.param((torch.bfloat16, 72, 72, 128, 64, 4, 2), id="bf16-d72-padded"),
    pytest.param((torch.bfloat16, 192, 128, 64, 32, 4, 2), id="bf16-d192x128"),
    pytest.param((torch.bfloat16, 256, 256, 64, 32, 4, 2), id="bf16-d256-m64n32"),
]
SHAPES = [pytest.param((1, 1, 1), id="1x1"), pytest.param((2, 113, 203), id="113x203"),
          pytest.param((1, 239, 799), id="239x799"), pytest.param((1, 300, 64), id="300x64")]
FEATURES = [
    pytest.param({}, False, id="full"),
    pytest.param({}, True, id="causal"),
    pytest.param({"window_size": (100, 20), "softcap": 20.0, "learnable_sink": "sink"}, False, id="window-softcap-sink"),
]


@pytest.mark.parametrize("features, causal", FEATURES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("mainloop", MAINLOOPS)
def test_mainloop_variant(mainloop, cfg, shape, features, causal):
    from flash_attn_4_sm120.config import FwdConfig

    dtype, d, dv, tm, tn, w, st = cfg
    config = FwdConfig(tile_m=tm, tile_n=tn, num_warps=w, num_stages=st, mainloop=mainloop.removesuffix("_mbarrier"),
                       mbarrier_release=mainloop.endswith("_mbarrier"))
    _check_config(config, dtype, d, dv, shape, features, causal, seed=d * 7 + tn + len(features))


def _check_config(config, dtype, d, dv, shape, features, causal, seed, num_splits=None, max_ctas=None):
    """GQA 3:1 (6 query heads over 2 KV heads) inputs of ``shape`` = (batch, seqlen_q, seqlen_k), run with
    ``config`` and checked against the fp32 reference; ``features["learnable_sink"] == "sink"`` draws one."""
    torch.manual_seed(seed)
    b, sq, sk = shape
    q = torch.randn(b, sq, 6, d, dtype=dtype, device="cuda")
    k = torch.randn(b, sk, 2, d, dtype=dtype, device="cuda")
    v = torch.randn(b, sk, 2, dv, dtype=dtype, device="cuda")
    features = dict(features)
    if features.get("learnable_sink") == "sink":
        features["learnable_sink"] = torch.randn(6, device="cuda") * 2
    _run_and_check(q, k, v, causal, config=config, num_splits=num_splits, max_ctas=max_ctas, **features)


OVERLAP_CONFIGS = [  # (dtype, head_dim, head_dim_v, tile_m, tile_n, q_in_regs, frag_prefetch); 4 warps, 2 stages
    pytest.param((torch.bfloat16, 64, 64, 64, 64, True, True), id="bf16-d64-m64n64-qreg"),
    pytest.param((torch.float16, 128, 128, 64, 64, False, True), id="fp16-d128-m64n64"),
    pytest.param((torch.bfloat16, 128, 128, 128, 32, False, True), id="bf16-d128-m128n32"),
    pytest.param((torch.bfloat16, 72, 72, 64, 64, False, True), id="bf16-d72-padded"),
    pytest.param((torch.bfloat16, 192, 128, 64, 32, True, True), id="bf16-d192x128"),
    # the d96x96_causal table entry: 32 rows per warp, k-step fragments loaded where they are used
    pytest.param((torch.float16, 96, 96, 128, 64, False, False), id="fp16-d96-m128n64-noprefetch"),
]
# + a shape with right-masked, full and left-masked (window) blocks, several of each
OVERLAP_SHAPES = SHAPES + [pytest.param((1, 700, 1500), id="700x1500")]
OVERLAP_FEATURES = FEATURES + [pytest.param({"window_size": (300, 0)}, False, id="window-left"),
                               pytest.param({"window_size": (64, 64)}, False, id="window-two-sided")]


@pytest.mark.parametrize("num_splits", [1, 3], ids=["whole", "split3"])
@pytest.mark.parametrize("features, causal", OVERLAP_FEATURES)
@pytest.mark.parametrize("shape", OVERLAP_SHAPES)
@pytest.mark.parametrize("cfg", OVERLAP_CONFIGS)
@pytest.mark.parametrize("mainloop", ["cp_async", "tma"])
def test_overlap_mainloop(mainloop, cfg, shape, features, causal, num_splits):
    """The overlapped mainloop (S of block j beside P V of block j - 1) on both loaders: the first
    block is peeled (a partial block, any mask class), each class's remaining blocks follow, the
    last P V runs after the loop; split-KV ranges start the pipeline anew in every split."""
    from flash_attn_4_sm120.config import FwdConfig

    dtype, d, dv, tm, tn, qreg, prefetch = cfg
    config = FwdConfig(tile_m=tm, tile_n=tn, num_warps=4, num_stages=2, q_in_regs=qreg, mainloop=mainloop,
                       frag_prefetch=prefetch, overlap=True)
    _check_config(config, dtype, d, dv, shape, features, causal, seed=d * 5 + tn + len(features) + num_splits,
                  num_splits=num_splits)


SINGLE_STAGE_CONFIGS = [  # (dtype, head_dim, head_dim_v, tile_m, tile_n, warps, q_in_regs); one K and one V buffer
    # the table's one-stage tiles (d64 / d96 classes, d256, the 64-row alternates, the d192 class on 8 warps), an fp16
    # padded head dim, and Q in registers
    pytest.param((torch.bfloat16, 96, 96, 128, 64, 4, False), id="bf16-d96-m128n64"),
    pytest.param((torch.float16, 80, 80, 128, 64, 4, False), id="fp16-d80-m128n64"),
    pytest.param((torch.bfloat16, 72, 72, 128, 64, 4, True), id="bf16-d72-m128n64-qreg-padded"),
    pytest.param((torch.bfloat16, 256, 256, 64, 64, 4, False), id="bf16-d256-m64n64"),
    pytest.param((torch.bfloat16, 192, 128, 64, 64, 4, False), id="bf16-d192x128-m64n64"),
    pytest.param((torch.bfloat16, 192, 128, 128, 64, 8, True), id="bf16-d192x128-m128n64w8-qreg"),
    pytest.param((torch.float16, 160, 160, 128, 64, 8, True), id="fp16-d160-m128n64w8-qreg"),
]


@pytest.mark.parametrize("num_splits", [1, 3], ids=["whole", "split3"])
@pytest.mark.parametrize("features, causal", OVERLAP_FEATURES)
@pytest.mark.parametrize("shape", OVERLAP_SHAPES)
@pytest.mark.parametrize("cfg", SINGLE_STAGE_CONFIGS)
def test_single_stage_mainloop(cfg, shape, features, causal, num_splits):
    """One K and one V buffer: the prologue leaves V in flight, each step waits for it after the S MMAs
    and refills K under the softmax and P V, then V after them; blocks of every mask class, splits with
    0, 1 or many blocks, and a partial first block (loaded bounded)."""
    from flash_attn_4_sm120.config import FwdConfig

    dtype, d, dv, tm, tn, warps, qreg = cfg
    config = FwdConfig(tile_m=tm, tile_n=tn, num_warps=warps, num_stages=1, q_in_regs=qreg, mainloop="cp_async")
    _check_config(config, dtype, d, dv, shape, features, causal, seed=d * 13 + tn + len(features) + num_splits,
                  num_splits=num_splits)


def test_tma_refuses_varlen_k():
    """The predicate routes varlen / seqused K away from the TMA loaders (no device needed to say so)."""
    from flash_attn_4_sm120.config import FwdConfig, fwd_config_problems
    from flash_attn_4_sm120.execution_model import SM120
    from flash_attn_4_sm120.problem import FwdSpec

    spec = FwdSpec("bf16", 128, 128, True, seqused_k=True)
    for ml in ("tma", "tma_ws"):
        problems = fwd_config_problems(spec, FwdConfig(128, 48, 4, 2, mainloop=ml), SM120)
        assert any("dense K/V" in p for p in problems), problems


PINGPONG_CONFIGS = [  # (dtype, head_dim, head_dim_v, tile_m, tile_n, q_in_regs); 8 warps in two turn-taking groups
    pytest.param((torch.bfloat16, 128, 128, 256, 32, False), id="bf16-d128-m256n32"),
    pytest.param((torch.float16, 64, 64, 256, 64, False), id="fp16-d64-m256n64"),
    pytest.param((torch.bfloat16, 96, 96, 256, 32, False), id="bf16-d96-m256n32"),
    pytest.param((torch.bfloat16, 72, 72, 128, 64, False), id="bf16-d72-m128n64-padded"),
    # the Q-in-registers tiles of the d128x128_causal and d192x{128,192} table entries (16 rows per warp)
    pytest.param((torch.float16, 128, 128, 128, 64, True), id="fp16-d128-m128n64-qreg"),
    pytest.param((torch.bfloat16, 192, 128, 128, 32, True), id="bf16-d192x128-m128n32-qreg"),
]


@pytest.mark.parametrize("num_splits", [1, 3], ids=["whole", "split3"])
@pytest.mark.parametrize("features, causal", OVERLAP_FEATURES)
@pytest.mark.parametrize("shape", OVERLAP_SHAPES)
@pytest.mark.parametrize("cfg", PINGPONG_CONFIGS)
def test_pingpong_mainloop(cfg, shape, features, causal, num_splits):
    """Two warp groups taking turns at the MMAs (named barriers, no CTA barrier in the loop): the
    turns must balance for every block count (0 blocks in a split, 1 block, many), both groups must
    see every refill, and the buffers must not be refilled while the other group still reads them."""
    from flash_attn_4_sm120.config import FwdConfig

    dtype, d, dv, tm, tn, qreg = cfg
    config = FwdConfig(tile_m=tm, tile_n=tn, num_warps=8, num_stages=2, q_in_regs=qreg, mainloop="tma", overlap=True,
                       pingpong=True)
    _check_config(config, dtype, d, dv, shape, features, causal, seed=d * 3 + tn + len(features) + num_splits,
                  num_splits=num_splits)


# + shapes whose tiles outnumber the CTAs several times over: (batch, seqlen_q, seqlen_k)
PERSISTENT_SHAPES = OVERLAP_SHAPES + [pytest.param((3, 1000, 1000), id="3x1000"),
                                      pytest.param((2, 600, 2000), id="600x2000")]


@pytest.mark.parametrize("max_ctas", [1, 5, None], ids=["1cta", "5ctas", "per-sm"])
@pytest.mark.parametrize("features, causal", OVERLAP_FEATURES)
@pytest.mark.parametrize("shape", PERSISTENT_SHAPES)
@pytest.mark.parametrize("cfg", PINGPONG_CONFIGS)
def test_persistent_pingpong(cfg, shape, features, causal, max_ctas):
    """Persistent CTAs walking many tiles each (1 CTA: every tile in turn; 5: interleaved; one per
    SM): the load slots, mbarrier phases and turns carry across tiles with 0, 1 or many key blocks,
    each group's next Q rows load under the tile's tail, O is stored from registers."""
    from flash_attn_4_sm120.config import FwdConfig

    dtype, d, dv, tm, tn, qreg = cfg
    config = FwdConfig(tile_m=tm, tile_n=tn, num_warps=8, num_stages=2, q_in_regs=qreg, mainloop="tma", overlap=True,
                       pingpong=True, persistent=True)
    # (num_splits=1: a forced config would serve the split kernel too, which persistent tiles refuse)
    _check_config(config, dtype, d, dv, shape, features, causal, seed=d * 11 + tn + len(features),
                  num_splits=1, max_ctas=max_ctas)


REPEAT_CONFIGS = [  # FwdConfig fields (None: the table's choice, which splits the keys at this shape for d64 / d96)
    pytest.param(None, 64, id="table-d64"),
    pytest.param(None, 96, id="table-d96"),
    pytest.param(dict(tile_m=128, tile_n=64, num_warps=4, num_stages=1), 96, id="single-stage-d96"),
    pytest.param(dict(tile_m=128, tile_n=64, num_warps=4, num_stages=2, q_in_regs=True), 64, id="cp_async-d64"),
    pytest.param(dict(tile_m=64, tile_n=64, num_warps=4, num_stages=2, overlap=True), 128, id="overlap-d128"),
    pytest.param(dict(tile_m=128, tile_n=48, num_warps=4, num_stages=2, mainloop="tma"), 128, id="tma-d128"),
    pytest.param(dict(tile_m=128, tile_n=48, num_warps=4, num_stages=2, mainloop="tma_ws"), 128, id="tma_ws-d128"),
    pytest.param(dict(tile_m=256, tile_n=32, num_warps=8, num_stages=2, mainloop="tma", overlap=True, pingpong=True),
                 128, id="pingpong-d128"),
    pytest.param(dict(tile_m=256, tile_n=32, num_warps=8, num_stages=2, mainloop="tma", overlap=True, pingpong=True,
                      persistent=True), 128, id="persistent-d128"),
]


def _dirty_shared_memory():
    """Leave random bits (NaN and Inf patterns among them) in every SM's shared memory: a cuBLAS GEMM of random
    16-bit patterns stages its operands there."""
    a = torch.randint(-2 ** 15, 2 ** 15, (2048, 2048), dtype=torch.int16, device="cuda").view(torch.float16)
    torch.matmul(a, a.T.contiguous())


@pytest.mark.parametrize("causal", [True, False], ids=["causal-sink", "full"])
@pytest.mark.parametrize("fields, d", REPEAT_CONFIGS)
def test_forward_is_bitwise_repeatable(fields, d, causal):
    """The same call gives the same out and LSE bit for bit however shared memory was left, on every mainloop, at a
    length whose last M tile is partial (its rows past the end are scored from whatever Q's buffer held: a row's
    rescale must not depend on them, else O of the valid rows differs by ~1e-6 relative between runs,
    ``_kernels/softmax``); split-KV calls (the table's d64 / d96 choice here) included."""
    from flash_attn_4_sm120.config import FwdConfig
    from flash_attn_4_sm120.launch import launch_fwd as _launch_fwd
    from flash_attn_4_sm120.problem import validate_fwd

    torch.manual_seed(d)
    b, s, hq, hkv = 2, 1500, 8, 2
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    sink = torch.randn(hq, device="cuda") if causal else None
    config = None if fields is None else FwdConfig(**fields)
    spec, shape, params = validate_fwd(q, k, v, None, causal, (None, None), 0.0, sink)
    runs = []
    for _ in range(4):
        _dirty_shared_memory()
        out = torch.empty(b, s, hq, d, dtype=q.dtype, device="cuda")
        lse = torch.empty(b, hq, s, dtype=torch.float32, device="cuda")
        _launch_fwd(q, k, v, spec, shape, params, out, lse, config=config, num_splits=1 if config else None)
        runs.append((out, lse))
    for out, lse in runs[1:]:
        assert torch.equal(out, runs[0][0]), "out differs between runs of the same call"
        assert torch.equal(lse, runs[0][1]), "lse differs between runs of the same call"
