"""flash_attn_combine on the CPU (no GPU): input checks raise clear errors (never asserts) before any
CUDA use, and the host glue (dense view of every layout, the LSE partials in the kernel's layout, rows
that no sequence covers, the returned lse view) is right, run against a torch stand-in that implements
the combine kernel's contract (fp32 merge; asserts the layouts the compiled kernel's arguments demand)."""

import math

import pytest
import torch

import flash_attn_4_sm120 as fa
from flash_attn_4_sm120 import combine

NEG_INF = -math.inf


def _z(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32)


O5, L5 = _z(2, 3, 5, 4, 72), _z(2, 3, 5, 4)  # dense: 2 splits, batch 3, seqlen 5, 4 heads, d 72
O4, L4 = _z(2, 11, 4, 72), _z(2, 11, 4)  # packed: 2 splits, 11 rows


@pytest.mark.parametrize(
    "o, lse, kwargs, exc, match",
    [
        pytest.param([0.0], L5, {}, TypeError, "out_partial must be a torch.Tensor", id="partials-not-tensor"),
        pytest.param(_z(2, 3, 64), _z(2, 3), {}, ValueError, "got rank 3", id="rank3"),
        pytest.param(_z(1, 2, 3, 4, 5, 64), _z(1, 2, 3, 4, 5), {}, ValueError, "got rank 6", id="rank6"),
        pytest.param(O4, _z(2, 11, 5), {}, ValueError, r"lse_partial must have shape \(2, 11, 4\)", id="lse-shape"),
        pytest.param(O5, _z(2, 3, 4, 5), {}, ValueError, "lse_partial must have shape", id="lse-transposed-shape"),
        pytest.param(_z(2, 11, 4, 64, dtype=torch.int32), L4, {}, TypeError, "out_partial has dtype torch.int32",
                     id="int-partials"),
        pytest.param(_z(2, 11, 4, 64, dtype=torch.float64), L4, {}, TypeError, "out_partial has dtype torch.float64",
                     id="fp64-partials"),
        pytest.param(O4, L4.bfloat16(), {}, TypeError, "lse_partial has dtype torch.bfloat16", id="bf16-lse"),
        pytest.param(_z(2, 11, 4, 60), L4, {}, ValueError, "head dim 60", id="head-dim-60"),
        pytest.param(_z(2, 11, 4, 520), L4, {}, ValueError, "head dim 520", id="head-dim-520"),
        pytest.param(O4, L4, {"out_dtype": torch.float64}, TypeError, "torch.float32, torch.bfloat16 or torch.float16",
                     id="out-dtype-fp64"),
        pytest.param(O4, L4, {"out_dtype": torch.int8}, TypeError, "output dtype torch.int8", id="out-dtype-int8"),
        pytest.param(O4, L4, {"out": [0.0]}, TypeError, "out must be a torch.Tensor", id="out-not-tensor"),
        pytest.param(O4, L4, {"out": _z(11, 4, 72), "out_dtype": torch.bfloat16}, ValueError,
                     "out has dtype torch.float32 but out_dtype is torch.bfloat16", id="out-vs-out-dtype"),
        pytest.param(O4, L4, {"out": _z(11, 4, 64)}, ValueError, r"out must have shape \(11, 4, 72\)",
                     id="out-shape"),
        pytest.param(O4, L4, {"out": _z(11, 72, 4).transpose(1, 2)}, ValueError, "contiguous in its last dimension",
                     id="out-transposed"),
        pytest.param(O4, L4, {"out": _z(11 * 4 * 72 + 1)[1:].view(11, 4, 72)}, ValueError, "16-byte aligned rows",
                     id="out-misaligned"),
        pytest.param(O5, L5, {"cu_seqlens": _i32(0, 2, 5)}, ValueError, "cu_seqlens goes with packed",
                     id="cu-seqlens-with-dense"),
        pytest.param(O4, L4, {"cu_seqlens": torch.tensor([0, 11])}, TypeError, "cu_seqlens has dtype torch.int64",
                     id="cu-seqlens-int64"),
        pytest.param(O4, L4, {"cu_seqlens": _i32(0, 11)[None]}, ValueError, "cu_seqlens must be 1-D",
                     id="cu-seqlens-2d"),
        pytest.param(O4, L4, {"cu_seqlens": _i32(0, 9, 3, 11)[::2]}, ValueError, "cu_seqlens must be contiguous",
                     id="cu-seqlens-strided"),
        pytest.param(O4, L4, {"cu_seqlens": _i32()}, ValueError, "batch \\+ 1 >= 1 entries", id="cu-seqlens-empty"),
        pytest.param(O4, L4, {"cu_seqlens": (0, 11)}, TypeError, "cu_seqlens must be a torch.Tensor",
                     id="cu-seqlens-tuple"),
        pytest.param(O5, L5, {"seqused": _i32(5, 5)}, ValueError, "seqused must have 3 entries",
                     id="seqused-dense-len"),
        pytest.param(O4, L4, {"cu_seqlens": _i32(0, 4, 11), "seqused": _i32(4, 7, 0)}, ValueError,
                     "seqused must have 2 entries", id="seqused-packed-len"),
        pytest.param(O4, L4, {"seqused": _i32(4, 7)}, ValueError, "seqused must have 1 entries",
                     id="seqused-one-sequence-len"),
        pytest.param(O5, L5, {"seqused": torch.tensor([5, 5, 5], dtype=torch.int16)}, TypeError,
                     "seqused has dtype torch.int16", id="seqused-int16"),
        pytest.param(_z(1, 65536, 1, 1, 8), _z(1, 65536, 1, 1), {}, ValueError, "dense batch 65536 exceeds 65535",
                     id="dense-batch-65536"),
        pytest.param(O4, L4, {"virtual_batch_idx": _i32(0)}, NotImplementedError, "virtual_batch_idx",
                     id="virtual-batch-idx"),
        pytest.param(O5, L5, {}, ValueError, "out_partial must be a CUDA tensor, got device cpu", id="cpu-tensors"),
        pytest.param(O4, L4, {"cu_seqlens": _i32(0, 4, 11), "seqused": _i32(4, 7)}, ValueError,
                     "must be a CUDA tensor", id="cpu-tensors-varlen"),
    ],
)
def test_invalid_inputs(o, lse, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        fa.flash_attn_combine(o, lse, **kwargs)


def test_exported_with_upstream_signature():
    import inspect

    params = list(inspect.signature(fa.flash_attn_combine).parameters)
    assert params == ["out_partial", "lse_partial", "out", "out_dtype", "cu_seqlens", "seqused", "virtual_batch_idx",
                      "return_lse"]
    assert fa.flash_attn_combine is combine.flash_attn_combine


# --- the host glue against a stand-in for the kernel --------------------------------------------------


def merge_ref(o_part, lse_part):
    """fp32 merge over dim 0: lse = logsumexp_s lse_s, O = sum_s exp(lse_s - lse) O_s (O = 0 where all -inf)."""
    o_part, lse_part = o_part.double(), lse_part.double()
    lse = torch.logsumexp(lse_part, dim=0)
    w = torch.exp(lse_part - lse.masked_fill(torch.isneginf(lse), 0.0)[None])
    return (w[..., None] * o_part).sum(0), lse


def covered_ref(total, cu_seqlens, seqused):
    """Rows some sequence covers, with the forward's clamping (seqlen_info), one row at a time."""
    covered = [False] * total
    for b in range(len(cu_seqlens) - 1):
        start = min(max(cu_seqlens[b], 0), total)
        if seqused is None:
            end = min(max(cu_seqlens[b + 1], start), total)
        else:
            end = start + min(max(seqused[b], 0), total - start)
        for r in range(start, end):
            covered[r] = True
    return torch.tensor(covered)


class StandInKernel:
    """The compiled combine's contract: dense CombineSpec, no sink / cu_seqlens / seqused; fp32 O
    partials with 16-byte rows, LSE partials (splits, batch, heads, seqlen) with unit last stride."""

    def __init__(self):
        self.specs, self.calls = [], []

    def get(self, spec, model, target):
        self.specs.append(spec)
        return self

    def __call__(self, o_part, lse_part, out, lse, sink, cu, used, max_seqlen):
        assert (sink, cu, used) == (None, None, None)
        assert o_part.dtype == torch.float32 and o_part.stride(-1) == 1 and o_part.data_ptr() % 16 == 0
        assert all(s % 4 == 0 for s, n in zip(o_part.stride()[:-1], o_part.shape[:-1]) if n > 1)
        assert lse_part.dtype == torch.float32 and (lse_part.stride(-1) == 1 or lse_part.shape[-1] == 1)
        assert out.dim() == 4 and lse.shape == (out.shape[0], out.shape[2], out.shape[1]) and max_seqlen == out.shape[1]
        assert tuple(lse_part.shape) == (o_part.shape[0], *lse.shape) and o_part.shape[1:] == out.shape
        self.calls.append((o_part, lse_part))
        o, l = merge_ref(o_part, lse_part.transpose(-1, -2))
        out.copy_(o)
        lse.copy_(l.transpose(-1, -2))


@pytest.fixture
def stand_in(monkeypatch):
    kernel = StandInKernel()
    monkeypatch.setattr(combine, "_check_devices", lambda *args, **kwargs: None)
    monkeypatch.setattr(combine, "model_and_target", lambda *args: ("model", "target"))
    monkeypatch.setattr(combine.compiler, "get_combine_kernel", kernel.get)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)  # CPU tensors: device.index is None
    return kernel


def _partials(shape, splits, d, seed):
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(splits, *shape, d, generator=g)
    lse = torch.randn(splits, *shape, generator=g) * 3
    lse[0, ..., 0] = NEG_INF  # split 0 saw no key of head 0's rows
    lse[(slice(None),) + (0,) * (len(shape) - 2) + (1, -1)] = NEG_INF  # a row every split left at -inf
    return o, lse


def _check(out, lse, ref_o, ref_lse, covered=None):
    if covered is not None:  # rows no sequence covers: out = 0, lse = -inf
        ref_o = ref_o.masked_fill(~covered[..., None, None], 0.0)
        ref_lse = ref_lse.masked_fill(~covered[..., None], NEG_INF)
    assert not out.isnan().any() and not lse.isnan().any()
    tol = 1e-6 if out.dtype == torch.float32 else 2 * (ref_o.to(out.dtype).double() - ref_o).abs().max().item() + 1e-6
    assert (out.double() - ref_o).abs().max().item() <= tol
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    fin = ~torch.isneginf(ref_lse)
    assert torch.allclose(lse[fin].double(), ref_lse[fin], rtol=0, atol=1e-5)


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16], ids=["default-fp32", "bf16", "fp16"])
@pytest.mark.parametrize("splits", [1, 3])
def test_dense(stand_in, splits, out_dtype):
    o, lse = _partials((2, 7, 3), splits, 24, seed=splits)
    out, got_lse = fa.flash_attn_combine(o, lse, out_dtype=out_dtype)
    assert out.shape == (2, 7, 3, 24) and out.dtype == (out_dtype or torch.float32)
    assert got_lse.shape == (2, 7, 3) and got_lse.transpose(1, 2).is_contiguous()  # upstream's (b, h, s) buffer
    assert stand_in.specs[-1] == combine.CombineSpec(combine._OUT_DTYPES[out.dtype], 24)
    _check(out, got_lse, *merge_ref(o, lse))


@pytest.mark.parametrize(
    "cu, used",
    [
        pytest.param(None, None, id="one-sequence"),
        pytest.param(None, (9,), id="one-sequence-seqused"),
        pytest.param((0, 5, 5, 13), None, id="cu-seqlens-empty-seq-tail-rows"),
        pytest.param((0, 5, 5, 13), (2, 0, 30), id="cu-seqlens-seqused"),
        pytest.param((2, 9, 4, 40), None, id="corrupt-cu-seqlens-clamped"),
        pytest.param((0,), None, id="no-sequence"),
    ],
)
def test_packed(stand_in, cu, used):
    o, lse = _partials((17, 3), 4, 16, seed=7)
    cu_t = None if cu is None else _i32(*cu)
    used_t = None if used is None else _i32(*used)
    out, got_lse = fa.flash_attn_combine(o, lse, cu_seqlens=cu_t, seqused=used_t)
    assert out.shape == (17, 3, 16) and got_lse.shape == (17, 3) and got_lse.transpose(0, 1).is_contiguous()
    covered = covered_ref(17, cu if cu is not None else (0, 17), used)
    _check(out, got_lse, *merge_ref(o, lse), covered)
    if cu is None and used is None:  # one sequence, all rows used: no mask, no LSE copy needed for it
        assert combine._uncovered_rows(17, cu_t, used_t, "cpu") is None


def test_dense_seqused_out_poisoned_and_no_lse(stand_in):
    o, lse = _partials((3, 6, 2), 5, 8, seed=3)
    used = _i32(6, 0, 4)
    out = torch.full((3, 6, 2, 8), math.nan, dtype=torch.float16)
    got, none = fa.flash_attn_combine(o, lse, out=out, seqused=used, return_lse=False)
    assert got is out and none is None
    _, got_lse = fa.flash_attn_combine(o, lse, seqused=used)
    covered = torch.arange(6)[None, :] < used[:, None]
    _check(out, got_lse, *merge_ref(o, lse), covered)


@pytest.mark.parametrize(
    "cu, used",
    [
        pytest.param((0, 3, 3, 10, 12), None, id="plain"),
        pytest.param((0, 3, 3, 10, 12), (1, 5, 0, 9), id="seqused-past-next-start"),
        pytest.param((5, 2, -4, 30), None, id="decreasing-negative-past-end"),
        pytest.param((5, 2, -4, 30), (-1, 3, 100), id="seqused-negative-large"),
        pytest.param((0,), None, id="batch-0"),
    ],
)
def test_uncovered_rows_match_the_forward_clamping(cu, used):
    got = combine._uncovered_rows(14, _i32(*cu), None if used is None else _i32(*used), "cpu")
    assert torch.equal(got, ~covered_ref(14, cu, used)[None, :])


def test_lse_layout_copied_only_when_needed(stand_in):
    o, lse = _partials((2, 5, 3), 3, 8, seed=1)
    fa.flash_attn_combine(o, lse)
    assert stand_in.calls[-1][1].data_ptr() != lse.data_ptr()  # (..., seqlen, heads): copied
    lse_t = lse.transpose(-1, -2).contiguous().transpose(-1, -2)  # a transposed (..., heads, seqlen) buffer
    out, got_lse = fa.flash_attn_combine(o, lse_t)
    assert stand_in.calls[-1][1].data_ptr() == lse_t.data_ptr()
    _check(out, got_lse, *merge_ref(o, lse))
    o1, lse1 = o[:, :, :1].contiguous(), lse[:, :, :1].contiguous()  # decode: seqlen 1
    out, got_lse = fa.flash_attn_combine(o1, lse1)
    assert stand_in.calls[-1][1].data_ptr() == lse1.data_ptr() and stand_in.calls[-1][0].data_ptr() == o1.data_ptr()
    _check(out, got_lse, *merge_ref(o1, lse1))


@pytest.mark.parametrize("kind", ["bf16", "transposed-head-dim", "misaligned"])
def test_unreadable_partials_copied(stand_in, kind):
    o, lse = _partials((13, 2), 3, 16, seed=5)
    if kind == "bf16":
        o = o.bfloat16()
    elif kind == "transposed-head-dim":
        o = o.transpose(-1, -2).contiguous().transpose(-1, -2)
    else:
        o = torch.cat([torch.zeros(1), o.flatten()])[1:].view(o.shape)
    out, got_lse = fa.flash_attn_combine(o, lse)
    assert out.dtype == o.dtype  # upstream's default: out_partial's dtype
    o_k = stand_in.calls[-1][0]
    assert o_k.is_contiguous() and o_k.dtype == torch.float32 and o_k.data_ptr() % 16 == 0
    _check(out, got_lse, *merge_ref(o.float(), lse))


def test_all_splits_neg_inf_and_zero_splits(stand_in):
    o = torch.randn(4, 2, 9, 3, 8)
    out, lse = fa.flash_attn_combine(o, torch.full((4, 2, 9, 3), NEG_INF))
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    out = torch.full((2, 9, 3, 8), math.nan)
    _, lse = fa.flash_attn_combine(o[:0], torch.zeros(0, 2, 9, 3), out=out)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all() and lse.shape == (2, 9, 3)
    assert len(stand_in.calls) == 1  # zero splits need no kernel


def test_empty_rows_launch_nothing(stand_in):
    out, lse = fa.flash_attn_combine(torch.zeros(3, 0, 4, 8), torch.zeros(3, 0, 4), cu_seqlens=_i32(0))
    assert out.shape == (0, 4, 8) and lse.shape == (0, 4) and not stand_in.calls
