"""compute-sanitizer over every kernel family, with good and corrupt metadata (run on a GPU machine).

    python tools/sanitize.py [--json PATH] [--families NAME ...] [--tools memcheck racecheck synccheck]

Each family is a small workload (``FAMILIES``): a mainloop forced by config (cp.async, TMA, TMA with
mbarrier release, TMA warp-specialized, overlapped, ping-pong, persistent ping-pong), the table's
packed-GQA decode, split-KV + combine, varlen (packed and dense with seqused), paged K/V (page
sizes 1, 16, 48; decode, prefill and chunked prefill), flash_attn_with_kvcache (append and rotary into
paged and dense caches), the public combine, and the backward (every head-dim class; deterministic; the
role-split kernel; the group split), score_mod / mask_mod forward and backward, block-sparse lists (good and
corrupt, forward and backward), varlen metadata included. Every family first runs
with good inputs, then (where it takes metadata) with corrupt metadata: cu_seqlens past the packed
rows, negative or decreasing offsets, seqused past the tensor or negative, max_seqlen too small, page
table entries past the pool or negative. Corrupt metadata may give wrong rows; it must never touch memory
outside the tensors, so the bar is 0 errors in every run.

The driver first runs every family once without a sanitizer (compiling into a shared disk cache),
then runs ``compute-sanitizer --tool T python tools/sanitize.py --run FAMILY`` per family and tool
(memcheck on all; racecheck and synccheck on the families with warp specialization, named
barriers or mbarriers, the one-stage schedule and the paged gather) and records each run's "ERROR SUMMARY" count in the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: families whose synchronization racecheck / synccheck should see (named barriers, mbarriers, WS, and the
#: one-stage schedule, which refills its single K and V buffers with a CTA barrier as the only guard)
SYNC_FAMILIES = ("single_stage", "single_stage_w8", "tma_mbarrier", "tma_ws", "pingpong", "persistent", "paged",
                 "paged_fp8", "paged_fp8_mma", "paged_decode_tile", "paged_fp8_decode_tile", "wide_varlen", "mla_paged",
                 "kvcache", "kvcache_wide", "kvcache_mla", "bwd", "bwd_det", "bwd_rolesplit", "bwd_det_orders", "bwd_varlen_classes", "flex",
                 "sparse", "dropout", "invariant_chunks")


def _i32(xs, device="cuda"):
    import torch

    return torch.tensor(xs, dtype=torch.int32, device=device)


def mainloop_config(kind: str):
    """A forced config per mainloop variant (d128-sized tiles), shared with tests/test_window_gpu.py."""
    from flash_attn_4_sm120.config import FwdConfig

    return {
        "cp_async": FwdConfig(64, 64, 4, 2),
        "single_stage": FwdConfig(128, 64, 4, 1),
        "single_stage_w8": FwdConfig(128, 64, 8, 1, q_in_regs=True),
        "tma": FwdConfig(128, 48, 4, 2, mainloop="tma"),
        "tma_mbarrier": FwdConfig(128, 48, 4, 2, mainloop="tma", mbarrier_release=True),
        "tma_ws": FwdConfig(128, 48, 4, 2, mainloop="tma_ws"),
        "overlap": FwdConfig(64, 64, 4, 2, overlap=True),
        "pingpong": FwdConfig(256, 32, 8, 2, mainloop="tma", overlap=True, pingpong=True),
        "pingpong_qreg": FwdConfig(128, 64, 8, 2, q_in_regs=True, mainloop="tma", overlap=True, pingpong=True),
        "persistent": FwdConfig(256, 32, 8, 2, mainloop="tma", overlap=True, pingpong=True, persistent=True),
    }[kind]


def _dense_config_run(kind):
    """A forced mainloop on dense GQA inputs: full, causal and a window with a negative bound."""
    import torch

    from flash_attn_4_sm120.launch import launch_fwd as _launch_fwd
    from flash_attn_4_sm120.problem import validate_fwd

    torch.manual_seed(0)
    q = torch.randn(2, 333, 6, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 517, 2, 128, dtype=torch.bfloat16, device="cuda")
    for causal, window in ((False, (None, None)), (True, (None, None)), (False, (100, -7))):
        spec, shape, params = validate_fwd(q, k, k, None, causal, window)
        _launch_fwd(q, k, k, spec, shape, params, config=mainloop_config(kind), num_splits=1,
                    max_ctas=5 if kind == "persistent" else None)
    torch.cuda.synchronize()


def _varlen_runs(num_splits, pack_gqa, grad=False, deterministic=False, d=128, invariant=False):
    """Packed and dense-with-seqused varlen calls at head dim ``d``, good and corrupt metadata; with ``grad`` each
    call's backward runs too (on the same metadata); ``invariant``: batch-invariant calls (``batch_invariant``)."""
    import torch

    import flash_attn_4_sm120 as fa

    def call(*args, **kwargs):
        if not grad:
            return fa.flash_attn_varlen_func(*args, **kwargs)
        leaves = [t.detach().requires_grad_(True) for t in args[:3]]
        out = fa.flash_attn_varlen_func(*leaves, *args[3:], deterministic=deterministic, **kwargs)[0]
        torch.autograd.grad(out, leaves, torch.ones_like(out))

    torch.manual_seed(1)
    hq, hkv = 8, 2
    lens_q, lens_k = [5, 0, 113, 1, 70], [700, 3, 250, 9, 300]
    cu_q = _i32([0, 5, 5, 118, 119, 189])
    cu_k = _i32([0, 700, 703, 953, 962, 1262])
    q = torch.randn(sum(lens_q), hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(sum(lens_k), hkv, d, dtype=torch.bfloat16, device="cuda")
    qd = torch.randn(5, 120, hq, d, dtype=torch.bfloat16, device="cuda")
    kd = torch.randn(5, 700, hkv, d, dtype=torch.bfloat16, device="cuda")
    opts = dict(num_splits=num_splits, pack_gqa=pack_gqa, causal=True, return_lse=True)
    if invariant:
        opts["batch_invariant"] = True
    if "check_metadata" in inspect.signature(fa.flash_attn_varlen_func).parameters:  # (older builds lack it)
        opts["check_metadata"] = False
    packed = [  # (label, cu_q, cu_k, seqused_q, seqused_k, max_q, max_k)
        ("good", cu_q, cu_k, None, None, 113, 700),
        ("cu_k past the rows", cu_q, _i32([0, 700, 703, 953, 962, 50_000]), None, None, 113, 700),
        ("cu_q past the rows", _i32([0, 5, 5, 118, 119, 4000]), cu_k, None, None, 113, 700),
        ("negative cu", _i32([-300, 5, 5, 118, 119, 189]), _i32([-9, 700, 703, 953, 962, 1262]), None, None, 113, 700),
        ("decreasing cu", _i32([0, 50, 5, 118, 119, 189]), _i32([0, 900, 3, 953, 962, 1262]), None, None, 113, 700),
        ("seqused past the sequence", cu_q, cu_k, _i32([5, 0, 113, 900, 70]), _i32([700, 3, 250, 100_000, 300]),
         113, 700),
        ("negative seqused", cu_q, cu_k, _i32([-5, 0, 113, 1, 70]), _i32([-1, 3, 250, 9, 300]), 113, 700),
        ("max_seqlen too small", cu_q, cu_k, None, None, 7, 20),
    ]
    for label, cq, ck, uq, uk, mq, mk in packed:
        call(q, k, k, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk, seqused_q=uq, seqused_k=uk,
             **opts)
    dense = [  # dense q and k with seqused
        ("good", _i32([120, 0, 7, 1, 50]), _i32([700, 1, 600, 9, 300])),
        ("seqused past the dense seqlen", _i32([500, 0, 7, 1, 50]), _i32([2_000_000, 1, 600, 9, 300])),
        ("negative seqused", _i32([120, -4, 7, 1, 50]), _i32([700, -1, 600, 9, 300])),
    ]
    for label, uq, uk in dense:
        call(qd, kd, kd, seqused_q=uq, seqused_k=uk, max_seqlen_q=120, max_seqlen_k=700, **opts)
    torch.cuda.synchronize()


def _bwd_runs(deterministic=False, role_split=False):
    """The backward (preprocess, main kernel, postprocess): dense GQA calls per head-dim class (full, causal, a
    window with a negative bound, softcap, a sink) and the varlen metadata cases of ``_varlen_runs``;
    ``role_split`` patches the d64 table entry to the 64x64 role-split kernel (named barriers; d96's and d128's
    entries are their 64x128 / 64x96 role splits with the S / dP B operands in registers and P / dS in V's shared
    memory)."""
    import dataclasses

    import torch

    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120 import backward, bwd_config

    if role_split:
        cfg = bwd_config.BwdConfig(64, 64, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2, role_split=True)
        bwd_config.BWD_TABLE[64] = dataclasses.replace(cfg, stages_do=2)
        backward.clear_caches()
    torch.manual_seed(2)
    for d in (64, 96, 128) if role_split else (64, 96, 128, 192, 256):
        q = torch.randn(2, 333, 6, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        k = torch.randn(2, 517, 2, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        v = torch.randn(2, 517, 2, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        sink = torch.randn(6, device="cuda", requires_grad=True)
        variants = [dict(), dict(causal=True), dict(window_size=(100, -7)), dict(learnable_sink=sink)]
        if not role_split:
            variants.append(dict(causal=True, softcap=20.0))
        for kw in variants:
            out = fa.flash_attn_func(q, k, v, deterministic=deterministic, **kw)[0]
            torch.autograd.grad(out, [q, k, v] + ([sink] if "learnable_sink" in kw else []), torch.ones_like(out))
    _varlen_runs(1, False, grad=True, deterministic=deterministic)
    torch.cuda.synchronize()


def _bwd_det_order_runs():
    """``_bwd_runs``' deterministic calls in each causal order forced (``backward._det_order``: highest first;
    lowest first, whole, and split over 2 CTAs in bands of 3 pairs)."""
    from flash_attn_4_sm120 import backward

    for order in ((False, 1, 1), (True, 1, 1), (True, 2, 3)):
        backward._det_order = lambda *a, order=order: order
        backward.bwd_launch.cache_clear()
        _bwd_runs(deterministic=True)


def _bwd_split_runs():
    """The backward's group split (partial dK / dV heads) forced on the varlen metadata cases of ``_varlen_runs``
    (8/2 heads: split 2 and 4); the dense calls of ``_bwd_runs`` already split (its 6/2 grids are small)."""
    from flash_attn_4_sm120 import backward

    for split in (2, 4):
        backward._group_split = lambda *a, split=split: split
        _varlen_runs(1, False, grad=True)
        _varlen_runs(1, False, grad=True, deterministic=True)


def _decode_run():
    """The table's decode path: packed GQA, automatic splits (split-KV + combine), sink and window."""
    import torch

    import flash_attn_4_sm120 as fa

    torch.manual_seed(2)
    q = torch.randn(4, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(4, 8192, 8, 128, dtype=torch.bfloat16, device="cuda")
    sink = torch.randn(32, device="cuda")
    for window in ((None, None), (1024, 0), (None, -100)):
        fa.flash_attn_func(q, k, k, window_size=window, learnable_sink=sink, return_lse=True)
    torch.cuda.synchronize()


def _page_tables(num_pages: int, max_pages: int) -> list:
    """(label, page table, seqused_k) for 3 sequences of up to 2000 keys: a good table, then pages past the pool,
    negative pages, seqused_k past the table row's capacity and negative seqused_k."""
    import torch

    good = torch.randperm(num_pages, device="cuda")[: 3 * max_pages].view(3, max_pages).to(torch.int32)
    past, negative = good.clone(), good.clone()
    past[0, 1], past[2, -1] = num_pages, 2**30
    negative[1, 0], negative[2, 3] = -1, -(2**30)
    used = _i32([2000, 1, 1500])
    return [("good", good, used), ("page past the pool", past, used), ("negative page", negative, used),
            ("seqused past the row", good, _i32([10**7, 1, 2001])), ("negative seqused", good, _i32([-5, 1, 7]))]


def _paged_runs(fp8: bool = False, fp8_q: bool = False, d: int = 128, invariant: bool = False):
    """Paged K/V through the page table (dense and packed q, decode with splits and prefill tiles, page sizes
    1, 16 and 48), with good and corrupt tables: pages past the pool, negative pages, seqused_k past the
    table row's capacity or negative. ``fp8``: e4m3 caches with per-(batch, KV head) scales (the staging
    stages and the widening, ``_kernels/kv_dequant``); ``fp8_q``: e4m3 q too (both GEMMs FP8 MMAs,
    ``_kernels/fwd_fp8_mma``); ``d`` 64: the decode steps run the decode tile (``_kernels/fwd_keysplit``: the warps
    split each key block and merge in shared memory); ``invariant``: batch-invariant calls (their own splits)."""
    import torch

    import flash_attn_4_sm120 as fa

    extra = dict(batch_invariant=True) if invariant else {}
    if "page_table" not in inspect.signature(fa.flash_attn_varlen_func).parameters:
        print("no paged K/V in this build: skipped")
        return
    torch.manual_seed(4)
    hq, hkv = 8, 2
    for page_size in (16, 1, 48):
        num_pages, max_pages = -(-2000 // page_size) * 3, -(-2000 // page_size)
        kc = torch.randn(num_pages, page_size, hkv, d, dtype=torch.bfloat16, device="cuda")
        scales = {}
        if fp8:
            kc = kc.to(torch.float8_e4m3fn)
            scales = dict(k_descale=torch.rand(3, hkv, device="cuda"), v_descale=torch.rand(3, hkv, device="cuda"))
        tables = _page_tables(num_pages, max_pages)
        qd = torch.randn(3, 1, hq, d, dtype=torch.bfloat16, device="cuda")
        qp = torch.randn(3, 300, hq, d, dtype=torch.bfloat16, device="cuda")
        cu_q = _i32([0, 100, 101, 400])
        q_packed = torch.randn(400, hq, d, dtype=torch.bfloat16, device="cuda")
        if fp8_q:
            qd, qp, q_packed = (t.to(torch.float8_e4m3fn) for t in (qd, qp, q_packed))
        for label, table, seqused in tables:
            for splits in (0, 1) if invariant else (0, 1, 5):
                fa.flash_attn_varlen_func(qd, kc, kc, seqused_k=seqused, page_table=table, num_splits=splits,
                                          return_lse=True, **scales, **extra)
            fa.flash_attn_varlen_func(qp, kc, kc, seqused_k=seqused, page_table=table, causal=True, **scales, **extra)
            fa.flash_attn_varlen_func(q_packed, kc, kc, cu_seqlens_q=cu_q, max_seqlen_q=300, seqused_k=seqused,
                                      page_table=table, causal=True, window_size=(256, 0), **scales, **extra)
    torch.cuda.synchronize()


def _mla_paged_runs():
    """MLA (``qv``) over paged latent / rope caches sharing one page table, decode with splits and speculative
    rows (16 and 128 heads packed), with good and corrupt tables: pages past the pool, negative pages, seqused_k
    past the table row's capacity or negative."""
    import torch

    import flash_attn_4_sm120 as fa

    torch.manual_seed(6)
    for page_size in (64, 1):
        num_pages, max_pages = -(-2000 // page_size) * 3, -(-2000 // page_size)
        kc = torch.randn(num_pages, page_size, 1, 64, dtype=torch.bfloat16, device="cuda")
        vc = torch.randn(num_pages, page_size, 1, 512, dtype=torch.bfloat16, device="cuda")
        tables = _page_tables(num_pages, max_pages)
        for hq, sq in ((16, 1), (128, 1), (16, 4)):
            q = torch.randn(3, sq, hq, 64, dtype=torch.bfloat16, device="cuda")
            qv = torch.randn(3, sq, hq, 512, dtype=torch.bfloat16, device="cuda")
            for label, table, seqused in tables:
                for splits in (0, 1, 5):
                    fa.flash_attn_varlen_func(q, kc, vc, qv=qv, seqused_k=seqused, page_table=table,
                                              num_splits=splits, causal=sq > 1, return_lse=True)
    torch.cuda.synchronize()


def _kvcache_runs(d: int = 128, dv: int = 128, mla: bool = False):
    """flash_attn_with_kvcache: append + rotary into paged (page size 16) and dense caches (cache_batch_idx,
    cache_leftpad), packed q and new k / v, with good and corrupt metadata: cache_seqlens past the cache or
    negative, page entries past the pool or negative, cache_batch_idx past the cache rows or negative,
    cache_leftpad past the sequence, cu_seqlens_k_new past the new rows, rotary positions past cos / sin.
    ``d`` / ``dv``: the key and value caches' head dims (rows past 256 take two passes of the append); ``mla``: a
    rope key cache, a latent value cache and ``qv`` (16 heads over one KV head)."""
    import torch

    import flash_attn_4_sm120 as fa

    if not hasattr(fa, "flash_attn_with_kvcache"):
        print("no flash_attn_with_kvcache in this build: skipped")
        return
    torch.manual_seed(5)
    (hq, hkv), b = ((16, 1) if mla else (8, 2)), 3

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16, device="cuda")

    cos, sin = rand(300, 32), rand(300, 32)
    q, k, v = rand(b, 2, hq, d), rand(b, 2, hkv, d), rand(b, 2, hkv, dv)
    qv = {"qv": rand(b, 2, hq, dv)} if mla else {}
    kc, vc = rand(60, 16, hkv, d), rand(60, 16, hkv, dv)
    good = torch.randperm(60, device="cuda")[:48].view(b, 16).to(torch.int32)
    bad = good.clone()
    bad[0, 0], bad[1, 3], bad[2, 15] = 60, -1, 2**30
    lens = [("good", _i32([10, 200, 254])), ("past the cache", _i32([255, 10**6, 2**31 - 2])),
            ("negative", _i32([-1, -(2**30), 3]))]
    for label, cache_seqlens in lens:
        for table in (good, bad):
            fa.flash_attn_with_kvcache(q, kc, vc, k, v, cos, sin, cache_seqlens=cache_seqlens, block_table=table,
                                       causal=True, **qv)
            fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=cache_seqlens, page_table=table, num_splits=3, **qv)
        dense_k, dense_v = rand(b + 1, 256, hkv, d), rand(b + 1, 256, hkv, dv)
        for idx, pad in ((_i32([3, 0, 1]), _i32([0, 5, 7])), (_i32([4, -1, 2**30]), _i32([300, -3, 2**30]))):
            fa.flash_attn_with_kvcache(q, dense_k, dense_v, k, v, cos, sin, cache_seqlens=cache_seqlens,
                                       cache_batch_idx=idx, cache_leftpad=pad, causal=True, rotary_interleaved=False,
                                       **qv)
        cu = _i32([0, 2, 3, 6])
        qp, kp, vp = rand(6, hq, d), rand(6, hkv, d), rand(6, hkv, dv)
        qvp = {"qv": rand(6, hq, dv)} if mla else {}
        for cu_new in (cu, _i32([0, 5, 2, 10**6])):
            fa.flash_attn_with_kvcache(qp, kc, vc, kp, vp, cos, sin, cache_seqlens=cache_seqlens, page_table=good,
                                       cu_seqlens_q=cu, max_seqlen_q=3, cu_seqlens_k_new=cu_new, causal=True,
                                       rotary_seqlens=_i32([0, 10**6, -4]), **qvp)
    torch.cuda.synchronize()


def _combine_run():
    """The public combine (when this build has it), dense and varlen with corrupt cu_seqlens / seqused."""
    import torch

    import flash_attn_4_sm120 as fa

    if not hasattr(fa, "flash_attn_combine"):
        print("no flash_attn_combine in this build: skipped")
        return
    torch.manual_seed(3)
    o = torch.randn(3, 2, 77, 4, 128, device="cuda")
    lse = torch.randn(3, 2, 77, 4, device="cuda")
    fa.flash_attn_combine(o, lse, out_dtype=torch.bfloat16)
    ov, lv = torch.randn(3, 150, 4, 128, device="cuda"), torch.randn(3, 150, 4, device="cuda")
    for cu, used in ((_i32([0, 50, 150]), None), (_i32([0, 50, 9000]), None), (_i32([-7, 50, 150]), _i32([900, -2]))):
        fa.flash_attn_combine(ov, lv, out_dtype=torch.bfloat16, cu_seqlens=cu, seqused=used)
    torch.cuda.synchronize()


def _flex_runs():
    """score_mod / mask_mod, forward and backward: every gate example on dense GQA inputs (d128;
    two at d64), decode-length queries (packed GQA), and a varlen batch through the mods path with the good and
    corrupt metadata of ``_varlen_runs`` (the mods read ``seqlen_info``, so corrupt lengths reach them); mods
    that read aux tensors, dense and varlen."""
    import torch

    from flash_attn_4_sm120 import flex_examples, interface

    if not hasattr(interface, "_flex_call"):
        print("no score_mod / mask_mod in this build: skipped")
        return
    opts = dict(softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0,
                num_splits=None, pack_gqa=None, deterministic=False, return_lse=True)

    def call(q, k, v, ex, varlen=None, extra=None):
        mods = dict(score_mod=ex.score_mod, mask_mod=ex.mask_mod, score_mod_bwd=ex.score_mod_bwd, **(extra or {}))
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = interface._flex_call(*leaves, varlen, mods, **opts)[0]
        torch.autograd.grad(out, leaves, torch.ones_like(out))

    torch.manual_seed(6)
    examples = flex_examples.gate_examples()
    dense = [(128, 333, 517, ex) for ex in examples] + [(64, 333, 517, ex) for ex in examples[:2]]
    for d, sq, sk, ex in dense + [(128, 3, 1000, examples[-1])]:  # the last: decode-length queries, packed GQA
        q = torch.randn(2, sq, 8, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(2, sk, 2, d, dtype=torch.bfloat16, device="cuda")
        call(q, k, k, ex)
    lens_q, lens_k = [5, 0, 113, 1, 70], [700, 3, 250, 9, 300]
    q = torch.randn(sum(lens_q), 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(sum(lens_k), 2, 128, dtype=torch.bfloat16, device="cuda")
    cu_q, cu_k = _i32([0, 5, 5, 118, 119, 189]), _i32([0, 700, 703, 953, 962, 1262])

    def metadata_varlen(entry):
        cq, ck, uq, uk, mq, mk = entry
        return dict(cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk, seqused_q=uq, seqused_k=uk,
                    page_table=None, check_metadata=False)

    metadata = [  # (cu_q, cu_k, seqused_q, seqused_k, max_q, max_k)
        (cu_q, cu_k, None, None, 113, 700),
        (cu_q, _i32([0, 700, 703, 953, 962, 50_000]), None, None, 113, 700),
        (_i32([-300, 5, 5, 118, 119, 189]), _i32([-9, 700, 703, 953, 962, 1262]), None, None, 113, 700),
        (_i32([0, 50, 5, 118, 119, 189]), _i32([0, 900, 3, 953, 962, 1262]), None, None, 113, 700),
        (cu_q, cu_k, _i32([5, 0, 113, 900, 70]), _i32([700, 3, 250, 100_000, 300]), 113, 700),
        (cu_q, cu_k, _i32([-5, 0, 113, 1, 70]), _i32([-1, 3, 250, 9, 300]), 113, 700),
        (cu_q, cu_k, None, None, 7, 20),
    ]
    for ex in (flex_examples.combined(flex_examples.alibi(8), flex_examples.causal()),
               flex_examples.chunked_local(128)):
        for entry in metadata:
            call(q, k, k, ex, metadata_varlen(entry))
    # mods that read aux tensors (indices held to each sequence), with good metadata: a corrupt length makes a
    # mod index its own tensor out of bounds, which only the caller's metadata can rule out
    aux_examples = (flex_examples.alibi_slopes(torch.rand(8, device="cuda")),
                    flex_examples.relative_bias(torch.randn(8, 65, device="cuda")),
                    flex_examples.documents(torch.arange(700, device="cuda", dtype=torch.int32) // 50))
    for ex in aux_examples:
        opts_aux = dict(aux_tensors=list(ex.aux_tensors))
        call(torch.randn(2, 333, 8, 128, dtype=torch.bfloat16, device="cuda"),
             torch.randn(2, 517, 2, 128, dtype=torch.bfloat16, device="cuda"),
             torch.randn(2, 517, 2, 128, dtype=torch.bfloat16, device="cuda"), ex, None, opts_aux)
        call(q, k, k, ex, metadata_varlen(metadata[0]), opts_aux)
    torch.cuda.synchronize()


def _sparse_runs():
    """Block sparsity: lists from a mask_mod at odd lengths (the partial last key block in a full
    list), with the causal flag, at d64 / d128 / d256 one-stage and two-stage tiles; then corrupt lists (counts
    past the lists' width or negative, indices past the key blocks or negative), which the kernel must clamp:
    out-of-bounds reads of K / V would show here; and the backward of good and corrupt lists."""
    import torch

    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120 import block_sparse as bs
    from flash_attn_4_sm120 import flex_examples as fx

    ex = fx.chunked_local(256)
    for d, sq, sk in ((128, 333, 517), (64, 700, 300), (256, 300, 701)):
        q = torch.randn(2, sq, 4, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(2, sk, 2, d, dtype=torch.bfloat16, device="cuda")
        fwd, _ = bs.block_sparse_from_example(ex, 1, 1, sq, sk, (128, 128), "cuda")
        fa.flash_attn_func(q, k, k, mask_mod=ex.mask_mod, block_sparse_tensors=fwd)
        fa.flash_attn_func(q, k, k, causal=True, block_sparse_tensors=fwd)
        bad = fwd._replace(mask_block_cnt=fwd.mask_block_cnt.clone().fill_(1 << 20),
                           mask_block_idx=fwd.mask_block_idx.clone().fill_(-(1 << 30)),
                           full_block_cnt=fwd.full_block_cnt.clone().fill_(-3),
                           full_block_idx=fwd.full_block_idx.clone().fill_(1 << 30))
        fa.flash_attn_func(q, k, k, block_sparse_tensors=bad)
        bad = bad._replace(mask_block_idx=fwd.mask_block_idx.clone().fill_(1 << 30),
                           full_block_cnt=fwd.full_block_cnt.clone().fill_(1 << 20))
        fa.flash_attn_func(q, k, k, mask_mod=ex.mask_mod, block_sparse_tensors=bad)
        # the backward: its lists derived from good and from corrupt forward lists (clamped on the host side too),
        # with the mask_mod and with the causal flag alone (d128: both on the role-split kernel, the mask_mod in its
        # S warp group)
        for lists in (fwd, bad):
            for mods in (dict(mask_mod=ex.mask_mod), dict(causal=True)):
                qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
                out, _ = fa.flash_attn_func(qg, kg, kg, block_sparse_tensors=lists, **mods)
                torch.autograd.grad(out, (qg, kg), torch.ones_like(out))
    # the backward lists refined by a mask_mod that reads an aux tensor (``_kernels/sparse_refine``), odd lengths
    docs = fx.documents((torch.arange(517, device="cuda") // 150).to(torch.int32))
    fwd, _ = bs.block_sparse_from_example(docs, 1, 1, 517, 517, (128, 128), "cuda")
    qg = torch.randn(2, 517, 4, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(2, 517, 2, 128, dtype=torch.bfloat16, device="cuda")
    out, _ = fa.flash_attn_func(qg, k, k, mask_mod=docs.mask_mod, aux_tensors=list(docs.aux_tensors),
                                block_sparse_tensors=fwd)
    torch.autograd.grad(out, (qg,), torch.ones_like(out))
    torch.cuda.synchronize()


def _dropout_runs():
    """Dropout: forward and backward at odd lengths on the d64 / d96 / d128 / d256 tiles (one-stage,
    ping-pong, two-stage, the role splits), causal and not, varlen with an empty sequence, and the deterministic
    backward."""
    import torch

    import flash_attn_4_sm120 as fa

    for d, sq, sk, causal in ((128, 333, 517, True), (64, 700, 300, False), (256, 300, 701, True),
                              (128, 1000, 1000, False), (96, 517, 333, True)):
        q = torch.randn(2, sq, 4, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        k = torch.randn(2, sk, 2, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        out, _ = fa.flash_attn_func(q, k, k, causal=causal, dropout_p=0.2, dropout_seed=7,
                                    deterministic=d == 128 and causal)
        torch.autograd.grad(out, (q, k), torch.ones_like(out))
    cu = torch.tensor([0, 100, 100, 357], dtype=torch.int32, device="cuda")
    q = torch.randn(357, 4, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    out, _ = fa.flash_attn_varlen_func(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=257, max_seqlen_k=257,
                                       causal=True, dropout_p=0.3)
    torch.autograd.grad(out, (q,), torch.ones_like(out))
    torch.cuda.synchronize()


def _invariant_chunk_runs():
    """Batch-invariant calls in fixed chunks of keys (``config.invariant_chunks``) with chunks of 256 keys so that
    these lengths take several: the varlen metadata cases (good and corrupt), paged K/V with corrupt tables, and
    dense calls with a window (narrow: uncut; wide: chunked) and a learnable sink (merged in the combine)."""
    import os

    import torch

    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120 import invariance

    os.environ[invariance.CHUNK_KEYS_ENV] = "256"
    invariance.chunk_keys.cache_clear()
    _varlen_runs(1, False, invariant=True)
    _varlen_runs(1, True, invariant=True, d=64)
    _paged_runs(invariant=True)
    torch.manual_seed(5)
    q = torch.randn(2, 333, 6, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 1517, 2, 128, dtype=torch.bfloat16, device="cuda")
    sink = torch.randn(6, device="cuda")
    for window in ((100, 0), (600, 0), (None, None)):
        for s in (None, sink):
            fa.flash_attn_func(q, k, k, causal=True, window_size=window, learnable_sink=s, batch_invariant=True)
    torch.cuda.synchronize()


FAMILIES = {
    **{kind: (lambda kind=kind: _dense_config_run(kind))
       for kind in ("cp_async", "single_stage", "single_stage_w8", "tma", "tma_mbarrier", "tma_ws", "overlap", "pingpong", "persistent")},
    "varlen": lambda: _varlen_runs(1, False),
    "varlen_packgqa": lambda: _varlen_runs(1, True),
    "varlen_splitkv": lambda: _varlen_runs(4, True),
    "decode": _decode_run,
    "paged": _paged_runs,
    "paged_fp8": lambda: _paged_runs(fp8=True),
    "paged_fp8_mma": lambda: _paged_runs(fp8=True, fp8_q=True),
    "paged_decode_tile": lambda: _paged_runs(d=64),
    "paged_fp8_decode_tile": lambda: [_paged_runs(fp8=True, d=d) for d in (64, 96, 128)],
    "kvcache": _kvcache_runs,
    "combine": _combine_run,
    # head dims past 256 (the dv_warps tiles: P and row statistics exchanged in shared memory) and MLA
    "wide_varlen": lambda: [_varlen_runs(splits, pack, d=512) for splits, pack in ((1, False), (4, True))],
    "mla_paged": _mla_paged_runs,
    "kvcache_wide": lambda: _kvcache_runs(512, 512),
    "kvcache_mla": lambda: _kvcache_runs(64, 512, mla=True),
    "bwd": _bwd_runs,
    "bwd_det": lambda: _bwd_runs(deterministic=True),
    "bwd_rolesplit": lambda: _bwd_runs(deterministic=True, role_split=True),
    "bwd_det_orders": _bwd_det_order_runs,
    "bwd_split": _bwd_split_runs,
    # varlen backward on the role splits of d64, d96 and d128 (d96 / d128: their kv_in_regs entries)
    "bwd_varlen_classes": lambda: [_varlen_runs(1, False, grad=True, d=d) for d in (64, 96, 128, 144)],
    "flex": _flex_runs,
    "sparse": _sparse_runs,
    "dropout": _dropout_runs,
    "invariant_chunks": _invariant_chunk_runs,
}


def _run_family(name: str, torch_ext: Path) -> None:
    sys.path.insert(0, str(torch_ext))
    FAMILIES[name]()
    print(f"family {name}: done")


def _sanitizer() -> str:
    import shutil

    found = shutil.which(os.environ.get("COMPUTE_SANITIZER", "compute-sanitizer"))
    found = found or next((p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None)
    if not found:
        raise SystemExit("compute-sanitizer not found (set COMPUTE_SANITIZER)")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", metavar="FAMILY", help="run one family's workload in this process (the child)")
    ap.add_argument("--families", nargs="*", default=list(FAMILIES))
    ap.add_argument("--tools", nargs="*", default=["memcheck", "racecheck", "synccheck"])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--log-dir", type=Path, help="keep each sanitizer run's output here")
    ap.add_argument("--jobs", type=int, default=6, help="processes at a time (compiles, sanitizer runs)")
    ap.add_argument("--torch-ext", type=Path, default=ROOT / "torch-ext",
                    help="the package source to test (e.g. an older checkout's, to see the check fail there)")
    args = ap.parse_args()
    if args.run:
        _run_family(args.run, args.torch_ext)
        return 0

    import torch
    from concurrent.futures import ThreadPoolExecutor

    me = [sys.executable, str(Path(__file__).resolve()), "--torch-ext", str(args.torch_ext.resolve())]
    cache_root = Path(os.environ.get("FA4_SM120_CACHE_DIR", "/tmp/fa4sm120-sanitize-cache"))

    def env_for(fam):  # one compile cache per family: parallel processes never write one entry
        return dict(os.environ, PYTHONUNBUFFERED="1", FA4_SM120_CACHE_DIR=str(cache_root / fam))

    def warm(fam):
        t0 = time.time()
        res = subprocess.run(me + ["--run", fam], env=env_for(fam), capture_output=True, text=True)
        print(f"warm {fam}: rc {res.returncode}, {time.time() - t0:.0f} s", flush=True)
        if res.returncode:
            print(res.stdout[-3000:], res.stderr[-3000:], flush=True)
        return res.returncode

    # Compile without a sanitizer first (in parallel): the sanitized children only load kernels.
    with ThreadPoolExecutor(args.jobs) as pool:
        failed = [fam for fam, rc in zip(args.families, pool.map(warm, args.families)) if rc]
    if failed:
        raise SystemExit(f"families fail without a sanitizer: {failed}")
    tool_bin = _sanitizer()

    def sanitize(job):
        tool, fam = job
        t0 = time.time()
        cmd = [tool_bin, "--tool", tool, "--error-exitcode", "0", "--print-limit", "20"]
        if tool == "racecheck":
            cmd += ["--racecheck-report", "all"]
        res = subprocess.run(cmd + me + ["--run", fam], env=env_for(fam), capture_output=True, text=True)
        text = res.stdout + res.stderr
        # memcheck / synccheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H hazards
        # displayed (N errors, W warnings)"
        m = re.search(r"ERROR SUMMARY: (\d+) error", text) or re.search(r"RACECHECK SUMMARY: .*\((\d+) error", text)
        hazards = re.search(r"RACECHECK SUMMARY: (\d+) hazard", text)
        entry = {"tool": tool, "family": fam, "errors": int(m.group(1)) if m else None,
                 "racecheck_hazards": int(hazards.group(1)) if hazards else None,
                 "workload_done": f"family {fam}: done" in text, "rc": res.returncode,
                 "seconds": round(time.time() - t0, 1)}
        print(json.dumps(entry), flush=True)
        if args.log_dir:
            args.log_dir.mkdir(parents=True, exist_ok=True)
            (args.log_dir / f"{tool}_{fam}.log").write_text(text[-200_000:])
        if entry["errors"] != 0 or not entry["workload_done"]:
            print(text[-4000:], flush=True)
        return entry

    jobs = [(tool, fam) for tool in args.tools for fam in args.families if tool == "memcheck" or fam in SYNC_FAMILIES]
    with ThreadPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(sanitize, jobs))
    clean = all(r["errors"] == 0 and r["workload_done"] for r in runs)
    report = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
              "sanitizer": subprocess.run([tool_bin, "--version"], capture_output=True, text=True).stdout.strip()
              .splitlines()[-1:], "clean": clean, "runs": runs}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'CLEAN' if clean else 'ERRORS'}: {sum(1 for r in runs if r['errors'] == 0)}/{len(runs)} runs with 0 errors")
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
