"""Dropout's tiles side by side (issue 20; a script, not a test): the backward's dropout split against the ``kv_in_regs``
64x64 splits, and the d96 forward's class tile against the tiles whose registers hold the keep flags on 16-bit pairs.

Session 40: dropout's d96 causal cost sat at 1.22-1.29x (the line: 1.25x). Its two parts: the backward leaves the
class's ``kv_in_regs`` entry for the split with both S / dP operands in shared memory (the 64x128 entry's K / V rows
and the keep flags spill), and the d96 causal forward applies the mask element by element from half Philox calls
(``config.dropout_on_pairs``: its 128x64 4-warp tile cannot hold the pairs), twice the draws of the other tiles.
Candidates: the 64x64 ``kv_in_regs`` splits (16 keys per warp: 24 / 32 registers of K / V rows, which conform with
dropout on sm_120a) and, for the d96 forward, the 128x64 8-warp two-stage tile and the 64x64 4-warp one.

Each backward candidate is patched into ``BWD_TABLE_DROPOUT`` (ahead of the smem-operand split), each forward one
into the forward table's class entry; the row checks the dispatcher picked it. Times (median CUDA events, SM120
occupancy): the backward alone (``autograd.grad`` of a retained graph) with dropout, against the class entry without
it, and the forward alone with and without dropout. The backward's gradients are compared with the current split's
(same seed: the same mask) as a sanity check, max |diff| over max |grad|.

    python benchmarks/explore/dropout_tiles.py --out dropout_tiles.json [--head-dims 96 128]
        [--shapes 4x4096x32x8 2x4096x16x4 8x2048x16x16]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import multiprocessing
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))

P, SEED = 0.1, 1234
SHAPES = ("4x4096x32x8", "2x4096x16x4", "8x2048x16x16")


def bwd_candidates(cls: int) -> dict:
    """name -> the backward config a dropout spec of class ``cls`` runs (None: the dispatcher's own choice)."""
    from flash_attn_4_sm120.bwd_config import BwdConfig

    def kvr(dq: int, stages_do: int = 1):
        return BwdConfig(64, 64, 8, 2, stages_do, sdp_warps_m=1, dkv_warps_n=2, dq_warps_m=dq, role_split=True,
                         step_divisor=True, kv_in_regs=True)
    out = {"dispatch": None, "kvr_64x64": kvr(4 if cls == 96 else 1), "kvr_64x64_o2": kvr(4 if cls == 96 else 1, 2)}
    if cls == 128:
        out["kvr_64x64_dq2"] = kvr(2)
    return out


def fwd_candidates(cls: int) -> dict:
    from flash_attn_4_sm120.config import FwdConfig

    if cls != 96:
        return {"dispatch": None}
    # session 40 part 2: the 128x64 8-warp two-stage and 64x64 4-warp tiles ran d96 causal dropout at 1.58 / 1.61 ms
    # against the class tile's 1.45 (their own plain forwards 1.23-1.25x slower). Part 3: the class tile's narrower
    # twins with 32 S registers per thread (the pairs fit; sm_120a with dropout 255 registers, no local memory; 128x48
    # breaks d96's 32-row copy passes)
    return {"dispatch": None, "m128n32s1": FwdConfig(128, 32, 4, 1), "m128n32s2": FwdConfig(128, 32, 4, 2)}


_SAVED = {}


def use_bwd(cfg, cls: int) -> None:
    from flash_attn_4_sm120 import backward, bwd_config, interface

    table = bwd_config.BWD_TABLE_DROPOUT
    _SAVED.setdefault(("bwd", cls), table.get(cls))
    if cfg is None and _SAVED[("bwd", cls)] is None:
        table.pop(cls, None)
    else:
        table[cls] = cfg if cfg is not None else _SAVED[("bwd", cls)]
    backward.clear_caches()
    interface._PLANS.clear()


def use_fwd(cfg, cls: int, causal: bool) -> None:
    from flash_attn_4_sm120 import config, interface

    key = f"d{cls}_{'causal' if causal else 'full'}"
    table = config.fwd_table()
    _SAVED.setdefault(("fwd", key), table[key])
    table[key] = cfg if cfg is not None else _SAVED[("fwd", key)]
    for cached in (config._select_entry, config.fwd_candidates, config.choose_fwd_config):
        cached.cache_clear()
    interface._PLANS.clear()


def picked(d: int, causal: bool) -> tuple:
    """(forward config, backward config) the dispatcher picks for a dropout call at head dim ``d``."""
    from flash_attn_4_sm120 import backward, config
    from flash_attn_4_sm120.execution_model import SM120
    from flash_attn_4_sm120.problem import BwdSpec, FwdSpec

    fspec = FwdSpec(dtype="bf16", head_dim=d, head_dim_v=d, causal=causal, dropout=True)
    bspec = BwdSpec(dtype="bf16", head_dim=d, head_dim_v=d, causal=causal, dropout=True)
    return config.select_fwd_config(fspec, SM120), backward.select_bwd_config(bspec, SM120)


def _inputs(shape, d: int, grad: bool = True):
    import torch

    b, s, hq, hkv = shape
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda", requires_grad=grad)
               for h in (hq, hkv, hkv))
    return q, k, v, torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")


def _call(q, k, v, causal: bool, p: float):
    import flash_attn_4_sm120 as fa

    if p:
        return fa.flash_attn_func(q, k, v, causal=causal, dropout_p=p, dropout_seed=SEED)[0]
    return fa.flash_attn_func(q, k, v, causal=causal)[0]


def _warm(item) -> str:
    """Compile one candidate's kernels (a spawned worker: the timing process then loads them from disk)."""
    import torch
    from tune_bwd import warm_grad

    kind, cfg_dict, cls, causal = item
    from flash_attn_4_sm120.bwd_config import BwdConfig
    from flash_attn_4_sm120.config import FwdConfig
    if kind == "bwd":
        use_bwd(BwdConfig(**cfg_dict) if cfg_dict else None, cls)
    else:
        use_fwd(FwdConfig(**cfg_dict) if cfg_dict else None, cls, causal)
    q, k, v, dout = _inputs((1, 256, 4, 2), cls)
    out = []
    for p in (0.0, P):
        out.append(warm_grad(lambda: _call(q, k, v, causal, p), (q, k, v), dout))
        with torch.no_grad():
            _call(q.detach(), k.detach(), v.detach(), causal, p)
    return "ok" if all(o == "ok" for o in out) else "; ".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--head-dims", nargs="*", type=int, default=[96, 128])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="batch x seqlen x heads_q x heads_kv")
    ap.add_argument("--kinds", nargs="*", default=["bwd", "fwd"], choices=("bwd", "fwd"))
    args = ap.parse_args()

    import torch
    from timing import median_ms

    plan = [("bwd", cls, name, cfg, causal) for cls in args.head_dims for causal in (False, True)
            for name, cfg in bwd_candidates(cls).items() if "bwd" in args.kinds]
    plan += [("fwd", cls, name, cfg, causal) for cls in args.head_dims for causal in (False, True)
             for name, cfg in fwd_candidates(cls).items() if "fwd" in args.kinds]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        warm = list(pool.imap(_warm, [(kind, asdict(cfg) if cfg else None, cls, causal)
                                      for kind, cls, _, cfg, causal in plan]))
    rows = []
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split("x"))
        b, s, hq, _ = shape
        for cls in args.head_dims:
            q, k, v, dout = _inputs(shape, cls)
            qn, kn, vn = (t.detach() for t in (q, k, v))
            for causal in (False, True):
                flops = 4 * b * hq * s * s * cls * (0.5 if causal else 1.0)
                use_bwd(None, cls)
                use_fwd(None, cls, causal)
                out = _call(q, k, v, causal, 0.0)
                plain_bwd = median_ms(functools.partial(torch.autograd.grad, out, (q, k, v), dout, retain_graph=True))
                with torch.no_grad():
                    plain_fwd = median_ms(lambda: _call(qn, kn, vn, causal, 0.0))
                ref = None
                for (kind, c, name, cfg, cz), w in zip(plan, warm):
                    if c != cls or cz != causal:
                        continue
                    row = {"shape": list(shape), "head_dim": cls, "causal": causal, "kind": kind, "name": name,
                           "config": asdict(cfg) if cfg else None, "plain_fwd_ms": plain_fwd,
                           "plain_bwd_ms": plain_bwd}
                    if w != "ok":
                        row["error"] = w
                        print(f"d{cls} {text} {'causal' if causal else 'full  '} {kind} {name}: {w}", flush=True)
                        rows.append(row)
                        continue
                    if kind == "bwd":
                        use_bwd(cfg, cls)
                        row["picked"] = str(picked(cls, causal)[1])
                        out = _call(q, k, v, causal, P)
                        grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                        if ref is None:
                            ref = grads
                        row["grad_vs_dispatch"] = [float((g - r).abs().max() / r.abs().max().clamp_min(1e-6))
                                                   for g, r in zip(grads, ref)]
                        ms = median_ms(functools.partial(torch.autograd.grad, out, (q, k, v), dout,
                                                         retain_graph=True))
                        row.update(ms=ms, tflops=2.5 * flops / ms / 1e9, vs_plain=ms / plain_bwd)
                        use_bwd(None, cls)
                    else:
                        use_fwd(cfg, cls, causal)
                        row["picked"] = str(picked(cls, causal)[0])
                        with torch.no_grad():
                            row["plain_ms"] = median_ms(lambda: _call(qn, kn, vn, causal, 0.0))
                            ms = median_ms(lambda: _call(qn, kn, vn, causal, P))
                        row.update(ms=ms, tflops=flops / ms / 1e9, vs_plain=ms / plain_fwd)
                        use_fwd(None, cls, causal)
                    print(f"d{cls} {text} {'causal' if causal else 'full  '} {kind} {name:14s} dropout "
                          f"{row['ms']:.3f} ms ({row['vs_plain']:.3f}x the class entry without dropout: "
                          f"{plain_bwd if kind == 'bwd' else plain_fwd:.3f} ms)"
                          + (f" own plain {row['plain_ms']:.3f}" if "plain_ms" in row else "")
                          + (" grad diff " + "/".join(f"{x:.1e}" for x in row["grad_vs_dispatch"])
                             if "grad_vs_dispatch" in row else ""), flush=True)
                    rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "date": datetime.date.today().isoformat(), "dropout_p": P,
                                              "occupancy": "sm120 (package default)", "shapes": args.shapes,
                                              "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
