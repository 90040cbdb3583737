"""Block-sparse backward lists, refined by the mask_mod (arch-free, no MMA).

The backward walks key tiles of ``tile_n`` keys over query tiles of ``tile_m`` rows, finer than the (128, 128)
blocks of the forward's lists, so every tile of a partial block would be a masked step, though many of them are
wholly kept or wholly dropped (a causal or document diagonal block of 128 is two partial 64 x 64 tiles, one
full, one empty). This kernel classifies them before the host compacts the lists
(``block_sparse.backward_lists``): it reads a (batch, head, query tile, key tile) int8 class grid and rewrites
each PARTIAL entry as EMPTY (the mask_mod drops every element of the tile inside the sequences), FULL (it keeps
every one) or PARTIAL, evaluating the traced mask_mod as the main kernels do. Tiles of other classes are left
alone. Elements past the sequence ends count for neither class (the main kernels mask them).

One CTA = one query tile row of one (batch, head): its four warps take the key tiles in turn, each lane a 32nd of
a partial tile's elements, and a warp vote gives the tile's class. ``batch`` / ``head`` are the grid's indices:
the host passes a grid of one batch or head only when the mask_mod does not read that argument.
"""

from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from .. import flex
from ..execution_model import ExecutionModel
from ..problem import RefineSpec
from .flex_mods import SeqlenInfo, aux_inputs, mask_keeps

#: the grid's classes (``block_sparse.EMPTY / PARTIAL / FULL``)
_EMPTY, _PARTIAL, _FULL = 0, 1, 2
_WARPS = 4
_LANES = 32


class SparseTileRefine:
    def __init__(self, spec: RefineSpec, model: ExecutionModel):
        self.spec = spec
        self.model = model

    @staticmethod
    def can_implement(spec: RefineSpec, model: ExecutionModel) -> tuple[str, ...]:
        problems = []
        if spec.mods is None or spec.mods.mask_mod is None:
            problems.append("the refinement evaluates a mask_mod: the spec has none")
        if spec.tile_m <= 0 or spec.tile_n <= 0:
            problems.append(f"tile {spec.tile_m} x {spec.tile_n} is empty")
        return tuple(problems)

    @cute.jit
    def __call__(self, mTiles: cute.Tensor, seqlen_q: Int32, seqlen_k: Int32, mAux0: Optional[cute.Tensor],
                 mAux1: Optional[cute.Tensor], mAux2: Optional[cute.Tensor], mAux3: Optional[cute.Tensor],
                 sAux0, sAux1, sAux2, sAux3, stream: cuda.CUstream):
        grid = (mTiles.shape[2], mTiles.shape[1], mTiles.shape[0])
        self.kernel(mTiles, seqlen_q, seqlen_k, mAux0, mAux1, mAux2, mAux3, sAux0, sAux1, sAux2, sAux3).launch(
            grid=grid, block=[_WARPS * _LANES, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mTiles: cute.Tensor, seqlen_q: Int32, seqlen_k: Int32, mAux0: Optional[cute.Tensor],
               mAux1: Optional[cute.Tensor], mAux2: Optional[cute.Tensor], mAux3: Optional[cute.Tensor],
               sAux0, sAux1, sAux2, sAux3):
        tidx, _, _ = cute.arch.thread_idx()
        m, head, batch = cute.arch.block_idx()
        warp, lane = tidx // _LANES, tidx % _LANES
        mask_mod = flex.callables(self.spec.mods)[2]
        aux = aux_inputs(mAux0, mAux1, mAux2, mAux3, sAux0, sAux1, sAux2, sAux3)
        info = SeqlenInfo(offset_q=Int32(0), offset_k=Int32(0), seqlen_q=seqlen_q, seqlen_k=seqlen_k)
        tile_m, tile_n = const_expr(self.spec.tile_m), const_expr(self.spec.tile_n)
        for n in cutlass.range(warp, mTiles.shape[3], _WARPS):
            if Int32(mTiles[batch, head, m, n]) == _PARTIAL:
                kept = Int32(0)
                dropped = Int32(0)
                for e in cutlass.range(lane, tile_m * tile_n, _LANES):
                    q_idx = m * tile_m + e // tile_n
                    kv_idx = n * tile_n + e % tile_n
                    if q_idx < seqlen_q and kv_idx < seqlen_k:
                        if mask_keeps(mask_mod, batch, head, q_idx, kv_idx, info, aux):
                            kept = Int32(1)
                        else:
                            dropped = Int32(1)
                any_kept = cute.arch.vote_any_sync(kept != 0)
                any_dropped = cute.arch.vote_any_sync(dropped != 0)
                if lane == 0:
                    cls = Int32(_PARTIAL)
                    if not any_kept:
                        cls = Int32(_EMPTY)
                    elif not any_dropped:
                        cls = Int32(_FULL)
                    mTiles[batch, head, m, n] = cls.to(cutlass.Int8)
