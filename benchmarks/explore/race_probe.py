"""Racecheck probe of the role-split backward with dropout (session 28): one case per process, so each runs under
compute-sanitizer alone. ``--case NAME`` runs it; ``--list`` prints the names. The cases vary one thing at a time
around the dropout family's d128 case (2 x 333 x 517, 4 / 2 heads, causal, deterministic): dropout, deterministic
mode, a partial last query tile, GQA (the group split), to place the hazards racecheck reports."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "torch-ext"))

BASE = dict(d=128, sq=333, sk=517, hq=4, hkv=2, causal=True, p=0.2, det=True)
CASES = {
    "base": {},
    "no_dropout": dict(p=0.0),
    "not_det": dict(det=False),
    "whole_tiles": dict(sq=320, sk=512),
    "mha": dict(hkv=4),
    "d64_full": dict(d=64, sq=700, sk=300, causal=False, det=False),
}


def run(name):
    import torch

    import flash_attn_4_sm120 as fa

    c = dict(BASE, **CASES[name])
    torch.manual_seed(0)
    q = torch.randn(2, c["sq"], c["hq"], c["d"], dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(2, c["sk"], c["hkv"], c["d"], dtype=torch.bfloat16, device="cuda", requires_grad=True)
    out, _ = fa.flash_attn_func(q, k, k, causal=c["causal"], dropout_p=c["p"], dropout_seed=7,
                                deterministic=c["det"])
    torch.autograd.grad(out, (q, k), torch.ones_like(out))
    torch.cuda.synchronize()
    print(f"case {name}: done", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--case")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print(" ".join(CASES))
    else:
        run(a.case)
