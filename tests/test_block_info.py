"""Key-block ranges against a brute-force mask: every visible key is visited, blocks outside the
band are skipped, and blocks in [unmasked_start, unmasked_end) need no element mask."""

import itertools

import pytest

from flash_attn_4_sm120._kernels.block_info import block_range


def _visible(i, j, sq, sk, causal, local, left, right):
    off = sk - sq
    if j >= sk:
        return False
    if local:
        return i + off - left <= j <= i + off + right
    return not causal or j <= i + off


MASKS = [
    pytest.param(False, False, 0, 0, id="full"),
    pytest.param(True, False, 0, 0, id="causal"),
    pytest.param(False, True, 100, 0, id="window100-0"),
    pytest.param(False, True, 0, 0, id="window0-0"),
    pytest.param(False, True, 37, 70, id="window37-70"),
    pytest.param(False, True, 1000, 5, id="window1000-5"),
    # FlashAttention-4's negative offsets (an unbounded side is clamped to sq + sk by the host)
    pytest.param(False, True, 40, -9, id="window40-minus9"),
    pytest.param(False, True, -6, 50, id="window-minus6-50"),
    pytest.param(False, True, 600, -70, id="windowNone-minus70"),
    pytest.param(False, True, -70, 600, id="window-minus70-None"),
    pytest.param(False, True, -10, 5, id="window-empty"),
    pytest.param(False, True, -600, 600, id="window-hides-everything"),
]


@pytest.mark.parametrize("causal, local, left, right", MASKS)
@pytest.mark.parametrize("tile_m, tile_n", [(128, 64), (64, 64), (64, 32), (64, 128)])
def test_block_ranges_match_brute_force(causal, local, left, right, tile_m, tile_n):
    for sq, sk in itertools.product([1, 63, 128, 130, 300], [1, 64, 65, 200, 257]):
        for m in range((sq + tile_m - 1) // tile_m):
            rows = range(m * tile_m, min((m + 1) * tile_m, sq))
            start, u_start, u_end, end = block_range(m, sq, sk, tile_m, tile_n, causal, local, left, right)
            assert 0 <= start <= u_start <= u_end <= end
            assert start == end or end <= (sk + tile_n - 1) // tile_n, "a non-empty range past the keys"
            for n in range((sk + tile_n - 1) // tile_n):
                cols = range(n * tile_n, (n + 1) * tile_n)
                vis = [_visible(i, j, sq, sk, causal, local, left, right) for i in rows for j in cols]
                if any(vis):
                    assert start <= n < end, (sq, sk, m, n, "visible block skipped")
                if u_start <= n < u_end:
                    assert all(vis), (sq, sk, m, n, "block marked mask-free needs a mask")


def test_window_cost_scales_with_width():
    """Sliding window 1024 at seqlen 8192: each M tile visits ~(1024 + tile_m) / tile_n blocks, not all."""
    visited = sum(end - start for m in range(8192 // 64)
                  for start, _, _, end in [block_range(m, 8192, 8192, 64, 64, False, True, 1024, 0)])
    causal = sum(end - start for m in range(8192 // 64)
                 for start, _, _, end in [block_range(m, 8192, 8192, 64, 64, True, False)])
    assert visited * 3.5 < causal


@pytest.mark.parametrize("group", [1, 3, 4, 7])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 8192), (5, 300), (37, 37), (50, 20)])
@pytest.mark.parametrize("causal, local, left, right", [(False, False, 0, 0), (True, False, 0, 0), (False, True, 40, 3)])
def test_packed_rows_cover_exactly_the_visible_blocks(group, seqlen_q, seqlen_k, causal, local, left, right):
    """A tile of packed GQA rows visits the union of its query rows' blocks, and masks every block
    some of its rows see only partly."""
    from flash_attn_4_sm120._kernels.block_info import block_range_rows, packed_rows

    tile_m, tile_n = 64, 32
    off = seqlen_k - seqlen_q
    for m in range((seqlen_q * group + tile_m - 1) // tile_m):
        lo, hi = packed_rows(m, tile_m, group)
        rows = range(lo, min(hi, seqlen_q))
        start, u_start, u_end, end = block_range_rows(lo, hi, seqlen_q, seqlen_k, tile_n, causal, local, left, right)

        def visible(i, j):
            if j >= seqlen_k:
                return False
            if local:
                return i + off - left <= j <= i + off + right
            return j <= i + off if causal else True

        needed = {j // tile_n for i in rows for j in range(seqlen_k) if visible(i, j)}
        assert needed <= set(range(start, end))
        for n in range(u_start, u_end):  # unmasked blocks: every row sees every key
            assert all(visible(i, j) for i in rows for j in range(n * tile_n, (n + 1) * tile_n))


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("ranges", [(0, 0, 0, 0), (0, 0, 127, 128), (3, 5, 9, 10), (0, 2, 2, 5), (4, 4, 4, 4)])
def test_split_ranges_visit_every_block_once_with_its_mask(ranges, num_splits):
    """Splits partition [start, end) into contiguous pieces, in order, and a block is masked in its
    split exactly when it is masked unsplit."""
    from flash_attn_4_sm120._kernels.block_info import split_range

    start, u_start, u_end, end = ranges
    masked = {n: not (u_start <= n < u_end) for n in range(start, end)}
    seen = []
    for s in range(num_splits):
        lo, us, ue, hi = split_range(ranges, s, num_splits)
        assert lo <= us <= ue <= hi
        seen += list(range(lo, hi))
        for n in range(lo, hi):
            assert masked[n] == (not (us <= n < ue))
    assert seen == list(range(start, end))


@pytest.mark.parametrize("chunk_blocks", [1, 3, 32])
@pytest.mark.parametrize("ranges", [(0, 0, 0, 0), (0, 0, 127, 128), (3, 5, 9, 10), (0, 2, 2, 5), (4, 4, 4, 4),
                                    (40, 41, 70, 71)])
def test_chunks_cut_at_fixed_multiples_and_keep_each_blocks_mask(ranges, chunk_blocks):
    """Chunk s visits the blocks of [start, end) within [s * chunk_blocks, (s + 1) * chunk_blocks), whatever the
    tile's range: the chunks partition it in order at the same block indices in every call, and a block is masked in
    its chunk exactly when it is masked unchunked; chunks past the range are empty."""
    from flash_attn_4_sm120._kernels.block_info import chunk_range

    start, u_start, u_end, end = ranges
    masked = {n: not (u_start <= n < u_end) for n in range(start, end)}
    seen = []
    for s in range(-(-max(end, 1) // chunk_blocks) + 2):
        lo, us, ue, hi = chunk_range(ranges, s, chunk_blocks)
        assert lo <= us <= ue <= hi
        assert set(range(lo, hi)) == set(range(start, end)) & set(range(s * chunk_blocks, (s + 1) * chunk_blocks))
        seen += list(range(lo, hi))
        for n in range(lo, hi):
            assert masked[n] == (not (us <= n < ue))
    assert seen == list(range(start, end))
