"""The backward of packed varlen calls on the class's table tile against its heavy 8-warp tile (a script, not a test).

Session 37: varlen specs at d64 / d96 had taken ``BWD_TABLE_HEAVY``'s 8-warp tiles since the classes' 4-warp entries
spilled with varlen; the role splits that replaced those entries hold varlen without spills. Documents of random
lengths (seeded, 128-2048 tokens) packed into ``--tokens`` tokens per call, GQA heads, causal and full, bf16, SM120
occupancy (the package default); each config patched into ``BWD_TABLE`` (kernels compiled first in spawned processes).

    python benchmarks/explore/varlen_tiles.py --out varlen_tiles.json [--head-dims 64 96 128] [--tokens 16384]
        [--configs table heavy smem_operands]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import multiprocessing
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))
from tune_bwd import _use, warm_grad  # noqa: E402  (_use patches BWD_TABLE[cls], clears the backward's caches)

HEADS = (32, 8)


def configs(cls: int) -> dict:
    """The class's table entry first (the ratios' base), its heavy tile, and (session 39) the split its kv_in_regs
    entry replaced, where the class has them."""
    from flash_attn_4_sm120.bwd_config import BWD_TABLE, BWD_TABLE_HEAVY, BWD_TABLE_SMEM_OPERANDS

    out = {"table": BWD_TABLE[cls]}
    out.update({"heavy": BWD_TABLE_HEAVY[cls]} if cls in BWD_TABLE_HEAVY else {})
    out.update({"smem_operands": BWD_TABLE_SMEM_OPERANDS[cls]} if cls in BWD_TABLE_SMEM_OPERANDS else {})
    return out


def lengths(tokens: int, seed: int = 0) -> list:
    import random

    rng, out = random.Random(seed), []
    while sum(out) < tokens:
        out.append(min(rng.randint(128, 2048), tokens - sum(out)))
    return out


def inputs(d: int, lens: list):
    import torch

    torch.manual_seed(0)
    total = sum(lens)
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(total, h, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
               for h in (HEADS[0], HEADS[1], HEADS[1]))
    return q, k, v, cu, max(lens), torch.randn(total, HEADS[0], d, dtype=torch.bfloat16, device="cuda")


def call(fa, q, k, v, cu, max_len, causal):
    return fa.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=causal)[0]


def _warm(item) -> str:
    import flash_attn_4_sm120 as fa
    from flash_attn_4_sm120.bwd_config import BwdConfig

    cfg, cls, causal = BwdConfig(**item[0]), item[1], item[2]
    _use(cfg, cls)
    q, k, v, cu, max_len, dout = inputs(cls, [300, 77, 513])
    return warm_grad(lambda: call(fa, q, k, v, cu, max_len, causal), (q, k, v), dout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--head-dims", nargs="*", type=int, default=[64, 96])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--configs", nargs="*", default=None, help="config names (default: all; the table always runs)")
    args = ap.parse_args()

    import torch

    import flash_attn_4_sm120 as fa
    from timing import median_ms

    plan = [(d, name, cfg, causal) for d in args.head_dims for causal in (False, True)
            for name, cfg in configs(d).items() if args.configs is None or name in args.configs or name == "table"]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        warm = list(pool.imap(_warm, [(asdict(cfg), d, causal) for d, _, cfg, causal in plan]))
    lens = lengths(args.tokens)
    rows, base = [], {}
    for (d, name, cfg, causal), w in zip(plan, warm):
        row = {"head_dim": d, "config_name": name, "config": asdict(cfg), "causal": causal, "lengths": lens}
        if w != "ok":
            row["error"] = w
        else:
            q, k, v, cu, max_len, dout = inputs(d, lens)
            _use(cfg, d)
            out = call(fa, q, k, v, cu, max_len, causal)
            row["ms"] = median_ms(functools.partial(torch.autograd.grad, out, (q, k, v), dout, retain_graph=True))
            base.setdefault((d, causal), row["ms"])
            row["vs_table"] = row["ms"] / base[(d, causal)]
        rows.append(row)
        print(f"d{d} {'causal' if causal else 'full  '} {name:13s}: " +
              (f"{row['ms']:.3f} ms {row['vs_table']:.3f}x the table's" if "ms" in row else row["error"]), flush=True)
    for d in args.head_dims:
        _use(configs(d)["table"], d)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "date": datetime.date.today().isoformat(), "heads": HEADS,
                                              "tokens": args.tokens, "occupancy": "sm120 (package default)",
                                              "rows": rows}))


if __name__ == "__main__":
    main()
