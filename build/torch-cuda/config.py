"""Tile configurations for the forward kernel: one validity predicate, one table, pure host code.

``fwd_config_problems`` is THE validity predicate: the heuristic, the conformance gate and the tests
all call it. ``FWD_TABLE`` is the dispatcher's choice per head dim; ``dispatchable_fwd`` enumerates
every (spec, config) the dispatcher can pick, for the conformance gate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .execution_model import ExecutionModel, Fp8MmaKind
from .problem import LATENT_ROPE_DIM, MAX_HEAD_DIM, FwdSpec

import json
import re
from functools import lru_cache
from itertools import product
from pathlib import Path
from typing import Optional

BYTES_PER_ELEM = 2  # bf16 / fp16 operands
#: 16-bit K/V buffers the MMAs read beside FP8 K/V's staging stages (``_kernels/kv_dequant.MMA_BUFFERS``)
FP8_KV_MMA_BUFFERS = 2
#: Most FP8 staging stages: a decode CTA is alone on its SM, and the keys its copies keep in flight set its
#: bandwidth (``_kernels/kv_dequant``)
FP8_KV_MAX_STAGES = 8
#: Head-dim classes of the tile table: a spec uses the smallest class >= max(head_dim, head_dim_v).
#: 96 splits the head dims 65-128 where the ping-pong tile's K/V block can double: at <= 96 columns a
#: 256x64 tile fits 99 KB (d80 284 / d96 399 TFLOPS full vs 238 / 307 for the best 4-warp tile, H100 at
#: SM120 occupancy, 2026-11-24), at 97-128 only 256x32 or 128x64 with Q in registers do.
HEAD_DIM_CLASSES = (64, 96, 128, 192, 256, 512)
#: A DSL kernel with dynamic smem also carries a 1024-byte static section (the dynamic block is
#: 1024-aligned); the conformance gate reads it from the cubin. The per-CTA budget covers both.
STATIC_SMEM_BYTES = 1024


#: Mainloop variants: "cp_async" (every MMA thread copies, CTA barrier per step), "tma" (one thread
#: issues TMA, full mbarriers, CTA barrier per step), "tma_ws" (a producer warp issues TMA; full and
#: empty mbarriers; no CTA barrier in the loop).
MAINLOOPS = ("cp_async", "tma", "tma_ws")
#: Bytes the TMA mainloops add for their mbarriers (one 1024-aligned slot ahead of the tiles).
MBARRIER_BYTES = 1024


@dataclass(frozen=True)
class FwdConfig:
    tile_m: int
    tile_n: int
    num_warps: int = 4
    #: K/V shared-memory stages: tiles in flight ahead of the one being consumed is num_stages - 1.
    num_stages: int = 2
    #: Keep Q's MMA fragments in registers for the whole mainloop instead of re-reading smem.
    q_in_regs: bool = False
    #: How K/V tiles reach shared memory (see ``MAINLOOPS``).
    mainloop: str = "cp_async"
    #: Issue the ldmatrix loads of k-step k+1 before the MMAs of step k (hides their latency at the
    #: cost of one k-step of operand registers; at 32 rows per warp and d=128 that decides whether
    #: ptxas fits 255 registers, differently per mask and loader, so the gate judges each entry).
    frag_prefetch: bool = True
    #: Software-pipeline each warp across key blocks: the S = Q K^T MMAs of block j are issued next to
    #: the P V MMAs of block j-1, so the softmax of block j (exp2, max, sums) runs while the tensor
    #: pipe works on P V instead of leaving it idle. Costs one P fragment (16-bit, tile_m x tile_n) of
    #: registers; K is loaded one block ahead of V in two buffers each (``num_stages`` = 2).
    overlap: bool = False
    #: Two warpgroups (``num_warps`` / 2 warps each, half the rows each) take turns at the tensor pipe:
    #: one issues its MMAs (P V of block j-1, S of block j) while the other runs its softmax, the
    #: alternation enforced by two named barriers, which also hand the K/V buffers back (no CTA barrier
    #: in the loop). With one CTA per SM (the model's 99 KB) this is the only way two warps per
    #: scheduler have independent work; it needs the overlapped step and the "tma" loader.
    pingpong: bool = False
    #: Persistent CTAs (ping-pong only): one CTA per SM walks the tiles in the grid's order. Each warp
    #: group loads its own Q rows of the next tile under the current tile's tail and stores its O rows
    #: straight from registers, and warp 0 starts the next tile's first K load as soon as the buffer is
    #: free, so a CTA's prologue and epilogue overlap its other group's MMAs instead of leaving the
    #: tensor pipe idle (at one CTA per SM nothing else covers them).
    persistent: bool = False
    #: mainloop="tma" without overlap: each warp hands a K/V stage back on the stage's "empty" mbarrier
    #: (warp 0 waits for all four before the refill) instead of a CTA barrier ending every step.
    mbarrier_release: bool = False
    #: How masked score entries become -inf (``mask.mask_scores``): one select per element (True), or a
    #: store under a condition, which ptxas compiles into chains of 64-bit register-pair selects (about
    #: 40% more instructions in a masked step; d64 causal +3-4% at 4096 tokens and +8-11% at 1024 with
    #: selects, 2026-11-23) but packs registers differently: the bf16 d96 ping-pong entry spills with
    #: selects and not without.
    mask_select: bool = True
    #: The warps share one 16-row tile of Q and split each key block between them (``_kernels/fwd_keysplit``):
    #: warp w computes S and P V for its own tile_n / num_warps keys with its own online softmax, and the warps'
    #: partial O and row statistics merge once, in shared memory, before the epilogue. For packed decode rows
    #: (seqlen_q x group <= 16): a 64-row tile there runs every MMA on 4x the rows it needs, and with FP8 K/V
    #: the MMA warps then bound the step (``decode_entry``).
    warps_on_keys: bool = False
    #: Warps that share each 16-row block of the tile (``_kernels/fwd_wide``): they split S's keys and O's columns,
    #: exchanging row maxima and P through shared memory, so each holds 1 / dv_warps of O's row block. For head
    #: dims past 256, where a whole 16-row O block (16 x dv fp32 per warp: 256 registers per thread at 512) does
    #: not fit a warp. 1: the warps split rows only.
    dv_warps: int = 1

    @property
    def uses_tma(self) -> bool:
        """K/V stages arrive by TMA (and the CTA carries mbarriers)."""
        return self.mainloop != "cp_async"

    @property
    def num_threads(self) -> int:
        return self.num_warps * 32


def atom_cols(width: int) -> int:
    """Columns of the swizzled smem atom for a tile ``width`` elements wide (64, 32 or 16)."""
    return 64 if width % 64 == 0 else (32 if width % 32 == 0 else 16)


def rows_per_copy_pass(width: int, num_threads: int) -> int:
    """Rows one pass of the 16-byte global->smem tiled copy covers: each atom row is read by
    ``atom_cols / 8`` threads. A tile shorter than this would be written past its end."""
    return num_threads * 8 // atom_cols(width)


def copied_tile_rows(cfg: "FwdConfig") -> int:
    """Rows of the shortest tile the threads' 16-byte tiled copy moves: Q and O (tile_m rows) always,
    K and V (tile_n rows) only in the cp.async mainloop; the TMA mainloops bring K/V by TMA boxes,
    which take any width."""
    return cfg.tile_m if cfg.uses_tma else min(cfg.tile_m, cfg.tile_n)


#: Widest TMA K/V row laid out in 16-column swizzle atoms (32-byte rows: one TMA box per 16 columns). Past
#: it the width goes to the next multiple of 32: same run, H100 at SM120 occupancy (2026-11-24), table
#: entries, 16-column atoms -> 32/64-column ones: d80 (80 -> 96) 2-4% slower, d112 (112 -> 128) 1-4% faster
#: causal and 1-4% slower full. A width past the head dim itself is refused to the TMA tiles
#: (``fwd_config_problems``: the box would span columns the K / V rows do not have).
MAX_WIDTH_16_COLUMN_ATOMS = 128


def padded_head_dim(d: int, cfg: "FwdConfig") -> int:
    """The smem/fragment width for head dim ``d``: a multiple of the MMA k-extent (16), widened to a
    multiple of 32 or 64 when a narrower swizzle atom would make one copy pass taller than a copied
    tile (e.g. d=200 with 32-row cp.async K tiles: 208 -> 224). Every padded column is MMA work (d=80
    computed as 96 costs a sixth of the tile's MMAs), so the TMA mainloops, whose K/V tiles no thread
    copies, widen only for Q/O, and for rows too wide for 16-column atoms (``MAX_WIDTH_16_COLUMN_ATOMS``)."""
    min_rows = copied_tile_rows(cfg)
    for multiple in (16, 32, 64):
        width = (d + multiple - 1) // multiple * multiple
        if cfg.uses_tma and atom_cols(width) == 16 and width > MAX_WIDTH_16_COLUMN_ATOMS:
            continue
        if rows_per_copy_pass(width, cfg.num_threads) <= min_rows:
            return width
    return width


def smem_head_dims(spec: FwdSpec, cfg: FwdConfig) -> tuple[int, int]:
    """(d, dv): the head dims as the forward lays them out in shared memory and in fragments, in elements. 16-bit
    tiles: ``padded_head_dim``. FP8 MMAs (``spec.fp8_mma``): twice the padded width of half the head dim, since
    the FP8 tiles are copied, swizzled and read by ldmatrix as 16-bit tiles of byte pairs; a multiple of 32, the
    FP8 MMA's k-extent."""
    if spec.fp8_mma:
        return 2 * padded_head_dim(spec.head_dim // 2, cfg), 2 * padded_head_dim(spec.head_dim_v // 2, cfg)
    return padded_head_dim(spec.head_dim, cfg), padded_head_dim(spec.head_dim_v, cfg)


def copy_width(spec: FwdSpec, d: int, cfg: FwdConfig) -> int:
    """The 16-bit width whose 16-byte copies move a head dim ``d`` tile (FP8 MMA tiles: half the FP8 width)."""
    return padded_head_dim(d // 2, cfg) if spec.fp8_mma else padded_head_dim(d, cfg)


def fwd_smem_bytes(spec: FwdSpec, cfg: FwdConfig) -> int:
    """Shared memory per CTA: Q tile (reused for O) + num_stages K and V tiles, each 1024-aligned."""
    d, dv = smem_head_dims(spec, cfg)

    def aligned(n: int) -> int:
        return (n + 1023) // 1024 * 1024

    fp8_stages = aligned(cfg.num_stages * cfg.tile_n * d) + aligned(cfg.num_stages * cfg.tile_n * dv)  # a byte each
    if spec.fp8_mma:  # a byte per Q / K / V element; O is bf16
        return aligned(max(cfg.tile_m * d, cfg.tile_m * dv * BYTES_PER_ELEM)) + fp8_stages
    q_or_o = max(cfg.tile_m * d, cfg.tile_m * dv) * BYTES_PER_ELEM
    if cfg.dv_warps > 1:  # + P (16-bit) and the row statistics the warps exchange (``wide_exchange_bytes``)
        v_stages = 0 if spec.latent_v else aligned(cfg.num_stages * cfg.tile_n * dv * BYTES_PER_ELEM)  # MLA: V in K
        return (aligned(q_or_o) + aligned(cfg.num_stages * cfg.tile_n * d * BYTES_PER_ELEM) + v_stages
                + aligned(wide_exchange_bytes(cfg)))
    if spec.kv_dtype and cfg.warps_on_keys:  # FP8 stages only, Q / O over the last (``keysplit_q_offset``)
        return fp8_stages
    stages = cfg.num_stages
    staging = 0
    if spec.kv_dtype:  # FP8 K/V: the stages the copies land in, two 16-bit buffers for the MMAs
        staging = fp8_stages
        stages = FP8_KV_MMA_BUFFERS
    return ((MBARRIER_BYTES if cfg.uses_tma else 0) + aligned(q_or_o) + aligned(stages * cfg.tile_n * d * BYTES_PER_ELEM)
            + aligned(stages * cfg.tile_n * dv * BYTES_PER_ELEM) + staging)


@lru_cache(maxsize=None)
def fwd_ctas_per_sm(spec: FwdSpec, cfg: FwdConfig, model: ExecutionModel) -> int:
    """CTAs of ``cfg`` one SM of ``model`` holds, by shared memory (the static section included).
    Memoized: the split-KV choice asks on every decode call."""
    return model.ctas_per_sm(fwd_smem_bytes(spec, cfg) + STATIC_SMEM_BYTES)


#: The fewest registers per thread a forward build is asked to fit in (``fwd_min_ctas_per_sm``) per 16
#: accumulator rows of a warp: 16 rows per warp fit in 128; 32 rows per warp (two m16 row blocks of S, O
#: and the softmax state) need twice that, i.e. the whole 255 (d40 128x64 one-stage Q-in-registers spilled
#: 236 B at the 168 registers of three CTAs per SM, sm_120a, 2026-11-25).
MIN_REGS_PER_THREAD = 128


def min_regs_per_thread(cfg: FwdConfig, fp8_mma: bool = False) -> int:
    """FP8 MMAs count double: P and V live as 16-bit fragments and as FP8 operands (the d128x64 8-warp FP8 tile spilled
    112 B at the 128 registers of two CTAs per SM, sm_120a, 2026-11-29; at 255, one CTA, none)."""
    return MIN_REGS_PER_THREAD * max(1, cfg.tile_m // cfg.num_warps // 16) * (2 if fp8_mma else 1)


@lru_cache(maxsize=None)
def fwd_min_ctas_per_sm(spec: FwdSpec, cfg: FwdConfig, model: ExecutionModel, launch_threads: int) -> int:
    """The CTAs per SM a build promises ptxas (the launch's ``min_blocks_per_mp``, ``.minnctapersm``):
    as many as shared memory lets the model hold, but never so many that a thread of a
    ``launch_threads`` CTA gets fewer than ``min_regs_per_thread(cfg)`` registers. Without it ptxas
    spends up to 255 registers per thread, and a small 8-warp tile that shared memory lets two to an SM
    runs one (registers bind first). A 4-warp CTA keeps the 255 cap at two CTAs per SM."""
    by_regs = model.regs_per_sm // (launch_threads * min_regs_per_thread(cfg, spec.fp8_mma))
    return max(1, min(fwd_ctas_per_sm(spec, cfg, model), by_regs))


def occupancy_launch_smem(spec: FwdSpec, cfg: FwdConfig, model: ExecutionModel,
                          device_smem: Optional[tuple[int, int]]) -> int:
    """Dynamic shared memory to launch ``cfg`` with so that the part holds the model's CTAs per SM
    (``ExecutionModel.occupancy_launch_smem``); ``device_smem`` is the part's (per SM, opt-in per CTA),
    None to launch as compiled (no GPU: precompile on a build box, or ``FA4_SM120_OCCUPANCY=device``)."""
    if device_smem is None:
        return 0
    return model.occupancy_launch_smem(fwd_smem_bytes(spec, cfg) + STATIC_SMEM_BYTES, STATIC_SMEM_BYTES, *device_smem)


def fwd_config_problems(spec: FwdSpec, cfg: FwdConfig, model: ExecutionModel) -> tuple[str, ...]:
    """Every reason ``cfg`` cannot run ``spec`` under ``model``; empty when valid."""
    out = []
    rows_per_pass = cfg.num_warps * 16  # rows one MMA step covers (one m16 atom per warp)
    if spec.mods is not None and cfg.tile_m // cfg.num_warps >= 32 and (cfg.q_in_regs or cfg.tile_n >= 64
                                                                         or spec.mods.aux_tensors):
        # sm_120a gate, 2026-11-25: the d64 128x64 4-warp one-stage tile with Q in registers (255 registers)
        # spilled 8-192 B; the d96 128x64 4-warp tile with Q in shared memory (64 S values per thread) 240 B;
        # the d128 256x32 ping-pong tile with a relative bias read from an aux tensor 180 B
        out.append("score_mod / mask_mod index vectors beside 32 query rows per warp (Q in registers, a 64-key "
                   "S tile, or aux tensor addresses) spill; a 64-row tile (16 rows per warp) serves mods")
    if spec.block_sparse is not None:
        out += block_sparse_problems(spec, cfg)
    if spec.dropout:
        out += dropout_problems(spec, cfg)
    if spec.kv_dtype is not None:
        out += fp8_mma_problems(spec, cfg) if spec.fp8_mma else fp8_kv_problems(spec, cfg)
    elif spec.fp8_mma:
        out.append("fp8_mma=True needs kv_dtype='e4m3' (Q, K and V all e4m3)")
    if spec.fp8_mma and model.fp8_mma is Fp8MmaKind.NONE:
        out.append(f"FP8 MMAs on the {model.name} model, which has no FP8 mma.sync (widen an FP8 q to bf16: FP8 K/V)")
    if cfg.num_warps not in (4, 8):
        out.append(f"num_warps={cfg.num_warps} (4 or 8 supported)")
    if cfg.warps_on_keys:
        out += keysplit_problems(spec, cfg)
    if cfg.dv_warps > 1:
        out += wide_problems(spec, cfg)
    elif cfg.dv_warps != 1:
        out.append(f"dv_warps={cfg.dv_warps} (1, or the warps sharing a 16-row block)")
    elif not cfg.warps_on_keys and cfg.tile_m % rows_per_pass:
        out.append(f"tile_m={cfg.tile_m} is not a multiple of {rows_per_pass} (16 rows per warp)")
    if cfg.mainloop not in MAINLOOPS:
        out.append(f"mainloop={cfg.mainloop!r} (one of {', '.join(MAINLOOPS)})")
    elif cfg.uses_tma:
        if not model.has_tma:
            out.append(f"mainloop={cfg.mainloop} needs TMA, which the {model.name} model lacks (use cp_async)")
        if spec.varlen_k or spec.seqused_k or spec.page_size:
            out.append(f"mainloop={cfg.mainloop} needs dense K/V: varlen / seqused / paged K run the cp_async mainloop")
        padded = [d for d, w in zip((spec.head_dim, spec.head_dim_v), smem_head_dims(spec, cfg)) if d != w]
        if padded:
            # a TMA box spans the padded row, which the K / V tensors' static row width does not reach (sm_120a
            # compile: d72, d88, d104, d120, d136-d152 and d176 failed to build the atom); cp.async pads its own rows
            out.append(f"mainloop={cfg.mainloop} needs head dims its tiles hold unpadded (multiples of 16 up to "
                       f"128, of 32 past it); {padded} pad: the cp_async mainloop serves them")
    if spec.page_size and (spec.varlen_k or spec.page_size < 0):
        out.append(f"page_size={spec.page_size} with varlen_k={spec.varlen_k}: paged K/V are (num_pages, page_size, "
                   "heads, d) caches with a page table, never packed with cu_seqlens_k; page_size >= 1")
    if spec.split_kv and spec.has_sink:
        out.append("split-KV forward with a learnable sink: the sink enters once, in the combine kernel "
                   "(build the split spec without it)")
    if (spec.kv_dtype is None or spec.fp8_mma) and cfg.num_stages not in (1, 2, 3):
        out.append(f"num_stages={cfg.num_stages} (1, 2 or 3 supported)")
    elif cfg.num_stages == 1 and (cfg.uses_tma or cfg.overlap):
        out.append(f"num_stages=1 (one K and one V buffer) is a cp_async schedule without overlap "
                   f"(got mainloop={cfg.mainloop}, overlap={cfg.overlap}): use num_stages=2")
    if cfg.overlap and cfg.num_stages != 2:
        out.append(f"overlap=True keeps K one block ahead of V in two buffers each: num_stages must be 2, "
                   f"not {cfg.num_stages}")
    if cfg.overlap and cfg.mainloop == "tma_ws":
        out.append("overlap=True with mainloop=tma_ws: the producer warp feeds whole K/V stages "
                   "(use mainloop=tma or cp_async)")
    if cfg.pingpong and not (cfg.overlap and cfg.mainloop == "tma" and cfg.num_warps == 8):
        out.append(f"pingpong=True alternates two 4-warp groups over the overlapped step and refills K/V by TMA "
                   f"after a turn: it needs overlap=True, mainloop=tma and num_warps=8 (got overlap={cfg.overlap}, "
                   f"mainloop={cfg.mainloop}, num_warps={cfg.num_warps})")
    if cfg.persistent and not cfg.pingpong:
        out.append("persistent=True overlaps one warp group's tile boundary with the other's MMAs: it needs "
                   "pingpong=True")
    if cfg.persistent and (spec.split_kv or spec.pack_gqa or spec.varlen_q or spec.seqused_q):
        out.append("persistent=True with split-KV, packed GQA or varlen / seqused Q: the persistent tile loop walks "
                   "dense, unpacked query tiles and stores 16-bit rows (these run the table's non-persistent entries)")
    if cfg.mbarrier_release and (cfg.mainloop != "tma" or cfg.overlap):
        out.append(f"mbarrier_release=True hands whole K/V stages back per warp in the plain TMA step: it needs "
                   f"mainloop=tma without overlap (got mainloop={cfg.mainloop}, overlap={cfg.overlap}; tma_ws always "
                   f"releases per warp)")
    if cfg.tile_n % 16:
        out.append(f"tile_n={cfg.tile_n} is not a multiple of 16 (two n8 atoms form one k16 step of P@V)")
    if spec.latent_v and (spec.k_head_dim != LATENT_ROPE_DIM or cfg.dv_warps == 1):
        out.append(f"latent_v (MLA) runs the dv_warps tiles with {LATENT_ROPE_DIM} rope columns per key (got "
                   f"head_dim={spec.head_dim}, head_dim_v={spec.head_dim_v}, dv_warps={cfg.dv_warps})")
    for name, d in (("head_dim", spec.k_head_dim), ("head_dim_v", spec.head_dim_v)):
        if d % 8 or not 8 <= d <= MAX_HEAD_DIM:
            out.append(f"{name}={d} is not a multiple of 8 in [8, {MAX_HEAD_DIM}] (16-byte rows)")
    for name, d in (("head_dim", spec.head_dim), ("head_dim_v", spec.head_dim_v)):
        width = copy_width(spec, d, cfg)
        rows = rows_per_copy_pass(width, cfg.num_threads)
        if cfg.tile_m % rows or (not cfg.uses_tma and cfg.tile_n % rows):
            out.append(f"{name}={d} (smem width {width}) needs {'Q/O' if cfg.uses_tma else 'Q/O and K/V'} tiles of "
                       f"{rows}-row multiples per copy pass; tile_m={cfg.tile_m}, tile_n={cfg.tile_n}")
    smem = fwd_smem_bytes(spec, cfg) + STATIC_SMEM_BYTES
    if smem > model.smem_per_cta:
        out.append(f"shared memory {smem} B (incl. {STATIC_SMEM_BYTES} B static) exceeds "
                   f"{model.smem_per_cta} B per CTA of the {model.name} model")
    # fp32 accumulators per thread: O (tile_m x dv) and S (tile_m x tile_n). Up to 192 (d=128 at 32 rows
    # per warp, 128x64 on 4 warps) ptxas fits them in 255 registers with or without a few spills,
    # depending on the mask and loader: the conformance gate judges each build; above 192 every
    # sm_120a build spilled (2026-11-22).
    # With ``overlap`` the previous block's P (16-bit: half a register per element) is live beside S.
    d, dv = smem_head_dims(spec, cfg)
    acc_regs = cfg.tile_m * (dv + cfg.tile_n + (cfg.tile_n // 2 if cfg.overlap else 0)) // cfg.num_threads
    if cfg.warps_on_keys:  # every warp holds all 16 rows of O, and S for its share of the keys
        acc_regs = 16 * (dv + cfg.tile_n // cfg.num_warps) // 32
    if cfg.dv_warps > 1:  # a warp's share of its 16-row block: dv / dv_warps columns of O, tile_n / dv_warps keys
        acc_regs = 16 * (dv + cfg.tile_n) // cfg.dv_warps // 32
    if acc_regs > 192:
        out.append(f"{acc_regs} accumulator registers per thread (O + S{' + P' if cfg.overlap else ''}) "
                   f"leave too few for operands")
    # Q in registers (16-bit: half a register per element) beside a row gather (packed GQA, varlen Q): at
    # d=256 (64x32: 144 + 64) every such sm_120a build spilled while the dense one fits (2026-11-23).
    # (FP8 Q: a quarter of a register per element)
    q_regs = cfg.tile_m * d // cfg.num_threads // (4 if spec.fp8_mma else 2) if cfg.q_in_regs else 0
    if q_regs and (spec.pack_gqa or spec.varlen_q) and acc_regs + q_regs > 192:
        out.append(f"q_in_regs with {'packed GQA' if spec.pack_gqa else 'varlen Q'}: {acc_regs} accumulator + "
                   f"{q_regs} Q registers per thread beside the row gather leave too few for operands")
    return tuple(out)


def fp8_kv_copy(spec: FwdSpec, cfg: FwdConfig) -> tuple[int, int]:
    """(elements per vector, threads per row) of FP8 K/V's copies into the staging stages (``_kernels/kv_dequant``).
    16-byte vectors (cp.async.cg, past L1) where both head dims are multiples of 16 and the thread rows tile the key
    block: ``threads per row`` is the largest power of two up to 8 that divides the 16-byte vectors of a row, and
    ``num_threads / threads per row`` rows must divide tile_n. Else 8-byte vectors in the 16-bit copies' thread
    layout (cp.async.ca, through L1: on an H200, 16x8192 32/8 d128 decode ran at 0.25 of the copy bandwidth with
    them, L1 the busiest unit, against 0.96 for bf16 K/V in 16-byte vectors)."""
    if spec.head_dim % 16 == 0 and spec.head_dim_v % 16 == 0:
        widths = [padded_head_dim(d, cfg) // 16 for d in (spec.head_dim, spec.head_dim_v)]
        per_row = min(8, *(w & -w for w in widths))
        if cfg.tile_n % (cfg.num_threads // per_row) == 0:
            return 16, per_row
    return 8, 0


def fp8_kv_problems(spec: FwdSpec, cfg: FwdConfig) -> list:
    """Why ``cfg`` cannot run ``spec``'s FP8 K/V (``_kernels/kv_dequant``): each thread widens the FP8 bytes its own
    cp.async copies brought, between the wait for a tile and the CTA barrier that publishes it, into the 16-bit
    buffer the MMAs read next; that needs the cp.async multistage step (``num_stages`` FP8 staging stages, two
    16-bit buffers: the one written is the one no warp still reads), not the TMA loaders (no thread owns a TMA tile's bytes), the one-stage step
    or the overlapped one (their buffers are read while the next tile lands)."""
    out = []
    if spec.kv_dtype not in ("e4m3", "e5m2"):
        out.append(f"kv_dtype={spec.kv_dtype!r} (e4m3 or e5m2)")
    if cfg.uses_tma or cfg.overlap or not 2 <= cfg.num_stages <= FP8_KV_MAX_STAGES:
        out.append(f"FP8 K/V are widened by the threads that copy them: they need mainloop=cp_async, num_stages 2 to "
                   f"{FP8_KV_MAX_STAGES} without overlap (got mainloop={cfg.mainloop}, num_stages={cfg.num_stages}, overlap={cfg.overlap})")
    if spec.mods is not None or spec.block_sparse is not None or spec.dropout:
        out.append("FP8 K/V with score_mod / mask_mod, block sparsity or dropout: not built (FP8 K/V serve inference "
                   "attention; run these with bf16 / fp16 K/V)")
    return out


def wide_exchange_bytes(cfg: FwdConfig) -> int:
    """Shared memory a ``dv_warps`` tile exchanges through (``_kernels/fwd_wide``): the block's P, (tile_m,
    tile_n) 16-bit, and an fp32 row statistic (block max, then the final row sum) per row and warp."""
    return cfg.tile_m * cfg.tile_n * BYTES_PER_ELEM + cfg.dv_warps * cfg.tile_m * 4


def wide_problems(spec: FwdSpec, cfg: FwdConfig) -> list:
    """Why ``cfg`` (``dv_warps`` > 1) cannot run ``spec``: the warps of a 16-row block split whole 16-key and
    16-column shares, Q read from shared memory per block (a 512-wide Q fragment would take 128 registers), the
    cp.async multistage step, and the inference features the exchange is built for."""
    out = []
    w = cfg.dv_warps
    d, dv = smem_head_dims(spec, cfg)
    if cfg.num_warps % w or cfg.tile_m != 16 * (cfg.num_warps // w):
        out.append(f"dv_warps={w} shares each 16-row block between {w} warps: num_warps a multiple of it and "
                   f"tile_m = 16 x num_warps / dv_warps (got num_warps={cfg.num_warps}, tile_m={cfg.tile_m})")
    if cfg.tile_n % (8 * w) or dv % (8 * w):
        out.append(f"dv_warps={w} interleaves S's keys and O's columns over the warps in n8 atoms: tile_n and dv "
                   f"multiples of {8 * w} (got tile_n={cfg.tile_n}, dv={dv})")
    if cfg.q_in_regs or cfg.uses_tma or cfg.overlap or cfg.pingpong or cfg.warps_on_keys:
        out.append("dv_warps > 1 runs the cp.async multistage step with Q read from shared memory (no q_in_regs, "
                   "TMA, overlap, ping-pong or warps_on_keys)")
    if spec.mods is not None or spec.block_sparse is not None or spec.dropout or spec.kv_dtype:
        out.append("dv_warps > 1 with score_mod / mask_mod, block sparsity, dropout or FP8: not built (head dims "
                   "past 256 serve 16-bit inference attention)")
    if spec.page_size and not spec.latent_v and cfg.num_stages < 2:
        out.append("paged K/V past 256 columns take two K/V stages: the one-stage tile's page lookups beside its "
                   "live accumulators spill on sm_120a (255 registers, 32-92 B at d320-d512)")
    if spec.latent_v and (cfg.num_stages < 2 or spec.head_dim_v % LATENT_ROPE_DIM):
        out.append(f"latent_v (MLA) loads the latent and the rope keys of a block together into one K tile: "
                   f"num_stages >= 2 and head_dim_v a multiple of {LATENT_ROPE_DIM} (got num_stages="
                   f"{cfg.num_stages}, head_dim_v={spec.head_dim_v})")
    return out


#: Head dims past this run the ``dv_warps`` tiles (``_kernels/fwd_wide``) only
WIDE_HEAD_DIM = 256


def wide_features(spec: FwdSpec) -> tuple:
    """The manifest features a call at head dims past ``WIDE_HEAD_DIM`` combines with that its ``dv_warps`` tiles do
    not serve (refused: ``head_dim_512`` + each); empty at head dims up to 256, and for 16-bit dense, varlen, paged
    and packed K/V with masks, softcap, sinks, GQA packing and split-KV."""
    if max(spec.head_dim, spec.head_dim_v) <= WIDE_HEAD_DIM:
        return ()
    return tuple(name for name, on in (("fp8", spec.kv_dtype or spec.fp8_mma),
                                       ("score_mod", spec.mods is not None),
                                       ("block_sparsity", spec.block_sparse is not None), ("dropout", spec.dropout))
                 if on)


def keysplit_merge_bytes(spec: FwdSpec, cfg: FwdConfig) -> tuple[int, int]:
    """(partial O, row statistics) bytes of a ``warps_on_keys`` tile's merge (``_kernels/fwd_keysplit``): each
    warp's fp32 partial O (16 rows of ``KEYSPLIT_ROW_PAD`` + dv floats) over the K/V tiles, and each warp's row max
    and row sum over Q's tile (FP8 K/V: right after the partial O), all free once the key blocks are done."""
    dv = smem_head_dims(spec, cfg)[1]
    return cfg.num_warps * 16 * (dv + KEYSPLIT_ROW_PAD) * 4, 2 * cfg.num_warps * 16 * 4


def keysplit_q_offset(spec: FwdSpec, cfg: FwdConfig) -> int:
    """Byte offset, from the start of V's FP8 stages, of the FP8 decode tile's Q / O tile: the end of V's last
    stage. That stage is first filled by the first mainloop step, after every warp has read Q into registers (a
    barrier), and O is written after the merge, whose buffers end below it (``keysplit_problems``); without a Q
    tile of its own, 3 stages of 64 keys at d128 take 48 KB: two CTAs per SM120 SM."""
    d, dv = smem_head_dims(spec, cfg)
    return cfg.num_stages * cfg.tile_n * dv - cfg.tile_m * max(d, dv) * BYTES_PER_ELEM


#: fp32 words past each row of a warp's partial O in the merge buffer: rows then start 4 banks apart
KEYSPLIT_ROW_PAD = 4


def keysplit_problems(spec: FwdSpec, cfg: FwdConfig) -> list:
    """Why ``cfg`` (``warps_on_keys``) cannot run ``spec``: one 16-row tile shared by the warps, whole 16-key
    shares of each key block per warp, the cp.async multistage step (no overlap, TMA or ping-pong: those hand
    tiles between warp groups by rows), inference features only (no mods, block sparsity or dropout, which
    address P by the rows-split tiles' cells), and a merge buffer within the tiles it reuses."""
    out = []
    if cfg.tile_m != 16:
        out.append(f"warps_on_keys=True shares one 16-row tile between the warps (got tile_m={cfg.tile_m})")
    if cfg.tile_n % (16 * cfg.num_warps):
        out.append(f"warps_on_keys=True gives each of the {cfg.num_warps} warps whole 16-key shares of a key block: "
                   f"tile_n a multiple of {16 * cfg.num_warps} (got {cfg.tile_n})")
    if cfg.uses_tma or cfg.overlap or cfg.pingpong or cfg.num_stages < 2:
        out.append(f"warps_on_keys=True runs the cp.async multistage step (got mainloop={cfg.mainloop}, "
                   f"num_stages={cfg.num_stages}, overlap={cfg.overlap}, pingpong={cfg.pingpong})")
    if spec.mods is not None or spec.block_sparse is not None or spec.dropout or spec.fp8_mma:
        out.append("warps_on_keys=True with score_mod / mask_mod, block sparsity, dropout or FP8 MMAs: not built "
                   "(the decode tile serves 16-bit and FP8 K/V inference attention; the 64-row tiles serve these)")
    if spec.kv_dtype and not cfg.q_in_regs:
        out.append("warps_on_keys=True over FP8 K/V reads Q into registers once, in the widened K's column order: "
                   "q_in_regs=True")
    d, dv = smem_head_dims(spec, cfg)
    o_bytes, stat_bytes = keysplit_merge_bytes(spec, cfg)
    if spec.kv_dtype:  # FP8 stages (a byte per element; _kernels/fwd_keysplit_fp8), Q / O over V's last stage's end
        q_bytes = cfg.tile_m * max(d, dv) * BYTES_PER_ELEM
        room = cfg.num_stages * cfg.tile_n * d + keysplit_q_offset(spec, cfg)
        if q_bytes > cfg.tile_n * dv or o_bytes + stat_bytes > room:
            out.append(f"warps_on_keys=True over FP8 K/V keeps Q / O ({q_bytes} B) in V's last stage "
                       f"({cfg.tile_n * dv} B) and merges {o_bytes + stat_bytes} B of partial O and row statistics "
                       f"below it ({room} B): tile_n={cfg.tile_n} x {cfg.num_stages} stages is too small")
        return out
    kv_bytes = cfg.num_stages * cfg.tile_n * (d + dv) * BYTES_PER_ELEM  # the 16-bit K / V tiles under the partial O
    if o_bytes > kv_bytes or stat_bytes > cfg.tile_m * d * BYTES_PER_ELEM:
        out.append(f"warps_on_keys=True merges {o_bytes} B of partial O over the K/V tiles ({kv_bytes} B) and "
                   f"{stat_bytes} B of row statistics over Q's: tile_n={cfg.tile_n} x {cfg.num_stages} stages is too small")
    return out


def fp8_mma_problems(spec: FwdSpec, cfg: FwdConfig) -> list:
    """Why ``cfg`` cannot run ``spec``'s FP8 MMAs (``_kernels/fwd_fp8_mma``): the cp.async step without overlap
    (P goes from S's accumulators to the FP8 operand of P V within a block; no TMA loader is built for FP8
    tiles), key blocks of whole 32-key MMA steps, and inference attention (no mods, block sparsity, dropout)."""
    out = []
    if spec.kv_dtype != "e4m3":
        out.append(f"fp8_mma=True with kv_dtype={spec.kv_dtype!r}: the FP8 MMAs take Q, K and V all e4m3")
    if cfg.uses_tma or cfg.overlap:
        out.append(f"FP8 MMAs run the cp.async step without overlap (got mainloop={cfg.mainloop}, "
                   f"overlap={cfg.overlap})")
    if cfg.tile_n % 32:
        out.append(f"tile_n={cfg.tile_n}: P V's FP8 MMA takes 32 keys per step (tile_n a multiple of 32)")
    if spec.mods is not None or spec.block_sparse is not None or spec.dropout:
        out.append("FP8 MMAs with score_mod / mask_mod, block sparsity or dropout: not built (FP8 attention serves "
                   "inference; run these with bf16 / fp16 inputs)")
    return out


#: Block sizes a block-sparse call may use: multiples of these, so that every forward tile the table
#: serves block-sparse specs with (64 or 128 query rows, 32 or 64 keys) divides them; (128, 128) is
#: FlexAttention's default block.
SPARSE_BLOCK_Q, SPARSE_BLOCK_K = 128, 64


def block_sparse_problems(spec: FwdSpec, cfg: FwdConfig) -> list:
    """Why ``cfg`` cannot run ``spec``'s block-sparse walk (``_kernels/block_walk``): a mainloop that takes its
    next tile from the walk (cp.async multistage, one-stage or overlapped; the overlapped / ping-pong TMA schedule,
    K one walk step ahead of V; not the plain TMA step, the warp-specialized producer or the persistent tile loop),
    dense unpacked rows, and tiles that divide the blocks."""
    out = []
    q_block, k_block, _ = spec.block_sparse
    if cfg.persistent or cfg.mainloop == "tma_ws" or (cfg.mainloop == "tma" and not cfg.overlap):
        out.append(f"block sparsity walks listed key blocks in the cp.async mainloops and the overlapped TMA one (got "
                   f"mainloop={cfg.mainloop}, overlap={cfg.overlap}, persistent={cfg.persistent})")
    if spec.split_kv or spec.pack_gqa or spec.page_size or spec.varlen_q or spec.varlen_k:
        out.append("block sparsity with split-KV, packed GQA, paged K/V or varlen: the lists are per dense "
                   "(batch, query head, query block) and walked whole by one CTA")
    if q_block % cfg.tile_m or k_block % cfg.tile_n:
        out.append(f"block-sparse blocks ({q_block}, {k_block}) are not multiples of the tile "
                   f"({cfg.tile_m}, {cfg.tile_n})")
    acc_regs = cfg.tile_m * (padded_head_dim(spec.head_dim_v, cfg) + cfg.tile_n) // cfg.num_threads
    if spec.mods is not None and acc_regs > SPARSE_MODS_MAX_ACC_REGS:
        # sm_120a gate, 2026-11-26: d256 64x64 on 4 warps (160 accumulator registers) with a document mask_mod and
        # the walk spilled 4 B; the class's paged tile (64x32: 144) serves it
        out.append(f"block sparsity with mods beside {acc_regs} accumulator registers per thread (more than "
                   f"{SPARSE_MODS_MAX_ACC_REGS}: the walk's and the mask_mod's indices spill)")
    return out


#: accumulator registers per thread (O + S) beside which the block-sparse walk and mods still fit (sm_120a gate)
SPARSE_MODS_MAX_ACC_REGS = 144


def dropout_problems(spec: FwdSpec, cfg: FwdConfig) -> list:
    """Why ``cfg`` cannot run ``spec``'s dropout (``_kernels/dropout_mask``): the mask is drawn per (query head,
    query row) of an unpacked tile; beside 64 S registers per thread only a one-stage tile holds the keep flags
    (drawn call by call)."""
    out = []
    if cfg.persistent or spec.pack_gqa:
        out.append("dropout draws its mask per (query head, query row) of an unpacked, non-persistent tile: packed "
                   "GQA and persistent=True do not run it (dropout calls run unpacked, on the non-persistent entries)")
    s_regs = cfg.tile_m * cfg.tile_n // cfg.num_threads
    if s_regs > 32 and cfg.num_stages > 1:
        # d64's 128x64 4-warp two-stage tile (64 S registers per thread) spilled 36-44 B; its one-stage twin fits
        out.append(f"dropout beside {s_regs} S registers per thread in a {cfg.num_stages}-stage tile spills (the "
                   f"one-stage tile fits)")
    return out


def dropout_on_pairs(spec: FwdSpec, cfg: FwdConfig) -> bool:
    """Whether the forward converts all of P to 16 bits and then applies dropout to its pairs
    (``dropout_mask.apply_keep_pairs``), or converts and masks P call by call from the fp32 scores
    (``dropout_mask.convert_keep_pairs``: each Philox call's 8 pairs rounded and masked as its words are used). sm_120a
    gate, 2026-11-27: beside 64 S and 96 O registers per thread and the causal mask's limits (d96's 128x64 4-warp tile)
    P in both widths beside the words spills 16 B; masking the fp32 scores element by element from half Philox calls
    fits too but draws twice (1.34-1.49x its forward's time without dropout); call by call it fits with whole calls
    (255 registers, no local memory). Every other dropout tile of the gate holds all of P."""
    s_regs = cfg.tile_m * cfg.tile_n // cfg.num_threads
    o_regs = cfg.tile_m * padded_head_dim(spec.head_dim_v, cfg) // cfg.num_threads
    return not (s_regs >= 64 and o_regs >= 96 and (spec.causal or spec.local))


#: Automatic GQA packing: when seqlen_q is below this (the largest tile_m), an unpacked M tile is
#: mostly empty and every query head re-reads its KV head; packed, the group fills the tile and K/V
#: are read once per group. At or above it the tiles are already full.
PACK_GQA_MAX_SEQLEN_Q = 128


def use_pack_gqa(requested, num_heads: int, num_heads_kv: int, seqlen_q: int) -> bool:
    """Whether a call packs GQA rows: ``requested`` (the caller's pack_gqa: True, False or None for
    automatic). Short queries of MHA pack too (a group of one): the gather is an identity, but the
    packed spec takes the 64-row short-query entry (``d{class}_packgqa``) instead of the prefill
    tiles, whose 128-256 rows would hold one query each (MHA decode, 16 x 32 heads over 8192 keys:
    1537 GB/s on the 256-row prefill tile, 2956 on the 64-row one; H100, 2026-11-23)."""
    if requested is None:
        return seqlen_q < PACK_GQA_MAX_SEQLEN_Q
    return bool(requested)


#: Most KV splits a call uses (the automatic choice, and the cap on an explicit num_splits).
MAX_SPLITS = 128
#: Fewest key blocks one split gets from the automatic choice: each split pays a prologue (Q load,
#: pipeline fill) and writes an fp32 partial row that the combine reads back.
MIN_BLOCKS_PER_SPLIT = 4
#: A split count whose predicted time (``num_splits_for``) is within this fraction of the best count's
#: counts as good as it; the fewest such splits win (each split pays a prologue and fp32 partials).
SPLIT_WAVE_SLACK = 0.05
#: What one CTA costs beyond streaming its key blocks (launch, Q and first K/V loads, the partials'
#: store), in key blocks of streaming time: ~2 us against ~1.4 us per 64-key d=128 block at one SM's
#: decode rate. It makes many small splits lose to a few (16 splits of 8 tiles against 32: 2450 GB/s to
#: 2014, decode_tiles_h100_2026-11-25.json).
SPLIT_FIXED_BLOCKS = 2


def num_splits_for(requested, num_ctas: int, num_n_blocks: int, num_sms: int, batch: int, ctas_per_sm: int,
                   one_m_block: bool = False) -> int:
    """Key-range splits for a call: ``requested`` (the caller's num_splits; None or 0 = automatic),
    clamped to the key blocks of the longest tile (a split must have a block to visit), to
    ``MAX_SPLITS`` and to the grid's z extent (batch * splits <= 65535).

    Automatic: the grid runs in waves of ``ctas_per_sm * num_sms`` resident CTAs, and a wave lasts as
    long as one CTA whether it is full or holds a few CTAs (a decode CTA streams K/V at about the rate
    one SM sustains, so a part-filled wave is no faster). With ``s`` splits a CTA streams ``1/s`` of the
    keys plus ``SPLIT_FIXED_BLOCKS`` blocks' worth of fixed cost, so the call takes
    ``ceil(num_ctas * s / slots) * (1/s + SPLIT_FIXED_BLOCKS / num_n_blocks)`` unsplit-CTA times; the
    count is the fewest splits within ``SPLIT_WAVE_SLACK`` of the best such time, each split keeping at
    least ``MIN_BLOCKS_PER_SPLIT`` key blocks. Grids beyond one wave split only when each (batch, head)
    has ``one_m_block`` (decode and short queries: the partials are a few rows); a prefill grid stays
    whole.

    Measured at the SM120's occupancy on 132 SMs (split_sweep_h100_2026-11-23_sm120occ.json,
    decode_tiles_h100_2026-11-25.json, pdl_decode_h100_2026-11-25.json.gz): 16 x 8 KV heads of an 80 KB tile
    (128 CTAs) stream fastest unsplit, 64 tiles with 2 splits, 8 tiles with 16 (17 spill into a second
    wave: 2081 GB/s against 2450; 32, two full waves: 2014); 132 tiles 3064 GB/s, 136 unsplit 1896 (the
    4-CTA second wave doubles the time), which this rule splits 4 ways (predicted 0.65 of unsplit)."""
    cap = max(1, min(MAX_SPLITS, num_n_blocks, 65535 // max(batch, 1)))
    if requested is not None and requested > 0:
        return min(int(requested), cap)
    slots = max(1, ctas_per_sm * num_sms)
    limit = min(cap, num_n_blocks // MIN_BLOCKS_PER_SPLIT)
    if num_ctas <= 0 or limit < 2 or (num_ctas > slots and not one_m_block):
        return 1
    fixed = SPLIT_FIXED_BLOCKS / max(num_n_blocks, 1)
    times = [-(-num_ctas * s // slots) * (1 / s + fixed) for s in range(1, limit + 1)]
    good = min(times) * (1 + SPLIT_WAVE_SLACK)
    return next(s for s, t in enumerate(times, start=1) if t <= good)


#: Share of the device's L2 one band of the causal tile order may fill with K/V (``tile_band``): the rest
#: holds Q/O traffic and the next band's first tiles.
L2_BAND_SHARE = 0.5
#: Masked tiles of at least this many rows run in the banded longest-first order (``tile_scheduler``).
#: Below it the order stays M tile first per (batch, head): 64-row tiles are half as uneven (predicted
#: gain 2-6% at 4096 keys against 6-13% for 128-256 rows), and their decoded (batch, head) costs the two
#: registers the d=256 64x32 entries do not have (ptxas spilled them; block indices it re-reads for free).
BANDED_ORDER_MIN_TILE_M = 128


def banded_tile_order(spec: FwdSpec, cfg: FwdConfig) -> bool:
    """Whether ``cfg``'s tiles of ``spec`` run in the banded longest-first order."""
    return spec.longest_first and cfg.tile_m >= BANDED_ORDER_MIN_TILE_M and not cfg.persistent


def tile_band(l2_bytes: int, seqlen_k: int, head_dim: int, head_dim_v: int, grid_heads_per_kv: int) -> int:
    """(batch, head) pairs per band of the longest-first order masked tiles run in (``tile_scheduler``):
    as many as keep their K/V (``seqlen_k`` keys of ``head_dim + head_dim_v`` 16-bit columns, shared by
    the ``grid_heads_per_kv`` consecutive grid heads of one KV head) within ``L2_BAND_SHARE`` of the L2.
    One pair (the M-tile-per-pair order) when a single pair's K/V alone fills that share."""
    kv_bytes = max(1, seqlen_k) * (head_dim + head_dim_v) * BYTES_PER_ELEM
    return max(1, int(l2_bytes * L2_BAND_SHARE) * max(1, grid_heads_per_kv) // kv_bytes)


def is_valid(spec: FwdSpec, cfg: FwdConfig, model: ExecutionModel) -> bool:
    return not fwd_config_problems(spec, cfg, model)


TABLE_PATH = Path(__file__).with_name("fwd_table.json")


@lru_cache(maxsize=None)
def fwd_table() -> dict:
    """The dispatcher's table, ``"d{head_dim}_{full|causal}" -> FwdConfig``, produced by
    ``benchmarks/tune_fwd.py`` on the device and committed with device and date (fwd_table.json)."""
    data = json.loads(TABLE_PATH.read_text())
    return {key: FwdConfig(**{k: v for k, v in knobs.items() if k not in TABLE_NOTES})
            for key, knobs in data["table"].items()}


#: Table fields that are measurements or links, not FwdConfig knobs.
TABLE_NOTES = ("geomean_tflops", "rate_tflops", "alternates", "unshared_kv")


@lru_cache(maxsize=None)
def table_notes() -> dict:
    """``key -> (rate_tflops or None, alternates, unshared_kv or None)`` of the table's entries
    (``fwd_candidates``, ``choose_fwd_config``)."""
    data = json.loads(TABLE_PATH.read_text())
    return {key: (knobs.get("rate_tflops"), tuple(knobs.get("alternates", ())), knobs.get("unshared_kv"))
            for key, knobs in data["table"].items()}


def head_dim_class(spec: FwdSpec) -> int:
    d = max(spec.k_head_dim, spec.head_dim_v)
    for c in HEAD_DIM_CLASSES:
        if d <= c:
            return c
    raise ValueError(f"head dim {d} exceeds {MAX_HEAD_DIM}")


def table_key(spec: FwdSpec) -> str:
    """Masked variants (causal, local window) share the "causal" entry: their mainloops carry the
    element-mask path, which sets the register budget."""
    return f"d{head_dim_class(spec)}_{'causal' if spec.causal or spec.local else 'full'}"


#: ``exact_key`` spellings: d{head_dim}x{head_dim_v}_{mask}[_softcap][_splitkv]
EXACT_KEY = re.compile(r"d(\d+)x(\d+)_(full|causal|local)(_softcap)?(_splitkv)?$")


def exact_key(spec: FwdSpec) -> str:
    """The exact-head-dims key: ``d{head_dim}x{head_dim_v}_{full|causal|local}``, plus the features that
    change the mainloop's register demand (softcap: a tanh per score; split-KV: the fp32 partial
    epilogue). A config tuned and gated for, say, d=128 exactly can then serve it without having to
    fit every head dim of its class (d=96 or head_dim_v=64 build differently)."""
    return (f"d{spec.head_dim}x{spec.head_dim_v}_{spec.mask}" + ("_softcap" if spec.softcap else "")
            + ("_splitkv" if spec.split_kv else ""))


def table_keys(spec: FwdSpec) -> list[str]:
    """The table keys a spec may use, most specific first: a packed-GQA entry (short queries: the
    row gather adds registers and a 64-row tile wastes less), a paged entry (paged K/V: the page
    lookups of a one-stage refill sit beside the live S accumulator, where d64 / d96 / d256 one-stage
    tiles spilled 4-100 B on sm_120a, 2026-11-25, so those classes take a two-stage tile; d128 prefill
    takes a 128-row two-stage cp.async tile, 1.26-1.35x the 64-row one, since the class entry's TMA
    tile cannot gather pages; the others fall through to their class entries), the exact-head-dims entry
    (``exact_key``), a dtype entry (ptxas allocates registers differently for fp16 and bf16), a
    local-window entry (the two-sided mask adds registers), the class entry, then the class's
    cp.async entry (for specs or models the class entry's mainloop cannot serve: varlen / seqused K,
    parts without TMA); specs with mods or block sparsity try the class's 64-row alternate before that."""
    key = table_key(spec)
    if spec.latent_v:  # MLA: the latent class's tile, V read from the K tile
        return [f"d{head_dim_class(spec)}_latent"]
    if spec.fp8_mma:  # Q, K, V e4m3: the class's FP8 MMA tile
        return [f"d{head_dim_class(spec)}_fp8mma"]
    if spec.kv_dtype:  # FP8 K/V: the class's staging tile (two 16-bit buffers beside the FP8 stages)
        return [f"d{head_dim_class(spec)}_fp8kv"]
    keys = [f"d{head_dim_class(spec)}_packgqa"] if spec.pack_gqa else []
    if spec.page_size:
        keys.append(f"d{head_dim_class(spec)}_paged")
    keys += [exact_key(spec), f"{key}_{spec.dtype}"]
    if spec.local:
        keys.append(f"{key}_local")
    # mods add registers; where the class entry has none to spare, its 64-row alternate serves them
    # block sparsity walks its lists in the cp.async tiles: at d128, where the class entry is a ping-pong tile,
    # the 64-row one-stage alternate ran the random 25% map 1.42x and documents 1.45x faster than the two-stage
    # cp.async entry (H100 at SM120 occupancy, 2026-11-26, benchmarks/results/sparse_tiles_h100_2026-11-26.json)
    m64 = spec.mods is not None or spec.block_sparse is not None
    # head dims the class entry's TMA tiles would pad (d104 / d120 in the d128 class: fwd_config_problems) take its
    # 64-row one-stage alternate too: two CTAs per SM at an SM120's shared memory, where the cp.async entry's two
    # stages hold one (fwd_padded_h200_2026-11-29.json: d120 1.23-1.35x, d104 1.16-1.21x the two-stage tile's speed)
    entry = fwd_table().get(key)
    if entry is not None and entry.uses_tma and smem_head_dims(spec, entry) != (spec.head_dim, spec.head_dim_v):
        m64 = True
    # block sparsity walks its lists in the overlapped / ping-pong tiles too: where the class entry's tile does not
    # divide the blocks (d128 non-causal: 256 rows), its 128-row alternate (128x64 ping-pong) comes before the
    # 64-row one-stage tile
    m128 = [f"{key}_m128"] if spec.block_sparse is not None else []
    # ... and, last, the class's paged tile (a cp.async tile tuned for a walk of looked-up blocks: d256's 64x32
    # keeps the walk and mods within the registers where the class entry's 64x64 spills)
    paged = [f"d{head_dim_class(spec)}_paged"] if spec.block_sparse is not None else []
    return keys + [key] + m128 + ([f"{key}_m64"] if m64 else []) + [f"{key}_cp_async"] + paged


@lru_cache(maxsize=None)
def _select_entry(spec: FwdSpec, model: ExecutionModel) -> tuple[str, FwdConfig]:
    table = fwd_table()
    problems = ()
    for key in (k for k in table_keys(spec) if k in table):
        problems = fwd_config_problems(spec, table[key], model)
        if not problems:
            return key, table[key]
    # a table without a valid entry for a spec is a bug in this file, not a user error
    raise RuntimeError(f"no forward table entry is valid for {spec} on {model.name}: {'; '.join(problems)}")


def select_fwd_config(spec: FwdSpec, model: ExecutionModel) -> FwdConfig:
    """The first table entry of ``table_keys(spec)`` that is valid for (spec, model): the config for
    long sequences (``choose_fwd_config`` weighs its alternates per call shape). Memoized: it runs on
    every forward call, and the spec, the model and the table are all immutable."""
    return _select_entry(spec, model)[1]


@lru_cache(maxsize=None)
def fwd_candidates(spec: FwdSpec, model: ExecutionModel,
                   shared_kv: bool = True) -> tuple[tuple[FwdConfig, Optional[float]], ...]:
    """(config, rate_tflops) of every entry ``choose_fwd_config`` may pick for ``spec``: the selected
    entry, then its valid ``alternates`` (smaller-M tiles; only when both carry a measured rate).
    ``shared_kv=False`` (every query head has its own K/V head, so K/V stream from DRAM and no head's
    tiles find another's in L2): the entry's ``unshared_kv`` entry, when it names one valid for the spec,
    stands in for it (a deeper K/V pipeline at the same CTAs per SM hides the longer latency)."""
    key, cfg = _select_entry(spec, model)
    notes, table = table_notes(), fwd_table()
    rate, alternates, unshared = notes[key]
    if not shared_kv and unshared and is_valid(spec, table[unshared], model):
        cfg, rate = table[unshared], notes[unshared][0] or rate
    out = [(cfg, rate)]
    if rate is not None:
        out += [(table[k], notes[k][0]) for k in alternates
                if notes[k][0] is not None and is_valid(spec, table[k], model)]
    return tuple(out)


#: Fixed cost of a tile in the tile-efficiency rule, in key blocks of that tile (its prologue, the
#: ping-pong pipeline's fill and drain, the epilogue): fitted with the rates below to 30 shapes of
#: 300-4096 tokens per head-dim class (H100, 2026-11-24), where the rule's pick is
#: within 0.4% of the fastest candidate on geometric mean (at most 7%), against up to 1.48x for the
#: class entry alone (d96 causal, 16x300).
TILE_OVERHEAD_BLOCKS = 1.5


def tile_work(cfg: FwdConfig, rows: int, seqlen_q: int, seqlen_k: int, causal: bool) -> float:
    """Score elements one (batch, head)'s tiles compute, padded rows and key blocks included, plus
    ``TILE_OVERHEAD_BLOCKS`` per tile: ``rows`` M rows (packed GQA: seqlen_q x group) over seqlen_k keys.
    Causal tile m (bottom-right aligned) visits keys up to its last row, seqlen_k - seqlen_q + (m + 1) x
    tile_m (``rows // seqlen_q`` packed rows per query row), whole blocks of tile_n."""
    tm, tn = cfg.tile_m, cfg.tile_n
    n_m = max(1, -(-rows // tm))
    k_blocks = -(-seqlen_k // tn)
    if not causal:
        return n_m * tm * (k_blocks + TILE_OVERHEAD_BLOCKS) * tn
    per_row = max(1, rows // max(seqlen_q, 1))
    blocks = 0
    for m in range(n_m):  # at most rows / 64 iterations; memoized per shape by choose_fwd_config
        last_key = seqlen_k - seqlen_q + -(-min((m + 1) * tm, rows) // per_row)
        blocks += min(k_blocks, max(0, -(-last_key // tn)))
    return tm * (blocks + TILE_OVERHEAD_BLOCKS * n_m) * tn


def dispatch_candidates(spec: FwdSpec, model: ExecutionModel) -> tuple[FwdConfig, ...]:
    """Every config a call of ``spec`` may run: ``fwd_candidates`` with K/V shared between heads or not, and the
    decode tile (``decode_entry``)."""
    decode = decode_entry(spec, model)
    return tuple(dict.fromkeys([c for shared in (True, False) for c, _ in fwd_candidates(spec, model, shared)]
                               + ([decode] if decode is not None else [])))


@lru_cache(maxsize=None)
def decode_entry(spec: FwdSpec, model: ExecutionModel) -> Optional[FwdConfig]:
    """The decode tile of a spec, when the table has one valid for it: over packed rows ``d{class}_decode`` (16-bit
    K/V) or ``d{class}_fp8kv_decode`` (FP8 K/V), ``warps_on_keys`` tiles of 16 rows; for MLA ``d{class}_latent_decode``,
    the 16-row ``dv_warps`` tile beside the class's 32-row one. ``choose_fwd_config`` takes it for calls whose rows fit
    it (seqlen_q x group <= 16: decode, short speculative decode), where a larger tile's MMAs would run mostly on
    padding (MLA at 16 heads: 36 us against 52 on the 32-row tile, 16x4096 on an H200,
    mla_tile_sweep_h200_2026-11-29.json)."""
    if not (spec.pack_gqa or spec.latent_v):
        return None
    kind = "fp8kv_" if spec.kv_dtype else "latent_" if spec.latent_v else ""
    cfg = fwd_table().get(f"d{head_dim_class(spec)}_{kind}decode")
    return cfg if cfg is not None and is_valid(spec, cfg, model) else None


#: Keys per block of the batch-invariant tiles (``invariant_config``) per head-dim class: one width for every
#: layout, mask and length of a class, so that a row's key blocks, and with them its online-softmax steps, start at
#: the same key indices in every call. It is the width of the class's dense table entries where the paged layouts'
#: 64-row fallback holds it without spilling (d64-d128: 64 keys). d192 and d256 take 32: their paged 64-key tiles
#: spilled 8-68 B on sm_120a (d192 64x64 one stage, with Q in registers or not, with or without softcap and sink).
INVARIANT_TILE_N = {64: 64, 96: 64, 128: 64, 192: 32, 256: 32}


#: Keys per chunk of a batch-invariant call longer than one chunk (``invariance.chunk_keys``: the environment can set
#: another): its keys are cut into chunks at fixed multiples of this from key 0, each a split of the split-KV kernel
#: (``FwdSpec.split_chunk``), merged by the combine in chunk order. A row gets the same chunks in every call that holds
#: it, and a row of one chunk gets the unsplit tile's bits (the combine of one partial is exact), so calls up to one
#: chunk long run unsplit. The chunk trades two costs. A prefill row writes and the combine reads an fp32 partial per
#: chunk: 8 d bytes per L / C keys against 4 d L flops, a time share of about 2 R / C for a machine of R flops per
#: byte (H200 at SM120 occupancy: R ~ 73, 290 / C; measured 1.14x at C = 2048 and 1.26x at 1024 on 4x4096 d128,
#: twice that share causal). A decode of a few sequences gets batch x KV heads x ceil(L / C) CTAs, where the default
#: fills the SMs. 4096 keeps a long prefill within about 1.07x (1.15x causal); shorter chunks serve few-sequence
#: decode (invariance_h200_2026-11-29.json holds both).
INVARIANT_CHUNK_KEYS = 4096


#: ``FwdSpec.split_chunk`` of a call that is not cut into chunks but merges in the combine (a window no wider than a
#: chunk with a learnable sink): one chunk past any length
WHOLE_CHUNK_BLOCKS = 1 << 24


def uncut_window(span: Optional[int], chunk_keys: int = INVARIANT_CHUNK_KEYS) -> bool:
    """Whether a batch-invariant call whose rows see at most ``span`` keys (its window; None without one) is never cut
    into chunks: a window no wider than a chunk."""
    return span is not None and span <= chunk_keys


def invariant_chunks(cfg: FwdConfig, seqlen_k: int, has_sink: bool, span: Optional[int] = None,
                     chunk_keys: int = INVARIANT_CHUNK_KEYS) -> int:
    """Chunks (splits) of a batch-invariant call on the invariant tile ``cfg`` over ``seqlen_k`` keys (the longest
    sequence's) in chunks of ``chunk_keys``; 0: unsplit. ``span``: the most keys a row sees under the call's window
    (None without one); a window no wider than a chunk is never cut (its rows are few keys whatever the call's
    length, and the same window gives every call the same answer). With a learnable sink every call merges in the
    combine, where the sink enters (the unsplit tile adds it to the row's sum instead: other bits), one chunk
    included."""
    if uncut_window(span, chunk_keys):
        return 1 if has_sink else 0
    chunk_blocks = chunk_keys // cfg.tile_n
    chunks = -(-(-(-seqlen_k // cfg.tile_n)) // chunk_blocks)
    if chunks > MAX_SPLITS:
        raise NotImplementedError(
            f"batch_invariant=True covers up to {MAX_SPLITS * chunk_keys} keys per sequence ({MAX_SPLITS} chunks "
            f"of {chunk_keys}; got {seqlen_k}): run longer sequences with batch_invariant=False, or longer chunks "
            "(FA4_SM120_INVARIANT_CHUNK_KEYS)")
    return chunks if chunks > 1 or has_sink else 0


def chunked_spec(spec: FwdSpec, cfg: FwdConfig, whole: bool = False,
                 chunk_keys: int = INVARIANT_CHUNK_KEYS) -> FwdSpec:
    """The split-KV spec of a batch-invariant call's chunks on the invariant tile ``cfg`` (no sink: the combine adds
    it) in chunks of ``chunk_keys``; ``whole``: one chunk of any length (``WHOLE_CHUNK_BLOCKS``: a narrow window
    with a sink)."""
    blocks = WHOLE_CHUNK_BLOCKS if whole else chunk_keys // cfg.tile_n
    return replace(spec, split_kv=True, has_sink=False, split_chunk=blocks)


def same_row_arithmetic(cfg: FwdConfig, width: int) -> bool:
    """Whether ``cfg`` gives each query row the arithmetic of the batch-invariant tiles: blocks of ``width`` keys,
    each row's whole block on one warp (no keys split over warps, no output columns split over warps with their
    statistics exchanged). The mainloops (cp.async, TMA, warp-specialized, overlapped, ping-pong, persistent), the
    rows per tile and the warps per tile only move where operands come from and which rows a warp owns; a row's
    MMAs, masks and softmax steps are the shared building blocks in the same order
    (``test_invariance_gpu.test_every_tile_of_one_key_width_gives_the_same_bits``)."""
    return cfg.tile_n == width and not cfg.warps_on_keys and cfg.dv_warps == 1


@lru_cache(maxsize=None)
def invariant_family(spec: FwdSpec, model: ExecutionModel, shared_kv: bool = True) -> tuple:
    """(config, rate) of the tiles a batch-invariant call of ``spec`` may run: the default dispatch's candidates
    (``fwd_candidates``) with the row arithmetic of ``INVARIANT_TILE_N`` (``same_row_arithmetic``), else the 64-row
    cp.async tile at that width with the first stages / Q placement the predicate accepts (paged layouts, d256).
    Raises ``NotImplementedError`` past d256, whose tiles are the wide kernel's."""
    cls = head_dim_class(spec)
    if cls not in INVARIANT_TILE_N:
        raise NotImplementedError(f"batch_invariant=True covers head dims up to 256 (got {spec.head_dim} / "
                                  f"{spec.head_dim_v}); larger head dims run the default tiles with batch_invariant=False")
    width = INVARIANT_TILE_N[cls]
    family = tuple((cfg, rate) for cfg, rate in fwd_candidates(spec, model, shared_kv)
                   if rate is not None and same_row_arithmetic(cfg, width))
    if family:
        return family
    problems: tuple = ()
    for stages, q_in_regs in ((2, True), (2, False), (1, True), (1, False)):
        cfg = FwdConfig(64, width, 4, stages, q_in_regs=q_in_regs)
        problems = fwd_config_problems(spec, cfg, model)
        if not problems:
            return ((cfg, None),)
    raise RuntimeError(f"no batch-invariant tile is valid for {spec} on {model.name}: {'; '.join(problems)}")


def invariant_config(spec: FwdSpec, model: ExecutionModel, rows: int = 1, seqlen_q: int = 1, seqlen_k: int = 1,
                     shared_kv: bool = True) -> FwdConfig:
    """The batch-invariant forward tile of a call (``batch_invariant=True``): among ``invariant_family``, which all
    give a row the same bits, the one the tile-efficiency rule (``choose_fwd_config``) prefers for this shape."""
    family = invariant_family(spec, model, shared_kv)
    if len(family) == 1:
        return family[0][0]
    return least_time(family, spec, rows, seqlen_q, seqlen_k)


def least_time(candidates, spec: FwdSpec, rows: int, seqlen_q: int, seqlen_k: int) -> FwdConfig:
    """The config of (config, rate_tflops) ``candidates`` with the least estimated time, ``tile_work / rate``."""
    masked = spec.causal or spec.local
    return min(candidates, key=lambda c: tile_work(c[0], rows, seqlen_q, seqlen_k, masked) / c[1])[0]


@lru_cache(maxsize=4096)
def choose_fwd_config(spec: FwdSpec, model: ExecutionModel, rows: int, seqlen_q: int, seqlen_k: int,
                      shared_kv: bool = True) -> FwdConfig:
    """The tile-efficiency rule: among ``fwd_candidates`` the config with the least estimated time,
    ``tile_work / rate_tflops``, for this call's shape. Long sequences keep the class entry (its rate
    is the highest); short ones move to a smaller M tile when the big tile's padding, causal diagonal
    and fixed cost outweigh its rate (d96 causal 12x777: 256x64 132 -> 128x64 157 TFLOPS)."""
    decode = decode_entry(spec, model)
    if decode is not None and rows <= decode.tile_m:
        return decode
    candidates = fwd_candidates(spec, model, shared_kv)
    if len(candidates) == 1:
        return candidates[0][0]
    return least_time(candidates, spec, rows, seqlen_q, seqlen_k)


def candidate_fwd_configs(spec: FwdSpec, model: ExecutionModel) -> list[FwdConfig]:
    """Configs the tuner may pick from: 16 rows per warp (128 rows on 8 warps, 64 on 4) or 32 (128 on
    4), 2-3 stages, Q in smem or registers, each mainloop variant the model supports, with and without
    the fragment prefetch at 32 rows per warp, with and without the cross-block overlap, with the CTA
    barrier or per-warp mbarriers handing the plain TMA step's stages back, the ping-pong
    configs (256 or 128 rows on two 4-warp groups), filtered by the
    validity predicate. The conformance gate screens them (``--subset candidates``) before
    ``benchmarks/tune_fwd.py`` times them on the device."""
    out = []
    for (tm, w), tn, st, qr, ml in product(((128, 8), (64, 4), (128, 4)), (32, 48, 64, 128), (2, 3), (False, True),
                                           MAINLOOPS):
        # without the fragment prefetch only where registers are the limit (32 rows/warp)
        for pf, ov, mbr in product((True, False) if tm // w == 32 else (True,), (False, True), (False, True)):
            cfg = FwdConfig(tile_m=tm, tile_n=tn, num_warps=w, num_stages=st, q_in_regs=qr, mainloop=ml,
                            frag_prefetch=pf, overlap=ov, mbarrier_release=mbr)
            if is_valid(spec, cfg, model):
                out.append(cfg)
    # ping-pong: two 4-warp groups of 32 or 16 rows per warp, overlapped steps, TMA loads; persistent or not
    for tm, tn, qr, ps in product((256, 128), (32, 64, 128), (False, True), (False, True)):
        cfg = FwdConfig(tile_m=tm, tile_n=tn, num_warps=8, num_stages=2, q_in_regs=qr, mainloop="tma", overlap=True,
                        pingpong=True, persistent=ps)
        if is_valid(spec, cfg, model):
            out.append(cfg)
    return out


#: Head dims the conformance list compiles per class: the class size (the largest tile, most
#: registers) and a padded one (column predicates; d120 for d128, whose TMA tiles take no padding). Plus the two
#: common head_dim_v != head_dim shapes.
REPRESENTATIVE_HEAD_DIMS = {64: ((64, 64), (40, 40)), 96: ((96, 96), (72, 72)),
                            128: ((128, 128), (112, 112), (120, 120), (128, 64)),
                            192: ((192, 192), (192, 128), (160, 160), (176, 176)), 256: ((256, 256), (232, 232), (200, 200))}


MASKS = ("full", "causal", "local")
#: head dims past 256 the gate compiles (the d512 class: ``dv_warps`` tiles), dv != d among them
WIDE_HEAD_DIMS = ((512, 512), (264, 264), (384, 384), (448, 320), (320, 512), (512, 128))


def _spec(dtype, d, dv, mask, softcap=False, sink=False) -> FwdSpec:
    return FwdSpec(dtype=dtype, head_dim=d, head_dim_v=dv, causal=mask == "causal", local=mask == "local",
                   softcap=softcap, has_sink=sink)


def dispatchable_fwd(model: ExecutionModel) -> list[tuple[FwdSpec, FwdConfig]]:
    """The (spec, config) pairs the conformance gate compiles: every table entry (head-dim class x
    mask x dtype) at its representative head dims, and at each class's largest head dim every
    softcap / sink combination (they add code to the same mainloop). Any other head dim of a class
    runs the same config with a subset of these code paths (exact or padded columns). Varlen layouts
    (packed Q and/or K, seqused), packed GQA and split-KV are compiled at each class's largest head
    dim."""
    specs = []
    for dtype in ("bf16", "fp16"):
        for dims in REPRESENTATIVE_HEAD_DIMS.values():
            for d, dv in dims:
                specs += [_spec(dtype, d, dv, mask) for mask in MASKS]
    for klass, dims in REPRESENTATIVE_HEAD_DIMS.items():
        d, dv = dims[0]
        for softcap, sink in ((True, False), (False, True), (True, True)):
            specs += [_spec("bf16", d, dv, mask, softcap, sink) for mask in MASKS]
        # varlen: packed Q and K (+ seqused), and dense Q over a packed/paged-style K with seqused_k
        # packed GQA: every mask, with softcap + sink, and over packed Q/K with seqused
        for mask in MASKS:
            specs.append(replace(_spec("bf16", d, dv, mask), pack_gqa=True))
            specs.append(replace(_spec("bf16", d, dv, mask, True, True), pack_gqa=True))
        specs.append(replace(_spec("fp16", d, dv, "causal"), pack_gqa=True))
        specs.append(replace(_spec("bf16", d, dv, "causal"), varlen_q=True, varlen_k=True, seqused_q=True,
                             seqused_k=True, pack_gqa=True))
        # split-KV (fp32 partial epilogue): every mask, packed GQA (decode), softcap, fp16, varlen
        for mask in MASKS:
            specs.append(replace(_spec("bf16", d, dv, mask, softcap=mask == "local"), split_kv=True))
            specs.append(replace(_spec("bf16", d, dv, mask), split_kv=True, pack_gqa=True))
        specs.append(replace(_spec("fp16", d, dv, "causal"), split_kv=True, pack_gqa=True))
        specs.append(replace(_spec("bf16", d, dv, "causal"), varlen_q=True, varlen_k=True, seqused_q=True,
                             seqused_k=True, pack_gqa=True, split_kv=True))
        for mask in MASKS:
            specs.append(replace(_spec("bf16", d, dv, mask), varlen_q=True, varlen_k=True, seqused_q=True, seqused_k=True))
            specs.append(replace(_spec("bf16", d, dv, mask), varlen_k=True, seqused_k=True))
            specs.append(replace(_spec("bf16", d, dv, mask), seqused_k=True))  # dense KV cache, filled length
            # paged K/V (page size 16: the division is a compile-time constant, the code path the same for
            # every size): prefill tiles, and decode (packed GQA, split) with softcap + sink
            specs.append(replace(_spec("bf16", d, dv, mask), seqused_k=True, page_size=16))
            specs.append(replace(_spec("bf16", d, dv, mask, True, True), seqused_k=True, page_size=16,
                                 pack_gqa=True))
            specs.append(replace(_spec("bf16", d, dv, mask), seqused_k=True, page_size=16, pack_gqa=True,
                                 split_kv=True))
        # chunked prefill: packed Q over paged K/V; page sizes 1 and 256 at the decode spec
        specs.append(replace(_spec("bf16", d, dv, "causal"), varlen_q=True, seqused_k=True, page_size=16))
        for page_size in (1, 256):
            specs.append(replace(_spec("bf16", d, dv, "causal"), seqused_k=True, page_size=page_size,
                                 pack_gqa=True, split_kv=True))
    # FP8 K/V (the class's staging tile) at each class's largest head dim: decode (packed GQA, split, over a dense
    # cache in every mask and a paged one with softcap + sink), chunked prefill (packed Q over a paged cache) and
    # prefill over dense or packed K/V; e5m2 K/V and fp16 q; at the class's other head dims, the paged decode
    for dims in REPRESENTATIVE_HEAD_DIMS.values():
        d, dv = dims[0]
        specs += [replace(_spec("bf16", d, dv, mask), kv_dtype="e4m3", seqused_k=True, pack_gqa=True, split_kv=True)
                  for mask in MASKS]
        specs += [replace(_spec("bf16", d, dv, mask, True, True), kv_dtype="e4m3", seqused_k=True, page_size=16,
                          pack_gqa=True) for mask in MASKS]
        specs.append(replace(_spec("bf16", d, dv, "causal"), kv_dtype="e4m3", varlen_q=True, seqused_k=True,
                             page_size=16))
        specs += [replace(_spec("bf16", d, dv, mask), kv_dtype="e4m3") for mask in ("full", "causal")]
        specs.append(replace(_spec("bf16", d, dv, "causal"), kv_dtype="e4m3", varlen_q=True, varlen_k=True))
        for dtype, kv in (("bf16", "e5m2"), ("fp16", "e4m3")):
            specs.append(replace(_spec(dtype, d, dv, "causal"), kv_dtype=kv, seqused_k=True, page_size=16,
                                 pack_gqa=True, split_kv=True))
        specs += [replace(_spec("bf16", d2, dv2, "causal"), kv_dtype="e4m3", seqused_k=True, page_size=16,
                          pack_gqa=True, split_kv=True) for d2, dv2 in dims]
    # FP8 MMAs (Q, K, V e4m3; models with FP8 mma.sync) at each class's head dims: prefill in every mask (with
    # softcap + sink), over packed K/V and packed Q; at the class's largest, decode (packed GQA, split) over a dense
    # cache and a paged one
    for dims in (REPRESENTATIVE_HEAD_DIMS.values() if model.fp8_mma is not Fp8MmaKind.NONE else ()):
        fp8 = dict(kv_dtype="e4m3", fp8_mma=True)
        specs += [replace(_spec("bf16", d2, dv2, mask), **fp8) for d2, dv2 in dims for mask in MASKS
                  if d2 % 16 == dv2 % 16 == 0]  # FP8 head dims: multiples of 16
        d, dv = dims[0]
        specs += [replace(_spec("bf16", d, dv, "causal", True, True), **fp8),
                  replace(_spec("bf16", d, dv, "causal"), varlen_q=True, varlen_k=True, **fp8),
                  replace(_spec("bf16", d, dv, "full"), seqused_k=True, pack_gqa=True, split_kv=True, **fp8),
                  replace(_spec("bf16", d, dv, "causal"), seqused_k=True, page_size=16, pack_gqa=True, split_kv=True,
                          **fp8)]
    # head dims past 256 (the dv_warps tiles): both dtypes and every mask at each wide head dim; at 512 softcap /
    # sink, packed GQA (decode, speculative decode), varlen / seqused and split-KV (FP8 is refused: wide_features)
    for d, dv in WIDE_HEAD_DIMS:
        specs += [_spec(dtype, d, dv, mask) for dtype in ("bf16", "fp16") for mask in MASKS]
    for mask in MASKS:
        specs += [_spec("bf16", 512, 512, mask, softcap, sink) for softcap, sink in ((True, False), (True, True))]
        specs.append(replace(_spec("bf16", 512, 512, mask, True, True), pack_gqa=True))
        specs.append(replace(_spec("bf16", 512, 512, mask, softcap=True), pack_gqa=True, split_kv=True))
        specs.append(replace(_spec("bf16", 512, 512, mask), pack_gqa=True, split_kv=True))
        specs.append(replace(_spec("bf16", 512, 512, mask), varlen_q=True, varlen_k=True, seqused_q=True,
                             seqused_k=True))
    specs.append(replace(_spec("bf16", 512, 512, "causal"), varlen_q=True, varlen_k=True, seqused_q=True,
                         seqused_k=True, pack_gqa=True, split_kv=True))
    specs.append(replace(_spec("fp16", 512, 512, "causal"), seqused_k=True, pack_gqa=True, split_kv=True))
    # paged K/V past 256 (d512_paged: two 16-key stages): prefill, and decode (packed GQA, split) with softcap + sink
    for d, dv in ((512, 512), (320, 512), (512, 128)):
        specs.append(replace(_spec("bf16", d, dv, "causal"), seqused_k=True, page_size=16))
        specs.append(replace(_spec("bf16", d, dv, "causal", True), seqused_k=True, page_size=16, pack_gqa=True,
                             split_kv=True))
    specs.append(replace(_spec("bf16", 512, 512, "local", True, True), seqused_k=True, page_size=1, pack_gqa=True))
    # MLA (latent_v: 512-wide latent + 64 rope columns per key): decode over dense and paged caches (packed GQA,
    # split), speculative decode (causal), prefill over packed Q/K, both dtypes, softcap + sink
    mla = dict(head_dim=512 + LATENT_ROPE_DIM, head_dim_v=512, latent_v=True)
    for mask in MASKS:
        specs.append(replace(_spec("bf16", 512, 512, mask), **mla))
        specs.append(replace(_spec("bf16", 512, 512, mask), seqused_k=True, pack_gqa=True, split_kv=True, **mla))
        specs.append(replace(_spec("bf16", 512, 512, mask, True, True), seqused_k=True, page_size=64, pack_gqa=True,
                             **mla))
    for page_size in (1, 16, 64):
        specs.append(replace(_spec("bf16", 512, 512, "causal"), seqused_k=True, page_size=page_size, pack_gqa=True,
                             split_kv=True, **mla))
    specs.append(replace(_spec("fp16", 512, 512, "causal"), seqused_k=True, page_size=64, pack_gqa=True, **mla))
    specs.append(replace(_spec("bf16", 512, 512, "causal"), varlen_q=True, varlen_k=True, seqused_q=True,
                         seqused_k=True, **mla))
    # exact-head-dims entries: both dtypes, with and without the sink (the features their key omits)
    for key in fwd_table():
        m = EXACT_KEY.match(key)
        if m:
            d, dv, mask, softcap, split = int(m[1]), int(m[2]), m[3], bool(m[4]), bool(m[5])
            specs += [replace(_spec(dtype, d, dv, mask, softcap, sink), split_kv=split)
                      for dtype in ("bf16", "fp16") for sink in ((False,) if split else (False, True))]
    return [(spec, cfg) for spec in dict.fromkeys(specs) for cfg in dispatch_candidates(spec, model)]


def invariant_pairs(model: ExecutionModel) -> list[tuple[FwdSpec, FwdConfig]]:
    """The batch-invariant tiles (``invariant_family``) the gate compiles: each class up to 256 at its representative
    head dims, both dtypes, every mask; at the class size softcap + sink and every layout (packed, seqused, paged at
    page sizes 1, 16 and 256 with and without softcap + sink, packed GQA); and each of those specs' chunked split
    (``chunked_spec``) on its own family's tiles."""
    specs = []
    for klass, dims in REPRESENTATIVE_HEAD_DIMS.items():
        if klass not in INVARIANT_TILE_N:
            continue
        specs += [_spec(dtype, d, dv, mask) for d, dv in dims for dtype in ("bf16", "fp16") for mask in MASKS]
        d, dv = dims[0]
        for mask in MASKS:
            specs.append(_spec("bf16", d, dv, mask, True, True))
            specs.append(replace(_spec("bf16", d, dv, mask), varlen_q=True, varlen_k=True, seqused_q=True,
                                 seqused_k=True, pack_gqa=True))
            specs += [replace(_spec("bf16", d, dv, mask, score, score), seqused_k=True, page_size=page, pack_gqa=True)
                      for page in (1, 16, 256) for score in (True, False)]
            specs.append(replace(_spec("bf16", d, dv, mask), varlen_q=True, seqused_k=True, page_size=16))
    pairs = [(spec, cfg) for spec in dict.fromkeys(specs) for shared_kv in (True, False)
             for cfg, _ in invariant_family(spec, model, shared_kv)]
    splits = dict.fromkeys(chunked_spec(spec, cfg, whole) for spec, cfg in pairs  # calls longer than a chunk,
                           for whole in ((False, True) if spec.local else (False,)))  # narrow windows with a sink
    return list(dict.fromkeys(pairs + [(split, cfg) for split in splits for shared_kv in (True, False)
                                       for cfg, _ in invariant_family(split, model, shared_kv)]))
