"""Tile configurations for the forward kernel: one validity predicate, one table, pure host code.

``fwd_config_problems`` is THE validity predicate: the heuristic, the conformance gate and the tests
all call it. ``FWD_TABLE`` is the dispatcher's choice per head dim; ``dispatchable_fwd`` enumerates
every (spec, config) the dispatcher can pick, for the conformance gate.
"""

from __future__ import annotations

from dataclasses import dataclass

from .execution_model import ExecutionModel
from .problem import SUPPORTED_HEAD_DIMS, FwdSpec

BYTES_PER_ELEM = 2  # bf16 / fp16 operands


@dataclass(frozen=True)
class FwdConfig:
    tile_m: int
    tile_n: int
    num_warps: int = 4

    @property
    def num_threads(self) -> int:
        return self.num_warps * 32


def padded_head_dim(d: int) -> int:
    """The MMA k-extent (16) rounds head dims up; smem and fragments use the padded size."""
    return (d + 15) // 16 * 16


def fwd_smem_bytes(spec: FwdSpec, cfg: FwdConfig) -> int:
    """Shared memory per CTA: Q tile (reused for O) + one K tile + one V tile, each 1024-aligned."""
    d, dv = padded_head_dim(spec.head_dim), padded_head_dim(spec.head_dim_v)

    def aligned(n: int) -> int:
        return (n + 1023) // 1024 * 1024

    q_or_o = max(cfg.tile_m * d, cfg.tile_m * dv) * BYTES_PER_ELEM
    return aligned(q_or_o) + aligned(cfg.tile_n * d * BYTES_PER_ELEM) + aligned(cfg.tile_n * dv * BYTES_PER_ELEM)


def fwd_config_problems(spec: FwdSpec, cfg: FwdConfig, model: ExecutionModel) -> tuple[str, ...]:
    """Every reason ``cfg`` cannot run ``spec`` under ``model``; empty when valid."""
    out = []
    rows_per_pass = cfg.num_warps * 16  # rows one MMA step covers (one m16 atom per warp)
    if cfg.num_warps not in (4, 8):
        out.append(f"num_warps={cfg.num_warps} (4 or 8 supported)")
    if cfg.tile_m % rows_per_pass:
        out.append(f"tile_m={cfg.tile_m} is not a multiple of {rows_per_pass} (16 rows per warp)")
    if cfg.tile_n % 16:
        out.append(f"tile_n={cfg.tile_n} is not a multiple of 16 (two n8 atoms form one k16 step of P@V)")
    for name, d in (("head_dim", spec.head_dim), ("head_dim_v", spec.head_dim_v)):
        if d % 16:
            out.append(f"{name}={d} is not a multiple of 16")
    smem = fwd_smem_bytes(spec, cfg)
    if smem > model.smem_per_cta:
        out.append(f"shared memory {smem} B exceeds {model.smem_per_cta} B per CTA of the {model.name} model")
    # fp32 accumulators per thread: O (tile_m x dv) and S (tile_m x tile_n). At 192 the sm_120a
    # build spills (d=128 128x64 and d=64 128x128 on 4 warps: 255 regs + 72/56 B stack); at 128 it
    # does not (measured with the conformance gate, 2026-11-22).
    acc_regs = cfg.tile_m * (padded_head_dim(spec.head_dim_v) + cfg.tile_n) // cfg.num_threads
    if acc_regs > 128:
        out.append(f"{acc_regs} accumulator registers per thread (O + S) leave too few for operands")
    return tuple(out)


def is_valid(spec: FwdSpec, cfg: FwdConfig, model: ExecutionModel) -> bool:
    return not fwd_config_problems(spec, cfg, model)


#: The dispatcher's table: head_dim -> config. 8 warps of 16 rows keep the accumulators at 96-128
#: registers per thread: sm_120a builds use 212 (d=64) and 215 (d=128) registers, no spills.
FWD_TABLE: dict[int, FwdConfig] = {
    64: FwdConfig(tile_m=128, tile_n=128, num_warps=8),
    128: FwdConfig(tile_m=128, tile_n=64, num_warps=8),
}


def select_fwd_config(spec: FwdSpec, model: ExecutionModel) -> FwdConfig:
    cfg = FWD_TABLE[spec.head_dim]
    problems = fwd_config_problems(spec, cfg, model)
    if problems:  # a table entry that fails the predicate is a bug in this file, not a user error
        raise RuntimeError(f"forward table entry {cfg} is invalid for {spec} on {model.name}: {'; '.join(problems)}")
    return cfg


def dispatchable_fwd(model: ExecutionModel) -> list[tuple[FwdSpec, FwdConfig]]:
    """Every (spec, config) the dispatcher can choose under ``model``: the conformance list."""
    out = []
    for dtype in ("bf16", "fp16"):
        for d in SUPPORTED_HEAD_DIMS:
            for causal in (False, True):
                spec = FwdSpec(dtype=dtype, head_dim=d, head_dim_v=d, causal=causal)
                out.append((spec, select_fwd_config(spec, model)))
    return out
