"""Score / mask mods benchmark: ours with score_mod / mask_mod against the same attention without
mods (the flags' kernels) and against torch FlexAttention (compiled), forward and forward + backward, in one
run (a script, not a test).

Cases (bf16, GQA): causal as a mask_mod against ``causal=True`` (the target: "within 10%"), alone (every key
block visited) and with block-sparse lists built from the same mask (``block_sparse.block_sparse_from_example``,
(128, 128) blocks, outside the timing); ALiBi as a score_mod with the causal flag; documents of fixed length,
causal inside (``flex_examples.chunked_local``), as a mask_mod with and without lists, against the same batch as
varlen (``cu_seqlens``, the dense equivalent); a prefix-LM mask with and without lists; a random block map at 25%
density as lists (every listed block full) against the dense attention of the same shape (the target: ">= 3x",
forward and backward).
FlexAttention builds its block mask once per case (``create_block_mask``, outside the timing); it runs twice:
with its own tiles for the device (the H100's need more than an SM120's 99 KB of shared memory, so they run at
the H100's occupancy only) and with ``SM120_FLEX_OPTIONS`` (torch's sm_120 tiles), which run at both.

Timing: ``timing.median_ms``; ``--occupancy`` as ``bench_fwd`` (sm120: ours padded by the package, FlexAttention's
Triton kernels through the context's cache preference where that reaches an SM120's CTAs per SM, else skipped).
TFLOPS use the share of the square a case's mask keeps (causal-like 1/2, documents 512 / s / 2, the random map its
density; x2.5 backward, x3.5 forward + backward), so a case's columns compare directly.

    python benchmarks/bench_flex.py --out results.json [--occupancy both|sm120|h100] [--cases causal alibi]
"""

from __future__ import annotations

import torch

from bench_fwd import (fa, fwd_and_grad_parts, save_result, select_impls, time_parts, training_args,  # noqa: E402
                       training_inputs)  # (puts torch-ext on the path)
from flash_attn_4_sm120 import block_sparse  # noqa: E402
from flash_attn_4_sm120 import flex_examples as fx  # noqa: E402

#: the SM120-occupancy peers here (FlexAttention's Triton kernels, through the cache preference)
PEERS = ("flex_attention", "flex_attention_sm120")
#: FlexAttention's tiles on an SM120 (its default tiles need 128-161 KB of shared memory): torch's own sm_120
#: forward default at d128 bf16 (``sm_120_default_flex_config``: 128 x 64, 2 stages, 8 warps) and a 64 x 64
#: one-stage backward, both within 99 KB
SM120_FLEX_OPTIONS = {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_stages": 2, "fwd_num_warps": 8,
                      "bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
                      "bwd_num_stages": 1, "bwd_num_warps": 8}
#: (batch, seqlen, heads_q, heads_kv, head_dim)
SHAPE = (4, 4096, 32, 8, 128)
DOC_LEN = 512
#: block density of the random block-sparse case (the issue's target: >= 3x the dense attention at 25%)
DENSITY = 0.25


def random_blocks(density: float, block: int = 128) -> fx.Example:
    """A random block map at ``density`` (per query head, seed 0) as an example: the torch twin looks the map up
    (FlexAttention builds its block mask from it); our lists come from the same map, every listed block full."""
    s, hq = SHAPE[1:3]
    g = torch.Generator().manual_seed(0)
    n = -(-s // block)
    table = (torch.rand(hq, n, n, generator=g) < density).cuda()

    def torch_mask(bi, hi, qi, ki, sq, sk):
        return table[hi, qi // block, ki // block]
    return fx.Example(f"random {density:.0%} blocks", torch_mask=torch_mask)


def cases() -> list[tuple[str, dict, fx.Example, float]]:
    """(name, our keyword arguments, the example FlexAttention mirrors, the share of the square's FLOPs it
    computes); ``block_sparse`` in the arguments: our call gets (128, 128) lists built from the example (outside
    the timing)."""
    causal, alibi = fx.causal(), fx.alibi(SHAPE[2])
    docs = fx.chunked_local(DOC_LEN)  # documents of DOC_LEN tokens, causal inside: chunked-local attention
    prefix = fx.prefix_lm(1024)
    rand = random_blocks(DENSITY)
    doc_share = DOC_LEN / SHAPE[1] / 2
    return [
        ("causal flag", dict(causal=True), causal, 0.5),
        ("causal mask_mod", dict(mask_mod=causal.mask_mod), causal, 0.5),
        ("causal mask_mod + block sparse", dict(mask_mod=causal.mask_mod, block_sparse=True), causal, 0.5),
        ("alibi score_mod + causal flag", dict(causal=True, score_mod=alibi.score_mod,
                                               score_mod_bwd=alibi.score_mod_bwd),
         fx.combined(alibi, causal), 0.5),
        (f"documents of {DOC_LEN} (mask_mod)", dict(mask_mod=docs.mask_mod), docs, doc_share),
        (f"documents of {DOC_LEN} (mask_mod + block sparse)", dict(mask_mod=docs.mask_mod, block_sparse=True), docs,
         doc_share),
        (f"documents of {DOC_LEN} (varlen)", dict(causal=True, varlen_docs=DOC_LEN), docs, doc_share),
        ("prefix-LM 1024", dict(mask_mod=prefix.mask_mod), prefix, 0.5),
        ("prefix-LM 1024 + block sparse", dict(mask_mod=prefix.mask_mod, block_sparse=True), prefix, 0.5),
        ("dense (no mask)", dict(), fx.Example("dense"), 1.0),
        (f"{rand.name} (block sparse)", dict(block_sparse=True), rand, DENSITY),
    ]


def ours_call(kwargs: dict, ex: fx.Example):
    kwargs = dict(kwargs)
    docs = kwargs.pop("varlen_docs", None)
    if kwargs.pop("block_sparse", False):  # lists of the example's mask, built once (not timed)
        s = SHAPE[1]
        fwd, _ = block_sparse.block_sparse_from_example(ex, 1, SHAPE[2], s, s, (128, 128), "cuda")
        kwargs["block_sparse_tensors"] = fwd

    def run(q, k, v):
        if docs is None:
            return fa.flash_attn_func(q, k, v, **kwargs)[0]
        b, s = q.shape[:2]
        cu = torch.arange(0, b * s + 1, docs, dtype=torch.int32, device=q.device)
        flat = (t.reshape(b * s, *t.shape[2:]) for t in (q, k, v))
        return fa.flash_attn_varlen_func(*flat, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=docs, max_seqlen_k=docs,
                                         **kwargs)[0].view(q.shape[:-1] + v.shape[-1:])
    return run


def flex_call(ex: fx.Example, s: int, options=None):
    """torch FlexAttention (compiled) with the example's torch twin as score_mod / mask_mod; ``options``: its
    kernel_options (None: its own choice for the device)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = None
    if ex.torch_mask is not None:
        block_mask = create_block_mask(lambda b, h, q, k: ex.torch_mask(b, h, q, k, s, s), None, SHAPE[2], s, s,
                                       device="cuda")
    def score_mod(score, b, h, q, k):
        return ex.torch_score(score, b, h, q, k, s, s)

    def run(q, k, v):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        out = compiled(qt, kt, vt, score_mod=score_mod if ex.torch_score is not None else None,
                       block_mask=block_mask, enable_gqa=kt.shape[1] != qt.shape[1], kernel_options=options)
        return out.transpose(1, 2)
    return run


def main():
    args = training_args()
    occupancies = args.occupancies
    # every case compiles FlexAttention for no-grad and grad calls and two tile choices: past the default limit
    torch._dynamo.config.recompile_limit = 256
    model = fa.dispatch_model(torch.device("cuda"))
    b, s, hq, hkv, d = SHAPE
    q, k, v, dout = training_inputs(b, s, s, hq, hkv, d, d)
    parts = fwd_and_grad_parts(q, k, v, dout)
    rows = []
    for name, kwargs, ex, share in cases():
        if args.cases and not any(c in name for c in args.cases):
            continue
        flops = 4 * b * hq * s * s * d * share
        impls = {"ours": ours_call(kwargs, ex)}
        if "varlen_docs" not in kwargs:
            impls["flex_attention"] = flex_call(ex, s)
            impls["flex_attention_sm120"] = flex_call(ex, s, SM120_FLEX_OPTIONS)
        impls = select_impls(impls, args.impls)
        row = {"case": name, "shape": list(SHAPE)}
        time_parts(row, impls, parts, occupancies, model, flops, PEERS)
        for occ in occupancies:
            key = "results" if occ == "sm120" else "results_h100"
            cells = [f"{i}=" + "/".join(f"{r[p]['ms']:.2f}" if "ms" in r.get(p, {}) else "-" for p in ("fwd", "fwd_bwd"))
                     + "ms" for i, r in row[key].items()]
            print(f"{name:36s} [{occ}] fwd/fwd+bwd " + " ".join(cells), flush=True)
        rows.append(row)
        if args.out:
            save_result(args.out, occupancies, rows)


if __name__ == "__main__":
    main()
