"""Run the backward of one shape a few times so a profiler can read its pipes (a script, not a test).

Under Nsight Compute:
    ncu --kernel-name regex:BwdMultistage --launch-skip 1 --launch-count 1 --set full \
        python benchmarks/probes/profile_bwd.py --head-dim 128 [--causal]

The forward runs once; the backward (preprocess, main kernel, postprocess) ``--runs`` times on the same
graph, so ``--launch-skip`` leaves out the first main-kernel launch and its cold caches.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "torch-ext"))
import flash_attn_4_sm120 as fa  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--head-dim-v", type=int, default=None)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--shape", default="4,4096,32,8", help="batch,seqlen,heads_q,heads_kv")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout_p (seeded)")
    ap.add_argument("--window", type=int, default=None, help="a (left, 0) window instead of --causal")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--smem-operands", action="store_true",
                    help="run the class's smem-operand role split instead of its kv_in_regs entry (the split its "
                         "dropout calls run: profiles with and without dropout on one kernel)")
    args = ap.parse_args()
    if args.smem_operands:
        from flash_attn_4_sm120 import bwd_config
        bwd_config.BWD_TABLE[args.head_dim] = bwd_config.BWD_TABLE_SMEM_OPERANDS[args.head_dim]
    b, s, hq, hkv = (int(x) for x in args.shape.split(","))
    d, dv = args.head_dim, args.head_dim_v or args.head_dim
    torch.manual_seed(0)
    q = torch.randn(b, s, hq, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(b, s, hkv, dv, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dout = torch.randn(b, s, hq, dv, dtype=torch.bfloat16, device="cuda")
    window = (args.window, 0) if args.window is not None else (None, None)
    out = fa.flash_attn_func(q, k, v, causal=args.causal, window_size=window, dropout_p=args.dropout,
                             dropout_seed=1234 if args.dropout else None, deterministic=args.deterministic)[0]
    for _ in range(args.runs):
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
