"""Where dropout's backward cost goes (issue 20): the backward alone (forward outside the timing) at SM120 occupancy,
bf16, 4 x 4096, 32 / 8 heads, for d64 and d128 causal and not: the plain spec on its table tile, the plain spec on the
tile dropout runs (the class's fallback), and dropout on that tile; ms per backward.

    python benchmarks/explore/dropout_bwd_tiles.py --out dropout_bwd_tiles.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from bench_fwd import fa  # noqa: E402
from flash_attn_4_sm120 import backward, bwd_config  # noqa: E402
from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV  # noqa: E402
from flash_attn_4_sm120.problem import BwdSpec  # noqa: E402
from timing import median_ms  # noqa: E402


def bwd_ms(d, causal, p, force=None):
    torch.manual_seed(0)
    b, s, hq, hkv = 4, 4096, 32, 8
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dout = torch.randn_like(q)
    patches = {}
    if force is not None:  # every spec of the class on this tile
        patches = {cls: force for cls in (d,)}
    with mock.patch.dict(bwd_config.BWD_TABLE, patches), mock.patch.dict(bwd_config.BWD_TABLE_HEAVY, patches), \
            mock.patch.dict(os.environ, {OCCUPANCY_ENV: "model"}):
        backward.clear_caches()
        out, _ = fa.flash_attn_func(q, k, v, causal=causal, dropout_p=p, dropout_seed=1 if p else None)
        spec = BwdSpec("bf16", d, d, causal=causal, dropout=p > 0)
        cfg = bwd_config.select_bwd_config(spec, fa.dispatch_model(q.device))
        ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    backward.clear_caches()
    return ms, str(cfg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for d in (64, 128):
        fallback = bwd_config.BWD_TABLE_FALLBACK[d]
        for causal in (False, True):
            row = {"d": d, "causal": causal}
            row["plain_table"] = bwd_ms(d, causal, 0.0)
            row["plain_fallback"] = bwd_ms(d, causal, 0.0, fallback)
            row["dropout"] = bwd_ms(d, causal, 0.1)
            print(row, flush=True)
            rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "date": datetime.date.today().isoformat(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
