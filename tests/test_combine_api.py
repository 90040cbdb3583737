"""flash_attn_combine's input checks (no GPU needed): clear errors, never asserts."""

import pytest
import torch

import flash_attn_4_sm120 as fa


@pytest.mark.parametrize(
    "o, lse, kwargs, exc, match",
    [
        pytest.param(torch.zeros(2, 3, 4, 64), torch.zeros(2, 3, 4), {}, ValueError, "CUDA", id="cpu"),
        pytest.param(torch.zeros(2, 3, 64), torch.zeros(2, 3), {}, ValueError, "num_splits", id="rank3"),
        pytest.param(torch.zeros(2, 3, 4, 64), torch.zeros(2, 3, 5), {}, ValueError, "lse_partial must have shape",
                     id="lse-shape"),
        pytest.param(torch.zeros(2, 3, 4, 64, dtype=torch.int32), torch.zeros(2, 3, 4), {}, TypeError,
                     "floating-point", id="int-partials"),
        pytest.param(torch.zeros(2, 3, 4, 64), torch.zeros(2, 3, 4), {"virtual_batch_idx": torch.zeros(1)},
                     NotImplementedError, "virtual_batch_idx", id="virtual-batch"),
        pytest.param(torch.zeros(2, 1, 3, 4, 64), torch.zeros(2, 1, 3, 4), {"cu_seqlens": torch.zeros(2)}, ValueError,
                     "cu_seqlens goes with packed", id="cu-with-dense"),
    ],
)
def test_invalid_inputs(o, lse, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        fa.flash_attn_combine(o, lse, **kwargs)
