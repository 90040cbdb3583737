"""``flash_attn_with_kvcache`` on a GPU, against a reference of FA2/FA3's semantics.

Reference per sequence b: the cache's keys before the call (dense: row ``cache_batch_idx[b]`` from
``cache_leftpad[b]`` to ``cache_seqlens[b]``; paged: through the page table), the new k rotated at
positions ``rotary base + i`` and appended, q rotated at ``base + i`` (causal / window) or ``base``,
then fp32 attention over the result (``reference.attention_ref``, bottom-right causal). Checked: the
output (2x rule), the LSE, the cache after the call (new rows written, every other row untouched), and
the caller's q left as it was. Covers dense and paged caches (page sizes 1, 16, 48), append of 1-5 tokens and
none, rotary off / GPT-NeoX / GPT-J / partial rotary_dim / rotary_seqlens, cache_batch_idx and
cache_leftpad, packed q with cu_seqlens_q and packed new k/v with cu_seqlens_k_new (mixed prefill and
decode), GQA, head dims 64-512 and dv != d, causal / window / softcap / sink, split-KV, ``out=``,
int and default cache_seqlens, appends past the cache's end (dropped), corrupt metadata (no fault), and MLA
(``qv``: the rope key cache rotated and appended, the latent cache appended, attention over [qv | q] . [v | k]).
"""

import pytest
import torch

from reference import attention_ref, rotary_ref, rotary_tables

pytestmark = pytest.mark.gpu


class Cache:
    """A KV cache, dense (batch_cache, capacity, hkv, d) or paged (num_pages, page_size, hkv, d) with a
    shuffled page table, and the host view of sequence b's slot j: ``rows(b)`` indexes the flattened cache."""

    def __init__(self, batch, capacity, hkv, d, dv, page_size=0, dtype=torch.bfloat16, batch_cache=None, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.page_size = page_size
        if page_size:
            max_pages = -(-capacity // page_size)
            num_pages = batch * max_pages + 2
            perm = torch.randperm(num_pages, generator=g)[: batch * max_pages]
            self.table = perm.view(batch, max_pages).to(torch.int32).cuda()
            shape = (num_pages, page_size)
        else:
            self.table = None
            shape = (batch_cache or batch, capacity)
        self.k = torch.randn(*shape, hkv, d, generator=g).to(dtype).cuda()
        self.v = torch.randn(*shape, hkv, dv, generator=g).to(dtype).cuda()
        self.capacity = capacity if not page_size else self.table.shape[1] * page_size

    def rows(self, b, start, end, cache_row=None):
        """Flattened cache rows of sequence b's key positions [start, end)."""
        j = torch.arange(start, end, device="cuda")
        if self.page_size:
            return self.table[b, j // self.page_size].long() * self.page_size + j % self.page_size
        width = self.k.shape[1]
        return (b if cache_row is None else cache_row) * width + j

    def keys(self, b, start, end, cache_row=None):
        r = self.rows(b, start, end, cache_row)
        return self.k.flatten(0, 1)[r], self.v.flatten(0, 1)[r]


def run_case(batch=3, seqlen_q=1, seqlen_new=1, hq=8, hkv=2, d=128, dv=None, capacity=300, page_size=0,
             lens=None, causal=True, rotary_dim=0, interleaved=False, rotary_offsets=False, batch_idx=False,
             leftpad=False, varlen=None, dtype=torch.bfloat16, out_buffer=False, num_splits=0, seed=0, mla=False,
             **features):
    """One call and its checks. ``varlen``: per-sequence (q rows, new rows) for packed q / k / v. ``mla``: q and
    the key cache are the rope part (``d``), the value cache the latent (``dv``), with an absorbed query ``qv``."""
    import flash_attn_4_sm120 as fa

    dv = dv or d
    torch.manual_seed(seed)
    batch_cache = batch + 2 if batch_idx else None
    cache = Cache(batch, capacity, hkv, d, dv, page_size, dtype, batch_cache, seed)
    k_before, v_before = cache.k.clone(), cache.v.clone()
    if lens is None:
        lens = torch.randint(0, capacity - 8, (batch,)).tolist()
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    pad = torch.randint(0, 5, (batch,)).tolist() if leftpad else [0] * batch
    pad = [min(p, n) for p, n in zip(pad, lens)]
    cache_rows = torch.randperm(batch_cache)[:batch].tolist() if batch_idx else list(range(batch))
    kw = dict(features, num_splits=num_splits)
    if varlen:
        q_lens, new_lens = zip(*varlen)
        cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        cu_new = torch.tensor([0, *torch.tensor(new_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        q = torch.randn(sum(q_lens), hq, d, dtype=dtype, device="cuda")
        k_new = torch.randn(sum(new_lens), hkv, d, dtype=dtype, device="cuda")
        v_new = torch.randn(sum(new_lens), hkv, dv, dtype=dtype, device="cuda")
        kw.update(cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_new, max_seqlen_q=max(q_lens))
        q_of = [q[cu_q[b]:cu_q[b + 1]] for b in range(batch)]
        new_of = [(k_new[cu_new[b]:cu_new[b + 1]], v_new[cu_new[b]:cu_new[b + 1]]) for b in range(batch)]
    else:
        q = torch.randn(batch, seqlen_q, hq, d, dtype=dtype, device="cuda")
        q_of = list(q)
        k_new = v_new = None
        if seqlen_new:
            k_new = torch.randn(batch, seqlen_new, hkv, d, dtype=dtype, device="cuda")
            v_new = torch.randn(batch, seqlen_new, hkv, dv, dtype=dtype, device="cuda")
        new_of = [(k_new[b], v_new[b]) if seqlen_new else None for b in range(batch)]
    q_copy = q.clone()
    qv_of = [None] * batch
    if mla:
        qv = torch.randn(*q.shape[:-1], dv, dtype=dtype, device="cuda")
        kw["qv"] = qv
        qv_of = [qv[kw["cu_seqlens_q"][b]:kw["cu_seqlens_q"][b + 1]] for b in range(batch)] if varlen else list(qv)
    if rotary_dim:
        cos, sin = rotary_tables(capacity + 16, rotary_dim, dtype)
        kw.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
        base = torch.tensor(lens, device="cuda")
        if rotary_offsets:
            base = torch.randint(0, capacity, (batch,), device="cuda")
            kw["rotary_seqlens"] = base.to(torch.int32)
    if features.get("learnable_sink") == "sink":
        kw["learnable_sink"] = features["learnable_sink"] = torch.randn(hq, device="cuda")
    if page_size:
        kw["block_table" if seed % 2 else "page_table"] = cache.table
    if batch_idx:
        kw["cache_batch_idx"] = torch.tensor(cache_rows, dtype=torch.int32, device="cuda")
    if leftpad:
        kw["cache_leftpad"] = torch.tensor(pad, dtype=torch.int32, device="cuda")
    out = None
    if out_buffer:
        out = torch.full((*q.shape[:-1], dv), float("nan"), dtype=dtype, device="cuda")
        kw["out"] = out
    res, lse = fa.flash_attn_with_kvcache(q, cache.k, cache.v, k_new, v_new, cache_seqlens=cache_seqlens,
                                         causal=causal, return_softmax_lse=True, **kw)
    torch.cuda.synchronize()
    if out_buffer:
        assert res.data_ptr() == out.data_ptr()
    assert torch.equal(q, q_copy), "the caller's q was modified"
    written = torch.zeros(cache.k.shape[0] * cache.k.shape[1], dtype=torch.bool, device="cuda")
    for b in range(batch):
        n_new = new_of[b][0].shape[0] if new_of[b] is not None else 0
        end = min(lens[b] + n_new, cache.capacity)
        if n_new:
            slot = cache.rows(b, lens[b], end, cache_rows[b])
            written[slot] = True
            kn, vn = new_of[b]
            kn, vn = kn[: end - lens[b]], vn[: end - lens[b]]
            if rotary_dim:
                kn = rotary_ref(kn, cos, sin, base[b] + torch.arange(kn.shape[0], device="cuda"), interleaved)
            got_k, got_v = cache.k.flatten(0, 1)[slot], cache.v.flatten(0, 1)[slot]
            assert torch.equal(got_v, vn), "appended values differ"
            torch.testing.assert_close(got_k.float(), kn.float(), atol=0, rtol=1e-2)
        keys, vals = cache.keys(b, pad[b], end, cache_rows[b])
        qb = q_of[b]
        if rotary_dim:
            per_row = causal or features.get("window_size") not in (None, (None, None), (-1, -1))
            offs = torch.arange(qb.shape[0], device="cuda") if per_row else torch.zeros(qb.shape[0], device="cuda")
            qb = rotary_ref(qb, cos, sin, base[b] + offs.long(), interleaved)
        if mla:  # [qv | q] against [latent | rope], the latent as values
            qb, keys = torch.cat([qv_of[b], qb], -1), torch.cat([vals, keys], -1)
        ref, ref_lse = attention_ref(qb[None], keys[None], vals[None], causal=causal, **features)
        pt, _ = attention_ref(qb[None], keys[None], vals[None], causal=causal, upcast=False, **features)
        got = res[b] if not varlen else res[kw["cu_seqlens_q"][b]:kw["cu_seqlens_q"][b + 1]]
        got_lse = lse[b] if not varlen else lse[:, kw["cu_seqlens_q"][b]:kw["cu_seqlens_q"][b + 1]]
        assert not got.isnan().any(), f"sequence {b}: unwritten output"
        err = (got.float() - ref[0].float()).abs().max().item() if got.numel() else 0.0
        pt_err = (pt[0].float() - ref[0].float()).abs().max().item() if got.numel() else 0.0
        assert err <= 2 * pt_err + (1e-4 if rotary_dim else 1e-5), f"sequence {b}: max|out-ref|={err:.3e}, pt {pt_err:.3e}"
        neg = torch.isneginf(ref_lse[0])
        assert torch.equal(torch.isneginf(got_lse), neg)
        if (~neg).any():
            assert (got_lse[~neg] - ref_lse[0][~neg]).abs().max().item() <= 1e-3
    untouched = ~written
    assert torch.equal(cache.k.flatten(0, 1)[untouched], k_before.flatten(0, 1)[untouched]), "cache rows clobbered"
    assert torch.equal(cache.v.flatten(0, 1)[untouched], v_before.flatten(0, 1)[untouched]), "cache rows clobbered"


@pytest.mark.parametrize("page_size", [0, 1, 16, 48], ids=lambda p: f"page{p}" if p else "dense")
@pytest.mark.parametrize("seqlen_new", [0, 1, 5], ids=lambda n: f"new{n}")
@pytest.mark.parametrize("seqlen_q", [1, 5], ids=lambda n: f"q{n}")
def test_decode_and_append(page_size, seqlen_new, seqlen_q):
    run_case(seqlen_q=seqlen_q, seqlen_new=seqlen_new, page_size=page_size, seed=seqlen_q + seqlen_new)


@pytest.mark.parametrize("rotary_dim", [64, 128], ids=lambda r: f"rot{r}")
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("page_size", [0, 16], ids=lambda p: f"page{p}" if p else "dense")
def test_rotary(rotary_dim, interleaved, causal, page_size):
    run_case(seqlen_q=3, seqlen_new=3, rotary_dim=rotary_dim, interleaved=interleaved, causal=causal,
             page_size=page_size, seed=1)


def test_rotary_seqlens():
    run_case(seqlen_q=2, seqlen_new=2, rotary_dim=64, rotary_offsets=True, page_size=16)


@pytest.mark.parametrize("batch_idx,leftpad", [(True, False), (False, True), (True, True)],
                         ids=["batch_idx", "leftpad", "both"])
@pytest.mark.parametrize("rotary_dim", [0, 32], ids=lambda r: f"rot{r}")
def test_batch_idx_leftpad(batch_idx, leftpad, rotary_dim):
    run_case(seqlen_q=2, seqlen_new=2, batch_idx=batch_idx, leftpad=leftpad, rotary_dim=rotary_dim, d=64)


@pytest.mark.parametrize("page_size", [0, 16], ids=lambda p: f"page{p}" if p else "dense")
def test_mixed_prefill_decode(page_size):
    """Packed q and new k / v: one sequence prefilling a chunk, others decoding, one idle."""
    run_case(batch=4, varlen=[(37, 37), (1, 1), (0, 0), (4, 4)], page_size=page_size, capacity=400,
             lens=[100, 250, 17, 0], rotary_dim=64)


@pytest.mark.parametrize("d,dv", [(64, 64), (96, 96), (192, 128), (256, 256)], ids=lambda x: str(x))
def test_head_dims(d, dv):
    run_case(d=d, dv=dv, seqlen_q=2, seqlen_new=2, page_size=16, hq=4, hkv=4)


@pytest.mark.parametrize("features", [
    dict(window_size=(40, 0)), dict(softcap=30.0), dict(learnable_sink="sink"), dict(window_size=(64, 0),
                                                                                      learnable_sink="sink")],
    ids=["window", "softcap", "sink", "window_sink"])
def test_features(features):
    run_case(seqlen_q=4, seqlen_new=4, page_size=16, capacity=600, rotary_dim=64, **dict(features))


@pytest.mark.parametrize("num_splits", [1, 3, 0], ids=lambda s: f"splits{s}")
def test_splits_and_out(num_splits):
    run_case(batch=2, capacity=2000, lens=[1900, 700], page_size=16, num_splits=num_splits, out_buffer=True)


@pytest.mark.parametrize("d,dv,page_size,rotary_dim", [(320, 384, 16, 128), (512, 512, 0, 512), (512, 512, 1, 0)],
                         ids=["d320x384_page16_rot128", "d512_dense_rot512", "d512_page1"])
def test_head_dims_past_256(d, dv, page_size, rotary_dim):
    """Rows past 256 columns: appended in two passes, rotated over any prefix, attended by the wide tiles."""
    run_case(d=d, dv=dv, seqlen_q=3, seqlen_new=3, page_size=page_size, hq=4, hkv=2, rotary_dim=rotary_dim,
             interleaved=rotary_dim == 512, capacity=200)


@pytest.mark.parametrize("hq,seqlen_q,page_size,interleaved", [(16, 1, 64, True), (64, 2, 1, False), (128, 1, 0, True)],
                         ids=["h16_page64", "h64_spec2_page1", "h128_dense"])
def test_mla(hq, seqlen_q, page_size, interleaved):
    """MLA decode and speculative decode: rope keys rotated and appended, the latent appended, one KV head."""
    run_case(batch=3, d=64, dv=512, hq=hq, hkv=1, seqlen_q=seqlen_q, seqlen_new=seqlen_q, page_size=page_size,
             rotary_dim=64, interleaved=interleaved, capacity=500, mla=True, seed=hq)


def test_mla_mixed_prefill_decode_with_starts():
    """Packed q and new rows (a prefill chunk beside decodes) on MLA caches, and a dense cache read from starts."""
    run_case(batch=3, d=64, dv=512, hq=16, hkv=1, varlen=[(21, 21), (1, 1), (0, 0)], lens=[40, 300, 9],
             capacity=400, rotary_dim=64, mla=True, learnable_sink="sink")
    run_case(batch=2, d=64, dv=512, hq=16, hkv=1, seqlen_q=1, seqlen_new=1, batch_idx=True, leftpad=True,
             capacity=300, mla=True, softcap=20.0)


def test_fp16_mqa_full():
    run_case(dtype=torch.float16, hq=8, hkv=1, causal=False, seqlen_q=3, seqlen_new=3)


def test_append_past_capacity_is_dropped():
    """Sequence 0 ends 2 keys before the cache's end: of 5 new keys, 2 are written and attended."""
    run_case(capacity=64, lens=[62, 10, 64], seqlen_new=5, seqlen_q=5, page_size=16)


def test_int_and_default_cache_seqlens():
    import flash_attn_4_sm120 as fa

    cache = Cache(2, 96, 2, 64, 64, page_size=16)
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16, device="cuda")
    full = fa.flash_attn_with_kvcache(q, cache.k, cache.v, block_table=cache.table)
    as_int = fa.flash_attn_with_kvcache(q, cache.k, cache.v, block_table=cache.table, cache_seqlens=96)
    lens = torch.full((2,), 96, dtype=torch.int32, device="cuda")
    as_tensor = fa.flash_attn_with_kvcache(q, cache.k, cache.v, block_table=cache.table, cache_seqlens=lens)
    assert torch.equal(full, as_tensor) and torch.equal(as_int, as_tensor)


def test_corrupt_metadata_no_fault():
    """Page entries outside the pool, negative and huge cache_seqlens: no fault, finite output."""
    import flash_attn_4_sm120 as fa

    cache = Cache(3, 64, 2, 64, 64, page_size=16)
    cache.table[0, 1] = 10_000
    cache.table[1, 0] = -7
    lens = torch.tensor([20, -5, 1 << 30], dtype=torch.int32, device="cuda")
    q = torch.randn(3, 2, 4, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(3, 2, 2, 64, dtype=torch.bfloat16, device="cuda")
    out = fa.flash_attn_with_kvcache(q, cache.k, cache.v, k, k.clone(), cache_seqlens=lens, page_table=cache.table,
                                     causal=True)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()


def test_repeated_calls_reuse_plan_and_graph_replay():
    """A decode step captured in a CUDA graph and replayed with new contents matches eager calls."""
    import flash_attn_4_sm120 as fa

    cache = Cache(4, 256, 2, 128, 128, page_size=16)
    lens = torch.tensor([10, 50, 100, 3], dtype=torch.int32, device="cuda")
    q = torch.randn(4, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(4, 1, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(4, 1, 2, 128, dtype=torch.bfloat16, device="cuda")
    cos, sin = rotary_tables(512, 64, torch.bfloat16)

    def step():
        return fa.flash_attn_with_kvcache(q, cache.k, cache.v, k, v, cos, sin, cache_seqlens=lens,
                                          block_table=cache.table, causal=True)

    step()  # compile and plan outside the capture
    k_ref, v_ref = cache.k.clone(), cache.v.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_graph = step()
    for it in range(3):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        lens.add_(1)
        cache.k.copy_(k_ref)
        cache.v.copy_(v_ref)
        graph.replay()
        got, k_graph = out_graph.clone(), cache.k.clone()
        cache.k.copy_(k_ref)
        cache.v.copy_(v_ref)
        want = step()
        torch.cuda.synchronize()
        assert torch.equal(got, want), f"replay {it} differs from the eager call"
        assert torch.equal(k_graph, cache.k)


def test_max_seqlen_k_is_ignored():
    """transformers' continuous batching passes max_seqlen_k=1 with a block table: it must not bound the keys
    (nor turn split-KV off); 0 must not read as "no keys"."""
    import flash_attn_4_sm120 as fa

    cache = Cache(2, 4096, 2, 128, 128, page_size=16)
    lens = torch.tensor([4000, 1500], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
    want = fa.flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=lens, block_table=cache.table)
    for hint in (1, 0, 10**6):
        got = fa.flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=lens, block_table=cache.table,
                                         max_seqlen_q=1, max_seqlen_k=hint)
        assert torch.equal(got, want), hint
