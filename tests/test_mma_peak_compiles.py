"""benchmarks/probes/mma_peak.py compiles on the CPU, and its SASS is the loop it claims to time.

The benchmark's TFLOPS formula counts ``unroll * chains`` MMAs per warp per loop trip; these tests compile
it (no GPU) and count them in the SASS: inside the loop (from a label to the branch back to it) there must be
exactly that many, all of the claimed instruction (bf16 HMMA.16816, FP8 QMMA.16832), with no local memory.
sm_90a has no FP8 mma.sync: its build must be recognised as emulated, so the probe never times it.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    """Import a script by path (once per session: test_conformance loads the gate under the same name)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gate = _load("conformance_gate", REPO / "tools" / "conformance.py")
mma_peak = _load("mma_peak", REPO / "benchmarks" / "probes" / "mma_peak.py")

_LABEL_RE = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH_RE = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


def loop_bodies(sass: str) -> list[Counter]:
    """Opcode counts of every backward-branch loop: from a label to a later branch to that label."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL_RE.match(line))}
    bodies = []
    for j, line in enumerate(lines):
        m = _BRANCH_RE.search(line)
        if m and labels.get(m.group(1), j) < j:
            bodies.append(Counter(gate.sass_opcodes("\n".join(lines[labels[m.group(1)]:j + 1]))))
    return bodies


def compile_sass(kernel, target: str, tmp_path: Path) -> str:
    compiled = mma_peak.compile_mma_peak(kernel, target, f"--keep-sass --keep-cubin --dump-dir {tmp_path}")
    art = compiled.artifacts
    return gate._sass_text(art.SASS, gate._cubin_bytes(art.CUBIN))


#: the SASS opcode each operand type's loop must consist of where the target runs it natively
NATIVE_OPCODE = {"bf16": "HMMA.16816.F32.BF16", "e4m3": "QMMA.16832.F32.E4M3.E4M3",
                 "e5m2": "QMMA.16832.F32.E5M2.E5M2"}


@pytest.mark.check
@pytest.mark.parametrize("target, knobs", [
    ("sm_120a", dict()),
    ("sm_120a", dict(num_warps=4, warp_tile_m=16, warp_tile_n=32, unroll=4)),
    ("sm_90a", dict()),
    ("sm_120a", dict(dtype="e4m3")),
    ("sm_120a", dict(dtype="e5m2", num_warps=4, warp_tile_m=16, warp_tile_n=32, unroll=4)),
], ids=["sm_120a-default", "sm_120a-4w-16x32-unroll4", "sm_90a-default", "sm_120a-e4m3", "sm_120a-e5m2-4w"])
def test_sass_loop_is_the_counted_mma(target, knobs, tmp_path):
    kernel = mma_peak.MmaPeak(**knobs)
    sass = compile_sass(kernel, target, tmp_path)
    assert gate.declared_target(sass) == target
    opcode = NATIVE_OPCODE[kernel.dtype]
    ops = Counter(gate.sass_opcodes(sass))
    mmas = {op: n for op, n in ops.items() if "MMA" in gate.family(op)}
    assert set(mmas) == {opcode}, mmas
    assert mma_peak.mma_sass(kernel, sass) == {"native": True, "mma_opcodes": mmas}
    assert not (ops.keys() & {"LDL", "STL"}), "the benchmark spills to local memory"
    [body] = [b for b in loop_bodies(sass) if b[opcode]]
    # The dynamic loop's body holds every MMA of one trip; ptxas may unroll the trip loop further.
    per_body = body[opcode]
    assert per_body % kernel.mmas_per_trip == 0 and 1 <= per_body // kernel.mmas_per_trip <= 4, (
        per_body, kernel.mmas_per_trip)
    # Outside the loop: at most a peeled remainder of the same trips, never extra work.
    assert mmas[opcode] % kernel.mmas_per_trip == 0


@pytest.mark.check
@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
def test_fp8_on_sm90a_is_emulated_and_not_timed(dtype, tmp_path):
    # sm_90a lowers FP8 mma.sync.m16n8k32 to f16 HMMA.16816 products plus FADDs into the accumulator: no QMMA,
    # and fewer HMMAs in the loop than the MMAs the formula would count (the invariant product is computed once).
    kernel = mma_peak.MmaPeak(dtype=dtype)
    sass = compile_sass(kernel, "sm_90a", tmp_path)
    code = mma_peak.mma_sass(kernel, sass)
    assert code["native"] is False
    assert not any(op.startswith("QMMA") for op in code["mma_opcodes"]) and "HMMA.16816.F32" in code["mma_opcodes"]
    [body] = [b for b in loop_bodies(sass) if b["HMMA.16816.F32"]]
    assert body["HMMA.16816.F32"] < 2 * kernel.mmas_per_trip and body["FADD"] > 0


def test_loop_bodies_finds_backward_branches_only():
    sass = "\n".join([
        "        /*0000*/  BRA `(.L_x_2) ;",
        ".L_x_1:",
        "        /*0010*/  HMMA.16816.F32.BF16 R4, R8, R12, R4 ;",
        "        /*0020*/  HMMA.16816.F32.BF16 R16, R8, R14, R16 ;",
        "        /*0030*/  BRA.U UP0, `(.L_x_1) ;",
        ".L_x_2:",
        "        /*0040*/  EXIT ;",
    ])
    [body] = loop_bodies(sass)
    assert body["HMMA.16816.F32.BF16"] == 2 and body["BRA.U"] == 1


def test_flop_count_and_knob_checks():
    k = mma_peak.MmaPeak(num_warps=8, warp_tile_m=32, warp_tile_n=32, unroll=16)
    assert (k.chains, k.mmas_per_trip) == (8, 128)
    assert k.mma_count(ctas=528, iters=4096) == 528 * 8 * 4096 * 128
    assert mma_peak.FLOPS_PER_MMA == k.flops_per_mma == 4096
    assert mma_peak.MmaPeak(dtype="e4m3").flops_per_mma == 8192  # m16n8k32
    for bad in (dict(warp_tile_m=24), dict(warp_tile_n=12), dict(num_warps=0), dict(unroll=0), dict(dtype="fp4")):
        with pytest.raises(ValueError):
            mma_peak.MmaPeak(**bad)


def test_without_a_gpu_the_script_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the message shown when there is no GPU")
    assert mma_peak.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
