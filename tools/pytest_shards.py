"""Run a pytest selection in N parallel shards (one process each) and summarize.

The GPU suite is dominated by kernel compilation (CPU-bound, one process at a time), so on the
device machine (16 cores) shards finish several times sooner than one pytest process. Shards are
contiguous runs of the collected ids (neighbours usually share a kernel, so each shard compiles
few); each gets its own compile-cache directory (no two processes write one cache entry).

    python tools/pytest_shards.py -n 8 [--log-dir DIR] -- -m gpu tests/test_mainloops_gpu.py -k overlap

Exit status: 0 when every shard passed (or had only skips), 1 otherwise. Prints each shard's summary
line and the failed test ids.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time


def collect(pytest_args: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *pytest_args],
                         capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if not ids and out.returncode not in (0, 5):
        sys.stderr.write(out.stdout + out.stderr)
        raise SystemExit(f"collection failed (rc {out.returncode})")
    return ids


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=os.cpu_count() or 2, help="shards (processes)")
    ap.add_argument("--log-dir", default=None, help="keep each shard's output here")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    pytest_args = [a for a in args.pytest_args if a != "--"]
    # marker / keyword options apply at collection; the ids then select exactly the collected tests
    ids = collect(pytest_args)
    if not ids:
        print("no tests collected")
        return 0
    n = max(1, min(args.n, len(ids)))
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="pytest-shards-")
    os.makedirs(log_dir, exist_ok=True)
    opts = [a for a in pytest_args if a.startswith("-") and not a.startswith("-k") and not a.startswith("-m")]
    procs = []
    start = time.time()
    for i in range(n):
        # contiguous chunks: neighbouring ids of a parametrized test usually share a compiled kernel
        lo, hi = len(ids) * i // n, len(ids) * (i + 1) // n
        shard = ids[lo:hi]
        list_path = os.path.join(log_dir, f"shard{i}.ids")
        with open(list_path, "w") as f:
            f.write("\n".join(shard) + "\n")
        env = dict(os.environ)
        base = env.get("FA4_SM120_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "fa4-shards")
        env["FA4_SM120_CACHE_DIR"] = os.path.join(base, f"shard{i}")
        log = open(os.path.join(log_dir, f"shard{i}.log"), "w")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *opts, *shard]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log, i))
    failed, ok = [], True
    for proc, log, i in procs:
        rc = proc.wait()
        log.close()
        text = open(os.path.join(log_dir, f"shard{i}.log")).read()
        summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", line)]
        print(f"shard {i}: rc {rc}: {summary[-1] if summary else '(no summary)'}")
        failed += [line for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))]
        ok &= rc in (0, 5)
    print(f"{len(ids)} tests in {n} shards, {time.time() - start:.0f} s wall")
    for line in failed:
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
