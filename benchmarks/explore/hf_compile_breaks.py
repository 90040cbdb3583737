"""Where torch.compile breaks the transformers Llama's graph with each attention (a script, not a test).

Issue 19's step target on the transformers Llama under ``torch.compile`` (``bench_step.py --models llama_compiled``):
the step measured host-bound with both attentions (session 44). This prints ``torch._dynamo.explain``'s graph and
break counts and each break's reason and user frame for the model's forward and loss, per attention, so the breaks
in this bundle's call path (if any) are told from transformers' own.

    python3 benchmarks/explore/hf_compile_breaks.py --out $OUT/breaks.json [--seq 2048 --batch 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    import torch

    import train_check
    from bench_step import client_setup, hf_step
    from client_transformers import REPO_ID

    client_setup(args.seq, args.batch)
    ids, labels = next(iter(train_check.batches(1, "cuda")))
    report = {}
    with tempfile.TemporaryDirectory() as work:
        ckpt = train_check.hf_checkpoint("llama", Path(work))
        for impl in (REPO_ID, "sdpa"):
            model = hf_step(impl, ckpt).model

            def loss_of(ids, labels, model=model):
                return model(input_ids=ids, labels=labels).loss

            torch._dynamo.reset()
            ex = torch._dynamo.explain(loss_of)(ids, labels)
            reasons = []
            for b in ex.break_reasons:
                frames = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in b.user_stack[-3:]]
                reasons.append({"reason": str(b.reason)[:300], "frames": frames})
            report[impl] = {"graphs": ex.graph_count, "breaks": ex.graph_break_count, "ops": ex.op_count,
                            "reasons": reasons}
            print(f"{impl}: {ex.graph_count} graphs, {ex.graph_break_count} breaks, {ex.op_count} ops", flush=True)
            seen = set()
            for r in reasons:
                key = (r["reason"][:120], tuple(r["frames"]))
                if key in seen:
                    continue
                seen.add(key)
                print("  break:", r["reason"][:200].replace("\n", " "))
                for f in r["frames"]:
                    print("     at", f)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
