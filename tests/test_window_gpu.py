"""FlashAttention-4's window convention on the GPU, on every path: random windows of all four kinds
(left / right each None or an int of either sign, sums of both signs) against the fp32 reference
(``reference.visible`` implements the convention independently of ``problem.resolve_window``).

Paths: the table's choice for each head-dim class (cp.async, TMA, ping-pong entries), packed GQA
(short queries), explicit split-KV, varlen with empty sequences and seqused, and each mainloop
variant forced by config (cp.async / TMA / TMA-WS / overlapped / ping-pong / persistent). Rows that
see no key must come out as out = 0 and lse = -inf (or the sink)."""

import random

import pytest
import torch

from reference import attention_ref, check_fwd
from test_fwd_gpu import _run_and_check
from test_varlen_gpu import _check_seq, _cu

pytestmark = pytest.mark.gpu

#: hand-picked windows of each kind: negative right (keys end before the diagonal), negative left
#: (keys start after it), one-sided, empty bands, FA2's (-1, -1), a sum < 0 (no window)
FIXED = [(None, -3), (-5, None), (17, -4), (-4, 9), (0, 0), (3, -1), (-1, -1), (-6, 2), (None, 0), (40, None)]


def random_windows(seed: int, count: int, span: int) -> list:
    """``count`` windows whose sides are each None, a non-negative or a negative int up to ``span``."""
    rng = random.Random(seed)

    def side():
        kind = rng.choice(("none", "pos", "neg"))
        return None if kind == "none" else (rng.randint(0, span) if kind == "pos" else -rng.randint(1, span))

    return [(side(), side()) for _ in range(count)]


def _ids(windows):
    return ["w" + "_".join("N" if x is None else (f"m{-x}" if x < 0 else str(x)) for x in w) for w in windows]


def _qkv(b, sq, sk, hq, hkv, d, dv, dtype, seed):
    torch.manual_seed(seed)
    return (torch.randn(b, sq, hq, d, dtype=dtype, device="cuda"), torch.randn(b, sk, hkv, d, dtype=dtype, device="cuda"),
            torch.randn(b, sk, hkv, dv, dtype=dtype, device="cuda"))


HEAD_DIMS = [pytest.param((64, 64), id="d64"), pytest.param((96, 96), id="d96"), pytest.param((128, 128), id="d128"),
             pytest.param((80, 80), id="d80"), pytest.param((192, 128), id="d192x128"),
             pytest.param((256, 256), id="d256")]
SHAPES = [pytest.param((2, 113, 203), id="113x203"), pytest.param((1, 300, 64), id="300x64"),
          pytest.param((1, 257, 257), id="257x257")]


@pytest.mark.parametrize("causal", [False, True], ids=["nc", "causal"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dims", HEAD_DIMS)
def test_table_paths(dims, shape, causal):
    """The tuned table's config for each head-dim class, every fixed window and six random ones."""
    (d, dv), (b, sq, sk) = dims, shape
    q, k, v = _qkv(b, sq, sk, 6, 2, d, dv, torch.bfloat16, seed=d + sq)
    for window in FIXED + random_windows(d * 1000 + sq + causal, 6, max(sq, sk)):
        check_fwd(q, k, v, causal, window_size=window)


@pytest.mark.parametrize("window", FIXED + random_windows(7, 8, 900), ids=_ids(FIXED + random_windows(7, 8, 900)))
@pytest.mark.parametrize("options", [{"pack_gqa": True, "num_splits": 1}, {"pack_gqa": True, "num_splits": None},
                                     {"pack_gqa": False, "num_splits": 5}, {"pack_gqa": True, "num_splits": 3}],
                         ids=["packed", "packed-auto-split", "split5", "packed-split3"])
@pytest.mark.parametrize("sq", [1, 3, 40])
def test_packed_gqa_and_split_kv(sq, options, window):
    """Short queries over long keys (decode, speculative decode): packed GQA rows take their window
    per query row; split ranges that see no key give weight 0; the sink enters once."""
    q, k, v = _qkv(2, sq, 1000, 8, 2, 128, 128, torch.bfloat16, seed=sq)
    sink = torch.randn(8, device="cuda")
    check_fwd(q, k, v, False, options, window_size=window)
    check_fwd(q, k, v, False, options, window_size=window, learnable_sink=sink, softcap=15.0)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_varlen_windows(head_dim):
    """Packed Q and K/V with empty and one-token sequences and seqused_k caps, each window per sequence."""
    import flash_attn_4_sm120 as fa

    torch.manual_seed(head_dim)
    lens_q, lens_k, used_k = [5, 0, 113, 1, 300], [7, 3, 250, 9, 300], [7, 0, 200, 9, 150]
    hq, hkv = 6, 2
    q = torch.randn(sum(lens_q), hq, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(sum(lens_k), hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(sum(lens_k), hkv, head_dim, dtype=torch.bfloat16, device="cuda")
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    seqused_k = torch.tensor(used_k, dtype=torch.int32, device="cuda")
    for window in FIXED + random_windows(head_dim, 5, 300):
        for used in (None, seqused_k):
            out, lse = fa.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                                 max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), seqused_k=used,
                                                 window_size=window, return_lse=True)
            torch.cuda.synchronize()
            for bi in range(len(lens_q)):
                if lens_q[bi] == 0:
                    continue
                qs = slice(cu_q[bi].item(), cu_q[bi + 1].item())
                nk = lens_k[bi] if used is None else used_k[bi]
                ks = slice(cu_k[bi].item(), cu_k[bi].item() + nk)
                args = (q[None, qs], k[None, ks], v[None, ks])
                ref, ref_lse = attention_ref(*args, window_size=window)
                pt, _ = attention_ref(*args, upcast=False, window_size=window)
                _check_seq(out[qs], lse[:, qs], ref[0], ref_lse[0], pt[0])


def _config(kind):
    """The forced config of a mainloop variant: tools/sanitize.py's (one list for both)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "sanitize.py"
    spec = importlib.util.spec_from_file_location("fa4_sanitize", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.mainloop_config(kind)


MAINLOOPS = ["cp_async", "single_stage", "tma", "tma_mbarrier", "tma_ws", "overlap", "pingpong", "pingpong_qreg", "persistent"]


@pytest.mark.parametrize("shape", [pytest.param((2, 113, 203), id="113x203"), pytest.param((1, 600, 1500), id="600x1500"),
                                   pytest.param((3, 1000, 700), id="3x1000x700")])
@pytest.mark.parametrize("mainloop", MAINLOOPS)
def test_mainloop_variants(mainloop, shape):
    """Every mainloop forced by config (turns must balance for tiles with no key block at all)."""
    b, sq, sk = shape
    q, k, v = _qkv(b, sq, sk, 6, 2, 128, 128, torch.bfloat16, seed=sq + len(mainloop))
    splits = 1 if mainloop == "persistent" else None
    for causal in (False, True):
        for window in FIXED + random_windows(sq * 7 + len(mainloop), 4, max(sq, sk)):
            _run_and_check(q, k, v, causal, config=_config(mainloop), num_splits=splits, window_size=window,
                           max_ctas=5 if mainloop == "persistent" else None)


def test_empty_rows_with_a_sink_give_the_sink():
    """(None, -w): the first w rows of a square problem see no key: out = 0, lse = sink."""
    import flash_attn_4_sm120 as fa

    q, k, v = _qkv(1, 70, 70, 4, 4, 64, 64, torch.bfloat16, seed=1)
    sink = torch.randn(4, device="cuda")
    out, lse = fa.flash_attn_func(q, k, v, window_size=(None, -10), learnable_sink=sink, return_lse=True)
    assert torch.equal(out[0, :10], torch.zeros_like(out[0, :10]))
    assert torch.allclose(lse[0, :, :10], sink[:, None].expand(4, 10))
    out, lse = fa.flash_attn_func(q, k, v, window_size=(None, -10), return_lse=True)
    assert torch.equal(out[0, :10], torch.zeros_like(out[0, :10])) and torch.isneginf(lse[0, :, :10]).all()


def test_fa2_minus_one_is_no_window():
    import flash_attn_4_sm120 as fa

    q, k, v = _qkv(1, 200, 300, 4, 2, 64, 64, torch.bfloat16, seed=2)
    for causal in (False, True):
        ref = fa.flash_attn_func(q, k, v, causal=causal)[0]
        assert torch.equal(fa.flash_attn_func(q, k, v, causal=causal, window_size=(-1, -1))[0], ref)
    assert torch.equal(fa.flash_attn_func(q, k, v, window_size=(None, 0))[0], fa.flash_attn_func(q, k, v, causal=True)[0])
