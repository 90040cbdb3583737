"""The backward's fp32 dQ accumulator in MMA-fragment order (arch-free building blocks).

The main kernel adds each key block's dQ_m = dS K into the accumulator of query block m; the
postprocess reads it once. Both partition the block with the same tiled MMA (``dq_tiled_mma``), so the
accumulator need not be row-major: within the ``tile_m x d_pad`` fp32 block of query block m (at
``m * tile_m * d_pad`` from the (sequence, head)'s first workspace row), head-dim slice ``ch`` of
``dq_chunks`` takes ``tile_m * width`` values, and in it the 4 values a thread holds of one m16n8
atom, ``[(col 0, row r), (col 1, row r), (col 0, row r + 8), (col 1, row r + 8)]``, are contiguous at
``((mi * MMA_N + ni) * num_threads + tidx) * 4``. One warp's additions for an atom then cover 512
contiguous bytes, and a thread adds them with one ``red.global.add.v4.f32`` where the execution model
has vector reductions (four scalar ones otherwise).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warp

from ..bwd_config import ROW_PAD
from .block_info import _max, _min
from .seqlen_info import packed_start


def warp_tiled_mma(dtype, num_warps: int, warps_m: int, cells: int = 0, n_step: int = 16) -> cute.TiledMma:
    """m16n8k16 MMAs over ``warps_m`` x (num_warps / warps_m) warps, 16 columns per warp per step (two
    n8 atoms: one ldmatrix.x4 of the B operand; ``n_step`` 8: one n8 atom, for a B operand held in registers whose
    warp share is not a 16-multiple, ``bwd_config.bwd_sdp_n_step``). The warps' n8 atoms interleave (warp w_n: columns
    8 w_n + 16 j);
    ``cells`` (16 or 32): each warp's atoms come in runs of ``cells`` neighbouring columns (warp w_n: columns
    ``cells * w_n + 8 j`` of each step of ``cells * warps_n``), so a thread holds whole cells of dropout's Philox
    grouping (``dropout_mask.warp_cell_columns``)."""
    warps_n = num_warps // warps_m
    if cells and warps_n > 1:
        n_perm = cute.make_layout((8, warps_n, cells // 8), stride=(1, cells, 8))
    else:
        n_perm = warps_n * n_step
    return cute.make_tiled_mma(
        warp.MmaF16BF16Op(dtype, Float32, (16, 8, 16)),
        (warps_m, warps_n, 1),
        permutation_mnk=(warps_m * 16, n_perm, 16),
    )


def dq_tiled_mma(dtype, config) -> cute.TiledMma:
    """The tiled MMA of dQ = dS K (a ``BwdConfig``'s warps and dQ split): the accumulator's layout."""
    return warp_tiled_mma(dtype, config.num_warps, config.dq_warps_m)


def slice_offset(m, ch, tile_m: int, head_dim: int, width: int):
    """Offset (fp32 elements) of query block m's head-dim slice ``ch`` from the (sequence, head)'s start."""
    return m * (tile_m * head_dim) + ch * (tile_m * width)


@cute.jit
def add_fragment(acc: cute.Tensor, ptr: cute.Pointer, tidx, num_threads: cutlass.Constexpr[int],
                 vector: cutlass.Constexpr[bool]):
    """Add this thread's dQ fragment ``acc`` ((2, 2), MMA_M, MMA_N) into the slice at ``ptr`` (relaxed,
    gpu scope: other CTAs add into the same slice)."""
    quad = cute.make_rmem_tensor((4,), Float32)
    num_n = cute.size(acc, mode=[2])
    for mi in cutlass.range_constexpr(cute.size(acc, mode=[1])):
        for ni in cutlass.range_constexpr(num_n):
            at = (ptr + ((mi * num_n + ni) * num_threads + tidx) * 4).align(16)
            for h in cutlass.range_constexpr(2):
                for c in cutlass.range_constexpr(2):
                    quad[2 * h + c] = acc[(c, h), mi, ni]
            if cutlass.const_expr(vector):
                cute.arch.red(at, quad.load(), op="add", dtype="f32", sem="relaxed", scope="gpu")
            else:
                for i in cutlass.range_constexpr(4):
                    cute.arch.red(at + i, quad[i], op="add", dtype="f32", sem="relaxed", scope="gpu")


@cute.jit
def load_fragment(acc: cute.Tensor, ptr: cute.Pointer, tidx, num_threads: cutlass.Constexpr[int]):
    """Read this thread's fragment of the slice at ``ptr`` into ``acc`` ((2, 2), MMA_M, MMA_N): 16-byte
    loads, a warp reading 512 contiguous bytes per atom."""
    num_n = cute.size(acc, mode=[2])
    for mi in cutlass.range_constexpr(cute.size(acc, mode=[1])):
        for ni in cutlass.range_constexpr(num_n):
            src = cute.make_tensor((ptr + ((mi * num_n + ni) * num_threads + tidx) * 4).align(16),
                                   cute.make_layout((4,)))
            quad = cute.make_rmem_tensor((4,), Float32)
            cute.autovec_copy(src, quad)
            for h in cutlass.range_constexpr(2):
                for c in cutlass.range_constexpr(2):
                    acc[(c, h), mi, ni] = quad[2 * h + c]


# ------------------------------------------------------------------------------------------------
# Deterministic mode: the key blocks that visit a query block add their dQ in a fixed order. One int32
# counter per (sequence, head, query block) starts at 0; key block n waits until it reads its rank,
# adds, and increments it (the role split a step later, in a warp group's slack: the release waits for
# the reductions and the acquire invalidates L1, each stalling its warp). Two orders (``BwdSpec.lowest_first``,
# chosen per call by ``bwd_schedule.bwd_det_order``), each launching a CTA only after every CTA it waits on
# (forward progress) and walking so that a CTA never waits on a walk behind its own:
#   highest first: rank = (last visiting key block) - n; a pair's key blocks launch highest first, one pair
#     after another, and walk their query blocks first to last (heads outer): key block n reaches query
#     block m a step after key block n + 1 did (causal), so the turn is usually there already; but a causal
#     pair's longest CTA starts last.
#   lowest first: rank = n - (first visiting key block); key blocks launch lowest first (per pair, or the
#     banded longest-first order) and walk their query blocks last to first with the heads inner: the key
#     blocks of a causal pair, whose ranges end together, reach each (head, query block) at the same step of
#     their walks, so each CTA trails its predecessor by one release (``bwd_schedule.DET_CHAIN_LAG``) where they
#     start together; the longest CTAs start first.
# ------------------------------------------------------------------------------------------------
def turn_rank(n_block, ranges, lowest_first: bool, rotated=None):
    """Key block ``n_block``'s place in the order of additions into a query block whose visiting key blocks are
    ``[ranges[0], ranges[3])`` (``block_info.block_range``). ``rotated``: (the query block's index in its walk,
    the sequence's query blocks) in the rotated order (``BwdSpec.rotated_turns``; no mask, so the range is every key
    block from 0): key block n starts its walk at query block n, so query block m sees key blocks min(m, last),
    ..., 0, last, ..., m + 1 arrive a step apart, and that is their order. A sequence with more key blocks than
    query blocks walks unrotated (``FlashBwdMultistage``) in the highest-first order: its start ``m + (hi - num_m)
    * hi`` clamps to the last key block, where ``(last - n) mod hi`` is the highest-first rank. Branch-free: host
    tests call it on integers."""
    if rotated is not None:
        m, num_m = rotated
        hi = ranges[3]
        first = _min(m + _max(hi - num_m, 0) * hi, hi - 1)
        return (first - n_block + hi) % hi
    return n_block - ranges[0] if lowest_first else ranges[3] - 1 - n_block


@cute.jit
def semaphore_ptr(mSem: cute.Tensor, batch, head, m, tile_m: cutlass.Constexpr[int], mCuSeqlensQ, total_q):
    """The counter of query block m of (batch, head): dense (batch, heads, blocks); packed (heads, slots)
    at the block's first workspace row over tile_m (``seqlen_info.workspace_row``'s rows: every sequence
    starts ``ROW_PAD`` >= tile_m rows after the previous one ends, so no two blocks share a slot)."""
    if cutlass.const_expr(mCuSeqlensQ is None):
        return mSem.iterator + cute.crd2idx((batch, head, m), mSem.layout)
    start = packed_start(mCuSeqlensQ, batch, total_q) + batch * ROW_PAD
    return mSem.iterator + cute.crd2idx((head, (start + m * tile_m) // tile_m), mSem.layout)


@cute.jit
def read_turn(ptr: cute.Pointer, tidx) -> Int32:
    """Thread 0's first (acquire) read of the counter, issued early so its latency hides under other work
    (other threads get 0: only thread 0 waits)."""
    seen = Int32(0)
    if tidx == 0:
        seen = cute.arch.load(ptr, Int32, sem="acquire", scope="gpu")
    return seen


@cute.jit
def wait_turn(ptr: cute.Pointer, rank, seen, tidx):
    """Thread 0 polls (acquire loads) until the counter reads ``rank``; the caller's next CTA barrier holds
    the other threads."""
    if tidx == 0:
        while seen != rank:
            seen = cute.arch.load(ptr, Int32, sem="acquire", scope="gpu")


@cute.jit
def pass_turn(ptr: cute.Pointer, tidx):
    """Called after a CTA barrier that follows every thread's reductions: thread 0 releases the next rank
    (the release orders the reductions, through the barrier, before the increment)."""
    if tidx == 0:
        cute.arch.red(ptr, Int32(1), op="add", dtype="s32", sem="release", scope="gpu")
