"""Split-KV sweep (a script, not a test): decode and short-query shapes at fixed split counts, the
automatic choice and SDPA flash (FA2, at the H100's occupancy) in one run, to check ``config.num_splits_for``.

Reports KV bandwidth (bytes of K and V read once / time) per split count; timing as in
benchmarks/timing.py.

    python benchmarks/explore/split_sweep.py --out results.json
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))
import flash_attn_4_sm120 as fa  # noqa: E402
from flash_attn_4_sm120.interface import _num_sms  # noqa: E402
from timing import median_ms  # noqa: E402

# (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal)
CASES = [
    ("decode 16x(1,8192) 32/8 d128", 16, 1, 8192, 32, 8, 128, False),
    ("decode 4x(1,8192) 32/8 d128", 4, 1, 8192, 32, 8, 128, False),
    ("decode 1x(1,32768) 32/8 d128", 1, 1, 32768, 32, 8, 128, False),
    ("decode 64x(1,4096) 32/8 d128", 64, 1, 4096, 32, 8, 128, False),
    ("decode 16x(1,8192) 28/4 d128", 16, 1, 8192, 28, 4, 128, False),
    ("decode 16x(1,8192) 16/16 d64", 16, 1, 8192, 16, 16, 64, False),
    ("spec-decode 8x(4,8192) 32/8 d128 causal", 8, 4, 8192, 32, 8, 128, True),
]
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, b, sq, sk, hq, hkv, d, causal in CASES:
        q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        gb = 2 * k.numel() * k.element_size() / 1e9
        row = {"case": name, "kv_GB": gb, "splits": {}}
        for s in (*SPLITS, None):
            ms = median_ms(lambda: fa.flash_attn_func(q, k, v, causal=causal, num_splits=s), iters=20)
            row["splits"]["auto" if s is None else str(s)] = {"ms": ms, "GBps": gb / ms * 1e3}
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        row["fa2"] = None
        if not (causal and sq != sk):  # SDPA's is_causal is top-left aligned: no peer for bottom-right
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ms = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                                      enable_gqa=hq != hkv), iters=20)
            row["fa2"] = {"ms": ms, "GBps": gb / ms * 1e3}
        best = max(row["splits"].items(), key=lambda kv: kv[1]["GBps"])
        print(f"{name}: " + " ".join(f"{s}:{r['GBps']:.0f}" for s, r in row["splits"].items())
              + f" | fa2 {row['fa2']['GBps'] if row['fa2'] else float('nan'):.0f} | best {best[0]}", flush=True)
        rows.append(row)
    meta = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
            "num_sms": _num_sms(torch.cuda.current_device()),
            "occupancy": "model (the package default)", "torch": torch.__version__}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
