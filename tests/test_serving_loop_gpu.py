"""A continuous-batching serving loop over a paged KV cache (page size 16), as a serving engine drives it.

Four sequences share a pool of shuffled pages. The loop runs:
  1. a mixed prefill step: three prompts prefilled whole and one prompt's first chunk, in one packed call
     (cu_seqlens_q / cu_seqlens_k_new, every cache empty);
  2. a mixed step: the chunked prompt's second chunk while the other three decode one token each;
  3. decode steps captured once in a CUDA graph (static q / k / v / cache_seqlens buffers) and replayed
     with new contents, cache_seqlens advanced in place between replays, as engines do.
Every step's output is checked against fp32 attention over a dense copy of each sequence's keys (the
rotary embedding applied by the reference), and the cache's pages against that copy.
"""

import pytest
import torch

from reference import attention_ref, rotary_ref, rotary_tables

pytestmark = pytest.mark.gpu

HQ, HKV, D, PAGE = 8, 2, 128, 16


class Loop:
    def __init__(self, batch, max_len, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.max_pages = -(-max_len // PAGE)
        num_pages = batch * self.max_pages + 5
        self.table = torch.randperm(num_pages, generator=g)[: batch * self.max_pages].view(batch, -1)
        self.table = self.table.to(torch.int32).cuda()
        self.k_cache = torch.randn(num_pages, PAGE, HKV, D, generator=g).to(torch.bfloat16).cuda()  # stale contents
        self.v_cache = torch.randn(num_pages, PAGE, HKV, D, generator=g).to(torch.bfloat16).cuda()
        self.cos, self.sin = rotary_tables(max_len + 64, D, torch.bfloat16)
        self.keys = [torch.empty(0, HKV, D, dtype=torch.bfloat16, device="cuda") for _ in range(batch)]
        self.vals = [k.clone() for k in self.keys]

    def call(self, q, k, v, cache_seqlens, **kw):
        import flash_attn_4_sm120 as fa

        return fa.flash_attn_with_kvcache(q, self.k_cache, self.v_cache, k, v, self.cos, self.sin,
                                          cache_seqlens=cache_seqlens, block_table=self.table, causal=True,
                                          rotary_interleaved=False, **kw)

    def expect(self, b, q, k, v):
        """Append sequence b's new rows to the dense copy; the reference output of its q rows."""
        start = self.keys[b].shape[0]
        pos = start + torch.arange(q.shape[0], device="cuda")
        self.keys[b] = torch.cat((self.keys[b], rotary_ref(k, self.cos, self.sin, pos[: k.shape[0]], False)))
        self.vals[b] = torch.cat((self.vals[b], v))
        qr = rotary_ref(q, self.cos, self.sin, pos, False)
        ref, _ = attention_ref(qr[None], self.keys[b][None], self.vals[b][None], causal=True)
        pt, _ = attention_ref(qr[None], self.keys[b][None], self.vals[b][None], causal=True, upcast=False)
        return ref[0], pt[0]

    def check(self, b, got, ref, pt, what):
        err = (got.float() - ref.float()).abs().max().item()
        pt_err = (pt.float() - ref.float()).abs().max().item()
        assert err <= 2 * pt_err + 1e-4, f"{what}, sequence {b}: max|out-ref|={err:.3e}, pt {pt_err:.3e}"

    def check_pages(self):
        for b, keys in enumerate(self.keys):
            j = torch.arange(keys.shape[0], device="cuda")
            rows = self.table[b, j // PAGE].long() * PAGE + j % PAGE
            torch.testing.assert_close(self.k_cache.flatten(0, 1)[rows].float(), keys.float(), atol=0, rtol=1e-2)
            assert torch.equal(self.v_cache.flatten(0, 1)[rows], self.vals[b])


def packed_step(loop, q_lens, cache_lens, what):
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(q_lens), HQ, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(sum(q_lens), HKV, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(sum(q_lens), HKV, D, dtype=torch.bfloat16, device="cuda")
    lens = torch.tensor(cache_lens, dtype=torch.int32, device="cuda")
    out = loop.call(q, k, v, lens, cu_seqlens_q=cu, cu_seqlens_k_new=cu, max_seqlen_q=max(q_lens))
    torch.cuda.synchronize()
    for b in range(len(q_lens)):
        s = slice(cu[b].item(), cu[b + 1].item())
        if q_lens[b]:
            ref, pt = loop.expect(b, q[s], k[s], v[s])
            loop.check(b, out[s], ref, pt, what)


def test_continuous_batching_loop():
    prompts = [37, 5, 130, 64]  # sequence 2 prefills in two chunks of 80 and 50
    loop = Loop(len(prompts), max_len=256)
    packed_step(loop, [37, 5, 80, 64], [0, 0, 0, 0], "prefill step")
    packed_step(loop, [1, 1, 50, 1], [37, 5, 80, 64], "mixed chunk + decode step")
    loop.check_pages()

    # decode: static buffers, one capture, replays with new contents
    batch = len(prompts)
    q = torch.zeros(batch, 1, HQ, D, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(batch, 1, HKV, D, dtype=torch.bfloat16, device="cuda")
    v = torch.zeros_like(k)
    lens = torch.tensor([loop.keys[b].shape[0] for b in range(batch)], dtype=torch.int32, device="cuda")
    saved = (loop.k_cache.clone(), loop.v_cache.clone(), lens.clone())
    loop.call(q, k, v, lens)  # compile and plan outside the capture (it appends zeros: undone below)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loop.call(q, k, v, lens)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = loop.call(q, k, v, lens)
    loop.k_cache.copy_(saved[0])
    loop.v_cache.copy_(saved[1])
    lens.copy_(saved[2])
    for step in range(20):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        graph.replay()
        torch.cuda.synchronize()
        for b in range(batch):
            ref, pt = loop.expect(b, q[b], k[b], v[b])
            loop.check(b, out[b], ref, pt, f"decode replay {step}")
        lens.add_(1)
    loop.check_pages()
