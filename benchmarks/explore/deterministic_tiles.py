"""Backward tiles of one head-dim class side by side, default and ``deterministic=True`` (a script, not a test).

Session 27 asked which d64 tile serves ``deterministic=True`` best (1.31-1.37x on the then 4-warp 64x64 table tile;
target 1.3x): the deterministic backward orders each query block's dQ additions by key block, so tiles with more keys
per CTA or more warps per step pay the wait over more work. The 64x128 tiles turned out faster by default too, and
the 64x128 role split became d64's table entry. Timed at SM120 occupancy (the package default), bf16, full and
causal: the table's default first (the ratios' base), then every candidate default and deterministic (each entry
patched into ``BWD_TABLE``; the kernels compile first in spawned processes).

    python benchmarks/explore/deterministic_tiles.py --out det_tiles.json [--head-dim 64|96|128]
        [--shapes 4x4096x32x8 2x4096x16x4] [--configs table four_warp_64x64 ...] [--jobs 8]
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
from tune_bwd import _use, warm_grad  # noqa: E402  (_use patches BWD_TABLE[cls], clears the backward's caches)

#: (batch, seqlen, heads_q, heads_kv): bench_bwd's rows and tune_bwd's shape (a quarter of the CTAs)
SHAPES = ("4x4096x32x8", "2x4096x16x4")


def candidates(cls: int) -> dict:
    from flash_attn_4_sm120.bwd_config import (BWD_TABLE, BWD_TABLE_DROPOUT, BWD_TABLE_HEAVY,
                                               BWD_TABLE_SMEM_OPERANDS, BwdConfig)

    # session 39: the split a class's kv_in_regs entry replaced (both S / dP operands from shared memory), for the
    # off-grid shapes (partial last key blocks, MQA)
    former = {"smem_operands": BWD_TABLE_SMEM_OPERANDS[cls]} if cls in BWD_TABLE_SMEM_OPERANDS else {}
    if cls == 64:
        return {"table": BWD_TABLE[64], "heavy_64x128_w8": BWD_TABLE_HEAVY[64],
                "rolesplit_64x64": BWD_TABLE_DROPOUT[64],
                "four_warp_64x64": BwdConfig(64, 64, 4, 2, 2, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2),
                # session 38 (compiled for sm_120a only, not yet timed): the table's 64x128 split with each group's
                # S / dP B operand in registers (32 keys per warp, 32 registers), with one or two dO stages (74752 /
                # 82944 B; 255 registers, no local memory; 64x192 spilled 248-364 B)
                "kvr_64x128": BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=1, dkv_warps_n=2, dq_warps_m=2, role_split=True,
                                        rotated_start=True, kv_in_regs=True),
                "kvr_64x128_o2": BwdConfig(64, 128, 8, 2, 2, sdp_warps_m=1, dkv_warps_n=2, dq_warps_m=2,
                                           role_split=True, rotated_start=True, kv_in_regs=True)}
    if cls == 96:
        return {"table": BWD_TABLE[96], **former, "heavy_64x64_w8": BWD_TABLE_HEAVY[96],
                "rolesplit_64x64": BwdConfig(64, 64, 8, 2, 2, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=4,
                                             role_split=True),
                # session 37: 96 keys per CTA (K / V by a warp group each: bwd_config.bwd_kv_copy_threads)
                "rolesplit_64x96": BwdConfig(64, 96, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=4,
                                             role_split=True),
                "rolesplit_64x96_s4": BwdConfig(64, 96, 8, 2, 1, sdp_warps_m=4, dkv_warps_n=2, dq_warps_m=4,
                                                role_split=True),
                "rolesplit_64x96_div": BwdConfig(64, 96, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=4,
                                                 role_split=True, step_divisor=True),
                # session 38: 128 keys per CTA with each group's S / dP B operand in registers (K / V rows), P and dS
                # in V's shared memory (kv_in_regs)
                "kvr_64x128_dkv2": BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=1, dkv_warps_n=2, dq_warps_m=4,
                                             role_split=True, step_divisor=True, kv_in_regs=True),
                "kvr_64x128_dkv4": BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=1, dkv_warps_n=4, dq_warps_m=4,
                                             role_split=True, step_divisor=True, kv_in_regs=True)}
    if cls == 128:  # session 37: 96 keys per CTA at d128 fit beside 32-row query tiles (84 KB)
        split = dict(sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=1, role_split=True, step_divisor=True)
        return {"table": BWD_TABLE[128], **former,
                "rolesplit_32x96": BwdConfig(32, 96, 8, 2, 1, **split),
                "rolesplit_32x96_dq2": BwdConfig(32, 96, 8, 2, 1, **{**split, "dq_warps_m": 2}),
                "rolesplit_32x96_o2": BwdConfig(32, 96, 8, 2, 2, **split),
                # session 38: 96 keys per CTA beside 64-row query tiles with each group's S / dP B operand in
                # registers (a warp's 24 K or V rows: one n8 atom per warp step, bwd_config.bwd_sdp_n_step), P and dS
                # in V's shared memory (98304 B)
                "kvr_64x96": BwdConfig(64, 96, 8, 2, 1, **{**split, "sdp_warps_m": 1, "kv_in_regs": True}),
                "kvr_64x96_dq2": BwdConfig(64, 96, 8, 2, 1, **{**split, "sdp_warps_m": 1, "dq_warps_m": 2,
                                                              "kv_in_regs": True})}
    raise SystemExit(f"no candidates for head-dim class {cls}")


def _inputs(shape, d: int, rows=None):
    import torch

    b, s, hq, hkv = shape
    s = rows or s
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
               for h in (hq, hkv, hkv))
    return q, k, v, torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")


def _warm(item) -> str:
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.bwd_config import BwdConfig

    cfg, cls, causal, det, d = BwdConfig(**item[0]), item[1], item[2], item[3], item[4]
    _use(cfg, cls)
    q, k, v, dout = _inputs((1, 256, 4, 2), d)
    return warm_grad(lambda: fa.flash_attn_func(q, k, v, causal=causal, deterministic=det)[0], (q, k, v), dout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64, choices=(64, 96, 128))
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="batch x seqlen x heads_q x heads_kv")
    ap.add_argument("--configs", nargs="*", default=None, help="candidate names (default: all of the class)")
    ap.add_argument("--no-deterministic", action="store_true", help="time the default backward only")
    ap.add_argument("--dim", type=int, default=None,
                    help="the inputs' head dim, within the class (default: the class's own; session 39: 80, 112)")
    args = ap.parse_args()

    import torch

    cls = args.head_dim
    d = args.dim or cls
    every = candidates(cls)
    cands = {n: c for n, c in every.items() if args.configs is None or n in args.configs or n == "table"}
    dets = (False,) if args.no_deterministic else (False, True)
    plan = [(name, cfg, causal, det) for causal in (False, True) for name, cfg in cands.items() for det in dets]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        warm = list(pool.imap(_warm, [(asdict(cfg), cls, causal, det, d) for _, cfg, causal, det in plan]))
    rows = []
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split("x"))
        base = {}
        tensors = _inputs(shape, d)
        for (name, cfg, causal, det), w in zip(plan, warm):
            rows.append(time_one(shape, d, name, cfg, causal, det, w, base, tensors, cls))
    _use(every["table"], cls)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "date": datetime.date.today().isoformat(), "head_dim": d, "class": cls,
                                              "shapes": args.shapes, "occupancy": "sm120 (package default)",
                                              "rows": rows}, indent=1))


def time_one(shape, d, name, cfg, causal, det, warm, base, tensors, cls=None):
    """One timing row at head dim ``d`` (class ``cls``, default ``d``); ``base``: the table tile's default time per
    causal flag (the table runs first)."""
    import torch

    import flash_attn_4_sm120 as fa
    from timing import median_ms

    q, k, v, dout = tensors
    b, s, hq, _ = shape
    row = {"shape": shape, "head_dim": d, "config_name": name, "config": asdict(cfg), "causal": causal,
           "deterministic": det}
    if warm != "ok":
        row["error"] = warm
    else:
        _use(cfg, cls or d)
        out = fa.flash_attn_func(q, k, v, causal=causal, deterministic=det)[0]
        ms = median_ms(functools.partial(torch.autograd.grad, out, (q, k, v), dout, retain_graph=True))
        flops = 2.5 * 4 * b * hq * s * s * d * (0.5 if causal else 1.0)
        row.update(ms=ms, tflops=flops / ms / 1e9)
        if not det and name == "table":
            base[causal] = ms
        row["vs_default"] = ms / base[causal] if causal in base else None
    print(f"d{d} {shape} {'causal' if causal else 'full  '} {name:18s} det={int(det)}: " +
          (f"{row['ms']:.3f} ms {row['tflops']:.0f} TFLOPS {row['vs_default']:.3f}x the table's default"
           if "ms" in row else row["error"]), flush=True)
    return row


if __name__ == "__main__":
    main()
