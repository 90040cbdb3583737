"""Documents forward against FlexAttention by document length (issue 20's last target: documents of 512, causal
inside, >= 1.5x FlexAttention forward; session 32 measured 0.98x).

Per document length L (4x4096 32/8 d128 bf16, documents of L tokens, causal inside) the forward alone, at SM120
occupancy, of:
* ours as bench_flex calls it (the dispatch: block-sparse lists (128, 128) from the documents mask, its
  mask_mod; at L = 512 only, since that mask_mod compiles per length);
* ours on each block-sparse tile the validity predicate admits, forced (``interface._launch_fwd(config=...)``):
  128x64 ping-pong TMA (the dispatch's), 64x64 one-stage and two-stage cp.async, 128x64 8-warp cp.async;
  these run the lists with the causal mask_mod (inside a list's diagonal block the documents mask is the causal
  one when L is a multiple of 128), so one kernel per tile serves every L;
* ours on the same batch as varlen (``cu_seqlens`` every L tokens, ``causal=True``: the dense equivalent);
* FlexAttention (compiled) with torch's sm_120 tiles (bench_flex.SM120_FLEX_OPTIONS), its block mask from the
  same documents mask.
The walk's step count per L is recorded with each row, so ``t = tiles x c0 + steps x c1`` can be fitted per
implementation (c0: a tile's fixed cost, c1: a key block's).

    python benchmarks/explore/docs_tiles.py --out docs.json [--doc-lens 256 512 1024 2048] [--flex-lens 256 512 2048]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from bench_fwd import fa, time_parts  # noqa: E402  (torch-ext on the path)
from bench_flex import SM120_FLEX_OPTIONS, flex_call  # noqa: E402
from flash_attn_4_sm120 import block_sparse, config, interface  # noqa: E402
from flash_attn_4_sm120 import flex_examples as fx  # noqa: E402
from flash_attn_4_sm120.problem import validate_fwd  # noqa: E402

B, S, HQ, HKV, D = 4, 4096, 32, 8, 128
TILES = {"pp_128x64": "d128_full_m128", "m64_1stage": "d128_full_m64", "m64_2stage": "d128_full_cp_async",
         "m128_w8_cpasync": "d128_paged"}


def steps(doc_len: int, tile_m: int, tile_n: int) -> tuple[int, int]:
    """(tiles, key-block steps) of one forward over the whole batch: every (128-row) query block j of a document
    lists its document's key blocks 0..j (128 keys each), walked by each of its 128 / tile_m M tiles."""
    per_doc = sum(j + 1 for j in range(doc_len // 128)) * (128 // tile_n) * (128 // tile_m)
    tiles_ = B * HQ * S // tile_m
    return tiles_, B * HQ * (S // doc_len) * per_doc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--doc-lens", nargs="*", type=int, default=[256, 512, 1024, 2048])
    ap.add_argument("--flex-lens", nargs="*", type=int, default=[256, 512, 2048])
    args = ap.parse_args()
    model = interface.dispatch_model(torch.device("cuda"))
    torch.manual_seed(0)
    q = torch.randn(B, S, HQ, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(B, S, HKV, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(B, S, HKV, D, dtype=torch.bfloat16, device="cuda")
    parts = {"fwd": (lambda fn: lambda: fn(q, k, v), 1.0)}
    table = config.fwd_table()
    causal = fx.causal()
    rows = []
    for doc_len in args.doc_lens:
        docs = fx.chunked_local(doc_len)
        fwd_lists, _ = block_sparse.block_sparse_from_example(docs, 1, HQ, S, S, (128, 128), "cuda")
        impls = {}
        if doc_len == 512:  # bench_flex's call (its mask_mod compiles per length: timed at bench_flex's only)
            impls["ours"] = lambda q, k, v, L=fwd_lists, m=docs.mask_mod: fa.flash_attn_func(
                q, k, v, mask_mod=m, block_sparse_tensors=L)[0]
        mods = dict(score_mod=None, mask_mod=causal.mask_mod, score_mod_bwd=None, aux_tensors=None, aux_scalars=None)
        spec, shape, params = validate_fwd(q, k, v, None, False, (None, None), 0.0, None)
        spec, params = interface._with_mods(spec, params, mods, False, q.device)
        spec, params = interface._with_block_sparse(spec, shape, params, fwd_lists, False, 1, None, q.device)
        info = {"selected": str(config.choose_fwd_config(spec, model, S, S, S))}
        for name, key in TILES.items():
            cfg = table[key]
            info[name] = {"config": key, "steps": steps(doc_len, cfg.tile_m, cfg.tile_n)}
            if config.fwd_config_problems(spec, cfg, model):
                info[name]["invalid"] = True
                continue
            impls[f"ours_{name}"] = (lambda q, k, v, cfg=cfg, spec=spec, shape=shape, params=params:
                                     interface._launch_fwd(q, k, v, spec, shape, params, config=cfg, num_splits=1))
        cu = torch.arange(0, B * S + 1, doc_len, dtype=torch.int32, device="cuda")
        impls["ours_varlen"] = lambda q, k, v, cu=cu, L=doc_len: fa.flash_attn_varlen_func(
            *(t.reshape(B * S, *t.shape[2:]) for t in (q, k, v)), cu, cu, L, L, causal=True)[0]
        if doc_len in args.flex_lens:
            impls["flex_attention_sm120"] = flex_call(docs, S, SM120_FLEX_OPTIONS)
        row = {"doc_len": doc_len, "shape": [B, S, HQ, HKV, D], **info}
        with torch.no_grad():
            time_parts(row, impls, parts, ("sm120",), model, 4 * B * HQ * S * doc_len * D / 2,
                       ("flex_attention_sm120",))
        cells = " ".join(f"{i}={r['fwd']['ms']:.3f}" if "ms" in r.get("fwd", {}) else f"{i}=-"
                         for i, r in row["results"].items())
        print(f"documents of {doc_len}: fwd ms {cells}", flush=True)
        rows.append(row)
        json.dump({"device": torch.cuda.get_device_name(), "occupancy": "sm120", "rows": rows},
                  open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
