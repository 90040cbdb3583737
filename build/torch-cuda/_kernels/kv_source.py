"""Where a key block's K and V live in global memory, and the copies that bring them to shared memory
(arch-free building blocks).

The mainloops never index K or V themselves. Per CTA they hold a *source*, one sequence of the batch
narrowed to one KV head, which knows the sequence's length, and a *loader* built from it, which moves
key block ``n_block`` (keys ``[n_block * tile_n, (n_block + 1) * tile_n)`` of the sequence) into a
stage of the K/V buffers. Another addressing (e.g. paged K/V: a page table maps a block's rows to
physical rows) is another source whose loaders have the same methods; the mainloops stay as they are.

Source:
  * ``DenseKV.locate(mK, mV, batch, cu_seqlens_k, seqused_k, tma_k, tma_v, head_kv)``: K/V
    (batch, seqlen, heads, d), or packed (total, heads, d) with ``cu_seqlens_k``, capped by
    ``seqused_k`` (``seqlen_info.sequence_heads``); ``seqlen_k``. ``head(head_kv)`` narrows a source
    located without a head; ``blocks(tile_n, d, dv)`` cuts it into key blocks; ``cp_async(...)`` and
    ``tma(...)`` build the loaders of those blocks.

Loaders (the interface the mainloops use):
  * ``CpAsyncKV``, every MMA thread issues its share; the caller commits the cp.async groups and
    waits. ``load_k(n_block, stage, bounded, looked_up=False)``, ``load_v(...)``: ``bounded`` when
    the block may end past seqlen_k (the sequence's last block); K rows past it are not read (their
    scores are masked), V rows past it are zero-filled (P is 0 there, but 0 * garbage could be NaN).
    ``lookahead(n_block)`` prepares a later unbounded load of that block (``looked_up=True``): a
    no-op for dense K/V, the page-table reads for paged K/V.
  * ``TmaKV``, one converged warp issues and every copy is counted on an mbarrier. ``load_k(n_block,
    stage, full)``, ``load_v(...)``, and ``issue(n_block, stage, full)``: expect both tiles' bytes
    (``k_bytes + v_bytes``), then both copies. TMA zero-fills rows past the tensor's seqlen and
    columns past its head dim, which is why it takes dense K/V only.
  * Both: ``padded(k_cols, v_cols)``, the loader that reads only the real head dims of tiles padded
    past them, and ``zero_k_padding(num_stages)``, which zeroes K's padded columns in every stage once
    (they are never loaded, and the padded part of every dot product must be 0).

Paged source:
  * ``PagedKV.locate(mK, mV, mPageTable, batch, seqused_k, page_size, head_kv)``: K/V caches
    (num_pages, page_size, heads, d) and the sequence's row of the page table (batch, max_pages): key
    j lives in row ``j % page_size`` of page ``page_table[batch, j // page_size]``. Its ``cp_async``
    loader (``PagedCpAsyncKV``) looks up each copy row's page as it issues the row, so any page size
    (1 to thousands of keys, not only multiples of tile_n) and any page order work; a block's rows may
    come from several pages. The sequence's length is ``seqused_k[batch]`` (else the table row's
    capacity, max_pages * page_size), clamped into that capacity, and every page index read from the
    table is clamped into ``[0, num_pages)``: a corrupt table gives wrong keys, never an access
    outside the caches. TMA reads whole boxes of one tensor, so paged K/V take the cp.async loader.

Sources and loaders are frozen dataclasses: the DSL carries an object through a dynamic ``if`` or loop
when one of its methods is called there, unless it is a frozen dataclass (read-only). A mainloop
therefore calls a loader through a local name (``kv = ctx.kv``), never through ``ctx``.

Partitions follow CuTe naming: ``tKgK`` (CPY, CPY_ROWS, CPY_COLS, n_blocks) is this thread's view of
every key block, ``tKsK`` (CPY, CPY_ROWS, CPY_COLS, stages) of every stage.
"""

from dataclasses import dataclass, replace
from typing import Any, Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from .seqlen_info import clamp, row_tile, sequence_heads
from .tile_io import column_predicate, copy_rows, zero_masked_cols


def make_tma_atoms(mK: cute.Tensor, mV: cute.Tensor, sK_layout, sV_layout, tile_n: int, head_dim: int,
                   head_dim_v: int):
    """Host side: (atom_K, tma_K, atom_V, tma_V), the TMA atoms for one (tile_n, d) tile of K / V and
    the tensors their coordinates index. ``sK_layout`` / ``sV_layout``: the stage buffers
    (tile_n, d, stages) as the TMA unit sees them."""
    op = cpasync.CopyBulkTensorTileG2SOp()
    out = []
    for m, layout, width in ((mK, sK_layout, head_dim), (mV, sV_layout, head_dim_v)):
        # (batch, seqlen, heads, d) -> (seqlen, d, heads, batch): the tile covers modes 0 and 1.
        view = cute.make_tensor(m.iterator, cute.select(m.layout, mode=[1, 3, 2, 0]))
        atom, tensor = cpasync.make_tiled_tma_atom(op, view, cute.select(layout, mode=[0, 1]), (tile_n, width))
        out += [atom, tensor]
    return tuple(out)


@dataclass(frozen=True)
class DenseKV:
    """K and V of sequence ``batch`` from its first key: ``mK_s`` / ``mV_s`` are (seqlen_k, heads_kv, d)
    views, or (seqlen_k, d) once narrowed to KV head ``head_kv``; ``blocks`` then cuts them into the
    key blocks the loaders read, ``gK`` / ``gV`` (tile_n, d, n_blocks) / (tile_n, dv, n_blocks).
    ``tma_k`` / ``tma_v``: (atom, tensor) from ``make_tma_atoms`` when the TMA loader is used."""

    batch: Any
    mK_s: cute.Tensor
    mV_s: cute.Tensor
    seqlen_k: Any
    tma_k: Optional[tuple] = None
    tma_v: Optional[tuple] = None
    head_kv: Any = None
    gK: Optional[cute.Tensor] = None
    gV: Optional[cute.Tensor] = None
    #: (tile_n, d, dv) of a key block
    block_shape: tuple = ()

    @staticmethod
    def locate(mK: cute.Tensor, mV: cute.Tensor, batch, mCuSeqlensK, mSeqUsedK, tma_k: Optional[tuple] = None,
               tma_v: Optional[tuple] = None, head_kv=None) -> "DenseKV":
        """The source for sequence ``batch`` of dense or packed K/V (``seqlen_info.sequence_heads``),
        narrowed to ``head_kv`` when given."""
        mK_s, seqlen_k = sequence_heads(mK, batch, mCuSeqlensK, mSeqUsedK)
        if const_expr(head_kv is not None):
            mK_s = mK_s[None, head_kv, None]
        mV_s, _ = sequence_heads(mV, batch, mCuSeqlensK, mSeqUsedK)
        if const_expr(head_kv is not None):
            mV_s = mV_s[None, head_kv, None]
        return DenseKV(batch, mK_s, mV_s, seqlen_k, tma_k, tma_v, head_kv)

    def head(self, head_kv) -> "DenseKV":
        """This source narrowed to KV head ``head_kv``."""
        return replace(self, mK_s=self.mK_s[None, head_kv, None], mV_s=self.mV_s[None, head_kv, None], head_kv=head_kv)

    def blocks(self, tile_n: int, head_dim: int, head_dim_v: int) -> "DenseKV":
        """This (narrowed) source cut into key blocks of ``tile_n`` keys, ``head_dim`` / ``head_dim_v``
        columns (padded head dims included)."""
        return replace(self, gK=cute.local_tile(self.mK_s, (tile_n, head_dim), (None, 0)),
                       gV=cute.local_tile(self.mV_s, (tile_n, head_dim_v), (None, 0)),
                       block_shape=(tile_n, head_dim, head_dim_v))

    def cp_async(self, tidx, sK: cute.Tensor, sV: cute.Tensor, g2s_k: cute.TiledCopy,
                 g2s_v: cute.TiledCopy) -> "CpAsyncKV":
        """Thread ``tidx``'s cp.async loader of the key blocks into ``sK`` (tile_n, d, stages) / ``sV``
        (tile_n, dv, stages), its share of ``g2s_k`` / ``g2s_v``; all columns (see
        ``CpAsyncKV.padded``)."""
        tile_n, head_dim, head_dim_v = self.block_shape
        gK, gV = self.gK, self.gV
        thr_k, thr_v = g2s_k.get_slice(tidx), g2s_v.get_slice(tidx)
        # (CPY, CPY_ROWS, CPY_COLS) coordinates within a block: this thread's and thread 0's (compile-time)
        cK = cute.make_identity_tensor((tile_n, head_dim))
        cV = cute.make_identity_tensor((tile_n, head_dim_v))
        tKcK, tVcV = thr_k.partition_S(cK), thr_v.partition_S(cV)
        return CpAsyncKV(
            g2s_k=g2s_k, g2s_v=g2s_v, seqlen_k=self.seqlen_k, tile_n=tile_n,
            tKgK=thr_k.partition_S(gK), tKsK=thr_k.partition_D(sK),  # (CPY, CPY_ROWS, CPY_COLS, n_blocks | stages)
            tVgV=thr_v.partition_S(gV), tVsV=thr_v.partition_D(sV),
            tKcK=tKcK, t0KcK=g2s_k.get_slice(0).partition_S(cK),
            tVcV=tVcV, t0VcV=g2s_v.get_slice(0).partition_S(cV),
        )

    def tma(self, sK: cute.Tensor, sV: cute.Tensor, dtype) -> "TmaKV":
        """The TMA loader of the key blocks into ``sK`` / ``sV`` (tile_n, d, stages), viewed with the
        layouts the atoms were made for."""
        tile_n, head_dim, head_dim_v = self.block_shape
        (atom_K, mK_tma), (atom_V, mV_tma) = self.tma_k, self.tma_v
        # (tile_n, d, n_blocks) in TMA coordinates
        gK = cute.local_tile(mK_tma[None, None, self.head_kv, self.batch], (tile_n, head_dim), (None, 0))
        gV = cute.local_tile(mV_tma[None, None, self.head_kv, self.batch], (tile_n, head_dim_v), (None, 0))
        # ((TMA, stages), (TMA, n_blocks))
        tKsK, tKgK = cpasync.tma_partition(atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        return TmaKV(atom_K=atom_K, atom_V=atom_V, tKgK=tKgK, tKsK=tKsK, tVgV=tVgV, tVsV=tVsV,
                     k_bytes=tile_n * head_dim * dtype.width // 8, v_bytes=tile_n * head_dim_v * dtype.width // 8)


@dataclass(frozen=True)
class PagedKV:
    """K and V of sequence ``batch`` in paged caches ``mK`` / ``mV`` (num_pages, page_size, heads_kv, d):
    ``pages`` is the sequence's row of the page table (max_pages,), ``seqlen_k`` its clamped length,
    ``page_size`` the compile-time keys per page (``FwdSpec.page_size``)."""

    batch: Any
    mK: cute.Tensor
    mV: cute.Tensor
    pages: cute.Tensor
    seqlen_k: Any
    page_size: int
    head_kv: Any = None
    #: (tile_n, d, dv) of a key block
    block_shape: tuple = ()

    @staticmethod
    def locate(mK: cute.Tensor, mV: cute.Tensor, mPageTable: cute.Tensor, batch, mSeqUsedK, page_size: int,
               head_kv=None) -> "PagedKV":
        """The source for sequence ``batch``: its table row, and its length capped by the row's capacity."""
        capacity = mPageTable.shape[1] * page_size
        seqlen_k = capacity
        if const_expr(mSeqUsedK is not None):
            seqlen_k = clamp(mSeqUsedK[batch], 0, capacity)
        return PagedKV(batch, mK, mV, mPageTable[batch, None], seqlen_k, page_size, head_kv)

    def head(self, head_kv) -> "PagedKV":
        return replace(self, head_kv=head_kv)

    def blocks(self, tile_n: int, head_dim: int, head_dim_v: int) -> "PagedKV":
        return replace(self, block_shape=(tile_n, head_dim, head_dim_v))

    def cp_async(self, tidx, sK: cute.Tensor, sV: cute.Tensor, g2s_k: cute.TiledCopy,
                 g2s_v: cute.TiledCopy) -> "PagedCpAsyncKV":
        """Thread ``tidx``'s cp.async loader of the key blocks into ``sK`` / ``sV`` (see ``DenseKV.cp_async``)."""
        tile_n, head_dim, head_dim_v = self.block_shape
        thr_k, thr_v = g2s_k.get_slice(tidx), g2s_v.get_slice(tidx)
        cK = cute.make_identity_tensor((tile_n, head_dim))
        cV = cute.make_identity_tensor((tile_n, head_dim_v))
        tKsK, tVsV = thr_k.partition_D(sK), thr_v.partition_D(sV)  # (CPY, CPY_ROWS, CPY_COLS, stages)
        return PagedCpAsyncKV(
            g2s_k=g2s_k, g2s_v=g2s_v, seqlen_k=self.seqlen_k, tile_n=tile_n,
            tKgK=None, tKsK=tKsK, tVgV=None, tVsV=tVsV,
            tKcK=thr_k.partition_S(cK), t0KcK=None, tVcV=thr_v.partition_S(cV), t0VcV=None,
            tidx=tidx, mK=self.mK, mV=self.mV, pages=self.pages, page_size=self.page_size, head_kv=self.head_kv,
            widths=(head_dim, head_dim_v),
            ahead_k=cute.make_rmem_tensor(cute.size(tKsK, mode=[1]), Int32),
            ahead_v=cute.make_rmem_tensor(cute.size(tVsV, mode=[1]), Int32),
        )

    def tma(self, sK: cute.Tensor, sV: cute.Tensor, dtype):
        raise TypeError("paged K/V take the cp.async loader (config.fwd_config_problems refuses TMA for them)")


@dataclass(frozen=True)
class CpAsyncKV:
    """cp.async of key blocks into the K/V stages by one thread (see ``DenseKV.cp_async``). ``tKp`` /
    ``tVp``: column predicates of padded head dims (None: every column is read)."""

    g2s_k: cute.TiledCopy
    g2s_v: cute.TiledCopy
    seqlen_k: Any
    tile_n: int
    tKgK: cute.Tensor
    tKsK: cute.Tensor
    tVgV: cute.Tensor
    tVsV: cute.Tensor
    tKcK: cute.Tensor
    t0KcK: cute.Tensor
    tVcV: cute.Tensor
    t0VcV: cute.Tensor
    tKp: Optional[cute.Tensor] = None
    tVp: Optional[cute.Tensor] = None

    def padded(self, k_cols: Optional[int], v_cols: Optional[int]) -> "CpAsyncKV":
        """This loader reading only the first ``k_cols`` / ``v_cols`` columns (the real head dims of
        tiles padded past them; None: all)."""
        return replace(self, tKp=column_predicate(self.tKcK, k_cols) if const_expr(k_cols is not None) else None,
                       tVp=column_predicate(self.tVcV, v_cols) if const_expr(v_cols is not None) else None)

    @cute.jit
    def zero_k_padding(self, num_stages: cutlass.Constexpr[int]):
        """Zero this thread's K columns past the head dim in every stage (padded head dims only)."""
        if const_expr(self.tKp is not None):
            for j in cutlass.range_constexpr(num_stages):
                zero_masked_cols(self.tKsK[None, None, None, j], self.tKp)

    def lookahead(self, n_block):
        """Nothing: dense rows are addressed without a lookup (see ``PagedCpAsyncKV.lookahead``)."""

    @cute.jit
    def load_k(self, n_block: Int32, stage: Int32, bounded: cutlass.Constexpr[bool],
               looked_up: cutlass.Constexpr[bool] = False):
        """K of key block ``n_block`` into stage ``stage``; ``bounded``: rows past seqlen_k are not read.
        ``looked_up``: ``lookahead(n_block)`` ran (paged loaders use its registers; nothing here)."""
        self.copy_block(self.g2s_k, self.tKgK[None, None, None, n_block], self.tKsK[None, None, None, stage],
                        self.tKcK, self.t0KcK, self.tKp, n_block, bounded, zero_fill=False)

    @cute.jit
    def load_v(self, n_block: Int32, stage: Int32, bounded: cutlass.Constexpr[bool],
               looked_up: cutlass.Constexpr[bool] = False):
        """V of key block ``n_block`` into stage ``stage``; ``bounded``: rows past seqlen_k are zeroed."""
        self.copy_block(self.g2s_v, self.tVgV[None, None, None, n_block], self.tVsV[None, None, None, stage],
                        self.tVcV, self.t0VcV, self.tVp, n_block, bounded, zero_fill=True)

    @cute.jit
    def copy_block(self, g2s: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor, tXcX: cute.Tensor,
                   t0XcX: cute.Tensor, col_pred, n_block: Int32, bounded: cutlass.Constexpr[bool],
                   zero_fill: cutlass.Constexpr[bool]):
        """One block ``src`` (CPY, CPY_ROWS, CPY_COLS) into one stage ``dst``; ``bounded``: only rows
        below seqlen_k are read, the others zeroed with ``zero_fill``."""
        if const_expr(bounded):
            copy_rows(g2s, src, dst, t0XcX, self.seqlen_k - n_block * self.tile_n - tXcX[0][0], zero_fill, col_pred)
        else:
            cute.copy(g2s, src, dst, pred=col_pred)


@dataclass(frozen=True)
class TmaKV:
    """TMA of key blocks into the K/V stages (see ``DenseKV.tma``), issued by one whole warp: the DSL's
    TMA copy elects its issuing lane with elect.sync, which needs the warp converged. ``k_bytes`` /
    ``v_bytes``: what one K / V tile brings in (what its full barrier expects)."""

    atom_K: Any
    atom_V: Any
    tKgK: cute.Tensor
    tKsK: cute.Tensor
    tVgV: cute.Tensor
    tVsV: cute.Tensor
    k_bytes: int
    v_bytes: int

    def padded(self, k_cols: Optional[int], v_cols: Optional[int]) -> "TmaKV":
        """This loader: TMA reads no column past the tensor's head dim."""
        return self

    def zero_k_padding(self, num_stages: int):
        """Nothing: TMA writes zeros into the columns past the tensor's head dim."""

    @cute.jit
    def load_k(self, n_block: Int32, stage: Int32, full):
        """K of key block ``n_block`` into stage ``stage``, counted on mbarrier ``full``."""
        cute.copy(self.atom_K, self.tKgK[None, n_block], self.tKsK[None, stage], tma_bar_ptr=full)

    @cute.jit
    def load_v(self, n_block: Int32, stage: Int32, full):
        """V of key block ``n_block`` into stage ``stage``, counted on mbarrier ``full``."""
        cute.copy(self.atom_V, self.tVgV[None, n_block], self.tVsV[None, stage], tma_bar_ptr=full)

    @cute.jit
    def issue(self, n_block: Int32, stage: Int32, full):
        """K and V of key block ``n_block`` into stage ``stage``, ``full`` expecting both tiles' bytes."""
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(full, self.k_bytes + self.v_bytes)
        self.load_k(n_block, stage, full)
        self.load_v(n_block, stage, full)


@dataclass(frozen=True)
class PagedCpAsyncKV(CpAsyncKV):
    """cp.async of key blocks gathered from a paged cache by one thread (see ``PagedKV``): each of the
    thread's copy rows is key ``n_block * tile_n + row``, found in its page as the row is issued."""

    tidx: Any = None
    mK: Optional[cute.Tensor] = None
    mV: Optional[cute.Tensor] = None
    pages: Optional[cute.Tensor] = None
    page_size: int = 1
    head_kv: Any = None
    #: padded (d, dv): the columns one row's copy covers
    widths: tuple = ()
    #: (CPY_ROWS,) Int32 registers: the pages of the K / V copy rows of the block ``lookahead`` last read
    ahead_k: Optional[cute.Tensor] = None
    ahead_v: Optional[cute.Tensor] = None

    @cute.jit
    def lookahead(self, n_block: Int32):
        """Read the pages of key block ``n_block``'s copy rows (a whole block: every key below seqlen_k)
        into registers, one step before its copies are issued: ``load_k`` / ``load_v`` with ``looked_up``
        then issue cp.async at once instead of waiting on the table read (a dependent global load), so
        the lookup's latency hides behind the step's MMAs and softmax."""
        first_key = n_block * self.tile_n
        for regs, tXcX, mX in ((self.ahead_k, self.tKcK, self.mK), (self.ahead_v, self.tVcV, self.mV)):
            for m in cutlass.range_constexpr(cute.size(regs)):
                regs[m] = self.page_of(mX, first_key + tXcX[0, m, 0][0])

    @cute.jit
    def page_of(self, mX: cute.Tensor, key):
        """The page holding key ``key`` (< seqlen_k), clamped into the cache."""
        return clamp(self.pages[key // self.page_size], 0, mX.shape[0] - 1)

    @cute.jit
    def load_k(self, n_block: Int32, stage: Int32, bounded: cutlass.Constexpr[bool],
               looked_up: cutlass.Constexpr[bool] = False):
        """K of key block ``n_block`` into stage ``stage``; ``bounded``: rows past seqlen_k are not read;
        ``looked_up``: the pages come from ``lookahead(n_block)``'s registers."""
        self.gather_block(self.g2s_k, self.mK, self.widths[0], self.tKsK[None, None, None, stage], self.tKcK,
                          self.tKp, n_block, bounded, zero_fill=False, ahead=self.ahead_k if const_expr(looked_up) else None)

    @cute.jit
    def load_v(self, n_block: Int32, stage: Int32, bounded: cutlass.Constexpr[bool],
               looked_up: cutlass.Constexpr[bool] = False):
        """V of key block ``n_block`` into stage ``stage``; ``bounded``: rows past seqlen_k are zeroed."""
        self.gather_block(self.g2s_v, self.mV, self.widths[1], self.tVsV[None, None, None, stage], self.tVcV,
                          self.tVp, n_block, bounded, zero_fill=True, ahead=self.ahead_v if const_expr(looked_up) else None)

    @cute.jit
    def gather_block(self, g2s: cute.TiledCopy, mX: cute.Tensor, width: cutlass.Constexpr[int], dst: cute.Tensor,
                     tXcX: cute.Tensor, col_pred, n_block: Int32, bounded: cutlass.Constexpr[bool],
                     zero_fill: cutlass.Constexpr[bool], ahead=None):
        """This thread's rows of key block ``n_block`` from their pages into ``dst`` (CPY, CPY_ROWS,
        CPY_COLS); ``bounded``: rows at or past seqlen_k are not read (zeroed with ``zero_fill``);
        ``ahead``: the rows' pages, read by ``lookahead`` (else looked up here)."""
        thr = g2s.get_slice(self.tidx)
        first_key = n_block * self.tile_n
        for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
            key = first_key + tXcX[0, m, 0][0]
            if const_expr(bounded):
                if key < self.seqlen_k:
                    self.copy_row(g2s, thr, mX, width, dst, col_pred, m, key, self.page_of(mX, key))
                else:
                    if const_expr(zero_fill):
                        dst[None, m, None].fill(0)
            else:
                page = ahead[m] if const_expr(ahead is not None) else self.page_of(mX, key)
                self.copy_row(g2s, thr, mX, width, dst, col_pred, m, key, page)

    @cute.jit
    def copy_row(self, g2s: cute.TiledCopy, thr, mX: cute.Tensor, width: cutlass.Constexpr[int], dst: cute.Tensor,
                 col_pred, m: cutlass.Constexpr[int], key, page):
        """Copy row ``m`` of this thread's share: key ``key`` (< seqlen_k), row key % page_size of ``page``."""
        # that key's row repeated over a block (seqlen_info.row_tile): its copy row m holds this thread's addresses
        src = thr.partition_S(row_tile(mX[page, None, None, None], key % self.page_size, self.head_kv, self.tile_n,
                                       width))
        cute.copy(g2s, src[None, m, None], dst[None, m, None], pred=None if const_expr(col_pred is None) else col_pred[None, m, None])
