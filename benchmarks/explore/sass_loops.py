"""Census of the loops in kept SASS (a script, not a test): each backward branch's body, its size and its
instruction families, per file. Used in sessions 26-27 to compare the causal flag's step loops with the block-sparse
walk's (which variant of a step a loop holds shows in its FSEL / ISETP counts: an element mask costs one compare and
one select per score).

    PYTHONPATH=<dir of a provider module> python tools/conformance.py --provider <module> --keep-dir /tmp/sass
    python benchmarks/explore/sass_loops.py /tmp/sass/*.sass [--min 20]
"""

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from conformance import family, sass_opcodes  # noqa: E402  (the gate's SASS parsing)

_LABEL = re.compile(r"\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"BRA.*`\((\.L_x_\d+)\)")


def parse(path: str):
    """(instructions as (family, line), {label: index of the instruction it precedes}) of an nvdisasm listing."""
    instrs, labels = [], {}
    for line in open(path).read().splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(instrs)
            continue
        ops = sass_opcodes(line)
        if ops:
            instrs.append((family(ops[0]), line))
    return instrs, labels


def loops(instrs, labels, min_size: int):
    """(first, last, family counts) of every backward branch's body of at least ``min_size`` instructions."""
    for i, (_, line) in enumerate(instrs):
        m = _BRANCH.search(line)
        j = labels.get(m.group(1)) if m else None
        if j is not None and j <= i and i - j + 1 >= min_size:
            yield j, i, collections.Counter(fam for fam, _ in instrs[j:i + 1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sass", nargs="+")
    ap.add_argument("--min", type=int, default=20, help="smallest loop body reported (spin-waits are ~5)")
    args = ap.parse_args()
    for path in args.sass:
        instrs, labels = parse(path)
        print(f"== {path.rsplit('/', 1)[-1]}: {len(instrs)} instructions, "
              f"{sum(fam == 'HMMA' for fam, _ in instrs)} HMMA")
        for j, i, fam in loops(instrs, labels, args.min):
            top = ", ".join(f"{k} {n}" for k, n in fam.most_common(10))
            print(f"  loop [{j}-{i}] {i - j + 1} instructions: {top}")


if __name__ == "__main__":
    main()
