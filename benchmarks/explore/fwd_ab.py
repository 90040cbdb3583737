"""Forward time of one tree (``--tree``: its torch-ext is imported), a script for same-call A/B runs of two trees
(the session script alternates them): ms per case, ours only, at the occupancy the environment sets.

    cd benchmarks && FA4_SM120_OCCUPANCY=model python3 explore/fwd_ab.py --tree /tmp/prev --label prev --out F
"""

import argparse
import json
import sys
from pathlib import Path

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--tree", required=True)
ap.add_argument("--label", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--cases", nargs="*", help="only these case names")
ap.add_argument("--rounds", type=int, default=1, help="time every case this many times, round by round")
args = ap.parse_args()
sys.path.insert(0, str(Path(args.tree) / "torch-ext"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flash_attn_4_sm120 as fa  # noqa: E402
from timing import median_ms  # noqa: E402

#: (name, batch, seqlen, heads, kv heads, d, causal): the forward table's classes, full and causal
CASES = [("d64 causal", 4, 4096, 16, 16, 64, True), ("d64", 4, 4096, 16, 16, 64, False),
         ("d96 causal", 4, 4096, 16, 16, 96, True), ("d128", 4, 4096, 32, 8, 128, False),
         ("d128 causal", 4, 4096, 32, 8, 128, True), ("d256 causal", 2, 4096, 8, 8, 256, True),
         ("d128 16x1024 causal", 16, 1024, 32, 8, 128, True)]
inputs = {}
for name, b, s, hq, hkv, d, causal in CASES:
    if args.cases and name not in args.cases:
        continue
    torch.manual_seed(0)
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    inputs[name] = (q, k, v, causal)
path = Path(args.out)
for _ in range(args.rounds):
    rows = {}
    for name, (q, k, v, causal) in inputs.items():
        rows[name] = median_ms(lambda: fa.flash_attn_func(q, k, v, causal=causal), iters=20, reps=9)
        print(f"{args.label} {name}: {rows[name]:.4f} ms", flush=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault(args.label, []).append(rows)
    path.write_text(json.dumps(data, indent=1))
