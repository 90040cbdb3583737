"""One backward call under compute-sanitizer's racecheck, and the SASS of its main kernel (a script, not a test).

Session 43: racecheck reported RAW hazards in a role-split kernel by PC offset (``+0xadf0``); this runs one dropout
call (``--run``: the dropout family's d128 case, 2 x 1000, 4 / 2 heads, p 0.2, seed 7), and (``--sass OUT``)
compiles the main kernel that call launches (its spec and config captured from ``compiler.get_bwd_kernel``) for the
device's target with the SASS kept, so the offsets map to instructions.

    compute-sanitizer --tool racecheck --racecheck-report all python3 benchmarks/explore/race_sass.py --run
    python3 benchmarks/explore/race_sass.py --sass $OUT/main.sass
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "torch-ext"))


def call(d=128, sq=1000, sk=1000, causal=False):
    import torch

    import flash_attn_4_sm120 as fa

    torch.manual_seed(0)
    q = torch.randn(2, sq, 4, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(2, sk, 2, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    out, _ = fa.flash_attn_func(q, k, k, causal=causal, dropout_p=0.2, dropout_seed=7)
    torch.autograd.grad(out, (q, k), torch.ones_like(out))
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--sass")
    args = ap.parse_args()
    if args.run:
        call()
    if args.sass:
        from flash_attn_4_sm120 import compiler

        seen = []
        get = compiler.get_bwd_kernel

        def spy(spec, cfg, model, target, *rest):
            seen.append((spec, cfg, model, target))
            return get(spec, cfg, model, target, *rest)
        compiler.get_bwd_kernel = spy
        call()
        compiler.get_bwd_kernel = get
        for i, (spec, cfg, model, target) in enumerate(seen):
            compiled, _ = compiler.compile_for_conformance(compiler.BwdCase(spec, cfg, model.name), target=target,
                                                           check_valid=False)
            text = compiled.artifacts.SASS
            text = open(text).read() if os.path.exists(str(text)) else str(text)
            with open(f"{args.sass}.{i}", "w") as f:
                f.write(f"// {spec}\n// {cfg}\n// {target}\n{text}")
            cubin = compiled.artifacts.CUBIN
            if isinstance(cubin, str) and os.path.exists(cubin):
                cubin = open(cubin, "rb").read()
            if isinstance(cubin, (bytes, bytearray)):
                with open(f"{args.sass}.{i}.cubin", "wb") as f:
                    f.write(cubin)
            print(i, spec, cfg, target, len(text))


if __name__ == "__main__":
    main()
