"""Reference attention for the tests (fp32 or the input dtype), with the bundle's masking rules.

Causal masking is bottom-right aligned: key j is visible to query i iff j <= i + seqlen_k - seqlen_q.
A row that sees no key has output 0 and LSE -inf.
"""

import math

import torch


def attention_ref(q, k, v, softmax_scale=None, causal=False, upcast=True):
    """q (b, sq, hq, d), k/v (b, sk, hkv, d) -> (out (b, sq, hq, dv), lse (b, hq, sq) fp32).

    ``upcast=True`` computes in fp32 (the reference); ``upcast=False`` computes in the input dtype with
    the same operation order (the ``pt`` baseline for the tolerance rule).
    """
    dtype_out = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    rep = hq // hkv
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q * scale, k).float()
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        scores = scores.masked_fill(j > i + sk - sq, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isinf(lse) & (lse < 0)
    p = torch.exp(scores - lse.masked_fill(empty, 0.0)[..., None])
    p = p.masked_fill(empty[..., None], 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v)
    return out.to(dtype_out), lse
