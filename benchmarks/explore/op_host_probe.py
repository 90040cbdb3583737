"""Host microseconds per call of the custom ops a compiled training graph calls, layer by layer (a script, not a
test).

Session 39: the compiled plain GPT's step is host-bound with the bundle (``explore/step_host_probe.py``); this
splits an op call's host time into the dispatcher and ``torch.library.custom_op`` layers (``torch.ops`` call, as an
inductor graph makes it, under ``no_grad`` as AOTAutograd's runtime runs the forward graph's ops) and the bundle's
own impl (``interface._fwd_impl`` / ``_bwd_impl`` called directly), for the tree's package and the build loaded
through ``kernels`` (``--profile``: cProfiles of the tree's op calls); a small causal GQA shape, so the GPU never holds the host back. Median of 7 rounds of 200 calls.

    source .kit_client/device-setup.sh && python3 benchmarks/explore/op_host_probe.py --out $OUT/op_host.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))


def per_call_us(fn, calls: int = 200, rounds: int = 7) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


PROFILE = False


def probe(label: str, iface) -> dict:
    import torch

    torch.manual_seed(0)
    b, s, hq, hkv, d = 1, 256, 8, 2, 128
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    fwd_op, bwd_op = (getattr(op, "_opoverload", op) for op in (iface._fwd_op, iface._bwd_op))
    fwd_args = (q, k, v, None, True, None, None, 0.0, None, 1, None, False, None)
    with torch.no_grad():
        out, lse = fwd_op(*fwd_args)
    dout = torch.randn_like(out)
    bwd_args = (dout, None, q, k, v, out, lse, None, True, None, None, 0.0, None, False, None)
    rows = {}
    with torch.no_grad():
        rows["fwd op (torch.ops, no_grad)"] = per_call_us(lambda: fwd_op(*fwd_args))
        rows["fwd impl (direct)"] = per_call_us(lambda: iface._fwd_impl(*fwd_args))
        rows["bwd op (torch.ops, no_grad)"] = per_call_us(lambda: bwd_op(*bwd_args))
        rows["bwd impl (direct)"] = per_call_us(lambda: iface._bwd_impl(*bwd_args))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        rows["SDPA forward (no_grad)"] = per_call_us(
            lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True))
    for name, us in rows.items():
        print(f"{label:6s} {name:30s} {us:7.1f} us/call", flush=True)
    if PROFILE:
        import cProfile
        import io
        import pstats

        for name, fn in (("fwd op", lambda: fwd_op(*fwd_args)), ("bwd op", lambda: bwd_op(*bwd_args))):
            prof = cProfile.Profile()
            with torch.no_grad():
                prof.enable()
                for _ in range(300):
                    fn()
                prof.disable()
            torch.cuda.synchronize()
            for key in ("tottime", "cumulative"):
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(28)
                rows[f"profile {name} {key}"] = buf.getvalue()
                print(f"== {label} {name} by {key}\n" + "\n".join(
                    line[:190] for line in buf.getvalue().splitlines()[6:40]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--profile", action="store_true", help="cProfile 300 calls of each op (the tree's package)")
    ap.add_argument("--tree-only", action="store_true")
    args = ap.parse_args()
    global PROFILE
    PROFILE = args.profile
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from client_transformers import REPO_ID, set_local_kernels, set_offline

    report = {"device": torch.cuda.get_device_name()}
    sys.path.insert(0, str(ROOT / "torch-ext"))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        report["tree"] = probe("tree", importlib.import_module("flash_attn_4_sm120.interface"))
        if args.tree_only:
            if args.out:
                Path(args.out).write_text(json.dumps(report, indent=1))
            return 0
        set_offline(True)
        set_local_kernels(str(ROOT), [REPO_ID])
        fa = __import__("kernels").get_kernel(REPO_ID, version=1)
        report["kernels"] = probe("kernels", importlib.import_module(fa.__name__ + ".interface"))
        report["tree_again"] = probe("tree", importlib.import_module("flash_attn_4_sm120.interface"))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
