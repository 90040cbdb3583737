"""FlashAttention-4's window convention on the host (no GPU): how (causal, window_size) resolve to the
mask the kernels run, and that the reference's visibility agrees with the kernels' block ranges."""

import itertools

import numpy as np
import pytest
import torch

from flash_attn_4_sm120._kernels.block_info import block_range
from flash_attn_4_sm120.problem import resolve_window
from reference import visible


@pytest.mark.parametrize(
    "causal, window, expected",
    [
        pytest.param(False, (None, None), (False, False, None, None), id="none"),
        pytest.param(False, None, (False, False, None, None), id="window-None"),
        pytest.param(False, (-1, -1), (False, False, None, None), id="fa2-minus1-minus1"),
        pytest.param(True, (-1, -1), (True, False, None, None), id="causal-fa2-minus1"),
        pytest.param(False, (-5, 2), (False, False, None, None), id="sum-negative-is-unbounded"),
        pytest.param(False, (None, 0), (True, False, None, None), id="none-0-is-causal"),
        pytest.param(True, (None, 7), (True, False, None, None), id="causal-ignores-right"),
        pytest.param(True, (5, 7), (False, True, 5, 0), id="causal-window"),
        pytest.param(True, (-3, None), (True, False, None, None), id="causal-left-minus3-sum-negative"),
        pytest.param(False, (3, -1), (False, True, 3, -1), id="left3-right-minus1"),
        pytest.param(False, (None, -3), (False, True, None, -3), id="none-minus3"),
        pytest.param(False, (-3, None), (False, True, -3, None), id="minus3-none"),
        pytest.param(False, (0, 0), (False, True, 0, 0), id="diagonal-only"),
        pytest.param(False, (np.int64(4), torch.tensor(2)), (False, True, 4, 2), id="numpy-and-tensor-ints"),
    ],
)
def test_resolve_window(causal, window, expected):
    assert resolve_window(causal, window) == expected


@pytest.mark.parametrize("window", [(1.0, 0), (True, 0), ("1", 2)], ids=["float", "bool", "str"])
def test_window_entries_must_be_integers(window):
    with pytest.raises(TypeError, match="int or None"):
        resolve_window(False, window)


BOUNDS = [None, -40, -3, -1, 0, 2, 17, 90]


@pytest.mark.parametrize("sq, sk", [(50, 50), (37, 130), (130, 37), (1, 200)])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_block_ranges_cover_the_reference_visibility(sq, sk, causal):
    """For every window of the four kinds (each side None or an int of either sign), the key blocks the
    kernels visit (after the host's resolution and clamping) cover every key the reference sees, and
    blocks they treat as mask-free are fully visible to the tile's rows."""
    tile_m, tile_n = 16, 16
    for window in itertools.product(BOUNDS, BOUNDS):
        seen = visible(sq, sk, causal, window)
        causal_mask, local, left, right = resolve_window(causal, window)
        unbounded = sq + sk
        clamp = lambda x: unbounded if x is None else max(-unbounded, min(x, unbounded))  # noqa: E731
        for m in range(-(-sq // tile_m)):
            start, u_start, u_end, end = block_range(m, sq, sk, tile_m, tile_n, causal_mask, local, clamp(left),
                                                     clamp(right))
            rows = seen[m * tile_m:(m + 1) * tile_m]
            for n in range(-(-sk // tile_n)):
                block = rows[:, n * tile_n:(n + 1) * tile_n]
                if block.any():
                    assert start <= n < end, (window, m, n, "visible block skipped")
                if u_start <= n < u_end:
                    full = block.all() and (n + 1) * tile_n <= sk
                    assert full, (window, m, n, "mask-free block needs a mask")
