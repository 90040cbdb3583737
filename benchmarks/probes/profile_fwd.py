"""Run one forward config a few times so a profiler can read its pipes (a script, not a test).

Under Nsight Compute, per config (same knobs as ``benchmarks/tune_fwd.py --config``):
    ncu --kernel-name regex:Flash --launch-skip 2 --launch-count 1 --section ComputeWorkloadAnalysis \
        --section WarpStateStats --page raw --csv \
        python benchmarks/probes/profile_fwd.py --head-dim 64 --config 128,64,4,3,0,cp_async [--causal]

It launches the kernel ``--runs`` times on one shape (no other kernel runs between them; inputs are
drawn first), so ``--launch-skip`` leaves out the first launches and their cold caches.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from tune_fwd import SHAPES, dense_launch, launch_smem, parse_config  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))
from flash_attn_4_sm120.compiler import compile_fwd  # noqa: E402
from flash_attn_4_sm120.interface import dispatch_model  # noqa: E402
from flash_attn_4_sm120.problem import FwdSpec  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--config", required=True, help="TM,TN,WARPS,STAGES,QREG[,MAINLOOP[,PREFETCH[,OVERLAP[,...]]]]")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--device-occupancy", action="store_true", help="launch as compiled (the H100's CTAs per SM)")
    args = ap.parse_args()
    d = args.head_dim
    model = dispatch_model(torch.device("cuda"))
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    spec = FwdSpec("bf16", d, d, args.causal)
    cfg = parse_config(args.config)
    fn = compile_fwd(spec, cfg, model, model.compile_target, launch_smem=launch_smem(spec, cfg, args.device_occupancy))
    run, _ = dense_launch(fn, *SHAPES[d][0], d, num_sms)
    for _ in range(args.runs):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
