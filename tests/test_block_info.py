"""Key-block ranges against a brute-force mask: every visible key is visited, and blocks below
``n_block_unmasked_end`` need no element mask."""

import itertools

import pytest

from flash_attn_4_sm120._kernels.block_info import n_block_end, n_block_unmasked_end


def _visible(i, j, sq, sk, causal):
    return j < sk and (not causal or j <= i + sk - sq)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tile_m, tile_n", [(128, 64), (128, 128), (64, 128)])
def test_block_ranges_match_brute_force(causal, tile_m, tile_n):
    for sq, sk in itertools.product([1, 63, 128, 130, 300], [1, 64, 65, 200, 257]):
        for m in range((sq + tile_m - 1) // tile_m):
            rows = range(m * tile_m, min((m + 1) * tile_m, sq))
            n_end = n_block_end(m, sq, sk, tile_m, tile_n, causal)
            n_full = n_block_unmasked_end(m, sq, sk, tile_m, tile_n, causal)
            for n in range((sk + tile_n - 1) // tile_n):
                cols = range(n * tile_n, (n + 1) * tile_n)
                any_visible = any(_visible(i, j, sq, sk, causal) for i in rows for j in cols)
                all_visible = all(_visible(i, j, sq, sk, causal) for i in rows for j in cols)
                assert (n < n_end) or not any_visible, (sq, sk, m, n, "visible block skipped")
                if n < n_full:
                    assert all_visible, (sq, sk, m, n, "block marked mask-free needs a mask")
