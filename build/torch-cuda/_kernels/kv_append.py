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

Work split: one warp per (row, head) of a job; lane l moves 8 elements (16 bytes) per pass: a row of up to
256 columns is one pass, up to 512 two. Grid (ceil(max rows x heads of a job / warps), 3 jobs, batch): a block past its
job's rows, or a job the spec does not have, returns at once.

Cache addressing: dense (batch_cache, seqlen_cache, heads_kv, d), sequence b in row
``cache_batch_idx[b]`` (else b); paged (num_pages, page_size, heads_kv, d), key j of sequence b in row
``j % page_size`` of page ``page_table[b, j // page_size]``.

FP8 caches (``AppendSpec.cache_dtype``): a new key / value is multiplied by the reciprocal of its (batch, KV
head) scale (``k_descale`` / ``v_descale``, FlashAttention-3's convention: the cache holds value / scale) in fp32,
after the rotary embedding, and rounded to the cache's type, saturating at its largest finite value.

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
#: the largest finite value of each FP8 cache type (quantized rows saturate there)
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _saturated(x, top):
    """``x`` (fp32 TensorSSA) clamped into [-top, top]."""
    return cute.where(x > top, cute.full_like(x, top), cute.where(x < -top, cute.full_like(x, -top), x))


class KVCacheAppend:
    """Appends new keys/values to a KV cache and applies the rotary embedding. Build with an
    ``AppendSpec`` and an execution model."""

    num_warps = 4

    def __init__(self, spec: AppendSpec, model: ExecutionModel):
        self.spec = spec
        self.model = model
        self.dtype = CUTLASS_DTYPES[spec.dtype]
        #: the caches' element type: ``dtype``, or the FP8 type new rows are quantized to
        self.cache_dtype = CUTLASS_DTYPES[spec.cache_dtype] if spec.cache_dtype else self.dtype

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
        mKDescale: Optional[cute.Tensor],
        mVDescale: Optional[cute.Tensor],
        stream: cuda.CUstream,
    ):
        """``max_rows``: the most (row, head) pairs any job has in one sequence (the grid's x extent in warps);
        ``mKDescale`` / ``mVDescale``: the FP8 caches' scales of new rows, (batch, heads_kv) fp32."""
        if const_expr(mKcache.element_type != self.cache_dtype):
            raise TypeError("the caches must have the spec's cache dtype")
        self.kernel(mQ, mQout, mKnew, mVnew, mKcache, mVcache, mPageTable, mCacheSeqlens, mBatchIdx, mLeftpad,
                    mRotarySeqlens, mCos, mSin, mCuSeqlensQ, mCuSeqlensNew, mUsedK, mKeyStart, mKDescale,
                    mVDescale).launch(
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
        mKDescale: Optional[cute.Tensor],
        mVDescale: Optional[cute.Tensor],
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
                                cache_end, rotary_base, lane, self.spec.head_dim, True, mKDescale)
            if job == 2:
                self.append_row(mVnew, mVcache, mPageTable, mBatchIdx, mCuSeqlensNew, mCos, mSin, batch, row,
                                cache_end, rotary_base, lane, self.spec.head_dim_v, False, mVDescale)

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
                   rotate: cutlass.Constexpr[bool], mDescale=None):
        """Row ``row`` ((new token, head) flattened) of sequence ``batch``'s new keys or values into its
        cache slot, rotated when ``rotate``, divided by ``mDescale[batch, head]`` for an FP8 cache; a slot outside
        the cache is skipped."""
        mNew_b, new_len = sequence_heads(mNew, batch, mCuSeqlensNew, None)
        heads = num_heads(mNew, self.spec.varlen_new)
        i, head = row // heads, row % heads
        pos = cache_end + i
        inv = None  # FP8 caches: 1 / scale, once per row (head < heads_kv: in bounds for every row)
        if const_expr(self.spec.cache_dtype is not None):
            inv = Float32(1.0) / Float32(mDescale[batch, head])
        if i < new_len and pos >= 0:
            if const_expr(self.spec.page_size > 0):
                slot = pos // self.spec.page_size
                if slot < mPageTable.shape[1]:
                    page = clamp(mPageTable[batch, slot], 0, mCache.shape[0] - 1)
                    self.move_row(mNew_b[i, head, None], mCache[page, pos % self.spec.page_size, head, None], mCos,
                                  mSin, rotary_base + i, lane, width, rotate, inv)
            else:
                if pos < mCache.shape[1]:
                    row0 = batch
                    if const_expr(self.spec.batch_idx):
                        row0 = clamp(mBatchIdx[batch], 0, mCache.shape[0] - 1)
                    self.move_row(mNew_b[i, head, None], mCache[row0, pos, head, None], mCos, mSin, rotary_base + i,
                                  lane, width, rotate, inv)

    @cute.jit
    def move_row(self, src: cute.Tensor, dst: cute.Tensor, mCos, mSin, pos, lane, width: cutlass.Constexpr[int],
                 rotate: cutlass.Constexpr[bool], inv=None):
        """One (width,) row from ``src`` to ``dst`` by a warp, rotated at position ``pos`` when ``rotate``
        and the spec has a rotary embedding; ``inv``: an FP8 ``dst``'s 1 / scale (``store_vec``)."""
        r = self.spec.rotary_dim if const_expr(rotate) else 0
        pc = clamp(pos, 0, mCos.shape[0] - 1) if const_expr(r > 0) else None
        for p in cutlass.range_constexpr((width + 32 * VEC - 1) // (32 * VEC)):  # a pass per 256 columns
            v = lane + 32 * p
            if const_expr(r == 0):
                if v < width // VEC:
                    self.copy_vec(src, dst, v, inv)
            else:
                if const_expr(self.spec.rotary_interleaved):
                    if v < r // VEC:
                        self.rotate_pairs(src, dst, mCos[pc, None], mSin[pc, None], v, inv)
                    else:
                        if v < width // VEC:
                            self.copy_vec(src, dst, v, inv)
                else:
                    half = r // 2 // VEC  # vectors per half of the rotated columns
                    if v < half:
                        self.rotate_halves(src, dst, mCos[pc, None], mSin[pc, None], v, half, inv)
                    else:
                        if v >= 2 * half and v < width // VEC:
                            self.copy_vec(src, dst, v, inv)

    @cute.jit
    def copy_vec(self, src: cute.Tensor, dst: cute.Tensor, v, inv=None):
        """Vector ``v`` (16 bytes) of a row, unchanged (or quantized into an FP8 ``dst``: ``store_vec``)."""
        if const_expr(inv is not None):
            self.store_vec(self.load_f32(src, VEC, v), dst, v, inv)
        else:
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
    def store_vec(self, x, dst: cute.Tensor, v, inv=None):
        """fp32 registers ``x`` (VEC,) rounded into vector ``v`` of ``dst``; with ``inv`` (an FP8 ``dst``), ``x *
        inv`` rounded to FP8, saturating at the largest finite value."""
        if const_expr(inv is not None):
            frag = cute.make_rmem_tensor(VEC, self.cache_dtype)
            top = Float32(FP8_MAX[self.spec.cache_dtype])
            frag.store(_saturated(x.load() * inv, top).to(self.cache_dtype))
        else:
            frag = cute.make_rmem_tensor(VEC, self.dtype)
            frag.store(x.load().to(self.dtype))
        cute.autovec_copy(frag, cute.local_tile(dst, (VEC,), (v,)))

    @cute.jit
    def rotate_halves(self, src: cute.Tensor, dst: cute.Tensor, cos: cute.Tensor, sin: cute.Tensor, v, half, inv=None):
        """GPT-NeoX: vector ``v`` of the first half with vector ``v + half`` of the second."""
        x1, x2 = self.load_f32(src, VEC, v), self.load_f32(src, VEC, v + half)
        c, s = self.load_f32(cos, VEC, v), self.load_f32(sin, VEC, v)
        y1 = cute.make_rmem_tensor(VEC, Float32)
        y2 = cute.make_rmem_tensor(VEC, Float32)
        y1.store(x1.load() * c.load() - x2.load() * s.load())
        y2.store(x1.load() * s.load() + x2.load() * c.load())
        self.store_vec(y1, dst, v, inv)
        self.store_vec(y2, dst, v + half, inv)

    @cute.jit
    def rotate_pairs(self, src: cute.Tensor, dst: cute.Tensor, cos: cute.Tensor, sin: cute.Tensor, v, inv=None):
        """GPT-J: the VEC // 2 adjacent pairs of vector ``v``, with cos/sin entries ``v * VEC // 2 + j``."""
        x = self.load_f32(src, VEC, v)
        c, s = self.load_f32(cos, VEC // 2, v), self.load_f32(sin, VEC // 2, v)
        y = cute.make_rmem_tensor(VEC, Float32)
        for j in cutlass.range_constexpr(VEC // 2):
            y[2 * j] = x[2 * j] * c[j] - x[2 * j + 1] * s[j]
            y[2 * j + 1] = x[2 * j] * s[j] + x[2 * j + 1] * c[j]
        self.store_vec(y, dst, v, inv)
