"""Why the compiled plain GPT's training step is host-bound with the bundle (a script, not a test).

Session 39: ``bench_step.py`` gave the compiled plain model 10.07 ms per step with the bundle (loaded through
``kernels``) against 7.95 with SDPA-FA2, its host issue time 10.61 ms (host-bound), while
``explore/profile_train_step.py`` (the bundle imported from ``torch-ext``) gave 7.09 ms a minute later. This
times, in one process and alternated (``bench_step.time_alternated``), the plain model with the bundle through
``kernels`` (``ours``), imported from the tree (``ours_tree``) and with SDPA-FA2, then cProfiles ``--profile-steps``
steps of each bundle variant (the functions with the most own time, and the bundle's with the most cumulative).
``--base ROOT``: instead of the tree's package, the build of another checkout (ROOT, e.g. the tree before a change)
through ``kernels`` under a second repo id (``ours_base``): an A/B of two builds in one process, the host's drift
landing on both.

    source .kit_client/device-setup.sh && python3 benchmarks/explore/step_host_probe.py --out $OUT/probe.json
        [--base /tmp/base] [--rounds 8] [--profile-steps 10]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--profile-steps", type=int, default=10, help="0: no profiles")
    ap.add_argument("--base", help="another checkout whose build is timed as ours_base (instead of ours_tree)")
    args = ap.parse_args()
    import torch

    import bench_step
    import train_check
    from client_transformers import REPO_ID, set_local_kernels, set_offline

    set_offline(True)
    set_local_kernels(str(ROOT), [REPO_ID])
    base_id = REPO_ID + "-base"
    if args.base:
        set_local_kernels(args.base, [base_id])

    def base_step():
        return bench_step.compiled_plain_step(__import__("kernels").get_kernel(base_id, version=1), "ours_base")

    def tree_step():
        sys.path.insert(0, str(ROOT / "torch-ext"))
        return bench_step.compiled_plain_step(__import__("flash_attn_4_sm120"), "ours_tree")

    data = list(train_check.batches(20, "cuda"))
    names = ("ours", "ours_base" if args.base else "ours_tree", "sdpa_fa2")
    contexts = {n: (lambda n=n: train_check.sdpa_backend(n)) for n in names}
    steps = {}
    for n in names:
        with contexts[n]():
            steps[n] = {"ours_tree": tree_step, "ours_base": base_step}.get(n, lambda n=n: bench_step.plain_step(n))()
    runs = bench_step.time_alternated(steps, contexts, data, 10, args.rounds, 5)
    for n, r in runs.items():
        print(f"{n:9s} step {r['step_ms']:7.2f} ms  issue {r['issue_ms']:7.2f} ms", flush=True)
    report = {"device": torch.cuda.get_device_name(), "runs": runs, "profiles": {}}
    for n in names if args.profile_steps else ():
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        with contexts[n]():
            prof.enable()
            for i in range(args.profile_steps):
                steps[n](*data[i % len(data)])
            prof.disable()
        torch.cuda.synchronize()
        text = {}
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(30)
            text[key] = buf.getvalue()
        report["profiles"][n] = text
        print(f"== {n} by own time\n" + "\n".join(text["tottime"].splitlines()[:45]), flush=True)
        print(f"== {n} by cumulative time\n" + "\n".join(text["cumulative"].splitlines()[:45]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
