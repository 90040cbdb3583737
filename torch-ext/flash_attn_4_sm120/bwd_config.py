"""Tile configurations of the backward kernels: one validity predicate, one table, pure host code.

The backward runs three kernels (``_kernels/bwd_preprocess``, ``bwd_multistage``, ``bwd_postprocess``).
Only the main one has a tile choice: ``BwdConfig`` (a query block of ``tile_m`` rows against a key block
of ``tile_n`` keys, ``num_warps`` warps, Q and dO stages, and how the warps split each of the three GEMM
shapes). ``bwd_config_problems`` is THE validity predicate: the table, the conformance gate and the
tests call it. ``BWD_TABLE`` is the dispatcher's choice per head-dim class (``BWD_TABLE_HEAVY`` for
specs with softcap or varlen where the class's tile has no registers to spare, ``BWD_TABLE_UNSPLIT``,
``BWD_TABLE_DROPOUT`` and ``BWD_TABLE_FALLBACK`` for specs the class's entry cannot run at all). The
per-call launch-order choices (group split, bands, the deterministic order) are ``bwd_schedule``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import product

from .config import BYTES_PER_ELEM, STATIC_SMEM_BYTES, rows_per_copy_pass
from .execution_model import CopyKind, ExecutionModel
from .problem import MAX_BWD_HEAD_DIM, BwdSpec

#: Query rows per sequence the fp32 workspaces (LSE2, D, the dQ accumulator) reserve in multiples of:
#: every sequence starts at a multiple of it (packed layouts add it once per sequence), so a query tile
#: of any allowed tile_m (a divisor) never reaches the next sequence's rows and needs no row check.
ROW_PAD = 128


@dataclass(frozen=True)
class BwdConfig:
    """One CTA = one key block (``tile_n`` keys) of one KV head; it walks the query blocks (``tile_m``
    rows) of every query head of the KV group."""

    tile_m: int
    tile_n: int
    num_warps: int = 8
    #: shared-memory stages of the Q and dO tiles (2: the next query block loads under this one's MMAs;
    #: 1: it loads after the step, exposed)
    stages_q: int = 2
    stages_do: int = 2
    #: warps along the queries for S = Q K^T and dP = dO V^T (the others split the keys)
    sdp_warps_m: int = 2
    #: warps along the keys for dV = P^T dO and dK = dS^T Q (the others split the head dim)
    dkv_warps_n: int = 4
    #: warps along the queries for dQ = dS K (the others split the head dim)
    dq_warps_m: int = 4
    #: dQ = dS K in this many head-dim slices, each reduced into the accumulator before the next: the
    #: transient dQ accumulator shrinks by the factor (d=256 on 4 warps spilled at 255 registers with one)
    dq_chunks: int = 1
    #: dK += dS^T Q and dV += P^T dO in this many head-dim slices per step, each with its own accumulator:
    #: only one slice's Q / dO operand fragments are live at a time (d=256 on 4 warps: a warp's 128 columns
    #: take 32 B-fragment registers per k-step, 64 with the next step's prefetch)
    dkv_chunks: int = 1
    #: two warp groups with roles (``_kernels/bwd_rolesplit``): group 0 computes S, P and dV, group 1 dP, dS
    #: and dK, each GEMM on 4 warps (32x32 S/dP warp tiles at 64x64), P handed over through shared memory
    #: with named barriers; dQ on all 8 warps. ``sdp_warps_m`` / ``dkv_warps_n`` then split 4 warps.
    role_split: bool = False
    #: the role split's dense step -> (query head, query block) through a FastDivmod divisor built once per CTA (a
    #: multiply-high) instead of a runtime division in each step's address math. A per-class choice, measured (H100,
    #: SM120 occupancy, 2026-11-26 / 27): d128's 64x64 role split 0.98-0.99x the backward's time with it (d128 full
    #: and causal, 8x2048, 2x4096 16/4); d96's 64x96 split 0.974-1.003x (4x4096 32/8, 2x4096 16/4, 8x2048 16/16,
    #: full and causal; a 64x64 split with two dO stages 1.01-1.02x slower) and d64's 64x128 split 1.04x (full)
    #: slower, so d64 keeps the division; block-sparse list entries always do (prefix-LM lists 1.05x slower)
    step_divisor: bool = False
    #: without a mask (``bwd_rotated_start``) key block n walks its query blocks from block n (mod their count)
    #: instead of from the first, so the head's CTAs do not add their dQ into one query block at once. A per-class
    #: choice, measured (H100, SM120 occupancy, 2026-11-26, same call): d64's 64x128 role split 0.97x the backward's
    #: time with it (4x4096 32/8 non-causal 255 / 257 -> 263 / 265 TFLOPS); d128's 64x64 split 1.02x slower (256 /
    #: 252 -> 250 / 249), so it keeps the common start
    rotated_start: bool = False
    #: the role split's S and dP GEMMs take their B operand (group 0: its warp's K rows, group 1: its V rows) from
    #: registers loaded once per CTA, and the V tile's shared memory then holds P and dS: 128 keys at d96 in 94 KB
    #: (Q 2 x 12, dO 12, K 24, V-or-P-and-dS 32) where the 64x128 split with a V tile needs 116 KB. A warp holds
    #: tile_n / (4 / sdp_warps_m) keys of it (``bwd_kv_regs``): one warp along the queries keeps that smallest
    kv_in_regs: bool = False

    @property
    def num_threads(self) -> int:
        return self.num_warps * 32

    @property
    def role_warps(self) -> int:
        """Warps of the S / dP and dK / dV GEMMs: one warp group each with the role split, else all."""
        return 4 if self.role_split else self.num_warps


def bwd_padded_head_dim(d: int, cfg: BwdConfig, qk: bool = True) -> int:
    """The smem/fragment width of head dim ``d`` (``qk``: Q/K's, else V/dO's): the smallest multiple of the
    MMA k-extent (16) that the warps' column splits divide (dK/dV: 16 per warp column per ``dkv_chunks``
    slice; dQ, for Q/K only: 16 per warp column per ``dq_chunks`` slice) and whose swizzle atom keeps one
    16-byte copy pass within the shortest copied tile (Q/dO: tile_m rows, K/V: tile_n). Every padded column
    is MMA work."""
    min_rows = min(cfg.tile_m, cfg.tile_n)
    step = 16 * max(1, cfg.role_warps // max(cfg.dkv_warps_n, 1)) * max(cfg.dkv_chunks, 1)
    if qk:
        dq_step = 16 * max(1, cfg.num_warps // max(cfg.dq_warps_m, 1)) * max(cfg.dq_chunks, 1)
        step = step * dq_step // math.gcd(step, dq_step)
    width = (d + step - 1) // step * step
    while rows_per_copy_pass(width, cfg.num_threads) > min_rows and width < 4 * MAX_BWD_HEAD_DIM:
        width += step
    return width


def bwd_kv_copy_threads(cfg: BwdConfig, d: int, dv: int) -> int:
    """Threads that move one of the K / V tiles (and dK / dV on the way out), at padded widths ``d`` and ``dv``:
    the whole CTA, or in the role split a warp group per tile (K and dK group 1's, V and dV group 0's) where the
    CTA's 16-byte copy pass spans more rows than the key tile has a multiple of (d96's 64x96 split: 64-row passes,
    96 keys; a group's pass is 32 rows)."""
    if cfg.role_split and any(cfg.tile_n % rows_per_copy_pass(w, cfg.num_threads) for w in (d, dv)):
        return cfg.num_threads // 2
    return cfg.num_threads


def _aligned(n: int) -> int:
    return (n + 1023) // 1024 * 1024


def bwd_tile_bytes(rows: int, cols: int) -> int:
    """Bytes of one 16-bit (rows x cols) shared-memory tile of the main kernel, 1024-aligned as its buffers are."""
    return _aligned(rows * cols * BYTES_PER_ELEM)


def bwd_v_region_bytes(cfg: BwdConfig, dv: int) -> int:
    """Bytes of the V tile's region at padded width ``dv``: the V tile, or with ``kv_in_regs`` the larger of it and
    the P and dS tiles that follow it there (V has gone to registers before the first P)."""
    v = bwd_tile_bytes(cfg.tile_n, dv)
    return max(v, 2 * bwd_tile_bytes(cfg.tile_m, cfg.tile_n)) if cfg.kv_in_regs else v


def bwd_smem_bytes(spec: BwdSpec, cfg: BwdConfig) -> int:
    """Dynamic shared memory of the main kernel: Q and dO stages, K, V, P and dS, each 1024-aligned (with
    ``kv_in_regs`` P and dS in V's region)."""
    d, dv = bwd_padded_head_dim(spec.head_dim, cfg), bwd_padded_head_dim(spec.head_dim_v, cfg, qk=False)
    e = BYTES_PER_ELEM
    p_ds = 0 if cfg.kv_in_regs else 2 * bwd_tile_bytes(cfg.tile_m, cfg.tile_n)
    return (_aligned(cfg.stages_q * cfg.tile_m * d * e) + _aligned(cfg.stages_do * cfg.tile_m * dv * e)
            + bwd_tile_bytes(cfg.tile_n, d) + bwd_v_region_bytes(cfg, dv) + p_ds)


def _sdp_key_share(cfg: BwdConfig) -> int:
    """Keys per warp of the S / dP MMA: ``tile_n`` over the role_warps / sdp_warps_m warps along the keys."""
    return cfg.tile_n // max(1, cfg.role_warps // max(cfg.sdp_warps_m, 1))


def bwd_group_scores(cfg: BwdConfig) -> int:
    """S (or dP) accumulator elements per thread of a role split's warp group: the tile over its ``role_warps`` warps
    (d64's 64x128 and d96's 64x128 splits: 64; d128's 64x96: 48; the 64x64 splits: 32)."""
    return cfg.tile_m * cfg.tile_n // (32 * cfg.role_warps)


def bwd_kv_regs(cfg: BwdConfig, d: int) -> int:
    """32-bit registers per thread of a ``kv_in_regs`` role split's B operand: its warp's share of the keys
    (``_sdp_key_share``) at padded width ``d``, two 16-bit elements a register."""
    return _sdp_key_share(cfg) * d // 64 if cfg.kv_in_regs else 0


def bwd_sdp_n_step(cfg: BwdConfig) -> int:
    """Columns per warp per step of the S / dP MMA: 16 (two n8 atoms, one ldmatrix.x4 of the B operand), or 8 where a
    ``kv_in_regs`` split's warp share of the keys is not a 16-multiple (d128's 64x96 split: 24 keys per warp on 1x4
    warps; its B operand is loaded once, by ldmatrix.x2)."""
    return 8 if cfg.kv_in_regs and _sdp_key_share(cfg) % 16 else 16


def _warp_split(out: list, what: str, rows: int, cols: int, warps_rows: int, num_warps: int, col_unit: int = 16) -> None:
    """A (rows x cols) GEMM tile split over warps: ``warps_rows`` along the rows (16 each per m16 atom), the
    rest along the columns (``col_unit`` each: two n8 atoms per ldmatrix.x4 of the B operand, or one)."""
    if warps_rows < 1 or num_warps % warps_rows:
        out.append(f"{what}: {warps_rows} warps along the rows does not divide {num_warps} warps")
        return
    warps_cols = num_warps // warps_rows
    if rows % (16 * warps_rows) or cols % (col_unit * warps_cols):
        out.append(f"{what}: a {rows}x{cols} tile does not split into {warps_rows}x{warps_cols} warps of "
                   f"{col_unit}-multiples")


def bwd_config_problems(spec: BwdSpec, cfg: BwdConfig, model: ExecutionModel) -> tuple[str, ...]:
    """Every reason ``cfg`` cannot run ``spec`` under ``model``; empty when valid."""
    out = []
    if spec.lowest_first and not (spec.deterministic and spec.causal and not spec.local):
        out.append("the lowest-first order is the deterministic mode's, under a causal mask without a window")
    if spec.rotated_turns and not (spec.deterministic and not (spec.causal or spec.local or spec.lowest_first)
                                   and spec.block_sparse is None):
        out.append("the rotated order is the deterministic mode's, without a mask, a window or block-sparse lists")
    if cfg.step_divisor and not cfg.role_split:
        # sm_120a gate, 2026-11-26: six 8-warp and 4-warp configs at 255 registers spilled with the divisor live
        out.append("the step divisor is the role split's (the 8-warp and 4-warp tiles spill with it)")
    if spec.block_sparse is not None:  # (the role split walks lists too; it refuses score_mods below)
        q_block, k_block = spec.block_sparse
        if q_block % cfg.tile_m or k_block % cfg.tile_n:
            out.append(f"block-sparse blocks ({q_block}, {k_block}) are not multiples of the tile ({cfg.tile_m}, "
                       f"{cfg.tile_n}): the backward's lists are in whole tiles")
        if spec.deterministic or spec.group_split > 1 or spec.varlen_q or spec.varlen_k:
            out.append("block sparsity walks host lists: no deterministic order (its counters expect every key "
                       "block of a query block), no group split, dense rows")
        # sm_120a gate, 2026-11-26: beside the walk, d64's 64x128 8-warp and 64x64 4-warp tiles (32 S registers
        # per thread) spilled 16 B; d256's class tile with a mask_mod kept one local word (its fallback, dQ on
        # two warps along the rows, none)
        if cfg.tile_m * cfg.tile_n // cfg.num_threads >= 32:
            out.append("block sparsity beside S fragments of 32 or more registers per thread spills")
    if spec.dropout:
        # sm_120a gate, 2026-11-26 (keep flags drawn up front): 32 S registers per thread beside d64's dK / dV
        # (64 registers) fit; with the causal mask's limits beside them 24 B spilled, with softcap's tanh tile 56 B,
        # and beside d96's dK / dV (96) 56-88 B
        s_regs = cfg.tile_m * cfg.tile_n // cfg.num_threads
        dkv_regs = cfg.tile_n * (bwd_padded_head_dim(spec.head_dim, cfg) + bwd_padded_head_dim(spec.head_dim_v, cfg)) \
            // cfg.num_threads
        extra = spec.causal or spec.local or spec.softcap or spec.mods is not None
        # the role split draws the flags in group 0 only, beside its one S-sized tile, out of the group branch
        # (``sign_dropped``): sm_120a gate, 2026-11-26, d40-d64 on the 64x128 role split, full, causal, a window or
        # deterministic: 243-255 registers, no local memory in the shipped cubin
        if s_regs >= 32 and (extra or s_regs + dkv_regs > 96) and not cfg.role_split:
            out.append(f"dropout beside {s_regs} S registers per thread and an element mask, softcap or mods, or "
                       f"{dkv_regs} dK / dV accumulator registers, spills")
    # d256's class tile (dQ on one warp along the rows) kept one local word beside the walk and a mask_mod, and beside
    # dropout's keep flags; its fallback (two warps) none
    heavy = None
    if spec.dropout:
        heavy = "dropout"
    elif spec.block_sparse is not None and spec.mods is not None:
        heavy = "block sparsity with mods"
    if heavy and max(spec.head_dim, spec.head_dim_v) > 192 and cfg.dq_warps_m < 2:
        out.append(f"{heavy} at head dims over 192 needs dQ on two warps along the rows (dq_warps_m=2): the class "
                   f"tile's one spills")
    if cfg.num_warps not in (4, 8):
        out.append(f"num_warps={cfg.num_warps} (4 or 8 supported)")
    if ROW_PAD % cfg.tile_m or cfg.tile_m % 16:
        out.append(f"tile_m={cfg.tile_m} must be a multiple of 16 dividing {ROW_PAD} (the workspaces' row padding)")
    if cfg.tile_n % 16:
        out.append(f"tile_n={cfg.tile_n} is not a multiple of 16 (the k16 steps of dQ = dS K)")
    for name, stages in (("stages_q", cfg.stages_q), ("stages_do", cfg.stages_do)):
        if stages not in (1, 2):
            out.append(f"{name}={stages} (1 or 2 supported)")
    for name, d in (("head_dim", spec.head_dim), ("head_dim_v", spec.head_dim_v)):
        if d % 8 or not 8 <= d <= MAX_BWD_HEAD_DIM:
            out.append(f"{name}={d} is not a multiple of 8 in [8, {MAX_BWD_HEAD_DIM}] (16-byte rows)")
    if out:
        return tuple(out)
    d, dv = bwd_padded_head_dim(spec.head_dim, cfg), bwd_padded_head_dim(spec.head_dim_v, cfg, qk=False)
    kv_threads = bwd_kv_copy_threads(cfg, d, dv)
    for name, width in (("head_dim", d), ("head_dim_v", dv)):
        rows, rows_n = rows_per_copy_pass(width, cfg.num_threads), rows_per_copy_pass(width, kv_threads)
        if cfg.tile_m % rows or cfg.tile_n % rows_n:
            out.append(f"{name} (smem width {width}) needs a tile_m of {rows}-row and a tile_n of {rows_n}-row "
                       f"multiples per copy pass; tile_m={cfg.tile_m}, tile_n={cfg.tile_n}")
    nw, rw = cfg.num_warps, cfg.role_warps
    if cfg.role_split:
        if nw != 8 or cfg.stages_q != 2 or cfg.dkv_chunks != 1:
            out.append("role_split needs 8 warps, a double-buffered Q tile and dkv_chunks=1")
        if d != dv:
            out.append(f"role_split keeps one dK-or-dV accumulator per thread: head dims {d} and {dv} (padded) "
                       f"must match")
        if spec.softcap:
            out.append("role_split: softcap's tanh tile lives in the S warp group, dS is formed in the other")
        if spec.mods is not None and spec.mods.score_mod is not None:
            out.append("role_split: score_mod's pre-mod scores live in the S warp group, dS is formed in the other")
    if cfg.kv_in_regs:
        if not cfg.role_split:
            out.append("kv_in_regs is the role split's (each group's one B operand in registers)")
        if spec.dropout and _sdp_key_share(cfg) % 8:
            # the keep flags come in 16-column atom pairs or one run of n8 atoms per warp (``dropout_mask.keep_flags``;
            # d128's 64x96 split: 24 keys per warp, ``RunKeepFlags``). (d96's 64x128 split holds them because group 1
            # reads P and the flags as one signed tile and the dropout words are read where used: sm_120a gate, no
            # local memory; reading them ahead spills 120-176 B)
            out.append(f"kv_in_regs: dropout's keep flags need a warp share of the keys in n8 atoms "
                       f"({_sdp_key_share(cfg)} keys per warp)")
        if spec.dropout and spec.deterministic and bwd_sdp_n_step(cfg) == 8:
            # sm_120a gate, 2026-11-27: d128's 64x96 split, causal, highest first: 56 B of local memory beside the
            # run's two Philox calls per m16 atom
            out.append("kv_in_regs: dropout's run of n8 atoms (two calls per m16 atom) beside the deterministic "
                       "mode's turn spills")
        if spec.dropout and (spec.varlen_q or spec.varlen_k):
            # sm_120a gate, 2026-11-27: d96's 64x128 split, causal, packed: one local word in the shipped SASS
            out.append("kv_in_regs: dropout's keep flags beside varlen's per-sequence addressing keep a local word")
        if spec.mods is not None:
            # sm_120a gate, 2026-11-27: d128's 64x96 split with a document mask_mod kept one local word
            out.append("kv_in_regs: a mask_mod's index arithmetic beside the K / V rows in registers spills")
        if spec.deterministic and not spec.lowest_first and (spec.varlen_q or spec.varlen_k):
            # sm_120a gate, 2026-11-27: d96's 64x128 split, causal, packed, highest first: one local word
            out.append("kv_in_regs: the highest-first counters beside varlen's per-sequence addressing keep a local "
                       "word")
    if spec.mods is not None and spec.mods.score_mod is not None and cfg.tile_m * cfg.tile_n // cfg.num_threads >= 32:
        # sm_120a gate, 2026-11-25: a softcap score_mod at d64 on the 64x128 8-warp tile spilled 256 B
        out.append("score_mod keeps the pre-mod scores beside S: S fragments of 32 or more registers per thread "
                   "spill; a tile with at most 16 (64x64 on 8 warps) serves it")
    if spec.group_split not in (1, *GROUP_SPLITS):
        out.append(f"group_split={spec.group_split} (1 or one of {GROUP_SPLITS})")
    if spec.group_split > 1 and spec.mods is not None and spec.mods.score_mod is not None and max(d, dv) > 192:
        # sm_120a gate, 2026-11-25: the d256 tile with the softcap score_mod runs at 255 registers unsplit and
        # spilled 32 B with the split's head arithmetic
        out.append("group_split beside a score_mod's pre-mod scores at head dims over 192 spills; the unsplit "
                   "kernel serves it")
    _warp_split(out, "S/dP", cfg.tile_m, cfg.tile_n, cfg.sdp_warps_m, rw, bwd_sdp_n_step(cfg))
    if cfg.dkv_chunks < 1 or d % cfg.dkv_chunks or dv % cfg.dkv_chunks:
        out.append(f"dkv_chunks={cfg.dkv_chunks} does not divide the head dims' smem widths {d}, {dv}")
    else:
        _warp_split(out, "dK", cfg.tile_n, d // cfg.dkv_chunks, cfg.dkv_warps_n, rw)
        _warp_split(out, "dV", cfg.tile_n, dv // cfg.dkv_chunks, cfg.dkv_warps_n, rw)
    if cfg.dq_chunks < 1 or d % cfg.dq_chunks:
        out.append(f"dq_chunks={cfg.dq_chunks} does not divide the head dim's smem width {d}")
    else:
        _warp_split(out, "dQ", cfg.tile_m, d // cfg.dq_chunks, cfg.dq_warps_m, nw)
    smem = bwd_smem_bytes(spec, cfg) + STATIC_SMEM_BYTES
    if smem > model.smem_per_cta:
        out.append(f"shared memory {smem} B (incl. {STATIC_SMEM_BYTES} B static) exceeds "
                   f"{model.smem_per_cta} B per CTA of the {model.name} model")
    # fp32 accumulators per thread live across the whole loop (dK, dV) or a step (S, dP, dQ)
    dq_regs = cfg.tile_m * d // max(cfg.dq_chunks, 1) // cfg.num_threads
    if cfg.role_split:
        # a thread holds dV or dK, and S or dP, which has gone to sP / sdS before dQ's tile starts (and with
        # kv_in_regs its K or V rows)
        acc_regs = (cfg.tile_n * d // (32 * rw) + max(cfg.tile_m * cfg.tile_n // (32 * rw), dq_regs)
                    + bwd_kv_regs(cfg, d))
    else:
        acc_regs = (cfg.tile_n * (d + dv) + 2 * cfg.tile_m * cfg.tile_n) // cfg.num_threads + dq_regs
    if acc_regs > 224:
        out.append(f"{acc_regs} accumulator registers per thread (dK + dV + S + dP + dQ) leave too few for operands")
    if spec.mods is not None and spec.mods.score_mod is not None and nw == 8 and acc_regs > 136:
        # sm_120a gate, 2026-11-29: a softcap score_mod at d192 keys / d128 values on the 64x64 8-warp tile (160
        # accumulator registers per thread) spilled 8 B; the 8-warp 32x64 tile (120-136) and d128's 64x64 fallback
        # (128) hold it. (The 4-warp d256 tile walks dK / dV and dQ in head-dim slices: its count is not comparable.)
        out.append(f"score_mod keeps the pre-mod scores beside {acc_regs} accumulator registers per thread of an "
                   f"8-warp tile (more than 136 spill)")
    if not model.supports(CopyKind.CP_ASYNC):
        out.append(f"the {model.name} model has no cp.async")
    if model.s2r_copy is not CopyKind.LDMATRIX:
        out.append(f"the {model.name} model has no ldmatrix")
    return tuple(out)


#: The main kernel's tile per head-dim class (the smallest class >= max(head_dim, head_dim_v)): tiles that fit
#: 101376 B (the byte arithmetic: docs/design-backward.md, "Budgets"), each the fastest measured at SM120 occupancy
#: on the H100 (the reasoning: docs/design-backward.md, "Tiles and the role split"):
#:
#: * d64: the 64x128 role split (128 keys per CTA, 91 KB), 1.30-1.42x the 4-warp 64x64 tile's speed, default and
#:   deterministic, at 4x4096 32/8 and 2x4096 16/4, full and causal (255 / 227 TFLOPS at 4x4096;
#:   ``deterministic_tiles_h100_2026-11-26.json.gz``).
#: * d96: the 64x128 role split with each group's S / dP B operand in registers (``kv_in_regs``: P and dS in V's
#:   shared memory, 94208 B): 0.82-0.93x the time of the 64x96 split with both operands in shared memory, full and
#:   causal, deterministic 1.06-1.21x its default; that split in turn takes 0.76-0.92x the 64x64 split's time
#:   (``deterministic_tiles_d96_h100_2026-11-27.json.gz``). 16x96 S warp tiles (sdp_warps_m=4) run 1.04-1.09x
#:   slower than 32x48; dK / dV on 4x1 warps instead of 2x2 0.98-1.01x (not taken).
#: * d128: the 64x96 role split with its K / V rows in registers (24 keys per warp: one n8 atom per warp step,
#:   ``bwd_sdp_n_step``; 98304 B): 0.86-0.93x the 64x64 split's time at 4x4096 32/8, 2x4096 16/4 and 8x2048
#:   16/16, full and causal; deterministic 1.04-1.28x its default
#:   (``deterministic_tiles_d128_h100_2026-11-27.json.gz``). The role split, each warp group running one of the two S-sized GEMMs on 32x32 warp tiles, beats the 8-warp
#:   tile by 20% (``tune_bwd_rolesplit_h100_2026-11-25.json.gz``).
#: * d160 (d129-d160): the 64x64 8-warp tile with single Q and dO stages (4x2 warps on S / dP, dK / dV and dQ: head
#:   dims pad to 32-column multiples; 97 KB at the padded 160). It takes 0.80-0.84x the time of the d192 class's
#:   32x64 tile, which ran these dims before, and runs 1.14-1.35x upstream's SM120 path (deterministic 1.04-1.23x its
#:   default) on 20 shapes of the off-grid sweep, d136-d160, at SM120 occupancy
#:   (H200, ``bwd_tile_ab_192_h200_2026-11-29.json``). Past d160 its Q, dO, K and V tiles alone exceed 101376 B.
#: * d192, d256: the 8- and 4-warp tiles ``benchmarks/tune_bwd.py`` picks (``tune_bwd_h100_2026-11-25.json.gz``).
BWD_TABLE = {
    64: BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2, role_split=True, rotated_start=True),
    96: BwdConfig(64, 128, 8, 2, 1, sdp_warps_m=1, dkv_warps_n=2, dq_warps_m=4, role_split=True, step_divisor=True,
                  kv_in_regs=True),
    128: BwdConfig(64, 96, 8, 2, 1, sdp_warps_m=1, dkv_warps_n=2, dq_warps_m=1, role_split=True, step_divisor=True,
                   kv_in_regs=True),
    160: BwdConfig(64, 64, 8, 1, 1, sdp_warps_m=4, dkv_warps_n=4, dq_warps_m=4),
    192: BwdConfig(32, 64, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2),
    256: BwdConfig(32, 32, 4, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=1, dq_chunks=2, dkv_chunks=2),
}

#: Specs that keep more registers live than the table's tile was chosen for: softcap (the tanh tile, S-sized), mods
#: and block sparsity. 4-warp d64 / d96 tiles spill with them; the role splits take softcap and score_mods not at all
#: (the predicate). Varlen is not heavy: the role splits hold it without spills, and these 8-warp tiles take 1.14-1.17x
#: the d64 role split's time and 1.35-1.36x the d96 one's on documents of 128-2048 tokens packed to 16384, 32/8
#: heads, SM120 occupancy (``varlen_tiles_h100_2026-11-27.json``).
BWD_TABLE_HEAVY = {
    64: BwdConfig(64, 128, 8, 2, 2, sdp_warps_m=2, dkv_warps_n=8, dq_warps_m=4),
    96: BwdConfig(64, 64, 8, 2, 2, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=4),
}

#: Plain specs (not heavy) a class's role split cannot run (head_dim != head_dim_v) where its heavy tile is not their
#: fastest: d96's 4-warp 64x64 tile (the 8-warp heavy tile takes 1.17x its time, causal 2x4096 16/4, ``tune_bwd_d64_d96_h100_2026-11-26.json.gz``; with dropout the predicate refuses it).
BWD_TABLE_UNSPLIT = {
    96: BwdConfig(64, 64, 4, 2, 2, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2),
}

#: Specs the class's entries cannot run (the predicate says why): at d128 the role split takes neither softcap
#: nor head_dim != head_dim_v nor mods; the 8-warp tile it replaced serves them. At d64 a score_mod (its pre-mod
#: scores kept beside S) needs smaller S fragments than either d64 entry has: the d96 heavy tile's shape. At d256
#: block sparsity with mods keeps a local word in the class tile; dQ split over two warps along the rows does not.
#: At d160 a score_mod (its pre-mod scores beside the 64x64 tile's accumulators) takes the d192 class's 32x64 tile.
BWD_TABLE_FALLBACK = {
    64: BwdConfig(64, 64, 8, 2, 2, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=4),
    128: BwdConfig(64, 64, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2),
    160: BwdConfig(32, 64, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2),
    # block sparsity with mods (the predicate says why): the class tile with dQ on two warps along the rows
    256: BwdConfig(32, 32, 4, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2, dq_chunks=2, dkv_chunks=2),
}


#: Specs a class's ``kv_in_regs`` entry cannot run (the predicate says which: dropout beside varlen or, where a warp's
#: key share is one run of n8 atoms, the deterministic mode; mask_mods, varlen in the highest-first deterministic
#: order), and those it runs slower (``_prefers_smem_operands``): the class's role split with both S / dP operands
#: read from shared memory (d96 64x96, 98304 B; d128 64x64: ``BWD_TABLE``'s comment).
BWD_TABLE_SMEM_OPERANDS = {
    96: BwdConfig(64, 96, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=4, role_split=True, step_divisor=True),
    128: BwdConfig(64, 64, 8, 2, 1, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=1, role_split=True, step_divisor=True),
}


#: Dropout specs the class's entries cannot run: d64 block sparsity (a heavy spec: its 8-warp tile cannot hold the
#: keep flags beside 32 S registers per thread and the mask: the predicate's dropout rule) takes the 64x64 role split,
#: whose groups each hold one S-sized tile and one of dK / dV. The 64x128 role split holds the other d64 dropout
#: specs, causal, windowed and varlen included: it draws the flags in one group only (sm_120a gate: 250-255
#: registers, no local memory).
BWD_TABLE_DROPOUT = {
    64: BwdConfig(64, 64, 8, 2, 2, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2, role_split=True),
}


def _is_heavy(spec: BwdSpec) -> bool:
    # block sparsity: the walk's list reads beside the 4-warp d64 / d96 tiles spill 16-168 B (sm_120a gate,
    # 2026-11-26). Varlen is not heavy: the role splits hold it (sm_120a gate: 219-255 registers, no local memory)
    return spec.softcap or spec.mods is not None or spec.block_sparse is not None


#: The backward's head-dim classes: the forward's up to 256 and d160, where a 64x64 tile still fits beside Q, dO, K
#: and V 160 columns wide (the d192 class's does not).
BWD_HEAD_DIM_CLASSES = (64, 96, 128, 160, 192, 256)


def bwd_head_dim_class(spec: BwdSpec) -> int:
    d = max(spec.head_dim, spec.head_dim_v)
    return next(c for c in BWD_HEAD_DIM_CLASSES if d <= c)


def _prefers_smem_operands(spec: BwdSpec, cfg: BwdConfig) -> bool:
    """Dropout on a causal or windowed walk where ``cfg`` is a ``kv_in_regs`` split whose warps draw their keys as one
    run of n8 atoms (``bwd_sdp_n_step`` 8: d128's 64x96, two Philox calls per m16 atom): the smem-operand split goes
    first. The run draws about 2.7x the calls of whole 32-column cells on every tile, masked or not; a full walk
    gains more from the split than it pays, a masked one, whose 64x64 smem-operand split already carries dropout
    at 1.17-1.19x its time without, does not. Measured (H100, SM120 occupancy, fwd+bwd with dropout 0.1, 32/8 heads,
    same call, two rounds, 2026-11-27): run split against the 64x64 split, full 4x4096 13.61 / 15.00 ms, 2x8192
    26.86 / 29.24 (-8 to -9%); causal 4x4096 7.37 / 7.10-7.25, 2x8192 14.04 / 13.73 (+2 to +4%)."""
    return spec.dropout and (spec.causal or spec.local) and bwd_sdp_n_step(cfg) == 8


@lru_cache(maxsize=None)
def select_bwd_config(spec: BwdSpec, model: ExecutionModel) -> BwdConfig:
    """The table's config for ``spec``: a heavy spec (softcap, mods, block sparsity) takes its class's ``BWD_TABLE_HEAVY``
    entry where there is one; a spec the chosen entry cannot run (a role-split entry and softcap) falls back to
    the other (a plain spec first to ``BWD_TABLE_UNSPLIT``'s, a dropout spec to ``BWD_TABLE_DROPOUT``'s; a spec a
    ``kv_in_regs`` entry has no registers for first to ``BWD_TABLE_SMEM_OPERANDS``'s, as does one it runs slower:
    ``_prefers_smem_operands``), then to
    ``BWD_TABLE_FALLBACK``'s. Raises if none fits (a table or predicate bug)."""
    cls = bwd_head_dim_class(spec)
    order = [BWD_TABLE[cls]] + ([BWD_TABLE_HEAVY[cls]] if cls in BWD_TABLE_HEAVY else [])
    if _is_heavy(spec):
        order.reverse()
    elif cls in BWD_TABLE_UNSPLIT:
        order.insert(1, BWD_TABLE_UNSPLIT[cls])
    if cls in BWD_TABLE_SMEM_OPERANDS:
        after = 0 if _prefers_smem_operands(spec, BWD_TABLE[cls]) else 1
        order.insert(order.index(BWD_TABLE[cls]) + after, BWD_TABLE_SMEM_OPERANDS[cls])
    if spec.dropout and cls in BWD_TABLE_DROPOUT:
        order.insert(1, BWD_TABLE_DROPOUT[cls])
    order += [BWD_TABLE_FALLBACK[cls]] if cls in BWD_TABLE_FALLBACK else []
    problems = []
    for cfg in order:
        problems = bwd_config_problems(spec, cfg, model)
        if not problems:
            return cfg
    raise ValueError(f"no valid backward config for {spec} on {model.name}: {'; '.join(problems)}")


#: Tiles the tuner may try per head-dim class besides the table's: (tile_m, tile_n, warps, stages_q,
#: stages_do, dq_chunks, dkv_chunks). Each is crossed with every warp split the predicate accepts. The d64
#: 64x64 single-stage, 32x64 and 64x32 tiles and the d96 32x32 and single-stage 32x64 / 64x32 ones (at the
#: splits that leave the head dim unpadded) need <= 50176 B, so an SM120 holds two CTAs of them per SM
#: (4 warps at <= 256 registers fit the register file twice).
BWD_TILE_CANDIDATES = {
    64: ((64, 128, 8, 2, 2, 1, 1), (64, 64, 8, 2, 2, 1, 1), (128, 64, 8, 2, 2, 1, 1), (64, 64, 4, 2, 2, 1, 1),
         (64, 64, 4, 1, 1, 1, 1), (32, 64, 4, 2, 2, 1, 1), (64, 32, 4, 2, 2, 1, 1)),
    96: ((64, 64, 8, 2, 2, 1, 1), (64, 64, 4, 2, 2, 1, 1), (64, 64, 8, 2, 1, 1, 1), (32, 64, 4, 2, 2, 1, 1),
         (32, 32, 4, 2, 1, 1, 1), (32, 64, 4, 1, 1, 1, 1), (64, 32, 4, 1, 1, 1, 1)),
    128: ((64, 64, 8, 2, 1, 1, 1), (64, 64, 4, 2, 1, 1, 1), (64, 64, 8, 1, 1, 1, 1), (32, 64, 4, 2, 2, 1, 1),
          (64, 32, 4, 2, 2, 1, 1), (32, 64, 4, 2, 2, 2, 1), (32, 64, 4, 2, 2, 2, 2)),
    160: ((64, 64, 8, 1, 1, 1, 1), (32, 64, 8, 2, 1, 1, 1), (32, 64, 8, 2, 1, 2, 1), (32, 32, 4, 2, 2, 2, 1)),
    192: ((32, 64, 8, 2, 1, 1, 1), (64, 64, 8, 1, 1, 1, 1), (32, 64, 8, 2, 1, 2, 1), (32, 64, 4, 2, 1, 2, 2),
          (32, 32, 4, 2, 2, 2, 1), (32, 32, 4, 2, 2, 2, 2), (16, 64, 4, 2, 2, 1, 1)),
    256: ((32, 32, 4, 2, 1, 2, 1), (32, 32, 4, 2, 1, 2, 2), (32, 32, 4, 2, 1, 4, 2), (16, 64, 8, 2, 1, 1, 1),
          (32, 32, 8, 2, 1, 1, 1), (16, 64, 4, 2, 2, 2, 2), (32, 32, 4, 2, 2, 2, 2)),
}


#: Role-split tiles (same tuple layout) the tuner may try.
BWD_ROLE_SPLIT_CANDIDATES = {
    64: ((64, 64, 8, 2, 2, 1, 1), (64, 128, 8, 2, 1, 1, 1)),
    96: ((64, 64, 8, 2, 2, 1, 1), (64, 64, 8, 2, 1, 1, 1), (64, 96, 8, 2, 1, 1, 1)),
    128: ((64, 64, 8, 2, 1, 1, 1),),
}

#: Role-split tiles (same tuple layout) the tuner may try with ``kv_in_regs``: P and dS in V's region leave room for
#: 128 keys at d96.
BWD_KV_REGS_CANDIDATES = {
    96: ((64, 128, 8, 2, 1, 1, 1),),
    128: ((64, 96, 8, 2, 1, 1, 1),),
}


def candidate_bwd_configs(spec: BwdSpec, model: ExecutionModel) -> list[BwdConfig]:
    """Configs the backward tuner may pick from for ``spec``: the class's candidate tiles with every warp
    split of the three GEMM shapes, filtered by the validity predicate (the conformance gate screens
    them for spills with ``--subset candidates``). The class's role-split entry's tile and split also come with
    and without the step divisor and the rotated start (the latter changes nothing under a mask)."""
    out = []
    cls = bwd_head_dim_class(spec)
    tiles = [(*t, False, False) for t in BWD_TILE_CANDIDATES[cls]]
    tiles += [(*t, True, False) for t in BWD_ROLE_SPLIT_CANDIDATES.get(cls, ())]
    tiles += [(*t, True, True) for t in BWD_KV_REGS_CANDIDATES.get(cls, ())]
    # the role split's step knobs are tried at the tile and split the class's entry has (tile first, then knobs)
    entry = BWD_TABLE.get(cls)
    entry = replace(entry, step_divisor=False, rotated_start=False) if entry is not None and entry.role_split else None
    for tm, tn, w, sq, sdo, ch, kch, rs, kvr in tiles:
        splits = [x for x in (1, 2, 4, 8) if x <= w]
        for sdp, dkv, dq in product(splits, splits, splits):
            base = BwdConfig(tm, tn, w, sq, sdo, sdp_warps_m=sdp, dkv_warps_n=dkv, dq_warps_m=dq, dq_chunks=ch,
                             dkv_chunks=kch, role_split=rs, kv_in_regs=kvr)
            knobs = (False, True) if base == entry else (False,)
            for div, rot in product(knobs, knobs):
                cfg = replace(base, step_divisor=div, rotated_start=rot)
                if not bwd_config_problems(spec, cfg, model):
                    out.append(cfg)
    return list(dict.fromkeys(out))


#: (head_dim, head_dim_v) pairs the conformance gate compiles per class: the class size and a padded one.
BWD_REPRESENTATIVE_HEAD_DIMS = {64: ((64, 64), (40, 40)), 96: ((96, 96), (72, 72)), 128: ((128, 128), (112, 112)),
                                160: ((160, 160), (144, 144)), 192: ((192, 192), (192, 128)),
                                256: ((256, 256), (200, 200))}


def dispatchable_bwd(model: ExecutionModel) -> list[tuple[BwdSpec, BwdConfig]]:
    """The (spec, config) pairs of the main backward kernel the conformance gate compiles: every class
    at its representative head dims, every mask, both dtypes; softcap, varlen and the deterministic mode
    at the class size, and a head_dim_v of half of it."""
    specs = []
    for dims in BWD_REPRESENTATIVE_HEAD_DIMS.values():
        for d, dv in dims:
            for dtype in ("bf16", "fp16"):
                for mask in ("full", "causal", "local"):
                    specs.append(BwdSpec(dtype, d, dv, causal=mask == "causal", local=mask == "local"))
        specs += _variant_specs(*dims[0], model)
    return [(spec, select_bwd_config(spec, model)) for spec in dict.fromkeys(specs)]


def _variant_specs(d: int, dv: int, model: ExecutionModel) -> list[BwdSpec]:
    """The gate's variants at (d, dv): softcap, varlen and the deterministic mode under every mask, a head_dim_v of
    half of it, the group splits, the heaviest layout, and the lowest-first order where the config admits it."""
    specs = []
    for mask in ("full", "causal", "local"):
        specs.append(BwdSpec("bf16", d, dv, causal=mask == "causal", local=mask == "local", softcap=True))
        specs.append(BwdSpec("bf16", d, dv, causal=mask == "causal", local=mask == "local", varlen_q=True,
                             varlen_k=True, seqused_q=True, seqused_k=True))
        specs.append(BwdSpec("bf16", d, dv, causal=mask == "causal", local=mask == "local", deterministic=True))
    specs.append(BwdSpec("bf16", d, dv, causal=True, varlen_q=True, varlen_k=True, deterministic=True))
    specs.append(BwdSpec("bf16", d, dv // 2, causal=True))  # head_dim != head_dim_v
    # the group splits of small GQA grids (each a compile-time divisor), and the heaviest layout split
    specs += [BwdSpec("bf16", d, dv, causal=True, group_split=s) for s in GROUP_SPLITS]
    heaviest = BwdSpec("bf16", d, dv, causal=True, varlen_q=True, varlen_k=True, seqused_q=True, seqused_k=True,
                       deterministic=True, softcap=True, group_split=2)
    specs.append(heaviest)
    # the deterministic mode's lowest-first order (``bwd_det_order``) where the class's config admits it: dense
    # whole and split, packed, and the heaviest layout
    lowest = [BwdSpec("bf16", d, dv, causal=True, deterministic=True, group_split=g) for g in (1, 2)]
    lowest += [BwdSpec("bf16", d, dv, causal=True, varlen_q=True, varlen_k=True, deterministic=True), heaviest]
    specs += [s for s in (replace(x, lowest_first=True) for x in lowest) if bwd_lowest_first_open(s, model)]
    # the deterministic mode's rotated order (no mask): dense whole and split, packed with seqused, softcap
    rotated = [BwdSpec("bf16", d, dv, causal=False, deterministic=True, rotated_turns=True, group_split=g)
               for g in (1, 2)]
    rotated.append(BwdSpec("bf16", d, dv, causal=False, varlen_q=True, varlen_k=True, seqused_q=True, seqused_k=True,
                           deterministic=True, softcap=True, rotated_turns=True))
    return specs + rotated


@lru_cache(maxsize=None)
def bwd_invariant_config(spec: BwdSpec, model: ExecutionModel) -> BwdConfig:
    """The batch-invariant backward's tile for ``spec``: the one the table picks for its heaviest layout (packed and
    capped Q and K, deterministic, highest first, unsplit), which serves every layout of the same options, so that a
    sequence's key blocks add in the same tiles whether its batch is dense or packed (the table alone sends some packed
    deterministic specs to another tile: ``BWD_TABLE_SMEM_OPERANDS``)."""
    heavy = replace(spec, varlen_q=True, varlen_k=True, seqused_q=True, seqused_k=True, deterministic=True,
                    lowest_first=False, group_split=1)
    cfg = select_bwd_config(heavy, model)
    problems = bwd_config_problems(spec, cfg, model)
    if problems:  # a table or predicate bug: the heaviest layout's tile must serve the lighter ones
        raise RuntimeError(f"the batch-invariant backward tile {cfg} does not serve {spec}: {'; '.join(problems)}")
    return cfg


def bwd_invariant_pairs(model: ExecutionModel) -> list[tuple[BwdSpec, BwdConfig]]:
    """The batch-invariant backward's (spec, tile) pairs the gate compiles: every class at its representative head
    dims, every mask, deterministic, dense, packed and capped, with softcap at the class size."""
    specs = []
    for dims in BWD_REPRESENTATIVE_HEAD_DIMS.values():
        for (d, dv), mask in product(dims, ("full", "causal", "local")):
            base = BwdSpec("bf16", d, dv, causal=mask == "causal", local=mask == "local", deterministic=True)
            specs += [base, replace(base, varlen_q=True, varlen_k=True),
                      replace(base, varlen_q=True, varlen_k=True, seqused_q=True, seqused_k=True)]
            if (d, dv) == dims[0]:
                specs.append(replace(base, softcap=True))
    return [(spec, bwd_invariant_config(spec, model)) for spec in dict.fromkeys(specs)]


def bwd_lowest_first_open(spec: BwdSpec, model: ExecutionModel) -> bool:
    """Whether the config ``spec``'s highest-first twin runs admits the lowest-first order (``backward.bwd_launch``
    asks it before it weighs that order)."""
    twin = replace(spec, lowest_first=False)
    return not bwd_config_problems(spec, select_bwd_config(twin, model), model)


#: The group splits the backward compiles (``BwdSpec.group_split``: a compile-time divisor), each in the gate.
GROUP_SPLITS = (2, 3, 4, 8)


def bwd_step_divisor(spec: BwdSpec, cfg: BwdConfig) -> bool:
    """Whether the main kernel finds a dense step's (query head, query block) with ``BwdConfig.step_divisor``'s
    FastDivmod divisor. Block-sparse list entries keep the division (with the divisor prefix-LM lists ran 1.05x
    slower, H100 at SM120 occupancy, 2026-11-26)."""
    return cfg.step_divisor and spec.block_sparse is None


def bwd_rotated_start(spec: BwdSpec, cfg: BwdConfig) -> bool:
    """Whether the main kernel's key block n walks its query blocks from block n (mod their count) instead of
    from the first (``BwdConfig.rotated_start``). Without a causal mask or a window every key block of a head
    visits every query block, and from the same start the head's CTAs, launched together, add their dQ into the
    same query block at once. Not with block-sparse lists (their own order), nor in deterministic mode (its
    counters give each query block's key blocks a fixed order of additions) unless in its rotated order
    (``BwdSpec.rotated_turns``), whose ranks follow the rotation."""
    if spec.rotated_turns:  # the deterministic mode's rotated order (BwdSpec.rotated_turns)
        return True
    return cfg.rotated_start and not (spec.causal or spec.local or spec.deterministic or spec.block_sparse is not None)


#: Key tiles of at least this many keys run in the banded longest-first order where the spec asks for it
#: (``bwd_banded``: causal masks and block-sparse lists).
BWD_BANDED_MIN_TILE_N = 64


def bwd_banded(spec: BwdSpec, cfg: BwdConfig) -> bool:
    """Whether the main kernel runs ``spec``'s key blocks in the banded longest-first order
    (``_kernels/tile_scheduler.KeyBlockScheduler``; ``BwdSpec.longest_first``). Tiles of fewer than
    ``BWD_BANDED_MIN_TILE_N`` keys keep the per-pair order: their CTAs are many and short (d256's 32x32 tile: 128
    key blocks per pair at 4096 keys), the model finds no imbalance to remove, the band rule took 1 there and bands
    of 2-16 ran 1.01-1.18x slower (``bwd_band_h100_2026-11-26.json``); and its varlen and group-split kernels,
    at 255 registers, spilled 8 B with the order's index arithmetic (sm_120a gate, 2026-11-26)."""
    return spec.longest_first and cfg.tile_n >= BWD_BANDED_MIN_TILE_N
