"""Launch-order models of the backward's main kernel: pure host code, one answer per call shape.

The main kernel runs one CTA per (key block, KV head, batch), walking the query heads of the KV head's group. How
those CTAs are ordered and cut decides how well the last wave fills the device, and three choices are made per
call from a greedy schedule model (``_makespan``: CTAs start in launch order on the device's CTA slots, each
taking its query-block visits in step times):

* ``bwd_group_split``: split each KV head's query-head group over more CTAs (small GQA grids), each writing
  partial dK / dV that the host sums;
* ``bwd_tile_band``: the (batch, KV head) pairs per band of the longest-first key-block order, bounded by the
  rows that fit the L2;
* ``bwd_det_order``: for a causal deterministic call, lowest-first or highest-first key blocks (with their split
  and band), the lowest-first order's serial chain of dQ additions modelled by ``_chained_makespan``.

The constants carry the measurements they come from (device, date and result file).
"""

from __future__ import annotations

from functools import lru_cache

from .bwd_config import GROUP_SPLITS
from .config import BYTES_PER_ELEM

#: A query-head group is split over more CTAs only where the modelled time improves by more than this share:
#: each split writes one more partial dK / dV, which the host sums, and the model's modest gains do not survive
#: that (H100, per-pair key-block order, 2026-11-25: modelled 1.07x at 4 x 1024 32/8 and 8 x 1024 16/4 d64,
#: measured 0.97x; modelled 1.06-1.10x at 8 x 512 8/2, where host time dominates, measured 0.64x; modelled
#: 1.12-1.28x, measured 1.12-1.22x).
GROUP_SPLIT_SLACK = 0.10
#: A split must also save at least this many step times (one step: a 64-row query block at d128, ~2 us on the
#: H100 at SM120 occupancy): it costs two fp32 reductions and their host time, which a short backward does not
#: earn back (group_split_ab_h100_2026-11-26.json: 8 x 512 8/2 d128 causal, banded, modelled 34 -> 22 steps with
#: 2 splits, measured 48 -> 33 TFLOPS; deterministic 8 x 1024 16/4 d64, 118 -> 96 steps with 4, measured 116 ->
#: 129).
GROUP_SPLIT_MIN_SAVED_STEPS = 16
#: Grids of at least this many waves stay whole: their tail is under 1/8 of the time (and the model is not
#: worth its host time there).
GROUP_SPLIT_MIN_WAVES = 8
#: Per-CTA fixed cost in query-block steps: the K/V tile load before the first step and the dK/dV store after
#: the last.
GROUP_SPLIT_FIXED_STEPS = 2.0


@lru_cache(maxsize=4096)
def bwd_group_split(seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, heads_kv: int, group: int, batch: int,
                    causal: bool, slots: int, banded: bool = False, l2_bytes: int = 0, head_dim: int = 0,
                    head_dim_v: int = 0) -> int:
    """Query-head splits of each KV head's group for the backward: the main kernel runs one CTA per (key
    block, KV head, batch) and walks ``group`` query heads in it, so a GQA model with few KV heads launches a
    small grid of long CTAs (8/2 heads at 4 x 2048 keys: 256 CTAs of 4 heads each), and the causal CTAs of
    early key blocks, which see every later query block, leave the last wave's SMs idle. With ``s`` splits
    (a divisor of ``group`` in ``GROUP_SPLITS``) each KV head gets ``s`` CTA rows (``BwdSpec.group_split``), a
    CTA walks ``group / s`` heads and writes its own partial dK/dV, which the host sums in fp32 (a fixed order:
    deterministic mode holds).

    The model: CTAs start in launch order on ``slots`` = SMs x CTAs per SM, each taking ``heads * query blocks it
    visits (bottom-right causal or all) + GROUP_SPLIT_FIXED_STEPS`` step times; the time is the greedy
    schedule's makespan; the answer is the fastest split where it beats the whole group by more than
    ``GROUP_SPLIT_SLACK`` and by ``GROUP_SPLIT_MIN_SAVED_STEPS``, else 1. ``banded``: the kernel runs the key
    blocks longest first in bands of pairs (``bwd_banded``), each split at the band ``bwd_tile_band`` gives it
    (``l2_bytes``, ``head_dim``, ``head_dim_v``: that rule's inputs); else key block fastest, one pair after
    another, from key block 0 (a causal deterministic call takes its order and split from ``bwd_det_order``). The
    banded order removes most of the tail a split would cut: H100, SM120 occupancy, causal
    (group_split_ab_h100_2026-11-26.json), whole groups run faster than any split at every shape measured (4 x
    2048 8/2 d128 209 TFLOPS, split 4 189; 8 x 1024 16/4 d64 168 against 143; 2 x 4096 16/4 237 against 227), as
    this model predicts; in the per-pair order a split gains 1.12-1.28x (H100, 2026-11-25; a deterministic call
    launched highest first per pair: 4 x 2048 8/2 125 -> 153 TFLOPS with 4 splits). What splits by default: grids
    too small to fill the device at any band (one or two pairs: MQA and small batches)."""
    num_n = -(-seqlen_k // tile_n)
    if group <= 1 or slots <= 0 or num_n <= 0 or seqlen_q <= 0:
        return 1
    if num_n * heads_kv * batch >= GROUP_SPLIT_MIN_WAVES * slots:
        return 1
    visits = _visits(seqlen_q, seqlen_k, tile_m, tile_n, causal)
    splits = [1] + [s for s in GROUP_SPLITS if group % s == 0]
    times = []
    for s in splits:
        pairs = heads_kv * s * batch
        band = (bwd_tile_band(l2_bytes, seqlen_q, seqlen_k, head_dim, head_dim_v, tile_m, tile_n, group // s, pairs,
                              slots) if banded else 1)
        works = [(group // s) * v + GROUP_SPLIT_FIXED_STEPS for v in visits]
        times.append(_makespan(works, pairs, band, slots))
    return splits[_split_choice(splits, times)]


def _split_choice(splits: list, times: list) -> int:
    """Index of the split to run among ``splits`` (the first is 1) of modelled ``times``: the fastest where it
    beats the whole group by more than ``GROUP_SPLIT_SLACK`` and by ``GROUP_SPLIT_MIN_SAVED_STEPS``, else 0."""
    best = min(range(len(splits)), key=lambda i: (times[i], splits[i]))
    saved = times[0] - times[best]
    return best if saved > times[best] * GROUP_SPLIT_SLACK and saved >= GROUP_SPLIT_MIN_SAVED_STEPS else 0


def _visits(seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, causal: bool) -> list:
    """Query blocks each key block's CTA visits: all, or under a causal mask those from the diagonal row of its
    first key on (bottom-right aligned)."""
    num_m = -(-seqlen_q // tile_m)
    if not causal:
        return [num_m] * -(-seqlen_k // tile_n)
    return [num_m - min(num_m, max(0, (n * tile_n - (seqlen_k - seqlen_q)) // tile_m))
            for n in range(-(-seqlen_k // tile_n))]


def _makespan(works: list, pairs: int, band: int, slots: int) -> float:
    """The greedy schedule's makespan of ``pairs`` (batch, KV head) pairs of CTAs taking ``works[n]`` step times
    at key block n on ``slots`` CTA slots, started in launch order: bands of ``band`` pairs, key block slowest
    within a band (``tile_scheduler.banded_coords``; band 1: every key block of a pair, then the next pair)."""
    import heapq

    free = [0.0] * slots
    for first in range(0, pairs, band):
        width = min(band, pairs - first)
        for w in works:
            for _ in range(width):
                heapq.heapreplace(free, free[0] + w)
    return max(free)


#: The deterministic lowest-first order's chain (``_kernels/dq_accum``): key blocks of a pair that start together
#: reach each query block at the same step, and each adds after its predecessor has released it; in the role split
#: the release comes in the next step, after dP: about 0.9 of a step after the wait (the model's CTA starts that
#: much after its predecessor's). H100, SM120 occupancy (deterministic_order_h100_2026-11-26.json.gz):
#: with it the model gives lowest first / highest first 1.45x at 8 x 2048 16/16 d128 causal with the band the
#: default's rule takes (measured 1.42x), 0.99x at 2 x 4096 16/4 (0.98x), 0.97-0.98x at 4 x 4096 32/8 d128 and 4 x
#: 2048 8/2 (0.92-0.94x), 0.95x at d64 4 x 4096 32/8 (0.90x).
DET_CHAIN_LAG = 0.9
#: The lowest-first order's bands may hold rows up to this share of the L2 (the default's ``BWD_L2_BAND_SHARE``:
#: 1.0): larger bands start fewer CTAs of a pair together, so shorter chains. Measured
#: (deterministic_order_h100_2026-11-26.json.gz), d128 causal: 4 x 2048 8/2 band 8 (64 MB of rows)
#: 0.492 ms against 0.529 with 4; 2 x 4096 16/4 band 8 (128 MB) 1.628 against 1.631 with 4; 16 x 1024 32/8 band 8
#: (32 MB) 1.979 against 2.003 with 16.
DET_L2_BAND_SHARE = 2.0


def _chained_makespan(works: list, pairs: int, band: int, slots: int, lag: float) -> float:
    """``_makespan`` with each CTA starting no earlier than ``lag`` after the previous key block of its pair
    started (the lowest-first order's chain; it holds its slot meanwhile)."""
    import heapq

    free = [0.0] * slots
    last = [float("-inf")] * pairs
    for first in range(0, pairs, band):
        width = min(band, pairs - first)
        for w in works:
            for p in range(first, first + width):
                start = max(free[0], last[p] + lag)
                last[p] = start
                heapq.heapreplace(free, start + w)
    return max(free)


def bwd_det_order(seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, heads_kv: int, group: int, batch: int,
                  slots: int, l2_bytes: int, head_dim: int, head_dim_v: int, banded: bool,
                  lowest_open: bool = True) -> tuple:
    """(lowest first, group split, band) of a causal deterministic backward (``BwdSpec.lowest_first``): the order
    whose schedule model is faster. Highest first: per pair, shortest CTA first, each split as ``bwd_group_split``
    models it (no chain: a key block reaches a query block a step after the one it waits on). Lowest first: the
    longest-first bands (``banded``: the kernel runs them; the band the L2 allows whose chained model --
    ``_chained_makespan``, ``DET_CHAIN_LAG`` -- is fastest, rows up to ``DET_L2_BAND_SHARE`` of the L2), whole
    groups only (``lowest_open``: the predicate admits it for the call's config). Small GQA grids gain from the
    longest CTAs starting first; grids of many short pairs (MHA) lose more to the chain than the tail costs them."""
    return _modelled_det_order(*_tile_rounded(seqlen_q, seqlen_k, tile_m, tile_n), tile_m, tile_n, heads_kv, group,
                               batch, slots, l2_bytes, head_dim, head_dim_v, banded, lowest_open)


@lru_cache(maxsize=4096)
def _modelled_det_order(seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, heads_kv: int, group: int,
                        batch: int, slots: int, l2_bytes: int, head_dim: int, head_dim_v: int, banded: bool,
                        lowest_open: bool) -> tuple:
    num_n = -(-seqlen_k // tile_n)
    if slots <= 0 or num_n <= 0 or seqlen_q <= 0:
        return False, 1, 1
    visits = _visits(seqlen_q, seqlen_k, tile_m, tile_n, True)
    splits = [1] + [s for s in GROUP_SPLITS if group % s == 0]
    if num_n * heads_kv * batch >= GROUP_SPLIT_MIN_WAVES * slots:
        splits = [1]  # as ``bwd_group_split``: a grid of many waves stays whole

    def works(s):
        return [(group // s) * v + GROUP_SPLIT_FIXED_STEPS for v in visits]

    # highest first: per pair, shortest CTA first, the split chosen as ``bwd_group_split`` chooses
    times = [_makespan(works(s)[::-1], heads_kv * s * batch, 1, slots) for s in splits]
    pick = _split_choice(splits, times)
    best = (times[pick], False, splits[pick], 1)
    # lowest first: whole groups only (deterministic_order_h100_2026-11-26.json.gz, split 2 / whole at the best
    # bands: 1.04x at 2 x 4096 16/4, 1.05x at 4 x 2048 8/2, 1.15x at 16 x 1024 32/8 slower, where the model, with a
    # split's 16 fixed steps added, says 1.02x faster to 1.05x slower); each band, a larger one only where it is
    # faster by BWD_BAND_SLACK
    pairs = heads_kv * batch
    cap = _band_cap(l2_bytes, seqlen_q, head_dim, head_dim_v, group, pairs, DET_L2_BAND_SHARE) if banded else 1
    for band in range(1, cap + 1) if lowest_open else ():
        t = _chained_makespan(works(1), pairs, band, slots, DET_CHAIN_LAG)
        if t < best[0] * (1 - BWD_BAND_SLACK):
            best = (t, True, 1, band)
    return best[1:]


#: Share of the device's L2 the rows one band's CTAs walk may fill (``bwd_tile_band``): H100, SM120 occupancy,
#: causal (bwd_band_h100_2026-11-26.json): d128 4x4096 32/8 ran 0.96x with bands of 2 and 4 pairs (34 / 67 MB of
#: rows against a 50 MB L2) and 1.02x with all 32 in one; 8x2048 16/16 d128 0.98x with 16 (34 MB), 1.70x with
#: all 128 (268 MB); d256 2x4096 16/16 1.01-1.02x with 2-4 (16-34 MB), 1.24x with all.
BWD_L2_BAND_SHARE = 1.0
#: The smallest band whose modelled time is within this share of the best is taken (more pairs per band hold
#: more rows in the L2: d64 4x4096 32/8 ran 0.89x with 4 pairs, 0.90x with 8, 0.91x with 16, modelled equal).
BWD_BAND_SLACK = 0.01


def bwd_tile_band(l2_bytes: int, seqlen_q: int, seqlen_k: int, head_dim: int, head_dim_v: int, tile_m: int,
                  tile_n: int, heads: int, pairs: int, slots: int) -> int:
    """(batch, KV head) pairs per band of the main kernel's longest-first key-block order
    (``_kernels/tile_scheduler.KeyBlockScheduler``). Key block n of a causal pair visits the query blocks from
    its diagonal on, so the pair's first CTAs are its longest; one pair after another (band 1), each wave ends
    on a few long CTAs started late. Bands of pairs run their key blocks 0 first, then 1, ...: longest first.
    The band is the smallest whose modelled time (``_makespan``: ``heads`` query heads per CTA, each visit one
    step, ``GROUP_SPLIT_FIXED_STEPS`` per CTA, ``slots`` CTA slots) is within ``BWD_BAND_SLACK`` of the best
    among the bands whose rows -- Q and dO of ``heads`` query heads (16-bit) and their fp32 dQ accumulator, per
    pair -- fit ``BWD_L2_BAND_SHARE`` of the L2. The model reproduces the measured pattern: with 32 pairs,
    bands of 3 and 6 leave a short last band and gain little, 4 and 8 the most (H100, SM120 occupancy, causal
    d64 4x4096 32/8: 0.97x / 1.01x against 0.89x / 0.90x; model 0.99x / 1.01x against 0.88x / 0.88x).
    Block-sparse lists (on the device; their lengths are not read back) take the causal model's band: right for
    the causal-like patterns, harmless for lists of equal lengths (any band whose rows fit the L2)."""
    return _modelled_band(l2_bytes, *_tile_rounded(seqlen_q, seqlen_k, tile_m, tile_n), head_dim, head_dim_v,
                          tile_m, tile_n, heads, pairs, slots)


def _tile_rounded(seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int) -> tuple:
    """The lengths the schedule models see: rounded up to whole tiles, so varlen calls (max_seqlen per batch)
    share few cache entries."""
    unit = max(tile_m, tile_n)
    return -(-seqlen_q // unit) * unit, -(-seqlen_k // unit) * unit


@lru_cache(maxsize=4096)
def _modelled_band(l2_bytes: int, seqlen_q: int, seqlen_k: int, head_dim: int, head_dim_v: int, tile_m: int,
                   tile_n: int, heads: int, pairs: int, slots: int) -> int:
    """``bwd_tile_band`` on tile-rounded lengths (its host time: 1-9 ms per new entry at 32-128 pairs)."""
    cap = _band_cap(l2_bytes, seqlen_q, head_dim, head_dim_v, heads, pairs)
    if cap <= 1 or slots <= 0 or seqlen_q <= 0 or seqlen_k <= 0:
        return 1
    works = [heads * v + GROUP_SPLIT_FIXED_STEPS for v in _visits(seqlen_q, seqlen_k, tile_m, tile_n, True)]
    times = {band: _makespan(works, pairs, band, slots) for band in range(1, cap + 1)}
    best = min(times.values())
    return min(band for band, t in times.items() if t <= best * (1 + BWD_BAND_SLACK))


def _band_cap(l2_bytes: int, seqlen_q: int, head_dim: int, head_dim_v: int, heads: int, pairs: int,
              share: float = BWD_L2_BAND_SHARE) -> int:
    """The most pairs a band may hold: their rows -- Q and dO of ``heads`` query heads (16-bit) and the fp32 dQ
    accumulator -- within ``share`` of the L2, at most ``BWD_MAX_BAND``."""
    pair_bytes = max(1, seqlen_q) * max(1, heads) * ((head_dim + head_dim_v) * BYTES_PER_ELEM + head_dim * 4)
    return min(pairs, max(1, int(l2_bytes * share) // pair_bytes), BWD_MAX_BAND)


#: Bands the model weighs at most (its host time grows with each; bands of 4 to 16 pairs balanced every causal
#: grid measured).
BWD_MAX_BAND = 16
