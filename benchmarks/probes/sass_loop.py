"""Instruction mix of a forward kernel's key-block loop in its sm_120a SASS (a script, compiled on the CPU).

The smallest backward-branch loop that holds MMAs is the unmasked key-block step; its instructions per warp, by
opcode, give the SM120 projection in docs/performance.md: a warp's MMAs keep the tensor pipe of its sub-partition
busy for 32 cycles each on an RTX 5090 (HMMA.16816 at bf16's FP32-accumulate rate, QMMA.16832 at FP8's, both
209.5 / 419 TFLOPS over 170 SMs x 4 sub-partitions), 16 on an RTX PRO 6000, while the sub-partition issues one
instruction per cycle.

    CUTE_DSL_ARCH=sm_120a python benchmarks/probes/sass_loop.py --out results.json
"""

import argparse
import collections
import datetime
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))

from flash_attn_4_sm120 import compiler, config  # noqa: E402
from flash_attn_4_sm120.execution_model import SM120  # noqa: E402
from flash_attn_4_sm120.problem import FwdSpec  # noqa: E402

#: one tile for both: 128x64, 8 warps (16 rows each), 2 stages, Q in registers; d128 full
TILE = config.FwdConfig(tile_m=128, tile_n=64, num_warps=8, num_stages=2, q_in_regs=True, mainloop="cp_async")
SPECS = {"bf16": FwdSpec(dtype="bf16", head_dim=128, head_dim_v=128, causal=False),
         "all_fp8": FwdSpec(dtype="bf16", head_dim=128, head_dim_v=128, causal=False, kv_dtype="e4m3",
                            fp8_mma=True)}


def loop_mix(sass: str) -> collections.Counter:
    """Opcodes (predicates and modifiers dropped) of the smallest loop (a branch back to an earlier label) with MMAs."""
    ins, labels = [], {}
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ins)
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            ins.append(m.group(1).strip())
    best = None
    for i, text in enumerate(ins):
        m = re.search(r"BRA.*`\((\.L_x_\d+)\)", text)
        if m and labels.get(m.group(1), i + 1) <= i:
            body = ins[labels[m.group(1)]:i + 1]
            mix = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", b).split()[0].split(".")[0] for b in body)
            if (mix["QMMA"] or mix["HMMA"]) and (best is None or sum(mix.values()) < sum(best.values())):
                best = mix
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    result = {"date": datetime.date.today().isoformat(), "target": "sm_120a", "tile": TILE.__dict__ if hasattr(
        TILE, "__dict__") else str(TILE), "head_dim": 128, "loops": {}}
    for name, spec in SPECS.items():
        fn = compiler.compile_fwd(spec, TILE, SM120, "sm_120a", extra_options="--keep-sass")
        mix = loop_mix(fn.artifacts.SASS)
        mma = mix["QMMA"] + mix["HMMA"]
        result["loops"][name] = {"instructions": sum(mix.values()), "mma": mma, "mix": dict(mix.most_common())}
        # per key block and sub-partition (2 warps of the 8-warp CTA): tensor-pipe cycles against issue cycles
        for part, cycles in (("rtx5090", 32), ("rtx_pro_6000", 16)):
            result["loops"][name][f"{part}_tensor_over_issue"] = mma * cycles / sum(mix.values())
        print(name, result["loops"][name], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
