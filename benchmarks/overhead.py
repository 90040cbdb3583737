"""Per-call host overhead of the forward, by layer (a script, not a test): host microseconds per call
of back-to-back launches at a decode shape (GPU work ~50-100 us, queued, never waited on inside
the loop), unsplit and split-KV, with and without the remembered launch plan, the paged varlen and
KV-cache entries (with append and rotary), beside torch SDPA's (alone, and with the cache append and rotary an
SDPA user runs in torch for the same step); a training forward + backward at a small causal GQA shape, ours and
SDPA's (ours also on transposed q / k / v, a transformers layer's layout); the median of 7 rounds that take the rows in turn; and cProfiles of the split, KV-cache and training
paths.

    python benchmarks/overhead.py [--out overhead.json]
"""

import argparse
import cProfile
import datetime
import dataclasses
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
import flash_attn_4_sm120 as fa  # noqa: E402
from flash_attn_4_sm120 import launch  # noqa: E402
from flash_attn_4_sm120.compiler import aux_args, sparse_args, get_combine_kernel, get_fwd_kernel  # noqa: E402
from flash_attn_4_sm120.config import select_fwd_config  # noqa: E402
from flash_attn_4_sm120.problem import CombineSpec, validate_fwd  # noqa: E402


def host_us(fn, n=100):
    """Host microseconds per call over ``n`` back-to-back calls (one sample)."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - t
    torch.cuda.synchronize()
    return elapsed / n * 1e6


def median_host_us(rows: dict, rounds: int = 7) -> dict:
    """Median over ``rounds`` samples per row, the rows taken in turn each round, so that a slow phase of the
    host (frequency, another tenant) lands on every row rather than on the rows measured during it."""
    samples = {name: [] for name in rows}
    for _ in range(rounds):
        for name, fn in rows.items():
            samples[name].append(host_us(fn))
    return {name: sorted(v)[len(v) // 2] for name, v in samples.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out")
    args = p.parse_args()
    b, sk, hq, hkv, d, splits = 4, 2048, 32, 8, 128, 4
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    o = torch.empty_like(q)
    lse = torch.empty(b, hq, 1, dtype=torch.float32, device="cuda")
    spec, shape, prm = validate_fwd(q, k, k, None, False)
    spec = launch.with_packing(spec, shape, None)
    model = fa.dispatch_model(q.device)
    cfg = select_fwd_config(spec, model)
    kern = get_fwd_kernel(spec, cfg, model, model.compile_target)
    split_kern = get_fwd_kernel(dataclasses.replace(spec, split_kv=True), cfg, model, model.compile_target)
    comb = get_combine_kernel(CombineSpec.of(spec, False), model, model.compile_target)
    o_part = torch.empty((splits, *o.shape), dtype=torch.float32, device="cuda")
    lse_part = torch.empty((splits, *lse.shape), dtype=torch.float32, device="cuda")
    scalars = (prm.scale_log2, prm.softcap_scale, prm.window_left, prm.window_right)
    rows = {
        "kernel call (tvm-ffi), unsplit": lambda: kern(q, k, k, o, lse, *scalars, None, None, None, None, None, None, 1, 1, 0, 1,
                                                       *aux_args(), *sparse_args(), None, None, None),
        "kernel call, split": lambda: split_kern(q, k, k, o_part, lse_part, *scalars, None, None, None, None, None, None,
                                                 1, splits, 0, 1, *aux_args(), *sparse_args(), None, None, None),
        "combine call": lambda: comb(o_part, lse_part, o, lse, None, None, None, 1),
        "validate_fwd": lambda: validate_fwd(q, k, k, None, False),
        "torch.empty x2": lambda: (torch.empty_like(o), torch.empty_like(lse)),
        "flash_attn_fwd(out=, lse=), unsplit": lambda: fa.flash_attn_fwd(q, k, k, out=o, lse=lse, num_splits=1),
        "flash_attn_fwd(out=, lse=), split": lambda: fa.flash_attn_fwd(q, k, k, out=o, lse=lse, num_splits=splits),
        "flash_attn_func, unsplit": lambda: fa.flash_attn_func(q, k, k, num_splits=1),
        "flash_attn_func, split": lambda: fa.flash_attn_func(q, k, k, num_splits=splits),
        # the same calls without their remembered launch plan (launch._PLANS): validation and dispatch again
        "flash_attn_func, unsplit, no plan": lambda: (launch._PLANS.clear(), fa.flash_attn_func(q, k, k, num_splits=1)),
        "flash_attn_func, split, no plan": lambda: (launch._PLANS.clear(), fa.flash_attn_func(q, k, k, num_splits=splits)),
    }
    # the KV-cache entry at the same decode shape over a paged cache (page size 16), and the paged varlen call
    page = 16
    kc = torch.randn(b * sk // page + 8, page, hkv, d, dtype=torch.bfloat16, device="cuda")
    table = torch.randperm(kc.shape[0], device="cuda")[: b * sk // page].view(b, -1).to(torch.int32)
    lens = torch.full((b,), sk - 8, dtype=torch.int32, device="cuda")
    k_new = torch.randn(b, 1, hkv, d, dtype=torch.bfloat16, device="cuda")
    cos, sin = (torch.randn(sk + 8, d // 2, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    rows.update({
        "flash_attn_varlen_func, paged": lambda: fa.flash_attn_varlen_func(q, kc, kc, seqused_k=lens, page_table=table),
        "flash_attn_with_kvcache, paged": lambda: fa.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens,
                                                                             block_table=table, causal=True),
        "flash_attn_with_kvcache, paged + append": lambda: fa.flash_attn_with_kvcache(
            q, kc, kc, k_new, k_new, cache_seqlens=lens, block_table=table, causal=True),
        "flash_attn_with_kvcache, paged + append + rotary": lambda: fa.flash_attn_with_kvcache(
            q, kc, kc, k_new, k_new, cos, sin, cache_seqlens=lens, block_table=table, causal=True),
    })
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, kt, enable_gqa=True)

    rows["torch SDPA flash"] = sdpa
    # What an SDPA user pays for the same KV-cache step: the step's k / v written into a dense cache with
    # index_copy_ (a static cache's update, graph-safe), then SDPA; with rotary, q and the new k rotated in
    # torch (GPT-NeoX halves, cos / sin gathered at the position) before the write.
    kd, vd = k.clone(), k.clone()
    pos = torch.full((1,), sk - 8, dtype=torch.long, device="cuda")

    def rope(x, c, s):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def sdpa_append(rotary=False):
        qs, ks = q, k_new
        if rotary:
            c, s = cos.index_select(0, pos).view(1, 1, 1, -1), sin.index_select(0, pos).view(1, 1, 1, -1)
            qs, ks = rope(q, c, s), rope(k_new, c, s)
        kd.index_copy_(1, pos, ks)
        vd.index_copy_(1, pos, k_new)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qs.transpose(1, 2), kd.transpose(1, 2), vd.transpose(1, 2),
                                                  enable_gqa=True)

    rows["torch SDPA flash + cache append"] = sdpa_append
    rows["torch SDPA flash + cache append + rotary"] = lambda: sdpa_append(rotary=True)
    # Training: forward + backward through autograd at a small causal GQA shape (GPU work well under the host
    # time), ours (eager, and the backward alone through the low-level entry) beside SDPA flash.
    qg = torch.randn(2, 128, 8, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    kg, vg = (torch.randn(2, 128, 2, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(2))
    dog = torch.randn_like(qg)
    og, lseg = fa.flash_attn_func(qg, kg, vg, causal=True, return_lse=True)
    og, lseg = og.detach(), lseg.detach()
    grads = tuple(torch.empty_like(t) for t in (qg, kg, vg))

    def ours_train():
        out = fa.flash_attn_func(qg, kg, vg, causal=True)[0]
        return torch.autograd.grad(out, (qg, kg, vg), dog)

    def sdpa_train():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                 is_causal=True, enable_gqa=True)
        return torch.autograd.grad(out, (qg, kg, vg), dog.transpose(1, 2))

    rows["train: flash_attn_func fwd + bwd (autograd)"] = ours_train
    rows["train: flash_attn_func fwd alone (inputs require grad)"] = lambda: fa.flash_attn_func(qg, kg, vg, causal=True)
    # the layout a transformers attention layer passes: (batch, heads, seqlen, d) storage seen as (b, s, h, d)
    qs, ks, vs = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (qg, kg, vg))

    def ours_train_strided():
        out = fa.flash_attn_func(qs, ks, vs, causal=True)[0]
        return torch.autograd.grad(out, (qs, ks, vs), dog)

    rows["train: flash_attn_func fwd + bwd, transposed q/k/v"] = ours_train_strided
    rows["train: flash_attn_bwd (low level, into dq/dk/dv)"] = lambda: fa.flash_attn_bwd(
        dog, qg, kg, vg, og, lseg, causal=True, dq=grads[0], dk=grads[1], dv=grads[2])
    rows["train: torch SDPA flash fwd + bwd (autograd)"] = sdpa_train

    def sdpa_fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                  is_causal=True, enable_gqa=True)

    rows["train: torch SDPA flash fwd alone (inputs require grad)"] = sdpa_fwd
    result = median_host_us(rows)
    for name, us in result.items():
        print(f"{name:50s} {us:8.1f} us/call  ({us / result['torch SDPA flash']:.2f}x SDPA)", flush=True)
    text = io.StringIO()
    for label in ("flash_attn_func, split", "flash_attn_with_kvcache, paged + append + rotary",
                  "train: flash_attn_func fwd + bwd (autograd)"):
        fn = rows[label]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            fn()
        pr.disable()
        torch.cuda.synchronize()
        text.write(f"== {label}\n")
        pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(18)
    print(text.getvalue())
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "date": datetime.date.today().isoformat(), "host_us": result,
                                              "profile": text.getvalue()}, indent=1))


if __name__ == "__main__":
    main()
