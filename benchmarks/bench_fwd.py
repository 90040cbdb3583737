"""Forward attention benchmark: this bundle vs its peers, all in one run (a script, not a test).

Peers: PyTorch SDPA flash backend (FA2), PyTorch SDPA cuDNN backend (uses wgmma on Hopper: a ceiling
for the H100, not a peer of the SM120 execution model), upstream flash-attn-4 forced onto its SM120
path (FLASH_ATTENTION_ARCH=sm_120, set before it is imported).

Timing: benchmarks/timing.py (median of CUDA-event timings of back-to-back calls, after warm-up).
TFLOPS = 2*B*Hq*Sq*Sk*(D + Dv) (x0.5 causal) / time; window cases use the same nominal FLOPs.
Decode cases report KV bandwidth instead (bytes of K and V read once / time).

Two occupancies, both in the same run (``--occupancy``): ``sm120`` runs every kernel at the CTAs per SM an
SM120 would give it (100 KB of shared memory per SM: ours padded by the package, the peers through the
context's cache preference, see occupancy.py); ``h100`` at the H100's own (228 KB per SM: two 64-99 KB
CTAs share an SM and hide each other's softmax, which no SM120 part can do). Rows keep them as
``results`` and ``results_h100``.

    python benchmarks/bench_fwd.py --out results.json [--quick] [--occupancy both|sm120|h100] [--matrix]
"""

import argparse
import datetime
import functools
import json
import os
import sys
from pathlib import Path
from unittest import mock

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_120")  # upstream FA4: its SM120 path, before import
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
# upstream's own disk compile cache (file-locked), so warm_cache.py can compile its kernels ahead, in parallel
os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "/tmp/fa4-upstream-cache")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
import flash_attn_4_sm120 as fa  # noqa: E402
from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV  # noqa: E402
from occupancy import cache_preference, faithful_preference  # noqa: E402
from timing import median_ms  # noqa: E402

# (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, causal, window_left)
CASES = [
    ("4x4096 32/8 d128", 4, 4096, 4096, 32, 8, 128, 128, False, None),
    ("4x4096 32/8 d128 causal", 4, 4096, 4096, 32, 8, 128, 128, True, None),
    ("16x1024 32/8 d128 causal", 16, 1024, 1024, 32, 8, 128, 128, True, None),
    ("4x4096 16/16 d64 causal", 4, 4096, 4096, 16, 16, 64, 64, True, None),
    ("4x4096 16/16 d64", 4, 4096, 4096, 16, 16, 64, 64, False, None),
    ("2x4096 8/8 d256 causal", 2, 4096, 4096, 8, 8, 256, 256, True, None),
    ("4x4096 16/16 d96 causal", 4, 4096, 4096, 16, 16, 96, 96, True, None),
    ("4x4096 16/16 d192/128 causal", 4, 4096, 4096, 16, 16, 192, 128, True, None),
    ("4x4096 28/4 d128 causal (7-way GQA)", 4, 4096, 4096, 28, 4, 128, 128, True, None),
    ("1x8192 32/8 d128 causal", 1, 8192, 8192, 32, 8, 128, 128, True, None),
    ("1x8192 32/8 d128 window 1024", 1, 8192, 8192, 32, 8, 128, 128, True, 1024),
    ("decode 16x(1,8192) 32/8 d128", 16, 1, 8192, 32, 8, 128, 128, False, None),
]



def matrix_cases() -> list:
    """The generalization matrix: every head-dim class and the dims between them (d104 / d120: padded widths the d128
    class's TMA tiles cannot hold, which run its cp.async tiles), causal and
    full, MHA / GQA 32:8 / an odd 7:1 ratio, long (2-4 x 2048-4096) and short odd (500-1000 tokens,
    batch 8-16) sequences, odd head counts, and decode. Names start with "m " so --cases can pick them."""
    dims = [(64, 64), (80, 80), (96, 96), (104, 104), (112, 112), (120, 120), (128, 128), (160, 160), (192, 128),
            (192, 192), (256, 256)]
    cases = []
    for d, dv in dims:
        tag = f"d{d}" if d == dv else f"d{d}/{dv}"
        mha = 32 if d <= 96 else 16  # about 2-3k of hidden width, as models pair heads and dims
        heads = {"mha": (mha, mha), "gqa": (32, 8), "gqa7": (28, 4)}
        for i, (kind, (hq, hkv)) in enumerate(heads.items()):
            b, s = ((4, 2048), (2, 4096), (3, 3072))[i]
            if d >= 192:  # keep the largest dims' cases near the others' FLOPs
                hq, hkv = hq // 2, max(hkv // 2, 1)
            for causal in (False, True):
                cases.append((f"m {b}x{s} {hq}/{hkv} {tag}{' causal' if causal else ''}", b, s, s, hq, hkv, d, dv,
                              causal, None))
    short = [(16, 537, 20, 20, 64, False), (12, 777, 24, 8, 96, True), (8, 999, 32, 8, 128, False),
             (16, 613, 40, 8, 128, True), (10, 901, 12, 3, 80, False), (8, 555, 25, 5, 112, True),
             (12, 700, 18, 6, 192, True), (8, 1000, 16, 4, 256, False),
             (4, 4096, 20, 20, 80, True)]  # (the d=80 shape)
    for b, s, hq, hkv, d, causal in short:
        dv = 128 if d == 192 else d
        cases.append((f"m {b}x{s} {hq}/{hkv} d{d}{'' if dv == d else f'/{dv}'}{' causal' if causal else ''}", b, s, s,
                      hq, hkv, d, dv, causal, None))
    for b, sk, hq, hkv, d in [(16, 8192, 32, 8, 128), (1, 32768, 32, 8, 128), (8, 4096, 64, 8, 64),
                              (32, 2048, 40, 8, 128), (4, 8192, 16, 4, 256)]:
        cases.append((f"m decode {b}x(1,{sk}) {hq}/{hkv} d{d}", b, 1, sk, hq, hkv, d, d, False, None))
    return cases


OCCUPANCY_METHOD = (
    "sm120: every kernel at the CTAs per SM an SM120 (100 KB of shared memory per SM) would run: ours padded by "
    "the package (ExecutionModel.occupancy_launch_smem, its default), FA2 and upstream by the CUDA context's cache "
    "preference that gives their longest kernel the SM120's count (benchmarks/occupancy.py; 'emulation' per row); "
    "cuDNN (wgmma) is not timed there. h100: every kernel at the H100's own occupancy (ours with "
    "FA4_SM120_OCCUPANCY=device).")
#: Peers of the SM120 comparison (cuDNN's wgmma kernels are a ceiling of the H100, not an SM120 peer)
SM120_PEERS = ("sdpa_flash_fa2", "fa4_sm120_path", "flashinfer")


def timed(impl: str, call, occ: str, model, emulation: dict, peers: tuple = SM120_PEERS) -> dict:
    """Median ms of ``call`` at occupancy ``occ`` (see OCCUPANCY_METHOD); at SM120 occupancy only ``peers`` (and
    ours) are timed."""
    if impl.startswith("ours"):  # ours and its variants (e.g. ours_deterministic)
        with mock.patch.dict(os.environ, {OCCUPANCY_ENV: "model" if occ == "sm120" else "device"}):
            return {"ms": median_ms(call)}
    if occ == "h100":
        return {"ms": median_ms(call)}
    if impl not in peers:
        return {"skipped": "not an SM120 peer"}
    info = emulation[impl] = faithful_preference(call, model)
    if info["pref"] is None:
        return {"skipped": "its occupancy cannot be set to an SM120's (see emulation)"}
    with cache_preference(info["pref"]):
        return {"ms": median_ms(call)}


def time_parts(row: dict, impls: dict, parts: dict, occupancies, model, flops: float, peers: tuple = SM120_PEERS):
    """Fill ``row["results"]`` (sm120) / ``row["results_h100"]`` with ``{impl: {part: {ms, tflops}}}``: ``parts``
    maps a part's name to ``(make, multiplier)``, ``make(fn)`` returning the call to time for implementation ``fn``
    and ``flops * multiplier`` its work; an implementation that cannot run a case gets ``{"error": ...}``."""
    for occ in occupancies:
        key = "results" if occ == "sm120" else "results_h100"
        row[key] = {}
        for impl, fn in impls.items():
            res = {}
            try:
                for part, (make, _) in parts.items():
                    res[part] = timed(impl, make(fn), occ, model, row.setdefault(f"emulation_{part}", {}), peers)
            except Exception as e:  # noqa: BLE001  (reported, not fatal)
                res["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            for part, (_, mult) in parts.items():
                if "ms" in res.get(part, {}):
                    res[part]["tflops"] = flops * mult / res[part]["ms"] / 1e9
            row[key][impl] = res


def training_args(extra=None) -> argparse.Namespace:
    """The training benchmarks' command line (``--out``, ``--cases``, ``--occupancy``, ``--impls``, and what
    ``extra(parser)`` adds), with ``occupancies``: the occupancies to time, in order."""
    ap = argparse.ArgumentParser()
    if extra is not None:
        extra(ap)
    ap.add_argument("--out")
    ap.add_argument("--cases", nargs="*", help="only the cases whose names contain one of these strings")
    ap.add_argument("--occupancy", choices=("both", "sm120", "h100"), default="both")
    ap.add_argument("--impls", nargs="*", help="only these implementations (an A/B of two trees needs no peers)")
    args = ap.parse_args()
    args.occupancies = ("sm120", "h100") if args.occupancy == "both" else (args.occupancy,)
    return args


def select_impls(impls: dict, names) -> dict:
    """``impls`` restricted to ``--impls``' names (all of them when none were given)."""
    return {name: fn for name, fn in impls.items() if not names or name in names}


def training_inputs(b: int, sq: int, sk: int, hq: int, hkv: int, d: int, dv: int) -> tuple:
    """(q, k, v, dout) of a training benchmark case: bf16 on the GPU, q / k / v requiring grad, seed 0."""
    torch.manual_seed(0)
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(b, sk, hkv, dv, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    return q, k, v, torch.randn(b, sq, hq, dv, dtype=torch.bfloat16, device="cuda")


def fwd_and_grad_parts(q, k, v, dout) -> dict:
    """``time_parts``' parts for implementations ``fn(q, k, v)``: the forward without grad (1x the forward's work)
    and forward + backward through autograd (3.5x)."""
    def forward(fn):
        def run():
            with torch.no_grad():
                fn(q, k, v)
        return run

    return {"fwd": (forward, 1.0),
            "fwd_bwd": (lambda fn: lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout), 3.5)}


def save_result(path, occupancies, rows, **extra) -> None:
    """Write a training benchmark's JSON (device, date, versions, occupancies, ``extra``, rows) to ``path`` (after
    every row: a run stopped early keeps what it measured)."""
    Path(path).write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "torch": torch.__version__,
         "bundle_version": fa.__version__, "dtype": "bf16", "occupancies": occupancies, **extra, "rows": rows},
        indent=1))


def sdpa(backend):
    def run(q, k, v, causal, window):
        if window is not None:  # SDPA has no window: it would need a dense mask (not a peer here)
            raise NotImplementedError("no sliding window in SDPA flash/cuDNN")
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=kt.shape[1] != qt.shape[1])
    return run


def upstream_fa4():
    try:
        from flash_attn.cute import flash_attn_func as up
    except Exception as e:  # not installed here: reported, not fatal
        print(f"upstream flash-attn-4 unavailable: {e}")
        return None
    return lambda q, k, v, causal, window: up(q, k, v, causal=causal,
                                              window_size=(window, 0) if window is not None else (None, None))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", nargs="*", help="only the cases whose names contain one of these strings")
    ap.add_argument("--matrix", action="store_true",
                    help="also the generalization matrix (matrix_cases: every head-dim class and the dims between, "
                         "masks, head layouts, short odd lengths, decode)")
    ap.add_argument("--occupancy", choices=("both", "sm120", "h100"), default="both",
                    help="sm120: every kernel at an SM120's CTAs per SM (ours padded by the package, peers by the "
                         "cache preference, see occupancy.py); h100: every kernel at the H100's own")
    args = ap.parse_args()
    occupancies = ("sm120", "h100") if args.occupancy == "both" else (args.occupancy,)
    dev = torch.cuda.get_device_name()
    model = fa.dispatch_model(torch.device("cuda"))
    impls = {
        "ours": lambda q, k, v, causal, window: fa.flash_attn_func(
            q, k, v, causal=causal, window_size=(window, 0) if window is not None else (None, None)),
        "sdpa_flash_fa2": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    up = upstream_fa4()
    if up is not None:
        impls["fa4_sm120_path"] = up
    rows = []
    cases = CASES + (matrix_cases() if args.matrix else [])
    cases = [c for c in cases if not args.cases or any(s in c[0] for s in args.cases)]
    for name, b, sq, sk, hq, hkv, d, dv, causal, window in cases[: 2 if args.quick else None]:
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, sk, hkv, dv, dtype=torch.bfloat16, device="cuda")
        # Nominal FLOPs of the full (causal: half) problem, for every case: a window case shows how
        # much faster it is than the full causal one, in the same units.
        flops = 2 * b * hq * sq * sk * (d + dv) * (0.5 if causal else 1.0)
        kv_bytes = b * sk * hkv * (d + dv) * 2
        row = {"case": name, "batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads_q": hq, "heads_kv": hkv,
               "head_dim": d, "head_dim_v": dv, "causal": causal, "window_left": window}
        for occ in occupancies:
            key = "results" if occ == "sm120" else "results_h100"
            row[key] = {}
            for impl, fn in impls.items():
                call = functools.partial(fn, q, k, v, causal, window)
                try:
                    row[key][impl] = timed(impl, call, occ, model, row.setdefault("emulation", {}))
                except Exception as e:
                    row[key][impl] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                    continue
                r = row[key][impl]
                if "ms" in r:
                    r.update(tflops=flops / r["ms"] / 1e9, kv_gbps=kv_bytes / r["ms"] / 1e6)
            cells = []
            for impl, r in row[key].items():
                metric = (f"{r['kv_gbps']:.0f}GB/s" if sq == 1 else f"{r['tflops']:.0f}TF") if "ms" in r else "-"
                cells.append(f"{impl}={metric}")
            print(f"{name:32s} [{occ}] " + " ".join(cells), flush=True)
        rows.append(row)
        result = {"device": dev, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
                  "bundle_version": fa.__version__, "dtype": "bf16", "occupancies": occupancies,
                  "method": OCCUPANCY_METHOD, "rows": rows}
        if args.out:  # after every row: a run stopped early keeps what it measured
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
