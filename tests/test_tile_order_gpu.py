"""The longest-first tile order of masked (causal / local) forwards: every band size the host can pick
must visit every (M tile, head, batch, split) exactly once (run on the device; skipped without CUDA).

``launch.tile_band`` sizes the band from the device's L2; here it is replaced by fixed values: one pair
per band (the M-tile-per-pair order), a band that does not divide the pairs (a short last band) and one
band for everything. Outputs are NaN-poisoned and checked against the fp32 reference (``reference.check_fwd``)."""

import pytest
import torch

from reference import check_fwd

pytestmark = pytest.mark.gpu

BANDS = [pytest.param(1, id="band1"), pytest.param(4, id="band4"), pytest.param(10_000, id="one_band")]
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, options (the kernel's choice), features (also the reference's))
CASES = [  # the table's configs: 128-row tiles run banded, 64-row ones (packed GQA, d=256) per pair
    pytest.param((3, 1023, 1023, 5, 5, 64, {}, {}), id="mha_d64"),
    pytest.param((2, 777, 777, 6, 2, 128, {}, {}), id="gqa_d128"),
    pytest.param((3, 555, 555, 5, 5, 192, {}, {"window_size": (100, 0), "softcap": 20.0}), id="local_softcap_d192"),
    pytest.param((3, 600, 2000, 4, 2, 128, {"num_splits": 3}, {}), id="split3_d128"),
    pytest.param((5, 7, 900, 8, 2, 64, {"pack_gqa": True}, {}), id="packgqa_d64"),
    pytest.param((2, 333, 333, 3, 3, 256, {}, {}), id="mha_d256"),
]


@pytest.mark.parametrize("band", BANDS)
@pytest.mark.parametrize("case", CASES)
def test_every_band_size_visits_every_tile(monkeypatch, case, band):
    from flash_attn_4_sm120 import launch

    monkeypatch.setattr(launch, "tile_band", lambda *args: band)
    monkeypatch.setattr(launch, "_PLANS", {})  # plans remembered under another band would skip the patch
    b, sq, sk, hq, hkv, d, options, features = case
    torch.manual_seed(0)
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
    check_fwd(q, k, v, True, options, **features)
