"""Time table-entry candidates the tuner cannot (a sliding window, a packed-GQA split-KV decode) through the API
with a config override, at both occupancies (a script, not a test). Session 10 chose d128_causal_local with it.

    python benchmarks/entry_sweep.py      # writes $OUT/explore.json (or ./explore.json)
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
import torch  # noqa: E402

from flash_attn_4_sm120.config import FwdConfig  # noqa: E402
from flash_attn_4_sm120.execution_model import OCCUPANCY_ENV  # noqa: E402
from flash_attn_4_sm120.interface import _launch_fwd, _with_packing  # noqa: E402
from flash_attn_4_sm120.problem import validate_fwd  # noqa: E402
from timing import median_ms  # noqa: E402


def cp_async(tm: int, tn: int, stages: int, q_in_regs: bool) -> FwdConfig:
    return FwdConfig(tile_m=tm, tile_n=tn, num_warps=4, num_stages=stages, q_in_regs=q_in_regs, mainloop="cp_async")


#: None = the table's own entry
CANDIDATES = [None, cp_async(64, 64, 2, True), cp_async(64, 32, 2, True), cp_async(64, 32, 2, False),
              cp_async(64, 64, 2, False), cp_async(64, 32, 3, True)]
# (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, window_left)
CASES = [("window1024", 1, 8192, 8192, 32, 8, 1024), ("causal8192", 1, 8192, 8192, 32, 8, None),
         ("decode", 16, 1, 8192, 32, 8, None)]


def label(cfg) -> str:
    if cfg is None:
        return "table"
    return f"{cfg.tile_m}x{cfg.tile_n}s{cfg.num_stages}" + ("q" if cfg.q_in_regs else "")


def main():
    out = {}
    for occ in ("model", "device"):
        os.environ[OCCUPANCY_ENV] = occ
        for name, b, sq, sk, hq, hkv, win in CASES:
            q = torch.randn(b, sq, hq, 128, dtype=torch.bfloat16, device="cuda")
            k = torch.randn(b, sk, hkv, 128, dtype=torch.bfloat16, device="cuda")
            v = torch.randn(b, sk, hkv, 128, dtype=torch.bfloat16, device="cuda")
            spec, shape, params = validate_fwd(q, k, v, None, sq > 1, (win, 0) if win else (None, None))
            spec = _with_packing(spec, shape, None)
            for cfg in CANDIDATES if name != "causal8192" else [None]:
                try:
                    ms = median_ms(lambda: _launch_fwd(q, k, v, spec, shape, params, config=cfg))
                except Exception as e:
                    print(name, occ, cfg, "ERR", str(e)[:150])
                    continue
                if name == "decode":  # K/V GB/s
                    metric = b * sk * hkv * 256 * 2 / ms / 1e6
                else:  # nominal causal TFLOPS
                    metric = 4 * b * hq * sq * sk * 128 * 0.5 / ms / 1e9
                out[f"{name}|{occ}|{label(cfg)}"] = {"ms": ms, "metric": metric}
                print(f"{name}|{occ}|{label(cfg)}", round(metric), flush=True)
    Path(os.environ.get("OUT", "."), "explore.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
