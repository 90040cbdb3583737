"""KV-cache append and rotary embedding ahead of ``flash_attn_with_kvcache``'s attention (arch-free).

One launch does everything the attention needs done to its inputs first:
  * q (job 0, only with a rotary embedding): every (row, head) of q rotated into ``q_out`` at
    position ``base[b] + i`` (causal / local attention: row i is the i-th new token) or ``base[b]``
    (every row at the cache's end), where ``base`` is ``rotary_seqlens`` when given, else
    ``cache_seqlens``.
  * new k (job 1): row i of sequence b rotated at ``base[b] + i`` and written to the cache at key
    position ``cache_seqlens[b] + i``.
  * new v (job 2): written beside it, unrotated.
  * metadata (thread 0 of each sequence's first block): ``used_k[b] = cache_seqlens[b] + new_len[b] -
    leftpad[b]``, the keys the attention reads, and for a dense cache read through ``cache_batch_idx`` /
    ``cache_leftpad``, ``key_start[b] = cache_batch_idx[b] * seqlen_cache + leftpad[b]``, the sequence's
    first row in the cache viewed as packed (batch_cache * seqlen_cache, heads_kv, d) rows
    (``key_start[batch] = batch_cache * seqlen_cache``, the total, closes the offsets).

Rotary embedding (``AppendSpec.rotary_dim`` columns, fp32 arithmetic, rounded once): with cos/sin rows
``c``/``s`` of length rotary_dim / 2 at the position, GPT-NeoX halves (``rotary_interleaved=False``)
map ``(x[j], x[j + r/2])`` to ``(x[j] c[j] - x[j + r/2] s[j], x[j] s[j] + x[j + r/2] c[j])``; GPT-J pairs
(``True``) do the same to ``(x[2j], x[2j + 1])``. Columns past rotary_dim are copied.

Work split: one warp per (row, head) of a job; lane l moves 8 elements (16 bytes), so a row of up to
256 columns is one pass. Grid (ceil(max rows x heads of a job / warps), 3 jobs, batch): a block past its
job's rows, or a job the spec does not have, returns at once.

Cache addressing: dense (batch_cache, seqlen_cache, heads_kv, d), sequence b in row
``cache_batch_idx[b]`` (else b); paged (num_pages, page_size, heads_kv, d), key j of sequence b in row
``j % page_size`` of page ``page_table[b, j // page_size]``.

Bounds safety, as in the attention (``seqlen_info``): metadata is never trusted. Key positions outside
the cache (negative, at or past seqlen_cache, past the table row's pages) are not written; batch
indices and page entries are clamped into the cache; rotary positions into cos/sin's rows; packed
sequences into their tensors. Corrupt metadata writes wrong rows of the cache, never outside it.
"""

from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ..execution_model import ExecutionModel
from ..problem import MAX_HEAD_DIM, AppendSpec
from . import CUTLASS_DTYPES
from .grid_dependency import enter_grid
from .seqlen_info import clamp, num_heads, sequence_heads

#: elements one lane moves: a 16-byte vector of bf16 / fp16
VEC = 8


class KVCacheAppend:
    """Appends new keys/values to a KV cache and applies the rotary embedding. Build with an
    ``AppendSpec`` and an execution model."""

    num_warps = 4

    def __init__(self, spec: AppendSpec, model: ExecutionModel):
        self.spec = spec
        self.model = model
        self.dtype = CUTLASS_DTYPES[spec.dtype]

    @staticmethod
    def can_implement(spec: AppendSpec, model: ExecutionModel) -> tuple[str, ...]:
        problems = [f"{name}={d} is not a multiple of 8 in [8, {MAX_HEAD_DIM}]"
                    for name, d in (("head_dim", spec.head_dim), ("head_dim_v", spec.head_dim_v))
                    if d % VEC or not VEC <= d <= MAX_HEAD_DIM]
        if spec.rotary_dim and (spec.rotary_dim % (2 * VEC) or spec.rotary_dim > spec.head_dim):
            problems.append(f"rotary_dim={spec.rotary_dim} must be a multiple of {2 * VEC} and <= head_dim")
        if spec.page_size and spec.key_starts:
            problems.append("cache_batch_idx / cache_leftpad address a dense cache, not a paged one")
        return tuple(problems)

    @cute.jit
    def __call__(
        self,
        mQ: Optional[cute.Tensor],
        mQout: Optional[cute.Tensor],
        mKnew: Optional[cute.Tensor],
        mVnew: Optional[cute.Tensor],
        mKcache: cute.Tensor,
        mVcache: cute.Tensor,
        mPageTable: Optional[cute.Tensor],
        mCacheSeqlens: cute.Tensor,
        mBatchIdx: Optional[cute.Tensor],
        mLeftpad: Optional[cute.Tensor],
        mRotarySeqlens: Optional[cute.Tensor],
        mCos: Optional[cute.Tensor],
        mSin: Optional[cute.Tensor],
        mCuSeqlensQ: Optional[cute.Tensor],
        mCuSeqlensNew: Optional[cute.Tensor],
        mUsedK: cute.Tensor,
        mKeyStart: Optional[cute.Tensor],
        max_rows: Int32,
        stream: cuda.CUstream,
    ):
        """``max_rows``: the most (row, head) pairs any job has in one sequence (the grid's x extent in warps)."""
        if const_expr(mKcache.element_type != self.dtype):
            raise TypeError("the caches must have the spec's dtype")
        self.kernel(mQ, mQout, mKnew, mVnew, mKcache, mVcache, mPageTable, mCacheSeqlens, mBatchIdx, mLeftpad,
                    mRotarySeqlens, mCos, mSin, mCuSeqlensQ, mCuSeqlensNew, mUsedK, mKeyStart).launch(
            grid=(cute.ceil_div(max_rows, self.num_warps), 3, mCacheSeqlens.shape[0]),
            block=[self.num_warps * 32, 1, 1],
            use_pdl=self.model.has_pdl,
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        mQ: Optional[cute.Tensor],
        mQout: Optional[cute.Tensor],
        mKnew: Optional[cute.Tensor],
        mVnew: Optional[cute.Tensor],
        mKcache: cute.Tensor,
        mVcache: cute.Tensor,
        mPageTable: Optional[cute.Tensor],
        mCacheSeqlens: cute.Tensor,
        mBatchIdx: Optional[cute.Tensor],
        mLeftpad: Optional[cute.Tensor],
        mRotarySeqlens: Optional[cute.Tensor],
        mCos: Optional[cute.Tensor],
        mSin: Optional[cute.Tensor],
        mCuSeqlensQ: Optional[cute.Tensor],
        mCuSeqlensNew: Optional[cute.Tensor],
        mUsedK: cute.Tensor,
        mKeyStart: Optional[cute.Tensor],
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bx, job, batch = cute.arch.block_idx()
        enter_grid(self.model.has_pdl)  # the new k/v and q of a user kernel are complete from here on
        lane = tidx % 32
        row = bx * self.num_warps + tidx // 32
        cache_end = mCacheSeqlens[batch]
        rotary_base = cache_end
        if const_expr(self.spec.rotary_seqlens):
            rotary_base = mRotarySeqlens[batch]
        if bx == 0 and job == 0 and tidx == 0:
            self.write_metadata(mKnew, mKcache, mCacheSeqlens, mBatchIdx, mLeftpad, mCuSeqlensNew, mUsedK, mKeyStart,
                                batch)
        if const_expr(self.spec.rotary_dim > 0):
            if job == 0:
                mQ_b, seqlen_q = sequence_heads(mQ, batch, mCuSeqlensQ, None)
                mQo_b, _ = sequence_heads(mQout, batch, mCuSeqlensQ, None)
                heads = num_heads(mQ, self.spec.varlen_q)
                i, head = row // heads, row % heads
                if i < seqlen_q:
                    pos = rotary_base + i if const_expr(self.spec.rotary_q_per_row) else rotary_base
                    self.move_row(mQ_b[i, head, None], mQo_b[i, head, None], mCos, mSin, pos, lane,
                                  self.spec.head_dim, True)
        if const_expr(self.spec.new_kv):
            if job == 1:
                self.append_row(mKnew, mKcache, mPageTable, mBatchIdx, mCuSeqlensNew, mCos, mSin, batch, row,
                                cache_end, rotary_base, lane, self.spec.head_dim, True)
            if job == 2:
                self.append_row(mVnew, mVcache, mPageTable, mBatchIdx, mCuSeqlensNew, mCos, mSin, batch, row,
                                cache_end, rotary_base, lane, self.spec.head_dim_v, False)

    @cute.jit
    def write_metadata(self, mKnew, mKcache, mCacheSeqlens, mBatchIdx, mLeftpad, mCuSeqlensNew, mUsedK, mKeyStart,
                       batch):
        """``used_k[batch]`` and, for a dense cache read from per-sequence starts, ``key_start[batch]``."""
        used = mCacheSeqlens[batch]
        if const_expr(self.spec.new_kv):
            _, new_len = sequence_heads(mKnew, batch, mCuSeqlensNew, None)
            used = used + new_len
        if const_expr(self.spec.key_starts):
            seqlen_cache = mKcache.shape[1]
            start = Int32(0)
            if const_expr(self.spec.leftpad):
                start = clamp(mLeftpad[batch], 0, seqlen_cache)
                used = used - start
            row0 = batch
            if const_expr(self.spec.batch_idx):
                row0 = clamp(mBatchIdx[batch], 0, mKcache.shape[0] - 1)
            mKeyStart[batch] = row0 * seqlen_cache + start
            if batch == 0:
                mKeyStart[mCacheSeqlens.shape[0]] = mKcache.shape[0] * seqlen_cache
        mUsedK[batch] = cutlass.max(used, 0)

    @cute.jit
    def append_row(self, mNew: cute.Tensor, mCache: cute.Tensor, mPageTable, mBatchIdx, mCuSeqlensNew, mCos, mSin,
                   batch, row, cache_end, rotary_base, lane, width: cutlass.Constexpr[int],
                   rotate: cutlass.Constexpr[bool]):
        """Row ``row`` ((new token, head) flattened) of sequence ``batch``'s new keys or values into its
        cache slot, rotated when ``rotate``; a slot outside the cache is skipped."""
        mNew_b, new_len = sequence_heads(mNew, batch, mCuSeqlensNew, None)
        heads = num_heads(mNew, self.spec.varlen_new)
        i, head = row // heads, row % heads
        pos = cache_end + i
        if i < new_len and pos >= 0:
            if const_expr(self.spec.page_size > 0):
                slot = pos // self.spec.page_size
                if slot < mPageTable.shape[1]:
                    page = clamp(mPageTable[batch, slot], 0, mCache.shape[0] - 1)
                    self.move_row(mNew_b[i, head, None], mCache[page, pos % self.spec.page_size, head, None], mCos,
                                  mSin, rotary_base + i, lane, width, rotate)
            else:
                if pos < mCache.shape[1]:
                    row0 = batch
                    if const_expr(self.spec.batch_idx):
                        row0 = clamp(mBatchIdx[batch], 0, mCache.shape[0] - 1)
                    self.move_row(mNew_b[i, head, None], mCache[row0, pos, head, None], mCos, mSin, rotary_base + i,
                                  lane, width, rotate)

    @cute.jit
    def move_row(self, src: cute.Tensor, dst: cute.Tensor, mCos, mSin, pos, lane, width: cutlass.Constexpr[int],
                 rotate: cutlass.Constexpr[bool]):
        """One (width,) row from ``src`` to ``dst`` by a warp, rotated at position ``pos`` when ``rotate``
        and the spec has a rotary embedding."""
        r = self.spec.rotary_dim if const_expr(rotate) else 0
        if const_expr(r == 0):
            if lane < width // VEC:
                self.copy_vec(src, dst, lane)
        else:
            p = clamp(pos, 0, mCos.shape[0] - 1)
            if const_expr(self.spec.rotary_interleaved):
                if lane < r // VEC:
                    self.rotate_pairs(src, dst, mCos[p, None], mSin[p, None], lane)
                else:
                    if lane < width // VEC:
                        self.copy_vec(src, dst, lane)
            else:
                half = r // 2 // VEC  # vectors per half of the rotated columns
                if lane < half:
                    self.rotate_halves(src, dst, mCos[p, None], mSin[p, None], lane, half)
                else:
                    if lane >= 2 * half and lane < width // VEC:
                        self.copy_vec(src, dst, lane)

    @cute.jit
    def copy_vec(self, src: cute.Tensor, dst: cute.Tensor, v):
        """Vector ``v`` (16 bytes) of a row, unchanged."""
        frag = cute.make_rmem_tensor(VEC, self.dtype)
        cute.autovec_copy(cute.local_tile(src, (VEC,), (v,)), frag)
        cute.autovec_copy(frag, cute.local_tile(dst, (VEC,), (v,)))

    @cute.jit
    def load_f32(self, src: cute.Tensor, n: cutlass.Constexpr[int], v):
        """Vector ``v`` of ``n`` elements of ``src`` in fp32 registers."""
        frag = cute.make_rmem_tensor(n, src.element_type)
        cute.autovec_copy(cute.local_tile(src, (n,), (v,)), frag)
        out = cute.make_rmem_tensor(n, Float32)
        out.store(frag.load().to(Float32))
        return out

    @cute.jit
    def store_vec(self, x, dst: cute.Tensor, v):
        """fp32 registers ``x`` (VEC,) rounded into vector ``v`` of ``dst``."""
        frag = cute.make_rmem_tensor(VEC, self.dtype)
        frag.store(x.load().to(self.dtype))
        cute.autovec_copy(frag, cute.local_tile(dst, (VEC,), (v,)))

    @cute.jit
    def rotate_halves(self, src: cute.Tensor, dst: cute.Tensor, cos: cute.Tensor, sin: cute.Tensor, v, half):
        """GPT-NeoX: vector ``v`` of the first half with vector ``v + half`` of the second."""
        x1, x2 = self.load_f32(src, VEC, v), self.load_f32(src, VEC, v + half)
        c, s = self.load_f32(cos, VEC, v), self.load_f32(sin, VEC, v)
        y1 = cute.make_rmem_tensor(VEC, Float32)
        y2 = cute.make_rmem_tensor(VEC, Float32)
        y1.store(x1.load() * c.load() - x2.load() * s.load())
        y2.store(x1.load() * s.load() + x2.load() * c.load())
        self.store_vec(y1, dst, v)
        self.store_vec(y2, dst, v + half)

    @cute.jit
    def rotate_pairs(self, src: cute.Tensor, dst: cute.Tensor, cos: cute.Tensor, sin: cute.Tensor, v):
        """GPT-J: the VEC // 2 adjacent pairs of vector ``v``, with cos/sin entries ``v * VEC // 2 + j``."""
        x = self.load_f32(src, VEC, v)
        c, s = self.load_f32(cos, VEC // 2, v), self.load_f32(sin, VEC // 2, v)
        y = cute.make_rmem_tensor(VEC, Float32)
        for j in cutlass.range_constexpr(VEC // 2):
            y[2 * j] = x[2 * j] * c[j] - x[2 * j + 1] * s[j]
            y[2 * j + 1] = x[2 * j] * s[j] + x[2 * j + 1] * c[j]
        self.store_vec(y, dst, v)
