"""Public API behaviour that needs no GPU: input validation errors and feature refusals."""

import pytest
import torch

import flash_attn_4_sm120 as fa


def _t(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=dtype)


@pytest.mark.parametrize(
    "make, exc, match",
    [
        pytest.param(lambda: (_t(2, 8, 4, 64, dtype=torch.float32),) * 3, TypeError, "bfloat16 and torch.float16", id="fp32"),
        pytest.param(lambda: (_t(8, 4, 64),) * 3, ValueError, "rank 4", id="rank3"),
        pytest.param(lambda: ("q", _t(1, 8, 4, 64), _t(1, 8, 4, 64)), TypeError, "torch.Tensor", id="not-a-tensor"),
        pytest.param(lambda: (_t(1, 8, 4, 64), _t(1, 8, 4, 64, dtype=torch.float16), _t(1, 8, 4, 64)), TypeError,
                     "share a dtype", id="mixed-dtypes"),
        pytest.param(lambda: (_t(1, 8, 6, 64), _t(1, 8, 4, 64), _t(1, 8, 4, 64)), ValueError, "multiple of num_heads_kv",
                     id="heads-not-divisible"),
        pytest.param(lambda: (_t(1, 8, 4, 64), _t(2, 8, 4, 64), _t(2, 8, 4, 64)), ValueError, "batch", id="batch-mismatch"),
        pytest.param(lambda: (_t(1, 8, 4, 64), _t(1, 8, 4, 32), _t(1, 8, 4, 64)), ValueError, "head_dim", id="qk-dim-mismatch"),
        pytest.param(lambda: (_t(1, 8, 4, 64),) * 3, ValueError, "CUDA tensors", id="cpu-tensors"),
    ],
)
def test_invalid_inputs_raise_clear_errors(make, exc, match):
    with pytest.raises(exc, match=match):
        fa.flash_attn_func(*make())


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: _t(1, 8, 4, 128)[..., ::2], id="strided-last-dim"),
        pytest.param(lambda: _t(1, 64, 4, 8).transpose(1, 3), id="transposed-view"),
        pytest.param(lambda: _t(1, 8, 4, 72)[..., 4:68], id="misaligned-pointer"),
        pytest.param(lambda: _t(1, 8, 4, 66)[..., :64], id="misaligned-row-stride"),
    ],
)
def test_layouts_the_kernels_cannot_read_are_copied(make):
    """Like upstream FlashAttention-4, inputs the kernels cannot read in place are copied, not refused:
    validation passes (only the device is wrong here) and the copy is contiguous and aligned."""
    from flash_attn_4_sm120.problem import kernel_layout

    t = make()
    copy = kernel_layout(t)
    assert copy is not t and copy.is_contiguous() and copy.data_ptr() % 16 == 0 and torch.equal(copy, t)
    with pytest.raises(ValueError, match="CUDA tensors"):
        fa.flash_attn_func(t, t, t)


def test_readable_layouts_are_not_copied():
    """Contiguous tensors and 16-byte-aligned views (a slice of the sequence, a head subset) go in as is."""
    from flash_attn_4_sm120.problem import kernel_layout

    t = _t(2, 8, 4, 64)
    for view in (t, t[:, 3:5], t[:, :, 1:3], t.transpose(1, 2)):
        assert kernel_layout(view) is view


@pytest.mark.parametrize("head_dim", [100, 4, 520], ids=["not-multiple-of-8", "too-small", "too-large"])
def test_head_dims_outside_the_envelope_are_value_errors(head_dim):
    q = _t(1, 8, 4, head_dim)
    with pytest.raises(ValueError, match="multiples of 8 between 8 and 512"):
        fa.flash_attn_func(q, q, q)


@pytest.mark.parametrize("head_dim, head_dim_v", [(40, 40), (96, 96), (192, 128), (256, 256), (128, 64)])
def test_any_head_dim_in_the_envelope_passes_validation(head_dim, head_dim_v):
    q, v = _t(1, 8, 4, head_dim), _t(1, 8, 4, head_dim_v)
    with pytest.raises(ValueError, match="CUDA tensors"):  # validation passed; only the device is wrong
        fa.flash_attn_func(q, q, v)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        pytest.param({"dropout_p": 1.0}, ValueError, "dropout_p", id="p-one"),
        pytest.param({"dropout_p": -0.1}, ValueError, "dropout_p", id="p-negative"),
        pytest.param({"dropout_p": "0.1"}, TypeError, "dropout_p", id="p-string"),
        pytest.param({"dropout_p": torch.tensor(0.1)}, TypeError, "dropout_p", id="p-tensor"),
        pytest.param({"dropout_p": 0.1, "dropout_seed": -1}, TypeError, "dropout_seed", id="seed-negative"),
        pytest.param({"dropout_p": 0.1, "dropout_seed": 1.5}, TypeError, "dropout_seed", id="seed-float"),
        pytest.param({"dropout_p": 0.1, "dropout_seed": 7}, ValueError, "CUDA tensors", id="valid-until-device"),
    ],
)
def test_dropout_arguments_are_checked(kwargs, exc, match):
    q = _t(1, 8, 4, 64).requires_grad_()
    with pytest.raises(exc, match=match):
        fa.flash_attn_func(q, q, q, **kwargs)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        pytest.param({"softcap": -1.0}, ValueError, "softcap", id="negative-softcap"),
        pytest.param({"window_size": (1, 2, 3)}, ValueError, "pair", id="window-triple"),
        pytest.param({"window_size": (1.5, 0)}, TypeError, "int or None", id="window-float"),
        pytest.param({"learnable_sink": torch.zeros(3)}, ValueError, "num_heads", id="sink-shape"),
        pytest.param({"learnable_sink": torch.zeros(4, dtype=torch.int32)}, ValueError, "floating", id="sink-int"),
        pytest.param({"window_size": (128, 0), "softcap": 30.0, "learnable_sink": torch.zeros(4)}, ValueError,
                     "CUDA tensors", id="all-valid-until-device"),
    ],
)
def test_window_softcap_sink_validation(kwargs, exc, match):
    q = _t(1, 8, 4, 64)
    with pytest.raises(exc, match=match):
        fa.flash_attn_func(q, q, q, **kwargs)


def test_dropout_p_zero_is_the_plain_call():
    q = _t(1, 8, 4, 64)
    with pytest.raises(ValueError, match="CUDA tensors"):  # accepted: validation goes on to the device check
        fa.flash_attn_func(q, q, q, dropout_p=0.0)


def test_unknown_keyword_is_a_type_error():
    q = _t(1, 8, 4, 64)
    with pytest.raises(TypeError, match="unexpected"):
        fa.flash_attn_func(q, q, q, attn_bias=q)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_softmax_scale(scale):
    q = _t(1, 8, 4, 64)
    with pytest.raises(ValueError, match="softmax_scale"):
        fa.flash_attn_func(q, q, q, softmax_scale=scale)


def test_import_has_no_cutlass_side_effect():
    """Importing the package must not import cutlass (compiles import it lazily)."""
    import subprocess
    import sys

    code = "import sys, flash_attn_4_sm120; print('cutlass' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__('os').environ, "PYTHONPATH": "torch-ext"})
    assert res.stdout.strip() == "False"


def test_torch_compile_fullgraph_traces_the_custom_op():
    """Dynamo traces flash_attn_func without graph breaks (the fake impl runs while tracing); the
    real implementation then validates the concrete tensors, so CPU inputs fail at run time only."""
    q = _t(1, 64, 2, 64)

    @torch.compile(fullgraph=True, backend="eager")
    def f(q):
        out, lse = fa.flash_attn_func(q, q, q, causal=True, return_lse=True)
        return out * 2, lse

    with pytest.raises(ValueError, match="CUDA tensors"):
        f(q)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_torch_compile_fullgraph_traces_the_backward(varlen):
    """With inputs that need gradients, AOTAutograd traces forward and backward ops (``_CompiledFwd`` /
    ``_CompiledVarlenFwd``: the ops carry no autograd of their own) with no graph break, one tensor passed as
    q, k and v and as both cu_seqlens included; the real forward then refuses the CPU tensors at run time."""
    torch._dynamo.reset()
    sink = torch.randn(2, requires_grad=True)
    cu = torch.tensor([0, 64], dtype=torch.int32)
    q = _t(64, 2, 64) if varlen else _t(1, 64, 2, 64)
    q.requires_grad_(True)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, sink):
        if varlen:
            out, lse = fa.flash_attn_varlen_func(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=64,
                                                 max_seqlen_k=64, causal=True, return_lse=True,
                                                 learnable_sink=sink)
        else:
            out, lse = fa.flash_attn_func(q, q, q, causal=True, return_lse=True, learnable_sink=sink)
        return out.float().sum() + lse.sum()

    with pytest.raises(ValueError, match="CUDA tensors"):
        f(q, sink)


@pytest.mark.parametrize(
    "make, exc, match",
    [
        pytest.param(lambda: dict(cu_seqlens_q=torch.tensor([0, 8], dtype=torch.int64),
                                  cu_seqlens_k=torch.tensor([0, 8], dtype=torch.int32)), TypeError, "int32",
                     id="cu-int64"),
        pytest.param(lambda: dict(cu_seqlens_q=torch.tensor([0, 4, 8], dtype=torch.int32),
                                  cu_seqlens_k=torch.tensor([0, 8], dtype=torch.int32)), ValueError, "entries",
                     id="cu-length-mismatch"),
        pytest.param(lambda: dict(cu_seqlens_q=torch.tensor([0, 8], dtype=torch.int32),
                                  cu_seqlens_k=torch.tensor([0, 8], dtype=torch.int32),
                                  seqused_k=torch.tensor([1, 2], dtype=torch.int32)), ValueError, "entries",
                     id="seqused-length"),
        pytest.param(lambda: dict(cu_seqlens_q=torch.tensor([0, 8], dtype=torch.int32),
                                  cu_seqlens_k=torch.tensor([0, 8], dtype=torch.int32),
                                  page_table=torch.zeros(1, 1, dtype=torch.int32)), ValueError, "instead of cu_seqlens_k",
                     id="page-table-with-cu-seqlens-k"),
    ],
)
def test_varlen_validation(make, exc, match):
    q = _t(8, 4, 64)
    with pytest.raises(exc, match=match):
        fa.flash_attn_varlen_func(q, q, q, **make())


@pytest.mark.parametrize(
    "table, cache_shape, exc, match",
    [
        pytest.param(torch.zeros(2, 3, dtype=torch.int32), (5, 16, 2, 64), ValueError, "CUDA tensors", id="valid"),
        pytest.param(torch.zeros(2, 3, dtype=torch.int64), (5, 16, 2, 64), TypeError, "int32", id="int64"),
        pytest.param(torch.zeros(6, dtype=torch.int32), (5, 16, 2, 64), TypeError, "2-D", id="rank-1"),
        pytest.param(torch.zeros(3, 3, dtype=torch.int32), (5, 16, 2, 64), ValueError, "batch", id="batch-mismatch"),
        pytest.param(torch.zeros(2, 6, dtype=torch.int32)[:, ::2], (5, 16, 2, 64), ValueError, "contiguous rows",
                     id="strided-rows"),
        pytest.param(torch.zeros(2, 3, dtype=torch.int32), (0, 16, 2, 64), ValueError, "no pages", id="no-pages"),
        pytest.param(torch.zeros(2, 3, dtype=torch.int32), (5, 16, 3, 64), ValueError, "multiple", id="heads"),
    ],
)
def test_paged_validation(table, cache_shape, exc, match):
    """Paged K/V: (num_pages, page_size, heads_kv, d) caches and an int32 (batch, max_pages) table; a call
    that passes validation reaches the device check (CPU tensors here)."""
    q, cache = _t(2, 1, 4, 64), _t(*cache_shape)
    with pytest.raises(exc, match=match):
        fa.flash_attn_varlen_func(q, cache, cache, page_table=table, seqused_k=torch.ones(2, dtype=torch.int32))


def test_varlen_packed_q_needs_rank_3():
    q = _t(1, 8, 4, 64)
    with pytest.raises(ValueError, match="total_tokens"):
        fa.flash_attn_varlen_func(q, q, q, cu_seqlens_q=torch.tensor([0, 8], dtype=torch.int32))


@pytest.mark.parametrize("pack_gqa", [True, False, None])
def test_pack_gqa_is_accepted(pack_gqa):
    q, kv = _t(1, 8, 8, 64), _t(1, 8, 2, 64)
    with pytest.raises(ValueError, match="CUDA tensors"):  # validation passed; only the device is wrong
        fa.flash_attn_func(q, kv, kv, pack_gqa=pack_gqa)


def test_pack_gqa_rejects_non_bool():
    q = _t(1, 8, 4, 64)
    with pytest.raises(TypeError, match="pack_gqa"):
        fa.flash_attn_func(q, q, q, pack_gqa="yes")


@pytest.mark.parametrize("num_splits", [None, 0, 1, 4, 1000])
def test_num_splits_is_accepted(num_splits):
    q = _t(1, 8, 4, 64)
    with pytest.raises(ValueError, match="CUDA tensors"):  # validation passed; only the device is wrong
        fa.flash_attn_func(q, q, q, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [-1, 2.0, True, "4"])
def test_num_splits_rejects_bad_values(num_splits):
    q = _t(1, 8, 4, 64)
    with pytest.raises(TypeError, match="num_splits"):
        fa.flash_attn_func(q, q, q, num_splits=num_splits)
    with pytest.raises(TypeError, match="num_splits"):
        fa.flash_attn_fwd(q, q, q, num_splits=num_splits)


def test_out_with_rows_not_16_byte_aligned_is_refused():
    """A caller's out must allow 16-byte row stores, like the inputs (the kernels assume it)."""
    from flash_attn_4_sm120.validation import check_output as _check_output

    good = torch.empty(2, 8, 4, 64, dtype=torch.bfloat16)
    _check_output("out", good, (2, 8, 4, 64), torch.bfloat16, good.device)
    bad = torch.empty(2, 8, 4, 68, dtype=torch.bfloat16)[..., :64]  # row stride 68 elements = 136 bytes
    with pytest.raises(ValueError, match="multiples of 16 bytes"):
        _check_output("out", bad, (2, 8, 4, 64), torch.bfloat16, bad.device)


def test_flash_attn_fwd_checks_pack_gqa_like_the_other_entry_points():
    q = _t(1, 8, 4, 64)
    with pytest.raises(TypeError, match="pack_gqa"):
        fa.flash_attn_fwd(q, q, q, pack_gqa="yes")


def test_occupancy_env_is_checked():
    from flash_attn_4_sm120 import launch

    assert launch.device_smem(None, "device") is None  # launch as compiled: no device query
    with pytest.raises(ValueError, match="FA4_SM120_OCCUPANCY='max'"):
        launch.device_smem(None, "max")


@pytest.mark.parametrize("entry", ["dense", "dense-split", "varlen"])
def test_torch_compile_traces_both_entries_without_graph_breaks(entry):
    """fullgraph=True with dynamic shapes: Dynamo traces through the namespaced custom ops (no
    'builtin operator mod' break); on CPU tensors the op's own validation then raises at run time."""
    q = _t(2, 8, 4, 64)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)

    def f(q):
        if entry.startswith("dense"):
            splits = 3 if entry == "dense-split" else None
            return fa.flash_attn_func(q, q, q, window_size=(None, -2), num_splits=splits, pack_gqa=False,
                                      return_lse=True)
        packed = q.reshape(16, 4, 64)
        return fa.flash_attn_varlen_func(packed, packed, packed, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5,
                                         max_seqlen_k=5, causal=True, return_lse=True)

    torch._dynamo.reset()
    with pytest.raises(ValueError, match="CUDA tensors"):
        torch.compile(f, fullgraph=True, dynamic=True, backend="eager")(q)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "with-grad"])
def test_deterministic_is_accepted(grad):
    """transformers passes deterministic=True under FLASH_ATTENTION_DETERMINISTIC=1, in inference too: like
    upstream, the forward accepts it (validation goes on to the device check), and a backward honours it."""
    q = _t(1, 8, 4, 64).requires_grad_(grad)
    with pytest.raises(ValueError, match="CUDA tensors"):
        fa.flash_attn_func(q, q, q, deterministic=True)


def test_torch_compile_runs_a_dropout_call_eagerly():
    """A dropout call is a graph break (like mods): under torch.compile it runs the eager path, whose validation
    then rejects the CPU tensors."""
    q = _t(1, 8, 4, 64).requires_grad_()
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="CUDA tensors"):
        torch.compile(lambda q: fa.flash_attn_func(q, q, q, dropout_p=0.1), backend="eager")(q)
