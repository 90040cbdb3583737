"""Forward numerics on a GPU against the fp32 reference (run on the device; skipped without CUDA).

Tolerance (upstream's rule): max|out - ref| <= 2 * max|pt - ref| + atol, where ``pt`` is the same
computation in the input dtype. Outputs are NaN-poisoned before the call, so an unwritten element
fails. LSE is checked against the fp32 reference, including -inf for rows that see no key.
"""


import pytest
import torch

from reference import attention_ref, capture

pytestmark = pytest.mark.gpu

DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
HEADS = [pytest.param((4, 4), id="mha"), pytest.param((8, 2), id="gqa4"), pytest.param((6, 1), id="mqa")]
SHAPES = [  # (batch, seqlen_q, seqlen_k)
    pytest.param((1, 1, 1), id="1x1"),
    pytest.param((2, 113, 203), id="113x203"),
    pytest.param((1, 239, 799), id="239x799"),
    pytest.param((2, 1023, 1023), id="1023x1023"),
    pytest.param((1, 300, 64), id="300x64"),  # seqlen_q > seqlen_k: causal rows with no keys
    pytest.param((3, 128, 128), id="128x128"),
]


def _run_and_check(q, k, v, causal, softmax_scale=None, config=None, num_splits=None, max_ctas=None, **features):
    """``config`` (a FwdConfig) bypasses the table: every mainloop variant runs the same checks.
    ``num_splits`` as in flash_attn_func (None: automatic); ``max_ctas`` caps a persistent grid."""
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.launch import launch_fwd as _launch_fwd
    from flash_attn_4_sm120.problem import validate_fwd

    b, sq, hq, _ = q.shape
    out = torch.full((b, sq, hq, v.shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((b, hq, sq), float("nan"), dtype=torch.float32, device=q.device)
    if config is None:
        fa.flash_attn_fwd(q, k, v, softmax_scale=softmax_scale, causal=causal, out=out, lse=lse,
                          num_splits=num_splits, **features)
    else:
        spec, shape, params = validate_fwd(q, k, v, softmax_scale, causal, features.get("window_size", (None, None)),
                                           features.get("softcap", 0.0), features.get("learnable_sink"))
        _launch_fwd(q, k, v, spec, shape, params, out, lse, config=config, num_splits=num_splits, max_ctas=max_ctas)
    torch.cuda.synchronize()
    ref, lse_ref = attention_ref(q, k, v, softmax_scale, causal, **features)
    pt, _ = attention_ref(q, k, v, softmax_scale, causal, upcast=False, **features)
    assert not out.isnan().any(), "output has NaN (unwritten or wrong)"
    assert not lse.isnan().any(), "lse has NaN (unwritten or wrong)"
    err = (out.float() - ref.float()).abs().max().item()
    pt_err = (pt.float() - ref.float()).abs().max().item()
    assert err <= 2 * pt_err + 1e-5, f"max|out-ref|={err:.3e} > 2*max|pt-ref|={2 * pt_err:.3e} + 1e-5"
    neg_inf = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), neg_inf), "rows with no visible key must have lse = -inf"
    lse_err = (lse[~neg_inf] - lse_ref[~neg_inf]).abs().max().item() if (~neg_inf).any() else 0.0
    assert lse_err <= 1e-3, f"max|lse-ref|={lse_err:.3e}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fwd_matches_reference(dtype, head_dim, heads, shape, causal):
    torch.manual_seed(hash((head_dim, heads, shape, causal)) % 2**31)
    b, sq, sk = shape
    hq, hkv = heads
    q = torch.randn(b, sq, hq, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(b, sk, hkv, head_dim, dtype=dtype, device="cuda")
    v = torch.randn(b, sk, hkv, head_dim, dtype=dtype, device="cuda")
    _run_and_check(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [pytest.param((2, 113, 203), id="113x203"), pytest.param((1, 300, 64), id="300x64"),
                                   pytest.param((1, 1, 799), id="1x799")])
@pytest.mark.parametrize(
    "head_dim, head_dim_v",
    [(8, 8), (40, 40), (72, 72), (96, 96), (160, 160), (192, 128), (192, 192), (128, 64), (64, 128), (200, 200),
     (256, 256)],
    ids=lambda x: str(x),
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fwd_any_head_dim(dtype, head_dim, head_dim_v, shape, causal):
    """Every head-dim class, padded (not a multiple of 16) and exact, and head_dim_v != head_dim; GQA 2:1."""
    torch.manual_seed(head_dim * 1000 + head_dim_v)
    b, sq, sk = shape
    q = torch.randn(b, sq, 4, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(b, sk, 2, head_dim, dtype=dtype, device="cuda")
    v = torch.randn(b, sk, 2, head_dim_v, dtype=dtype, device="cuda")
    _run_and_check(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [104, 120])
def test_head_dims_the_tma_tiles_would_pad(head_dim, causal):
    """d104 and d120 at shapes where the d128 class's table picks its TMA tiles: a TMA box cannot span a padded row,
    so these head dims run the cp.async tiles (``config.fwd_config_problems``)."""
    torch.manual_seed(head_dim)
    q, k, v = (torch.randn(1, 2048, 8, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    _run_and_check(q, k, v, causal)


WINDOWS = [pytest.param((64, 0), False, id="w64-0"), pytest.param((100, 37), False, id="w100-37"),
           pytest.param((0, 0), False, id="w0-0"), pytest.param((300, None), True, id="causal-w300"),
           pytest.param((None, 50), False, id="wNone-50"), pytest.param((1000, 1000), False, id="w-wide")]


@pytest.mark.parametrize("window, causal", WINDOWS)
@pytest.mark.parametrize("shape", [pytest.param((2, 113, 203), id="113x203"), pytest.param((1, 500, 300), id="500x300"),
                                   pytest.param((1, 1, 799), id="1x799"), pytest.param((1, 1023, 1023), id="1023x1023")])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
def test_fwd_sliding_window(head_dim, shape, window, causal):
    torch.manual_seed(7)
    b, sq, sk = shape
    q = torch.randn(b, sq, 4, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, 2, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, 2, head_dim, dtype=torch.bfloat16, device="cuda")
    _run_and_check(q, k, v, causal, window_size=window)


FEATURES = [
    pytest.param({"softcap": 5.0}, False, id="softcap"),
    pytest.param({"softcap": 30.0}, True, id="softcap-causal"),
    pytest.param({"learnable_sink": "sink"}, False, id="sink"),
    pytest.param({"learnable_sink": "sink"}, True, id="sink-causal"),
    pytest.param({"learnable_sink": "sink", "window_size": (128, 0), "softcap": 20.0}, False, id="gpt-oss-like"),
]


@pytest.mark.parametrize("features, causal", FEATURES)
@pytest.mark.parametrize("shape", [pytest.param((2, 113, 203), id="113x203"), pytest.param((1, 300, 64), id="300x64"),
                                   pytest.param((1, 1, 513), id="1x513")])
@pytest.mark.parametrize("head_dim, dtype", [(64, torch.bfloat16), (128, torch.float16), (256, torch.bfloat16)],
                         ids=["d64-bf16", "d128-fp16", "d256-bf16"])
def test_fwd_softcap_and_sink(head_dim, dtype, shape, features, causal):
    torch.manual_seed(11)
    b, sq, sk = shape
    q = torch.randn(b, sq, 4, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(b, sk, 1, head_dim, dtype=dtype, device="cuda")
    v = torch.randn(b, sk, 1, head_dim, dtype=dtype, device="cuda")
    features = dict(features)
    if features.get("learnable_sink") == "sink":
        features["learnable_sink"] = torch.randn(4, device="cuda") * 2
    _run_and_check(q, k, v, causal, **features)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dims", [(40, 40), (72, 72), (80, 80), (104, 104), (112, 112), (112, 64), (144, 144),
                                  (160, 160), (176, 176), (176, 128), (200, 200), (232, 232)],
                         ids=lambda d: f"d{d[0]}x{d[1]}")
def test_head_dims_between_the_classes(dims, causal):
    """Every head dim a class serves runs its class's tile with a width of its own (padded columns zeroed,
    16-column swizzle atoms up to 128 columns on TMA K/V, the next multiple of 32 past them): GQA at
    lengths that leave partial tiles."""
    torch.manual_seed(5)
    d, dv = dims
    q = torch.randn(2, 333, 8, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 517, 2, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(2, 517, 2, dv, dtype=torch.bfloat16, device="cuda")
    _run_and_check(q, k, v, causal)


def test_sliding_window_skips_blocks_outside_the_window():
    """A 1024-wide window at seqlen 8192 must cost well under a third of full causal (blocks skipped)."""
    import flash_attn_4_sm120 as fa

    q = torch.randn(1, 8192, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1, 8192, 8, 128, dtype=torch.bfloat16, device="cuda")

    def run(**kw):
        for _ in range(3):
            fa.flash_attn_func(q, k, k, **kw)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            fa.flash_attn_func(q, k, k, **kw)
        e.record()
        e.synchronize()
        return s.elapsed_time(e)

    assert run(causal=True, window_size=(1024, 0)) * 3 < run(causal=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fwd_strided_inputs_and_scale(causal):
    """Non-contiguous (but last-dim contiguous) q/k/v views, e.g. slices of a packed QKV tensor."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 257, 3, 4, 128, dtype=torch.bfloat16, device="cuda")
    q, k, v = qkv.unbind(dim=2)
    _run_and_check(q, k, v, causal, softmax_scale=0.3)


def test_flash_attn_func_api_returns_lse_only_when_asked():
    import flash_attn_4_sm120 as fa

    q = torch.randn(1, 64, 2, 64, dtype=torch.bfloat16, device="cuda")
    out, lse = fa.flash_attn_func(q, q, q, causal=True)
    assert lse is None and out.shape == q.shape
    out2, lse2 = fa.flash_attn_func(q, q, q, causal=True, return_lse=True)
    assert lse2.shape == (1, 2, 64) and torch.equal(out, out2)
    qg = q.clone().requires_grad_(True)
    _, lse3 = fa.flash_attn_func(qg, q, q, causal=True)
    assert lse3 is not None
    fa.flash_attn_func(qg, q, q, causal=True)[0].sum().backward()
    assert qg.grad is not None and qg.grad.shape == q.shape


def test_seqlen_k_zero_gives_zero_output_and_neg_inf_lse():
    import flash_attn_4_sm120 as fa

    q = torch.randn(2, 5, 2, 64, dtype=torch.float16, device="cuda")
    k = torch.randn(2, 0, 2, 64, dtype=torch.float16, device="cuda")
    out, lse = fa.flash_attn_fwd(q, k, k)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_one_compile_serves_all_shapes():
    """Sizes are runtime values: new batch sizes / sequence lengths / head counts never recompile."""
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.compile_cache import default_cache

    def call(b, sq, sk, hq, hkv):
        q = torch.randn(b, sq, hq, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, hkv, 64, dtype=torch.bfloat16, device="cuda")
        fa.flash_attn_fwd(q, k, k, causal=True)

    call(1, 17, 33, 2, 1)  # short GQA query: the packed-GQA kernel
    call(1, 200, 33, 2, 2)  # the unpacked kernel
    call(1, 17, 4096, 2, 1)  # ... and both split-KV kernels (tiny grids over long keys) + the combine
    call(1, 200, 4096, 2, 2)
    call(1, 1, 4096, 2, 2)  # one query row: the decode tile (keys split over warps), split
    before = default_cache().stats.compiles
    for shape in [(3, 100, 700, 4, 2), (1, 1, 4096, 8, 8), (2, 999, 13, 6, 3), (5, 1, 3000, 32, 8), (1, 127, 9, 7, 1)]:
        call(*shape)
    assert default_cache().stats.compiles == before


def test_torch_compile_fullgraph_uses_the_namespaced_op():
    import flash_attn_4_sm120 as fa

    q = torch.randn(2, 200, 4, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 300, 2, 64, dtype=torch.bfloat16, device="cuda")

    @torch.compile(fullgraph=True)
    def f(q, k):
        out, lse = fa.flash_attn_func(q, k, k, causal=True, return_lse=True)
        return out * 2, lse

    out, lse = f(q, k)
    ref_out, ref_lse = fa.flash_attn_func(q, k, k, causal=True, return_lse=True)
    assert torch.equal(out, ref_out * 2) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("case", [
    pytest.param((2, 1, 4096, 32, 8, 128, False), id="decode-packed-split"),  # packed GQA, split-KV + combine
    pytest.param((1, 300, 300, 8, 8, 64, True), id="prefill-causal"),
])
def test_cuda_graph_capture_and_replay(case):
    """Serving stacks capture decode and prefill steps in CUDA graphs: after a warm-up (compiles happen
    outside the capture) the captured call replays on new data written into the captured inputs and
    gives the eager result bit for bit (the split workspaces come from the graph's memory pool)."""
    import flash_attn_4_sm120 as fa

    b, sq, sk, hq, hkv, d, causal = case
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    graph, (out, lse) = capture(lambda: fa.flash_attn_func(q, k, v, causal=causal, return_lse=True))
    for seed in (1, 2):
        torch.manual_seed(seed)
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = fa.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_fullgraph_varlen(dynamic):
    """flash_attn_varlen_func (transformers' entry for padded batches) traces into one graph through
    its namespaced custom op, with dynamic shapes too; compiled and eager outputs are equal, also
    after the lengths change."""
    import flash_attn_4_sm120 as fa

    torch._dynamo.reset()

    def f(q, k, v, cu_q, cu_k, max_q: int, max_k: int):
        out, lse = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                                             max_seqlen_k=max_k, causal=True, window_size=(64, None),
                                             return_lse=True)
        return out.float() * 2, lse

    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic)
    for lens_q, lens_k in (([5, 0, 113], [7, 3, 250]), ([300, 17], [300, 40])):
        cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")  # noqa: E731
        q = torch.randn(sum(lens_q), 4, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(sum(lens_k), 2, 64, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(sum(lens_k), 2, 64, dtype=torch.bfloat16, device="cuda")
        args = (q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k))
        out, lse = compiled(*args)
        ref_out, ref_lse = f(*args)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_torch_compile_passes_pack_gqa_and_windows():
    """The compiled flash_attn_func keeps pack_gqa, num_splits and FA4 windows (negative bounds)."""
    import flash_attn_4_sm120 as fa

    torch._dynamo.reset()
    q = torch.randn(2, 3, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 900, 2, 128, dtype=torch.bfloat16, device="cuda")

    def f(q, k):
        return fa.flash_attn_func(q, k, k, window_size=(None, -5), pack_gqa=False, num_splits=3, return_lse=True)

    out, lse = torch.compile(f, fullgraph=True)(q, k)
    ref_out, ref_lse = f(q, k)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_non_contiguous_inputs_are_copied():
    """A transposed view (last dim not contiguous) gives the result of its contiguous copy."""
    import flash_attn_4_sm120 as fa

    base = torch.randn(2, 4, 64, 200, dtype=torch.bfloat16, device="cuda")
    q = base.transpose(1, 3).transpose(2, 3)  # (2, 200, 4, 64) with stride(-1) == 200
    assert q.stride(-1) != 1
    out = fa.flash_attn_func(q, q, q, causal=True)[0]
    assert torch.equal(out, fa.flash_attn_func(q.contiguous(), q.contiguous(), q.contiguous(), causal=True)[0])
