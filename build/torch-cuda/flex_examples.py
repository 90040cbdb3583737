"""Example score_mod / mask_mod callables in upstream FlashAttention-4's conventions, each with a
torch twin that computes the same thing on index tensors (for references and for
``block_sparse.block_sparse_from_mask_fn``).

Kernel side: ``score_mod(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors)`` and
``mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors)`` on ``TensorSSA`` vectors (see
``_kernels/flex_mods.py``); torch side: ``(score, b, h, q, k, seqlen_q, seqlen_k)`` / ``(b, h, q, k, seqlen_q,
seqlen_k)`` on broadcast tensors. Factories capture their parameters (part of the compile key).
Imports of cutlass are deferred to call time: this module loads without the DSL.
"""

from __future__ import annotations

from typing import NamedTuple


class Example(NamedTuple):
    """A mod and its torch twin."""

    name: str
    score_mod: object = None
    mask_mod: object = None
    torch_score: object = None
    torch_mask: object = None
    #: the score_mod's derivative rule: ``score_mod_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors)``
    score_mod_bwd: object = None
    #: the tensors the mods read (pass as ``aux_tensors=``); the torch twins read the same ones
    aux_tensors: tuple = ()
    #: the runtime numbers the mods read (pass as ``aux_scalars=``); the torch twins read the same ones
    aux_scalars: tuple = ()


def alibi(num_heads: int) -> Example:
    """ALiBi: score - slope_h * |q - k| with slope_h = 2^(-8 (h + 1) / num_heads) (the query head)."""
    step = -8.0 / num_heads

    def score_mod(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        import cutlass
        import cutlass.cute as cute

        slope = cute.math.exp2((h + 1).to(cutlass.Float32) * step)
        dist = (q_idx - kv_idx).to(cutlass.Float32)
        return score - slope * cute.where(dist < 0.0, -dist, dist)

    def torch_score(score, b, h, q, k, seqlen_q, seqlen_k):
        return score - 2.0 ** ((h + 1) * step) * (q - k).abs()

    def score_mod_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return grad  # the bias does not depend on the score

    return Example(f"alibi{num_heads}", score_mod=score_mod, torch_score=torch_score, score_mod_bwd=score_mod_bwd)


def softcap(cap: float) -> Example:
    """tanh softcapping written as a score_mod: cap * tanh(score / cap)."""
    inv = 1.0 / cap

    def score_mod(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        import cutlass.cute as cute

        return cute.math.tanh(score * inv) * cap

    def torch_score(score, b, h, q, k, seqlen_q, seqlen_k):
        return cap * (score * inv).tanh()

    def score_mod_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        import cutlass.cute as cute

        t = cute.math.tanh(score * inv)
        return grad * (1.0 - t * t)

    return Example(f"softcap{cap:g}", score_mod=score_mod, torch_score=torch_score, score_mod_bwd=score_mod_bwd)


def causal() -> Example:
    """Bottom-right causal mask (FlashAttention's alignment) as a mask_mod."""

    def mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return kv_idx <= q_idx + (seqlen_info.seqlen_k - seqlen_info.seqlen_q)

    def torch_mask(b, h, q, k, seqlen_q, seqlen_k):
        return k <= q + (seqlen_k - seqlen_q)

    return Example("causal", mask_mod=mask_mod, torch_mask=torch_mask)


def prefix_lm(prefix: int) -> Example:
    """Prefix-LM: the first ``prefix`` keys are visible to every query, the rest causally (top-left aligned)."""

    def mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return (kv_idx < prefix) | (kv_idx <= q_idx)

    def torch_mask(b, h, q, k, seqlen_q, seqlen_k):
        return (k < prefix) | (k <= q)

    return Example(f"prefixlm{prefix}", mask_mod=mask_mod, torch_mask=torch_mask)


def chunked_local(chunk: int) -> Example:
    """Chunked local attention (Llama-4 style): a query sees the keys of its own chunk, causally."""

    def mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return ((q_idx // chunk) == (kv_idx // chunk)) & (kv_idx <= q_idx)

    def torch_mask(b, h, q, k, seqlen_q, seqlen_k):
        return (q // chunk == k // chunk) & (k <= q)

    return Example(f"chunked{chunk}", mask_mod=mask_mod, torch_mask=torch_mask)


def alibi_slopes(slopes) -> Example:
    """ALiBi with per-head slopes read from an aux tensor: score - slopes[h] * |q - k| (``slopes``: (num_heads,)
    float32, ``aux_tensors[0]``)."""

    def score_mod(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        import cutlass
        import cutlass.cute as cute

        heads = cute.make_rmem_tensor(h.shape, cutlass.Int32)  # every lane holds the row's head
        heads.store(h)
        slope = cutlass.Float32(aux_tensors[0][heads[0]])
        dist = (q_idx - kv_idx).to(cutlass.Float32)
        return score - cute.where(dist < 0.0, -dist, dist) * slope

    def torch_score(score, b, h, q, k, seqlen_q, seqlen_k):
        return score - slopes.float()[h] * (q - k).abs()

    def score_mod_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return grad

    return Example("alibi-slopes", score_mod=score_mod, torch_score=torch_score, score_mod_bwd=score_mod_bwd,
                   aux_tensors=(slopes,))


def relative_bias(bias) -> Example:
    """A learned relative position bias read from an aux tensor: score + bias[h, clamp(q - k, -w, w) + w]
    (``bias``: (num_heads, 2 w + 1) float32, ``aux_tensors[0]``; distances past w share the edge entries)."""
    width = (bias.shape[-1] - 1) // 2

    def score_mod(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        import cutlass
        import cutlass.cute as cute

        heads = cute.make_rmem_tensor(h.shape, cutlass.Int32)
        heads.store(h)
        dist = cute.make_rmem_tensor(q_idx.shape, cutlass.Int32)
        dist.store(q_idx - kv_idx)
        out = cute.make_rmem_tensor(score.shape, cutlass.Float32)
        out.store(score)
        for j in range(cute.size(out)):  # plain Python: the vector's lanes, unrolled while tracing
            col = cutlass.min(cutlass.max(dist[j], cutlass.Int32(-width)), cutlass.Int32(width)) + width
            out[j] = out[j] + cutlass.Float32(aux_tensors[0][heads[0], col])
        return out.load()

    def torch_score(score, b, h, q, k, seqlen_q, seqlen_k):
        return score + bias.float()[h, (q - k).clamp(-width, width) + width]

    def score_mod_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return grad

    return Example("relative-bias", score_mod=score_mod, torch_score=torch_score, score_mod_bwd=score_mod_bwd,
                   aux_tensors=(bias,))


def documents(doc_ids) -> Example:
    """Document masking read from an aux tensor: a query sees the keys of its own document, causally
    (``doc_ids``: (seqlen,) int32, the document of each position, shared by the batch: ``aux_tensors[0]``)."""

    def mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        import cutlass
        import cutlass.cute as cute

        rows, cols = cute.make_rmem_tensor((1,), cutlass.Int32), cute.make_rmem_tensor((1,), cutlass.Int32)
        rows.store(q_idx)
        cols.store(kv_idx)
        diff = cute.make_rmem_tensor((1,), cutlass.Int32)
        diff[0] = cutlass.Int32(aux_tensors[0][rows[0]]) - cutlass.Int32(aux_tensors[0][cols[0]])
        return (diff.load() == 0) & (kv_idx <= q_idx)

    def torch_mask(b, h, q, k, seqlen_q, seqlen_k):
        return (doc_ids[q] == doc_ids[k]) & (k <= q)

    return Example("documents", mask_mod=mask_mod, torch_mask=torch_mask, aux_tensors=(doc_ids,))


def softcap_scalar(cap: float) -> Example:
    """tanh softcapping with the cap a runtime number (``aux_scalars[0]``, a Float32): cap * tanh(score / cap). A
    call with another cap runs the same kernel (``softcap`` captures its cap: one kernel per cap)."""

    def score_mod(score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors, aux_scalars):
        import cutlass.cute as cute

        return cute.math.tanh(score * (1.0 / aux_scalars[0])) * aux_scalars[0]

    def torch_score(score, b, h, q, k, seqlen_q, seqlen_k):
        return cap * (score / cap).tanh()

    def score_mod_bwd(grad, score, b, h, q_idx, kv_idx, seqlen_info, aux_tensors, aux_scalars):
        import cutlass.cute as cute

        t = cute.math.tanh(score * (1.0 / aux_scalars[0]))
        return grad * (1.0 - t * t)

    return Example("softcap-scalar", score_mod=score_mod, torch_score=torch_score, score_mod_bwd=score_mod_bwd,
                   aux_scalars=(float(cap),))


def window_scalar(width: int, slot: int = 0) -> Example:
    """A causal sliding window whose width is a runtime number (``aux_scalars[slot]``, an Int32): a query sees the
    ``width`` keys up to its own (bottom-right aligned). ``slot`` is the width's place in the call's aux_scalars:
    1 after ``softcap_scalar``'s cap in ``combined(softcap_scalar(c), window_scalar(w, slot=1))``."""

    def mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors, aux_scalars):
        diag = q_idx + (seqlen_info.seqlen_k - seqlen_info.seqlen_q)
        return (kv_idx <= diag) & (kv_idx > diag - aux_scalars[slot])

    def torch_mask(b, h, q, k, seqlen_q, seqlen_k):
        diag = q + (seqlen_k - seqlen_q)
        return (k <= diag) & (k > diag - width)

    return Example("window-scalar", mask_mod=mask_mod, torch_mask=torch_mask, aux_scalars=(int(width),))


def combined(score: Example, mask: Example) -> Example:
    return Example(f"{score.name}+{mask.name}", score_mod=score.score_mod, mask_mod=mask.mask_mod,
                   torch_score=score.torch_score, torch_mask=mask.torch_mask, score_mod_bwd=score.score_mod_bwd,
                   aux_tensors=score.aux_tensors + mask.aux_tensors, aux_scalars=score.aux_scalars + mask.aux_scalars)


def gate_examples() -> list:
    """The examples the conformance gate compiles (each traced into a few table configs)."""
    return [alibi(8), softcap(30.0), causal(), prefix_lm(100), chunked_local(128), combined(alibi(8), causal())]


def aux_gate_examples() -> list:
    """The aux-tensor and aux-scalar examples the gate compiles (CPU tensors: only their dtype and rank enter the key;
    of the scalars, only their types)."""
    import torch

    return [alibi_slopes(torch.zeros(8, dtype=torch.float32)), documents(torch.zeros(16, dtype=torch.int32)),
            relative_bias(torch.zeros(8, 65, dtype=torch.float32)),
            combined(softcap_scalar(30.0), window_scalar(256, slot=1))]
