"""The SM120 conformance gate (tools/conformance.py).

Three layers:
  * pure functions on synthetic text: the SASS family classifier and its forbidden list, the PTX
    check, the ``ptxas -v`` parser, the PTX rewrites, the rules in ``analyze``;
  * the gate's CLI over the stub provider (tests/support/conformance_stub.py), real cutlass-dsl
    output: a conforming MMA kernel, a kernel with no HMMA, forced spills, a shared-memory overrun;
  * the gate over the package's own declared cases (the CI subset must conform) and a real
    over-budget config it must reject. These skip while ``flash_attn_4_sm120.conformance`` lacks the
    provider functions.
The CLI runs in a subprocess: it sets CUTE_DSL_ARCH / CUTE_DSL_DUMP_DIR for its own process only.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("conformance_gate", REPO / "tools" / "conformance.py")
gate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gate  # dataclasses look their module up there
_spec.loader.exec_module(gate)


# ----------------------------------------------------------------------------------------------
# SASS families
# ----------------------------------------------------------------------------------------------
SASS_SNIPPET = """\
\t.target\tsm_120a
//--------------------- .text.kernel_x --------------------------
\t.section\t.text.kernel_x,"ax",@progbits
kernel_x:
.text.kernel_x:
        /*0000*/                   LDC R1, c[0x0][0x37c] ;
        /*0010*/                   S2R R7, SR_TID.X ;
        /*0020*/                   LDGSTS.E.BYPASS.LTC128B.128 [R3], desc[UR4][R4.64] ;
        /*0030*/                   LDGDEPBAR ;
.L_x_1:
        /*0040*/                   LDSM.16.M88.4 R8, [R2] ;
        /*0050*/                   HMMA.16816.F32.BF16 R12, R8, R20, R12 ;
        /*0060*/               @P0 HMMA.16816.F32.BF16 R16, R8, R22, R16 ;
        /*0070*/              @!P1 BRA `(.L_x_1) ;
        /*0080*/                   STSM.16.M88.4 [R2], R12 ;
        /*0090*/                   MUFU.EX2 R5, R5 ;
        /*00a0*/              @!UPT UIADD3 UR4, UPT, UPT, UR4, 0x1, URZ ;
        /*00b0*/                   EXIT ;
        /*00c0*/                   NOP;
"""


def test_classify_counts_families_and_skips_directives_and_labels():
    fams = gate.classify_sass(SASS_SNIPPET)
    assert fams["HMMA"] == 2  # predicated and unpredicated
    assert fams["LDSM"] == 1 and fams["STSM"] == 1 and fams["LDGSTS"] == 1
    assert fams["BRA"] == 1 and fams["UIADD3"] == 1 and fams["NOP"] == 1
    assert not any(f.startswith((".", "kernel")) for f in fams)
    assert sum(fams.values()) == 13


def test_opcodes_keep_modifiers():
    ops = gate.sass_opcodes(SASS_SNIPPET)
    assert "HMMA.16816.F32.BF16" in ops and "LDSM.16.M88.4" in ops and "MUFU.EX2" in ops


def test_conforming_sass_has_nothing_forbidden():
    assert gate.forbidden_sass(SASS_SNIPPET) == {}


@pytest.mark.parametrize(
    "line, what",
    [
        ("/*0100*/ HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;", "wgmma"),
        ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;", "wgmma"),  # no address column
        ("/*0100*/ QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24 ;", "wgmma"),
        ("/*0100*/ WARPGROUP.ARRIVE ;", "wgmma fence"),
        ("/*0100*/ UTCHMMA gdesc[UR4], gdesc[UR6], tmem[UR8], tmem[UR10], idesc[UR11], UPT ;", "tcgen05"),
        ("/*0100*/ UTCQMMA.2CTA gdesc[UR4], gdesc[UR6], tmem[UR8], tmem[UR10], idesc[UR11], UPT ;", "tcgen05"),
        ("/*0100*/ @P0 UTCBAR [UR4], URZ ;", "tcgen05"),
        ("/*0100*/ UTCCP.T.S.128x256b tmem[UR4], gdesc[UR6] ;", "tcgen05"),
        ("/*0100*/ LDTM.x16 R4, tmem[UR4] ;", "TMEM"),
        ("/*0100*/ STTM.x16 tmem[UR4], R4 ;", "TMEM"),
        ("/*0100*/ UTMALDG.2D.MULTICAST [UR8], [UR4], UR6, desc[UR10] ;", "multicast"),
    ],
    ids=["HGMMA", "HGMMA-bare", "QGMMA", "WARPGROUP", "UTCHMMA", "UTCQMMA-2cta", "UTCBAR", "UTCCP",
         "LDTM", "STTM", "UTMALDG-multicast"],
)
def test_forbidden_sass_is_flagged(line, what):
    found = gate.forbidden_sass(line)
    assert len(found) == 1, found
    (label,) = found
    assert what in label


@pytest.mark.parametrize(
    "line",
    [
        "/*0100*/ UTMALDG.2D [UR8], [UR4], desc[UR10] ;",  # single-CTA TMA load: sm_120 has it
        "/*0100*/ UTMASTG.2D [UR4], [UR8] ;",
        "/*0100*/ UBLKCP.S.G [UR4], [UR6], UR8 ;",
        "/*0100*/ SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR4+0x8], RZ ;",
        "/*0100*/ USETMAXREG.DEALLOC.CTAPOOL 0x18 ;",  # setmaxnreg is allowed
        "/*0100*/ QMMA.16832.F32.E4M3.E4M3 R4, R8, R12, R4 ;",
        "/*0100*/ LDSM.16.MT88.4 R8, [R2] ;",
        "/*0100*/ STSM.16.M88.4 [R2], R12 ;",
    ],
    ids=["UTMALDG", "UTMASTG", "UBLKCP", "SYNCS", "USETMAXREG", "QMMA", "LDSM", "STSM"],
)
def test_sm120_instructions_are_allowed(line):
    assert gate.forbidden_sass(line) == {}


def test_forbidden_ptx():
    ptx = """
    // wgmma.mma_async in a comment does not count
    setmaxnreg.inc.sync.aligned.u32 240;
    cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2, %r3}], [%r4];
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f1};
    """
    assert gate.forbidden_ptx(ptx) == {}
    bad = """
    wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, 1, 1, 1, 0, 0;
    tcgen05.mma.cta_group::1.kind::f16 [%r1], %rd1, %rd2, %r2, 1;
    cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%r1], [%rd1], [%r4], %rs1;
    """
    found = gate.forbidden_ptx(bad)
    assert set(found) == {"wgmma (sm_90a)", "tcgen05 (sm_100a)", "multicast::cluster (TMA multicast)"}


def test_declared_target():
    assert gate.declared_target(SASS_SNIPPET) == "sm_120a"
    assert gate.declared_target(".version 9.4\n.target sm_90a\n.address_size 64\n") == "sm_90a"
    assert gate.declared_target(".target sm_80, debug\n") == "sm_80"


# ----------------------------------------------------------------------------------------------
# ptxas -v and PTX rewrites
# ----------------------------------------------------------------------------------------------
PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kernel_a' for 'sm_120a'
ptxas info    : Function properties for kernel_a
    72 bytes stack frame, 312 bytes spill stores, 280 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 72 bytes cumulative stack size
ptxas info    : Compile time = 38.3 ms
ptxas info    : Compiling entry function 'kernel_b' for 'sm_120a'
ptxas info    : Function properties for kernel_b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 46 registers, used 0 barriers
"""


def test_parse_ptxas_verbose():
    k = gate.parse_ptxas_verbose(PTXAS_LOG)
    assert set(k) == {"kernel_a", "kernel_b"}
    a, b = k["kernel_a"], k["kernel_b"]
    assert (a.regs, a.stack, a.spill_stores, a.spill_loads, a.barriers) == (255, 72, 312, 280, 1)
    assert (b.regs, b.stack, b.spill_stores, b.spill_loads, b.barriers) == (46, 0, 0, 0, 0)


def test_parse_ptxas_verbose_empty():
    assert gate.parse_ptxas_verbose("ptxas fatal   : Unsupported .version 9.4; current version is '9.0'") == {}


def test_rewrite_ptx_version():
    ptx = "//\n// .version 1.0 in a comment\n.version 9.4\n.target sm_120a\n"
    out = gate.rewrite_ptx_version(ptx, "9.0")
    assert ".version 9.0\n.target sm_120a" in out and ".version 9.4" not in out


PTX_TWO_ENTRIES = """\
.visible .entry k1(
\t.param .align 8 .b8 k1_param_0[8]
)
.reqntid 128, 1, 1
{
\tret;
}
.visible .entry k2(
\t.param .align 8 .b8 k2_param_0[8]
)
.reqntid 256, 1, 1
.maxnreg 168
{
\tret;
}
"""


def test_cap_registers_adds_or_replaces_maxnreg_on_every_entry():
    out = gate.cap_registers(PTX_TWO_ENTRIES, 32)
    assert out.count(".maxnreg 32\n{") == 2
    assert ".maxnreg 168" not in out
    assert ".reqntid 128, 1, 1\n.maxnreg 32\n{" in out


def test_parse_knobs():
    assert gate._parse_knobs("head_dim=128,causal=True,dtype=bf16, tile_n = 64") == {
        "head_dim": 128, "causal": True, "dtype": "bf16", "tile_n": 64}


# ----------------------------------------------------------------------------------------------
# The rules, on synthetic facts
# ----------------------------------------------------------------------------------------------
GOOD_PTX = ".version 9.4\n.target sm_120a\n.address_size 64\n"
GOOD_LOG = """\
ptxas info    : Compiling entry function 'kernel_b' for 'sm_120a'
ptxas info    : Function properties for kernel_b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 46 registers, used 1 barriers
"""


def _analyze(sass=SASS_SNIPPET, log=GOOD_LOG, static=1024, dynamic=65536, ptx=GOOD_PTX, target="sm_120a"):
    cubin = {"kernel_b": gate.CubinKernel("kernel_b", regs=46, static_smem=static)}
    return gate.analyze("case", {"k": 1}, target, ptx=ptx, sass=sass, ptxas_log=log, cubin=cubin,
                        smem_dynamic=dynamic, smem_limit=101376)


def test_analyze_conforming():
    rep = _analyze()
    assert rep.ok, rep.violations
    assert (rep.regs, rep.regs_cubin, rep.smem_bytes, rep.smem_static) == (46, 46, 65536 + 1024, 1024)
    assert rep.families["HMMA"] == 2


def test_analyze_spills():
    rep = _analyze(log=PTXAS_LOG)
    assert [v for v in rep.violations if v.startswith("spills: 312 B stores, 280 B loads at 255 registers")]


def test_analyze_local_memory_in_sass():
    rep = _analyze(sass=SASS_SNIPPET + "        /*00d0*/                   STL [R1+0x8], R4 ;\n")
    assert rep.violations == ["local memory in the shipped SASS: 1 STL"]


def test_analyze_smem_counts_static_shared_memory():
    assert _analyze(dynamic=101376 - 1024).ok
    rep = _analyze(dynamic=101376 - 1023)
    assert rep.violations == ["shared memory 101377 B per CTA (dynamic 100353 + static 1024) > 101376 B"]


def test_analyze_no_hmma_and_forbidden():
    sass = SASS_SNIPPET.replace("HMMA.16816.F32.BF16", "HGMMA.64x128x16.F32.BF16")
    rep = _analyze(sass=sass)
    assert "no HMMA (warp-level mma.sync) in the SASS" in rep.violations
    assert any(v.startswith("forbidden SASS, wgmma") for v in rep.violations)


def test_analyze_wrong_target():
    rep = _analyze(ptx=GOOD_PTX.replace("sm_120a", "sm_90a"))
    assert rep.violations == ["PTX is for sm_90a, not sm_120a"]


def test_no_ptxas_fails_clearly(monkeypatch):
    monkeypatch.setattr(gate, "_nvjitlink", lambda: None)
    with pytest.raises(gate.GateError, match="ptxas not found"):
        gate.Ptxas(None, "auto")
    with pytest.raises(gate.GateError, match="ptxas not found"):
        gate.Ptxas(None, "binary")


# ----------------------------------------------------------------------------------------------
# The CLI over the stub provider (real cutlass-dsl output)
# ----------------------------------------------------------------------------------------------
needs_cutlass = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                   reason="nvidia-cutlass-dsl is not installed: nothing to compile")


def run_gate(tmp_path, *args, provider="support.conformance_stub", name="report.json"):
    out = tmp_path / name
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO / "torch-ext"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "conformance.py"), "--provider", provider, "--json", str(out), *args],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900,
    )
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report


def by_name(report):
    return {c["name"]: c for c in report["configs"]}


@pytest.fixture(scope="module")
def stub_all(tmp_path_factory):
    return run_gate(tmp_path_factory.mktemp("stub_all"))


@needs_cutlass
@pytest.mark.check
def test_stub_gate_reports_mma_case(stub_all):
    proc, report = stub_all
    mma = by_name(report)["stub_mma_smem8192"]
    assert mma["violations"] == [], proc.stdout + proc.stderr
    assert mma["families"]["HMMA"] > 0
    assert mma["regs"] and mma["regs_cubin"] and mma["target"] == "sm_120a"
    assert (mma["spill_stores"], mma["spill_loads"], mma["stack"]) == (0, 0, 0)
    # Dynamic smem from the provider plus the static smem the cubin records.
    assert mma["smem_dynamic"] == 8192 and mma["smem_bytes"] == 8192 + mma["smem_static"]
    assert "stub_mma_smem8192" in proc.stdout and "HMMA:" in proc.stdout


@needs_cutlass
@pytest.mark.check
def test_stub_gate_fails_kernel_without_hmma(stub_all):
    proc, report = stub_all
    assert proc.returncode == 1, proc.stdout + proc.stderr
    copy = by_name(report)["stub_copy_smem0"]
    assert copy["violations"] == ["no HMMA (warp-level mma.sync) in the SASS"]
    assert not report["ok"]


@needs_cutlass
@pytest.mark.check
def test_stub_gate_passes_when_every_case_conforms(tmp_path):
    proc, report = run_gate(tmp_path, "--subset", "ci")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c["name"] for c in report["configs"]] == ["stub_mma_smem8192"] and report["ok"]


@needs_cutlass
@pytest.mark.check
def test_stub_gate_catches_spills_under_a_register_cap(tmp_path):
    proc, report = run_gate(tmp_path, "--only", "stub_mma_*", "--maxnreg", "32")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (case,) = report["configs"]
    assert case["spill_stores"] > 0 and case["spill_loads"] > 0 and case["regs"] <= 32
    assert case["violations"][0].startswith("spills: ")


@needs_cutlass
@pytest.mark.check
def test_stub_gate_catches_smem_overrun(tmp_path):
    proc, report = run_gate(tmp_path, "--make-case", "kind=mma,smem_bytes=120000", "--no-check-valid")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (case,) = report["configs"]
    assert len(case["violations"]) == 1 and case["violations"][0].startswith("shared memory 1")
    assert case["smem_bytes"] >= 120000


@needs_cutlass
@pytest.mark.check
def test_stub_gate_setup_errors_exit_2(tmp_path):
    proc, _ = run_gate(tmp_path, "--only", "no_such_case")
    assert proc.returncode == 2 and "matched no case" in proc.stderr
    proc, _ = run_gate(tmp_path, provider="support.no_such_provider")
    assert proc.returncode == 2 and "cannot import provider" in proc.stderr


# ----------------------------------------------------------------------------------------------
# The package's own cases
# ----------------------------------------------------------------------------------------------
def real_provider():
    try:
        mod = importlib.import_module(gate.DEFAULT_PROVIDER)
    except ImportError as e:
        pytest.skip(f"{gate.DEFAULT_PROVIDER} is not importable yet: {e}")
    missing = [f for f in ("conformance_cases", "compile_for_conformance", "make_case") if not hasattr(mod, f)]
    if missing:
        pytest.skip(f"{gate.DEFAULT_PROVIDER} does not provide {', '.join(missing)} yet")
    return mod


def test_declared_cases_are_named_uniquely_and_have_a_ci_subset():
    provider = real_provider()
    cases = provider.conformance_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    assert any(c.subset_ci for c in cases)
    assert all(isinstance(c.describe(), dict) for c in cases)
    # the tuner's candidates too: two configs that differ only in a knob the name leaves out would share a report
    # entry (the role split's step divisor: ``_rsd``)
    names = [c.name for c in provider.candidate_cases()]
    assert len(names) == len(set(names)) and any(n.endswith("_rsd") for n in names)


@pytest.fixture(scope="module")
def real_ci(tmp_path_factory):
    real_provider()
    return run_gate(tmp_path_factory.mktemp("real_ci"), "--subset", "ci", provider=gate.DEFAULT_PROVIDER)


@needs_cutlass
@pytest.mark.check
def test_ci_subset_of_real_cases_conforms(real_ci):
    proc, report = real_ci
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = {c.name for c in real_provider().conformance_cases() if c.subset_ci}
    assert set(by_name(report)) == expected
    for case in report["configs"]:
        assert case["smem_bytes"] <= report["smem_limit"]
        if case["config"]["kernel"] == "fwd_fp8_mma":  # both GEMMs FP8 mma.sync (QMMA), no 16-bit one
            assert case["families"].get("QMMA", 0) > 0 and "HMMA" not in case["families"]
        elif case["config"].get("uses_mma", True):
            assert case["families"].get("HMMA", 0) > 0
        else:  # the split-KV combine (fp32 adds), the KV-cache append (copies, fp32 rotary) and the block-sparse
            # refinement (a mask_mod's evaluation): no MMA
            assert case["config"]["kernel"] in ("fwd_combine", "kv_append", "sparse_refine") \
                and "HMMA" not in case["families"]


@needs_cutlass
@pytest.mark.check
def test_gate_catches_spills_in_a_real_kernel(tmp_path):
    provider = real_provider()
    first_ci = next(c.name for c in provider.conformance_cases() if c.subset_ci)
    proc, report = run_gate(tmp_path, "--only", first_ci, "--maxnreg", "64", provider=gate.DEFAULT_PROVIDER)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (case,) = report["configs"]
    assert case["spill_stores"] > 0 and any(v.startswith("spills: ") for v in case["violations"])


@needs_cutlass
@pytest.mark.check
def test_gate_rejects_a_real_over_budget_config(tmp_path):
    provider = real_provider()
    # d=256 with a 128x64 tile: Q/O 64 KB + K 32 KB + V 32 KB of shared memory > 99 KB.
    knobs = dict(head_dim=256, tile_m=128, tile_n=64, num_warps=8, causal=True, dtype="bf16")
    case = provider.make_case(**knobs)
    arg = ",".join(f"{k}={v}" for k, v in knobs.items())
    proc, report = run_gate(tmp_path, "--make-case", arg, "--no-check-valid", provider=gate.DEFAULT_PROVIDER)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (rep,) = report["configs"]
    assert rep["name"] == case.name
    assert rep["smem_bytes"] > report["smem_limit"]
    assert any(v.startswith("shared memory ") for v in rep["violations"])
    # With the validity predicate on, the provider refuses to build it at all.
    proc, report = run_gate(tmp_path, "--make-case", arg, provider=gate.DEFAULT_PROVIDER, name="valid.json")
    assert proc.returncode == 1
    assert report["configs"][0]["violations"][0].startswith("compile failed: ValueError")
