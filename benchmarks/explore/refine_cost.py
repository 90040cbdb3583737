"""Device time of the block-sparse backward's refinement (``_kernels/sparse_refine`` through
``block_sparse.backward_lists``, uncached), a script, not a test: bench_flex's shape (4 x 4096, 32 / 8 heads, d128's
64 x 64 backward tiles) with (128, 128) lists of documents of 512 (structured: the diagonal blocks' tiles split
into empty, full and partial) and of a random 25% block map listed as partial blocks under a mask_mod that reads
the head (every listed tile evaluated per query head; none becomes empty or full), against the lists' derivation
without the refinement.

    python benchmarks/explore/refine_cost.py [--out results.json]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))
from flash_attn_4_sm120 import backward, block_sparse as bs, flex_examples as fx  # noqa: E402
from timing import median_ms  # noqa: E402

B, S, HQ, HKV = 4, 4096, 32, 8


def head_parity_mask():
    """A mask_mod that reads its head: even heads causal, odd heads everything (a stand-in for any per-head mask)."""

    def mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return (kv_idx <= q_idx) | ((h % 2) == 1)

    return fx.Example("head-parity", mask_mod=mask_mod)


def random_partial_lists(density=0.25, block=128):
    n = S // block
    g = torch.Generator().manual_seed(0)
    keep = (torch.rand(1, HQ, n, n, generator=g) < density).cuda()
    cls = torch.where(keep, bs.PARTIAL, bs.EMPTY).to(torch.int8)
    return bs.block_sparse_from_classes(cls, (block, block))[0]


def refine_of(ex):
    """The call's refinement as the backward builds it (``backward._tile_refine``)."""
    from types import SimpleNamespace

    from flash_attn_4_sm120 import flex, interface
    from flash_attn_4_sm120.problem import BwdSpec, FwdShape

    mods = flex.register(flex.ModKey.of(mask_mod=ex.mask_mod, aux_tensors=ex.aux_tensors), mask_mod=ex.mask_mod)
    bspec = BwdSpec("bf16", 128, 128, causal=False, mods=mods, block_sparse=(128, 128))
    shape = FwdShape(batch=B, seqlen_q=S, seqlen_k=S, num_heads=HQ, num_heads_kv=HKV)
    model, target = interface._model_and_target(torch.cuda.current_device(), None, None)
    return backward._tile_refine(bspec, SimpleNamespace(tile_m=64, tile_n=64), shape, tuple(ex.aux_tensors), model,
                                 target)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    docs = fx.chunked_local(512)
    cases = [("documents of 512", bs.block_sparse_from_example(docs, 1, HQ, S, S, (128, 128), "cuda")[0], docs),
             ("random 25% partial, per-head mask", random_partial_lists(), head_parity_mask())]
    rows = []
    for name, fwd, ex in cases:
        refine = refine_of(ex)
        args_ = ((128, 128), HQ, HKV, S, S, 64, 64)
        plain = median_ms(lambda: bs.backward_lists(fwd, *args_))
        refined = median_ms(lambda: bs.backward_lists(fwd, *args_, refine=refine))
        partial = int(bs.backward_lists(fwd, *args_)[0].sum())
        after = int(bs.backward_lists(fwd, *args_, refine=refine)[0].sum())
        rows.append(dict(case=name, lists_ms=plain, refined_lists_ms=refined, partial_steps=partial,
                         partial_steps_after=after))
        print(f"{name:36s} lists {plain:.3f} ms, refined {refined:.3f} ms; partial steps {partial} -> {after}",
              flush=True)
    if args.out:
        json.dump(dict(device=torch.cuda.get_device_name(), shape=[B, S, HQ, HKV], rows=rows), open(args.out, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
