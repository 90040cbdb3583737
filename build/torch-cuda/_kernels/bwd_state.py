"""The trace-time state the backward main kernel's parts hand each other (``bwd_multistage``, ``bwd_walk``,
``bwd_rolesplit``).

Plain Python objects holding DSL values, built while the kernel is traced. None of them is carried
through a dynamic loop or branch: the DSL sees only the uses of their fields. The frozen ones are
built once and read; ``BwdTileState`` fills in as the kernel learns its key block (``update``).
"""

from dataclasses import dataclass, fields
from typing import Any, Optional

import cutlass.cute as cute
from cutlass import Int32


@dataclass(frozen=True)
class BwdSmemLayouts:
    """The shared-memory layouts of the CTA's tiles (``FlashBwdMultistage._setup``)."""

    sQ: Any  # (tile_m, d, stages_q)
    sdO: Any  # (tile_m, dv, stages_do)
    sK: Any  # (tile_n, d)
    sV: Any  # (tile_n, dv)
    sP: Any  # (tile_m, tile_n), also dS's


@dataclass(frozen=True)
class BwdSmem:
    """The CTA's tiles and their transposed views (``FlashBwdMultistage.shared_tiles``)."""

    sQ: cute.Tensor
    sdO: cute.Tensor
    sK: cute.Tensor
    sV: cute.Tensor
    sP: cute.Tensor
    sdS: cute.Tensor
    sQt: cute.Tensor  # (d, tile_m, stages_q)
    sdOt: cute.Tensor  # (dv, tile_m, stages_do)
    sKt: cute.Tensor  # (d, tile_n)
    sPt: cute.Tensor  # (tile_n, tile_m)
    sdSt: cute.Tensor  # (tile_n, tile_m)


@dataclass(frozen=True)
class MmaOperands:
    """One GEMM's operands for a thread (``FlashBwdMultistage.operands``): fragments A / B, their ldmatrix
    copies and the copies' smem partitions (stage modes kept), and the tiled MMA."""

    rA: cute.Tensor
    rB: cute.Tensor
    sA: cute.Tensor
    rA_v: cute.Tensor
    sB: cute.Tensor
    rB_v: cute.Tensor
    s2r_a: cute.TiledCopy
    s2r_b: cute.TiledCopy
    mma: cute.TiledMma


@dataclass(eq=False)
class BwdTileState:
    """One thread's state for one key block: its GEMMs' operands and accumulators (``mma_context``), then the
    key block's coordinates, lengths and walk (``kernel``)."""

    # -- the thread's GEMMs -----------------------------------------------------------------------
    thr_sdp: Any
    thr_dkv: Any
    thr_dq: Any
    S: Optional[MmaOperands] = None  # S = Q K^T
    dP: Optional[MmaOperands] = None  # dP = dO V^T
    dQ: Optional[MmaOperands] = None  # dQ = dS K
    dV: Optional[list] = None  # dV += P^T dO, one MmaOperands per head-dim slice
    dK: Optional[list] = None  # dK += dS^T Q, likewise
    acc_dV: Optional[list] = None  # fp32 accumulators, per slice
    acc_dK: Optional[list] = None
    r2s: Any = None  # P / dS register -> smem copy, its thread slice and partitions
    thr_r2s: Any = None
    tPsP: Optional[cute.Tensor] = None
    tdSsdS: Optional[cute.Tensor] = None
    tScS_rc: Optional[cute.Tensor] = None  # this thread's S coordinates as (rows, cols)
    t0ScS_rc: Optional[cute.Tensor] = None  # thread 0's (compile-time)
    rB: Optional[cute.Tensor] = None  # role split, ``kv_in_regs``: the group's K or V fragment for the walk
    acc_kv: Optional[cute.Tensor] = None  # role split: the group's dK or dV accumulator
    # -- the key block ----------------------------------------------------------------------------
    tidx: Optional[Int32] = None
    batch: Optional[Int32] = None
    head_kv: Optional[Int32] = None  # the dK / dV (partial) head this CTA writes
    group: Optional[Int32] = None  # query heads this CTA walks
    n_block: Optional[Int32] = None
    seqlen_q: Optional[Int32] = None
    seqlen_k: Optional[Int32] = None
    m_start: Optional[Int32] = None  # query blocks [m_start, m_start + num_m) see the key block
    num_m: Optional[Int32] = None
    mQ_s: Optional[cute.Tensor] = None  # Q's and dO's (rows, heads, d) views of the sequence
    mdO_s: Optional[cute.Tensor] = None
    window_left: Optional[Int32] = None
    window_right: Optional[Int32] = None
    scale_log2: Any = None
    softcap_scale: Any = None
    total_q: Optional[Int32] = None
    seqlen_info: Any = None  # the mods' ``flex_mods.SeqlenInfo``, None without mods
    dropout: Any = None  # the forward's keep mask, regenerated (``dropout_mask.DropoutMask``)
    rng_slot: Optional[cute.Tensor] = None
    num_heads: Optional[Int32] = None
    walk: Any = None  # a block-sparse walk (``block_walk.tile_walk``), None for the dense walk
    m_rotation: Optional[Int32] = None  # ``bwd_rotated_start``: the first query block's offset
    step_inner: Optional[Int32] = None  # the inner count of a dense step index
    step_div: Any = None  # its FastDivmod divisor (``bwd_step_divisor``)
    sK_out: Optional[cute.Tensor] = None  # where dK and dV go through shared memory (the freed K / V tiles)
    sV_out: Optional[cute.Tensor] = None

    def update(self, **values) -> None:
        """Set the named fields (a name that is not a field is an error at trace time)."""
        names = {f.name for f in fields(self)}
        for name, value in values.items():
            if name not in names:
                raise AttributeError(f"BwdTileState has no field {name!r}")
            setattr(self, name, value)
