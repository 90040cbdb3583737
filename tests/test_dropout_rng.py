"""Dropout's random numbers (dropout.py) on the CPU: Philox4x32-10 against Random123's known answers, and the
keep mask's definition (coordinates only, keep rate, independence of seed / offset / head)."""

import pytest
import torch

from flash_attn_4_sm120.dropout import dropout_keep_mask, keep_scale, keep_threshold, philox4x32_10

# Random123's published known-answer vectors for Philox4x32-10 (its tests/kat_vectors)
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr, key, out", KAT)
def test_philox_known_answers(ctr, key, out):
    assert tuple(int(w) for w in philox4x32_10(ctr, key)) == out


def test_philox_vectorized_equals_scalar():
    ctr = (torch.tensor([0, 0x243F6A88]), torch.tensor([0, 0x85A308D3]), torch.tensor([0, 0x13198A2E]),
           torch.tensor([0, 0x03707344]))
    words = philox4x32_10(ctr, (torch.tensor([0, 0xA4093822]), torch.tensor([0, 0x299F31D0])))
    assert [int(w[0]) for w in words] == list(KAT[0][2]) and [int(w[1]) for w in words] == list(KAT[2][2])


def test_mask_is_a_function_of_the_coordinates():
    full = dropout_keep_mask(1234, 7, 2, 3, 50, 70, 0.3)
    # a sub-block computed on its own (another "tile") is the same: the mask depends on (b, h, q, k) only
    assert full.shape == (2, 3, 50, 70)
    part = dropout_keep_mask(1234, 7, 2, 3, 20, 17, 0.3)
    assert torch.equal(full[:, :, :20, :17], part)


def test_keep_rate_and_independence():
    m = dropout_keep_mask(42, 0, 2, 4, 256, 256, 0.25)
    rate = m.float().mean().item()
    assert abs(rate - 0.75) < 0.01
    # different heads, batches, seeds and offsets give different masks (not shifted copies)
    assert (m[0, 0] != m[0, 1]).float().mean() > 0.3 and (m[0, 0] != m[1, 0]).float().mean() > 0.3
    other_seed = dropout_keep_mask(43, 0, 2, 4, 256, 256, 0.25)
    other_offset = dropout_keep_mask(42, 1, 2, 4, 256, 256, 0.25)
    assert (m != other_seed).float().mean() > 0.3 and (m != other_offset).float().mean() > 0.3
    # neighbouring 8-column groups and rows are not copies of each other
    assert (m[..., :8] != m[..., 8:16]).float().mean() > 0.3 and (m[:, :, :-1] != m[:, :, 1:]).float().mean() > 0.3


def test_threshold_and_scale():
    assert keep_threshold(0.0) == 0 and keep_scale(0.0) == 1.0
    assert dropout_keep_mask(1, 2, 1, 1, 8, 8, 0.0).all()
    assert keep_threshold(0.1) == 26 and keep_scale(0.1) == 256 / 230
    for p in (-0.1, 1.0):
        with pytest.raises(ValueError, match="dropout_p"):
            keep_threshold(p)
