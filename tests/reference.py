"""Reference attention for the tests (fp32 or the input dtype), with the bundle's masking rules.

Visibility (bottom-right aligned, off = seqlen_k - seqlen_q), FlashAttention-4's convention: key j is
visible to query i iff j >= i + off - left (unless left is None) and j <= i + off + right (unless right
is None); causal sets right = 0; negative bounds are real offsets ((None, -2) ends each row two keys
before the diagonal); only a pair with both bounds given and left + right < 0 means no window (FA2's
(-1, -1)). Logits are scale * q.k, or softcap * tanh(scale * q.k / softcap).
A learnable sink adds exp(sink_h) to each row's denominator and LSE. A row that sees no key (and has
no sink) has output 0 and LSE -inf.
"""

import math

import torch


def attention_ref(q, k, v, softmax_scale=None, causal=False, upcast=True, window_size=(None, None),
                  softcap=0.0, learnable_sink=None, dropout=None):
    """q (b, sq, hq, d), k/v (b, sk, hkv, d) -> (out (b, sq, hq, dv), lse (b, hq, sq) fp32).

    ``upcast=True`` computes in fp32 (the reference); ``upcast=False`` computes in the input dtype with
    the same operation order (the ``pt`` baseline for the tolerance rule). ``dropout``: (keep mask (b, hq, sq,
    sk) bool, scale): the normalized probabilities times keep * scale before P V (the LSE keeps every element).
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
    if softcap:
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k).float()
        scores = softcap * torch.tanh(scores * (scale / softcap))
    else:
        scores = torch.einsum("bqhd,bkhd->bhqk", q * scale, k).float()
    seen = visible(sq, sk, causal, window_size, q.device)
    scores = scores.masked_fill(~seen, float("-inf"))
    if learnable_sink is not None:
        sink = learnable_sink.float().view(1, hq, 1, 1).expand(b, hq, sq, 1)
        lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1)
        empty = torch.zeros_like(lse, dtype=torch.bool)
    else:
        # A row that sees no key: its LSE is -inf and its P 0. The logsumexp runs over zeros there, so
        # that autograd through it stays finite (its gradient is multiplied by P = 0).
        empty = ~seen.any(dim=-1).expand(b, hq, sq)
        lse = torch.logsumexp(scores.masked_fill(empty[..., None], 0.0), dim=-1)
    p = torch.exp(scores - lse[..., None])
    if dropout is not None:
        keep, scale = dropout
        p = p * (keep.to(p.dtype) * scale)
    lse = lse.masked_fill(empty, float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v)
    return out.to(dtype_out), lse


def masked_attention_ref(q, k, v, keep=None, upcast=True, score_fn=None, sink=None):
    """(out, lse) of attention with an element mask ``keep`` (broadcast to (b, hq, sq, sk); None = all), an
    optional ``score_fn(scores, bi, hi, qi, ki)`` on the scaled scores (index tensors broadcast like them) and a
    sink logit per head; fp32 (``upcast``) or the input dtype. The mods' and block sparsity's reference."""
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(hq // hkv, dim=2), v.repeat_interleave(hq // hkv, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q * (1.0 / math.sqrt(d)), k).float()
    dev = q.device
    if score_fn is not None:
        idx = (torch.arange(b, device=dev).view(-1, 1, 1, 1), torch.arange(hq, device=dev).view(1, -1, 1, 1),
               torch.arange(sq, device=dev).view(1, 1, -1, 1), torch.arange(sk, device=dev).view(1, 1, 1, -1))
        scores = score_fn(scores, *idx)
    if keep is not None:
        scores = scores.masked_fill(~keep.expand_as(scores), float("-inf"))
    if sink is not None:  # one more logit per row with no value row
        scores = torch.cat([scores, sink.float().view(1, -1, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    empty = torch.isneginf(scores).all(dim=-1)
    lse = torch.logsumexp(scores.masked_fill(empty[..., None], 0.0), dim=-1)
    p = torch.exp(scores - lse[..., None])[..., :sk]
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v)
    return out.to(dtype), lse.masked_fill(empty, float("-inf"))


def visible(sq, sk, causal, window_size, device=None):
    """(sq, sk) bool: which keys each query sees (the convention in the module docstring)."""
    left, right = window_size if window_size is not None else (None, None)
    if causal:
        right = 0
    if left is not None and right is not None and left + right < 0:
        left, right = None, (0 if causal else None)  # "no window": causal stays causal
    diag = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    seen = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right is not None:
        seen &= j <= diag + right
    if left is not None:
        seen &= j >= diag - left
    return seen


def check_fwd(q, k, v, causal=False, options=None, **features):
    """Run ``flash_attn_fwd`` into NaN-poisoned out/lse with ``features`` (masks, softcap, sink: also given
    to the reference) and ``options`` (pack_gqa, num_splits: the kernel's choice only), and assert the
    tolerance rule max|out-ref| <= 2 max|pt-ref| + 1e-5, every row written, -inf LSE exactly where the
    reference has it and the LSE within 1e-3 elsewhere."""
    import flash_attn_4_sm120 as fa

    b, sq, hq, _ = q.shape
    out = torch.full((b, sq, hq, v.shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((b, hq, sq), float("nan"), dtype=torch.float32, device=q.device)
    fa.flash_attn_fwd(q, k, v, causal=causal, out=out, lse=lse, **(options or {}), **features)
    torch.cuda.synchronize()
    ref, lse_ref = attention_ref(q, k, v, None, causal, **features)
    pt, _ = attention_ref(q, k, v, None, causal, upcast=False, **features)
    assert not out.isnan().any() and not lse.isnan().any(), "unwritten output rows"
    err = (out.float() - ref.float()).abs().max().item()
    pt_err = (pt.float() - ref.float()).abs().max().item()
    assert err <= 2 * pt_err + 1e-5, f"max|out-ref|={err:.3e} > 2*{pt_err:.3e}"
    neg = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), neg)
    if (~neg).any():
        assert (lse[~neg] - lse_ref[~neg]).abs().max().item() <= 1e-3


def varlen_batch(lens_q, lens_k, hq, hkv, d, dtype=torch.bfloat16):
    """Packed (total, heads, d) q, k, v of random values and int32 cu_seqlens for the given lengths."""
    def cu(lens):
        return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")

    q = torch.randn(sum(lens_q), hq, d, dtype=dtype, device="cuda")
    k = torch.randn(sum(lens_k), hkv, d, dtype=dtype, device="cuda")
    v = torch.randn(sum(lens_k), hkv, d, dtype=dtype, device="cuda")
    return q, k, v, cu(lens_q), cu(lens_k)


def paged_cache(batch, max_len, page_size, hkv, d, dv, spare=2, dtype=torch.bfloat16):
    """A paged K/V cache of random values for ``batch`` sequences of up to ``max_len`` keys: (k_cache, v_cache,
    table, k, v), the table's pages shuffled over a pool with ``spare`` pages no sequence uses, and k / v each
    sequence's keys in order, (batch, pages per sequence x page_size, hkv, d / dv), for the reference."""
    max_pages = -(-max_len // page_size)
    num_pages = batch * max_pages + spare
    kc = torch.randn(num_pages, page_size, hkv, d, dtype=dtype, device="cuda")
    vc = torch.randn(num_pages, page_size, hkv, dv, dtype=dtype, device="cuda")
    table = torch.randperm(num_pages, device="cuda")[: batch * max_pages].reshape(batch, max_pages).int()
    rows = (batch, max_pages * page_size)
    return kc, vc, table, kc[table.long()].reshape(*rows, hkv, d), vc[table.long()].reshape(*rows, hkv, dv)


def rotary_ref(x, cos, sin, positions, interleaved):
    """x (s, h, d) rotated at ``positions`` (s,) in fp32 and rounded once, as the kernel does."""
    r = 2 * cos.shape[1]
    pos = positions.clamp(0, cos.shape[0] - 1).long()
    c, s = cos[pos].float()[:, None, :], sin[pos].float()[:, None, :]
    xr = x[..., :r].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
        rot = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., r:]), dim=-1)


def rotary_tables(seqlen_ro, rotary_dim, dtype, device="cuda"):
    """(cos, sin) (seqlen_ro, rotary_dim / 2) of the usual 10000-base rotary embedding, in ``dtype``."""
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device=device).float() / rotary_dim))
    ang = torch.arange(seqlen_ro, device=device).float()[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def attention_grads_ref(q, k, v, dout, upcast=True, dlse=None, **features):
    """Gradients (dq, dk, dv, dsink or None) of ``attention_ref`` (fp32 with ``upcast``, else in the input
    dtype: the ``pt`` baseline) for the output gradient ``dout`` and, optionally, an LSE gradient
    ``dlse`` (b, hq, sq); ``features`` as ``attention_ref`` takes them (the sink as a tensor)."""
    sink = features.pop("learnable_sink", None)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    sink_leaf = sink.detach().clone().requires_grad_(True) if sink is not None else None
    out, lse = attention_ref(*leaves, upcast=upcast, learnable_sink=sink_leaf, **features)
    loss = (out.float() * dout.float()).sum()
    if dlse is not None:
        finite = torch.isfinite(lse)
        loss = loss + (lse.masked_fill(~finite, 0.0) * dlse.masked_fill(~finite, 0.0)).sum()
    grads = torch.autograd.grad(loss, leaves + ([sink_leaf] if sink_leaf is not None else []))
    return (*grads[:3], grads[3] if sink_leaf is not None else None)


def capture(fn, warmups: int = 2):
    """``(graph, outputs)``: ``fn()`` run ``warmups`` times on a side stream (kernels compile, the allocator warms
    outside the capture), then captured in a CUDA graph; ``outputs`` are the captured call's (static) results."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs
