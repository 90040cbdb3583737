"""The trace-time state the forward kernel's parts hand each other (``fwd_multistage`` and its parts,
``fwd_tma``, ``fwd_persistent``).

Plain Python objects holding DSL values, built while the kernel is traced. None of them is carried
through a dynamic loop or branch: the DSL sees only the uses of their fields. The frozen ones are
built once and read; ``FwdTileState`` fills in as the kernel learns its tile (``update``).
"""

from dataclasses import dataclass, fields
from typing import Any, Optional

import cutlass.cute as cute
from cutlass import Int32


@dataclass(frozen=True)
class FwdSmem:
    """The CTA's shared memory (``FlashFwdMultistage.shared_tiles``)."""

    #: mbarriers of the TMA mainloops (full / empty per stage), None for cp.async
    bars: Any
    #: the softmax scale the ping-pong turns reload (``OverlappedMainloop.pass_turn``), None without ping-pong
    sScale: Optional[cute.Tensor]
    sQ: cute.Tensor  # (tile_m, d)
    sK: cute.Tensor  # (tile_n, d, stages)
    sV: cute.Tensor  # (tile_n, dv, stages)
    sO: cute.Tensor  # (tile_m, dv), over sQ's bytes
    sVt: cute.Tensor  # (dv, tile_n, stages): V^T, the B operand of P V
    #: FP8 K/V: the staging stages the copies land in, (tile_n, d | dv, stages) (``kv_dequant``); else None
    sK8: Optional[cute.Tensor] = None
    sV8: Optional[cute.Tensor] = None
    #: FP8 MMAs: 16-bit views (sQ, sK) of the FP8 tiles, which the ldmatrix copies read (``fwd_fp8_mma``); else None
    views16: Optional[tuple] = None
    #: a variant's own tensors (``FlashFwdMultistage.extra_smem_views``); else None
    extra: Optional[tuple] = None


@dataclass(eq=False)
class FwdTileState:
    """One thread's state for one tile: what its MMAs need (``FlashFwdMultistage.mma_context``), then the
    tile's coordinates, key-block ranges, loaders and score step (``kernel`` / ``persistent_tiles``)."""

    # -- the thread's MMAs, independent of the tile ---------------------------------------------
    tidx: Int32
    bars: Any
    sScale: Optional[cute.Tensor]
    tSrQ: cute.Tensor  # (MMA, MMA_M, MMA_K)
    tSrK: cute.Tensor  # (MMA, MMA_N, MMA_K)
    tOrVt: cute.Tensor  # (MMA, MMA_N, MMA_K)
    acc_O: cute.Tensor  # (MMA, MMA_M, MMA_N) fp32
    acc_O_rc: cute.Tensor  # acc_O as (rows, cols)
    tSsQ: cute.Tensor
    tSrQ_v: cute.Tensor
    tSsK: cute.Tensor
    tSrK_v: cute.Tensor
    tOsVt: cute.Tensor
    tOrVt_v: cute.Tensor
    s2r_q: cute.TiledCopy
    s2r_k: cute.TiledCopy
    s2r_v: cute.TiledCopy
    thr_mma: Any
    tScS_rc: cute.Tensor  # this thread's S coordinates as (rows, cols)
    t0ScS_rc: cute.Tensor  # thread 0's (compile-time)
    softmax: Any  # ``softmax.OnlineSoftmax``
    # -- the tile -------------------------------------------------------------------------------
    m_block: Optional[Int32] = None
    seqlen_q: Optional[Int32] = None
    seqlen_k: Optional[Int32] = None
    n_start: Optional[Int32] = None  # key blocks [n_start, n_end) ...
    n_end: Optional[Int32] = None
    n_unmasked_start: Optional[Int32] = None  # ... of which [n_unmasked_start, n_unmasked_end) need no mask
    n_unmasked_end: Optional[Int32] = None
    group: Optional[Int32] = None  # query heads per KV head when GQA rows are packed, else None
    tile_rows: Optional[Int32] = None  # the M extent of this (batch, head)
    head_kv: Optional[Int32] = None
    mQ_h: Optional[cute.Tensor] = None  # Q's (rows, heads, d) view of this sequence
    thr_qk: Any = None  # the Q copy's thread slice and its partitions (CPY, CPY_ROWS, CPY_COLS)
    tQgQ: Optional[cute.Tensor] = None
    tQsQ: Optional[cute.Tensor] = None
    tQcQ: Optional[cute.Tensor] = None
    t0QcQ: Optional[cute.Tensor] = None
    kv: Any = None  # the K/V loader (``kv_source``)
    slot_base: Any = None  # overlapped load slots count on across a persistent CTA's tiles
    walk: Any = None  # a block-sparse walk (``block_walk``), None for the dense range
    score: Any = None  # what S goes through before the softmax (``score_step.ScoreStep``)
    dropout: Any = None  # the keep mask of P (``dropout_mask.DropoutMask``), None without dropout
    v_descale: Any = None  # FP8 K/V: V's scale for this (batch, KV head), applied with O's normalization
    batch: Optional[Int32] = None  # (dropout: the mask's coordinates)
    head: Optional[Int32] = None
    num_heads: Optional[Int32] = None
    next_k: Any = None  # persistent tiles: the next tile's first K load (``NextTileLoad``)
    merge: Any = None  # warps on keys: (partial O, row statistics) smem views the warps merge in (``fwd_keysplit``)
    shadow: Any = None  # FP8 K/V widened in registers: the 16-bit-view fragments ldmatrix fills (K, V^T)
    exchange: Any = None  # warps sharing a row block: the P / row-statistic views and copies (``fwd_wide``)

    def update(self, **values) -> None:
        """Set the named fields (a name that is not a field is an error at trace time)."""
        names = {f.name for f in fields(self)}
        for name, value in values.items():
            if name not in names:
                raise AttributeError(f"FwdTileState has no field {name!r}")
            setattr(self, name, value)


@dataclass(frozen=True)
class EpilogueTarget:
    """Where a tile's O and LSE go (``FwdEpilogue``): the output tensors, the sequence layout and the tile's
    (batch, head, split)."""

    mO: cute.Tensor
    mLSE: cute.Tensor
    mCuSeqlensQ: Optional[cute.Tensor]
    mSeqUsedQ: Optional[cute.Tensor]
    batch: Int32
    head: Int32
    split: Any


@dataclass(frozen=True)
class PersistentArgs:
    """The kernel's parameters as ``FlashFwdPersistent.persistent_tiles`` reads them."""

    mQ: cute.Tensor
    mK: cute.Tensor
    mV: cute.Tensor
    mO: cute.Tensor
    mLSE: cute.Tensor
    scale_log2: Any
    softcap_scale: Any
    window_left: Int32
    window_right: Int32
    mSink: Optional[cute.Tensor]
    mCuSeqlensQ: Optional[cute.Tensor]
    mCuSeqlensK: Optional[cute.Tensor]
    mSeqUsedQ: Optional[cute.Tensor]
    mSeqUsedK: Optional[cute.Tensor]
    layouts: tuple  # (sQ, sK, sV, sO) layouts
    scheduler: Any
    tma_atom_K: Any
    mK_tma: Optional[cute.Tensor]
    tma_atom_V: Any
    mV_tma: Optional[cute.Tensor]
    num_m_blocks: Int32


@dataclass(frozen=True)
class TilePlan:
    """What a persistent CTA's tile is (``FlashFwdPersistent.tile_plan``)."""

    m_block: Int32
    head: Int32
    batch: Int32
    head_kv: Int32
    mQ_h: cute.Tensor
    seqlen_q: Int32
    seqlen_k: Int32
    ranges: tuple  # (n_start, n_unmasked_start, n_unmasked_end, n_end)
    kv_src: Any  # the K/V source of (batch, head_kv), cut into key blocks


@dataclass(frozen=True)
class NextTileLoad:
    """The next tile's first K load, started in this tile's tail turn (``FlashFwdPersistent.tail_hook``). It
    has the fields of ``FwdTileState`` that ``issue_first_k`` reads."""

    go: Int32  # 1 when the load is started
    n_start: Int32
    n_end: Int32
    bars: Any
    slot_base: Any
    kv: Any
