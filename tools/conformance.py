"""SM120 conformance gate: compile every kernel config the dispatcher can choose and check the code.

    python tools/conformance.py [--target sm_120a] [--subset ci|all|candidates] [--json out.json] [--only NAME...]

What it does, per config (a ``Case`` from the provider's ``conformance_cases()``, a declared list):
  1. ``compile_for_conformance(case, target)`` traces and compiles the kernel on the CPU with
     ``--keep-ptx --keep-cubin --keep-sass`` and returns it with the dynamic shared memory per CTA
     the launch requests.
  2. ``ptxas -arch=<target> -v [--ptxas-flag ...]`` on the PTX: registers per thread, stack frame,
     spill store/load bytes, per kernel entry. ``--maxnreg N`` caps registers (a ``.maxnreg``
     directive; ptxas ignores ``-maxrregcount`` for cutlass-dsl kernels, which declare ``.reqntid``).
  3. The shipped cubin (ELF): registers per kernel and static shared memory (``.nv.shared.<kernel>``;
     cutlass-dsl 4.8.1 kernels using dynamic smem carry 1024 static bytes, which count against
     the per-CTA limit like the dynamic bytes do).
  4. The SASS: a count per instruction family (``HMMA``, ``LDSM``, ``LDGSTS``, ``UTMALDG``, ...);
     the PTX: instructions sm_120a lacks.
  5. The rules below; any violation makes the exit status 1.

Rules (the SM120 execution model, ``flash_attn_4_sm120.execution_model``):
  * no spills: ptxas reports 0 bytes of spill stores and spill loads for every kernel, and the shipped
    SASS has no local-memory instructions (``LDL``/``STL``);
  * shared memory per CTA (dynamic + static) <= the model's ``smem_per_cta`` (101376 B on SM120);
  * warp-level ``mma.sync`` is present (``HMMA``; FP8/FP4 forms are ``QMMA``/``OMMA``), unless the
    case's ``describe()`` says ``uses_mma: False`` (the split-KV combine, the KV-cache append, the
    block-sparse refinement);
  * nothing from sm_90a/sm_100a: ``HGMMA``/``IGMMA``/``QGMMA``/``BGMMA`` and ``WARPGROUP`` (wgmma),
    ``UTC*`` (tcgen05: UTCHMMA, UTCQMMA, UTCBAR, UTCCP, ...), ``LDTM``/``STTM`` (TMEM), TMA multicast;
    in the PTX: ``wgmma.*``, ``tcgen05.*``, ``.multicast::cluster``, ``.cta_group::2``.
    Allowed: TMA (``UTMALDG``/``UTMASTG``/``UBLKCP``), mbarriers (``SYNCS``), ``setmaxnreg``
    (``USETMAXREG``), ``ldmatrix``/``stmatrix`` (``LDSM``/``STSM``), ``cp.async`` (``LDGSTS``);
  * the code is for the requested target (the ``.target`` line of the PTX and SASS).

ptxas: ``--ptxas PATH``, else ``$PTXAS``, else ``ptxas`` on PATH, else ``/usr/local/cuda/bin/ptxas``.
cutlass-dsl emits PTX newer than some toolkits' ptxas reads (4.8.1: ``.version 9.4``; CUDA 13.0 ptxas
reads up to 9.0); the gate then retries with the ``.version`` line lowered to what ptxas reads and
says so. The shipped cubin comes from the DSL's own ptxas, so its register count is reported beside
ptxas's ("regs (cubin)"). With no usable ptxas binary the gate uses nvJitLink (cuda-bindings +
the nvidia-nvjitlink wheel) and says so; with neither it fails (exit status 2).

Exit status: 0 all configs conform, 1 some config violates a rule (or failed to compile),
2 the gate itself could not run (no ptxas, provider not importable, no case matched ``--only``).

The functions ``sass_opcodes``, ``classify_sass``, ``forbidden_sass``, ``forbidden_ptx``,
``parse_ptxas_verbose`` and ``cubin_kernels`` are pure (text/bytes in, data out) and unit-tested.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROVIDER = "flash_attn_4_sm120.conformance"
DEFAULT_TARGET = "sm_120a"


class GateError(RuntimeError):
    """The gate could not run (as opposed to a config that violates a rule)."""


# ----------------------------------------------------------------------------------------------
# SASS: instruction families (pure)
# ----------------------------------------------------------------------------------------------
# An instruction line of `nvdisasm` output: `/*0a30*/  @!P0 HMMA.16816.F32.BF16 R4, R8, R12, R4 ;`.
# Lines without the address comment (hand-written snippets) are accepted too.
_SASS_ADDR = r"(?:/\*[0-9a-fA-F]+\*/)"
_SASS_PRED = r"(?:@!?U?P(?:T|\d+)\s+)"
_SASS_OPCODE = r"(?P<op>[A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)"
_SASS_LINE_RE = re.compile(rf"^\s*(?:{_SASS_ADDR}\s*)?\{{?\s*{_SASS_PRED}?{_SASS_OPCODE}(?=[\s;]|$)")

#: Warp-level mma.sync: f16/bf16 (HMMA), fp8 (QMMA), fp4/f8f6f4 block-scaled (OMMA), int8 (IMMA).
MMA_SYNC_FAMILIES = ("HMMA", "QMMA", "OMMA", "IMMA")

#: Families shown in the table (all families go to the JSON).
SHOWN_FAMILIES = (
    "HMMA", "QMMA", "OMMA", "LDSM", "STSM", "LDGSTS", "UTMALDG", "UTMASTG", "UBLKCP", "SYNCS",
    "USETMAXREG", "LDL", "STL",
)


def sass_opcodes(sass: str) -> list[str]:
    """Every instruction's full opcode (``HMMA.16816.F32.BF16``), in order; directives, labels and
    comments are skipped."""
    out = []
    for line in sass.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("//", ".", "#")) or stripped.endswith(":"):
            continue
        m = _SASS_LINE_RE.match(line)
        if m:
            out.append(m.group("op"))
    return out


def family(opcode: str) -> str:
    """``HMMA.16816.F32.BF16`` -> ``HMMA``."""
    return opcode.split(".", 1)[0]


def classify_sass(sass: str) -> Counter:
    """Instruction family -> count (``{"HMMA": 512, "LDSM": 96, ...}``)."""
    return Counter(family(op) for op in sass_opcodes(sass))


#: (predicate on the full opcode, what it is). SM120 has none of these.
_FORBIDDEN_SASS = (
    (lambda op: family(op) in ("HGMMA", "IGMMA", "QGMMA", "BGMMA"), "wgmma (sm_90a warpgroup MMA)"),
    (lambda op: family(op) == "WARPGROUP", "wgmma fence/arrive (sm_90a WARPGROUP.*)"),
    (lambda op: family(op).startswith("UTC"), "tcgen05 (sm_100a UTC*: UTCHMMA/UTCQMMA/UTCBAR/UTCCP...)"),
    (lambda op: family(op) in ("LDTM", "STTM"), "TMEM load/store (sm_100a tcgen05.ld/st)"),
    (lambda op: family(op).startswith("UTMA") and ".MULTICAST" in op, "TMA multicast (the SM120 model has none)"),
)


def forbidden_sass(sass_or_opcodes: str | Sequence[str]) -> dict[str, Counter]:
    """What it is -> Counter of the offending full opcodes. Empty when the SASS conforms."""
    ops = sass_opcodes(sass_or_opcodes) if isinstance(sass_or_opcodes, str) else sass_or_opcodes
    found: dict[str, Counter] = {}
    for op in ops:
        for pred, what in _FORBIDDEN_SASS:
            if pred(op):
                found.setdefault(what, Counter())[op] += 1
    return found


_FORBIDDEN_PTX = (
    (re.compile(r"\bwgmma\.[\w.:]+"), "wgmma (sm_90a)"),
    (re.compile(r"\btcgen05\.[\w.:]+"), "tcgen05 (sm_100a)"),
    (re.compile(r"\S*\.multicast::cluster\S*"), "multicast::cluster (TMA multicast)"),
    (re.compile(r"\S*\.cta_group::2\S*"), "cta_group::2 (2-CTA, sm_100a)"),
)


def forbidden_ptx(ptx: str) -> dict[str, Counter]:
    """What it is -> Counter of the offending PTX instructions (comments ignored)."""
    found: dict[str, Counter] = {}
    for line in ptx.splitlines():
        code = line.split("//", 1)[0]
        if not code.strip():
            continue
        for rx, what in _FORBIDDEN_PTX:
            for m in rx.finditer(code):
                found.setdefault(what, Counter())[m.group(0).rstrip(";,")] += 1
    return found


_TARGET_RE = re.compile(r"^\s*\.target\s+(\S+)", re.MULTILINE)


def declared_target(text: str) -> Optional[str]:
    """The first ``.target`` of PTX or SASS text (``sm_120a``), without trailing options."""
    m = _TARGET_RE.search(text)
    return m.group(1).split(",")[0] if m else None


# ----------------------------------------------------------------------------------------------
# ptxas -v (pure)
# ----------------------------------------------------------------------------------------------
@dataclass
class PtxasKernel:
    name: str
    regs: Optional[int] = None
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: Optional[int] = None


_PTXAS_ENTRY_RE = re.compile(r"(?:Compiling entry function|Function properties for) '?([^'\s]+)'?")
_PTXAS_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_REGS_RE = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?")


def parse_ptxas_verbose(log: str) -> dict[str, PtxasKernel]:
    """``ptxas -v`` output -> kernel name -> resources. Each fact is attributed to the function most
    recently named by a "Compiling entry function" / "Function properties for" line."""
    kernels: dict[str, PtxasKernel] = {}
    current: Optional[PtxasKernel] = None
    for line in log.splitlines():
        m = _PTXAS_ENTRY_RE.search(line)
        if m:
            current = kernels.setdefault(m.group(1), PtxasKernel(m.group(1)))
            continue
        if current is None:
            continue
        m = _PTXAS_FRAME_RE.search(line)
        if m:
            current.stack, current.spill_stores, current.spill_loads = (int(x) for x in m.groups())
            continue
        m = _PTXAS_REGS_RE.search(line)
        if m:
            current.regs = int(m.group(1))
            current.barriers = int(m.group(2)) if m.group(2) is not None else None
    return kernels


_PTX_VERSION_RE = re.compile(r"Unsupported \.version (\d+\.\d+); current version is '(\d+\.\d+)'")


def rewrite_ptx_version(ptx: str, version: str) -> str:
    return re.sub(r"^(\s*)\.version\s+\d+\.\d+", rf"\g<1>.version {version}", ptx, count=1, flags=re.MULTILINE)


_ENTRY_RE = re.compile(r"\.entry\b")
_MAXNREG_RE = re.compile(r"^[ \t]*\.maxnreg[ \t]+\d+[ \t]*\n?", re.MULTILINE)


def cap_registers(ptx: str, maxnreg: int) -> str:
    """Give every ``.entry`` a ``.maxnreg`` directive (replacing any): the register cap ptxas obeys.

    ``ptxas -maxrregcount`` is ignored for entries that declare ``.reqntid``, and cutlass-dsl
    declares it on every kernel, so this is how a run forces register pressure (to see spills)."""
    out, pos = [], 0
    for m in _ENTRY_RE.finditer(ptx):
        if m.start() < pos:
            continue
        body = ptx.index("{", m.end())  # parameters and performance directives come before the body
        head = _MAXNREG_RE.sub("", ptx[pos:body])
        out.append(head.rstrip(" \t") + ("" if head.endswith("\n") else "\n") + f".maxnreg {maxnreg}\n")
        pos = body
    out.append(ptx[pos:])
    return "".join(out)


# ----------------------------------------------------------------------------------------------
# cubin (pure): registers and static shared memory per kernel, from the ELF
# ----------------------------------------------------------------------------------------------
_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4


@dataclass
class CubinKernel:
    name: str
    regs: Optional[int] = None
    frame: Optional[int] = None
    static_smem: int = 0


def cubin_kernels(cubin: bytes) -> dict[str, CubinKernel]:
    """Kernel name -> registers (EIATTR_REGCOUNT), frame size and static shared memory
    (size of ``.nv.shared.<kernel>``) from a CUDA ELF."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstr(off: int) -> str:
        return cubin[off:cubin.index(b"\0", off)].decode("utf-8", "replace")

    names = [cstr(sections[shstrndx][4] + s[0]) for s in sections]
    symbols: list[str] = []
    for (_, stype, _, _, off, size, link, _, _, entsize) in sections:
        if stype == 2:  # SHT_SYMTAB
            stroff = sections[link][4]
            symbols = [cstr(stroff + struct.unpack_from("<I", cubin, off + i)[0])
                       for i in range(0, size, entsize or 24)]
            break
    kernels: dict[str, CubinKernel] = {}
    for name in names:
        if name.startswith(".text."):
            kernels[name[len(".text."):]] = CubinKernel(name[len(".text."):])
    for name, s in zip(names, sections):
        if name.startswith(".nv.shared.") and name[len(".nv.shared."):] in kernels:
            kernels[name[len(".nv.shared."):]].static_smem = s[5]
        if name != ".nv.info":
            continue
        pos, end = s[4], s[4] + s[5]
        while pos + 2 <= end:
            fmt, attr = cubin[pos], cubin[pos + 1]
            if fmt == _EIFMT_SVAL:
                size = struct.unpack_from("<H", cubin, pos + 2)[0]
                if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and size == 8:
                    sym, value = struct.unpack_from("<II", cubin, pos + 4)
                    kernel = kernels.get(symbols[sym]) if sym < len(symbols) else None
                    if kernel is not None:
                        if attr == _EIATTR_REGCOUNT:
                            kernel.regs = value
                        else:
                            kernel.frame = value
                pos += 4 + size
            elif fmt == _EIFMT_NVAL:
                pos += 2
            else:  # BVAL / HVAL: 2 bytes of value inline
                pos += 4
    return kernels


# ----------------------------------------------------------------------------------------------
# Running ptxas
# ----------------------------------------------------------------------------------------------
def find_ptxas(explicit: Optional[str] = None) -> Optional[str]:
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise GateError(f"--ptxas {explicit}: no such executable")
        return explicit
    for cand in (os.environ.get("PTXAS"), shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _nvjitlink():
    try:
        from cuda.bindings import nvjitlink
        nvjitlink.version()
        return nvjitlink
    except Exception:  # missing module or missing libnvJitLink.so
        return None


class Ptxas:
    """``ptxas -v`` on PTX text: the binary if there is one, else nvJitLink. ``describe()`` names it."""

    def __init__(self, binary: Optional[str], backend: str = "auto"):
        self.binary = binary
        self.backend = backend
        self._nvjitlink = _nvjitlink() if backend in ("auto", "nvjitlink") else None
        if backend == "binary" and not binary:
            raise GateError("ptxas not found (looked at --ptxas, $PTXAS, PATH, /usr/local/cuda/bin/ptxas); "
                            "registers and spills cannot be checked")
        if backend == "nvjitlink" and self._nvjitlink is None:
            raise GateError("--ptxas-backend nvjitlink: cuda.bindings.nvjitlink / libnvJitLink is not available")
        if backend == "auto" and not binary and self._nvjitlink is None:
            raise GateError("ptxas not found (looked at --ptxas, $PTXAS, PATH, /usr/local/cuda/bin/ptxas) and "
                            "nvJitLink is not importable: registers and spills cannot be checked. "
                            "Install the CUDA toolkit's ptxas or pass --ptxas PATH.")
        self.version = self._binary_version() if binary and backend != "nvjitlink" else None

    def _binary_version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"release (\S+), V(\S+)", out)
        return m.group(2) if m else out.strip().splitlines()[-1] if out.strip() else "?"

    def describe(self) -> str:
        if self.binary and self.backend != "nvjitlink":
            return f"{self.binary} (V{self.version})"
        major, minor = self._nvjitlink.version()
        return f"nvJitLink {major}.{minor}"

    def run(self, ptx: str, target: str, flags: Sequence[str]) -> tuple[str, str]:
        """-> (ptxas -v log, how it ran). Raises GateError when no route assembles the PTX."""
        errors = []
        if self.binary and self.backend != "nvjitlink":
            ok, log = self._run_binary(ptx, target, flags)
            if ok:
                return log, f"ptxas V{self.version}"
            m = _PTX_VERSION_RE.search(log)
            if m:
                ok, log2 = self._run_binary(rewrite_ptx_version(ptx, m.group(2)), target, flags)
                if ok:
                    return log2, f"ptxas V{self.version}, PTX .version {m.group(1)} read as {m.group(2)}"
                errors.append(f"ptxas with .version {m.group(2)}: {log2.strip()[-500:]}")
            else:
                errors.append(f"ptxas: {log.strip()[-500:]}")
        if self._nvjitlink is not None:
            ok, log = self._run_nvjitlink(ptx, target, flags)
            if ok:
                major, minor = self._nvjitlink.version()
                return log, f"nvJitLink {major}.{minor}"
            errors.append(f"nvJitLink: {log.strip()[-500:]}")
        raise GateError("no ptxas could assemble the PTX: " + " | ".join(errors))

    def _run_binary(self, ptx: str, target: str, flags: Sequence[str]) -> tuple[bool, str]:
        with tempfile.TemporaryDirectory(prefix="conformance_ptxas_") as tmp:
            src = os.path.join(tmp, "kernel.ptx")
            with open(src, "w") as f:
                f.write(ptx)
            cmd = [self.binary, f"-arch={target}", "-v", *flags, src, "-o", os.path.join(tmp, "k.cubin")]
            proc = subprocess.run(cmd, capture_output=True, text=True)
        return proc.returncode == 0, proc.stdout + proc.stderr

    def _run_nvjitlink(self, ptx: str, target: str, flags: Sequence[str]) -> tuple[bool, str]:
        nvj = self._nvjitlink
        opts = [f"-arch={target}", "-Xptxas=-v", *(f"-Xptxas={f}" for f in flags)]
        data = ptx.encode()
        handle = nvj.create(len(opts), opts)
        try:
            try:
                nvj.add_data(handle, nvj.InputType.PTX, data, len(data), "kernel.ptx")
                nvj.complete(handle)
                ok = True
            except Exception as e:  # nvJitLinkError: the log says why
                ok, err = False, str(e)
            size = nvj.get_info_log_size(handle)
            buf = bytearray(size)
            nvj.get_info_log(handle, buf)
            log = buf.decode(errors="replace").rstrip("\0")
            if not ok:
                size = nvj.get_error_log_size(handle)
                ebuf = bytearray(size)
                nvj.get_error_log(handle, ebuf)
                log += ebuf.decode(errors="replace").rstrip("\0") + f"\n{err}"
            return ok, log
        finally:
            nvj.destroy(handle)


# ----------------------------------------------------------------------------------------------
# The gate
# ----------------------------------------------------------------------------------------------
@dataclass
class KernelReport:
    name: str
    regs: Optional[int]
    regs_cubin: Optional[int]
    spill_stores: int
    spill_loads: int
    stack: int
    static_smem: int


@dataclass
class CaseReport:
    name: str
    config: dict
    target: str
    regs: Optional[int] = None
    regs_cubin: Optional[int] = None
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    smem_bytes: Optional[int] = None
    smem_dynamic: Optional[int] = None
    smem_static: int = 0
    smem_limit: Optional[int] = None
    families: dict = field(default_factory=dict)
    kernels: list = field(default_factory=list)
    ptxas: str = ""
    compile_s: float = 0.0
    check_s: float = 0.0
    violations: list = field(default_factory=list)
    #: facts worth reading that break no rule (e.g. an older ptxas's spills the shipped code lacks)
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def _text_artifact(value: Any, label: str) -> str:
    """Artifacts are the text, or (when the DSL did not write the file) a path that does not exist."""
    if value is None:
        raise GateError(f"compiled function has no {label}: compile with --keep-ptx --keep-cubin --keep-sass")
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if "\n" in value:
        return value
    if os.path.isfile(value):
        return Path(value).read_text()
    raise GateError(f"the {label} artifact was not written (expected at {value})")


def _cubin_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str) and os.path.isfile(value):
        return Path(value).read_bytes()
    raise GateError("compiled function has no CUBIN: compile with --keep-cubin")


def find_nvdisasm() -> Optional[str]:
    cands = [os.environ.get("NVDISASM")]
    try:
        import nvidia  # the nvidia-cuda-nvdisasm wheel puts bin/nvdisasm under nvidia/cu*/
        for base in nvidia.__path__:
            cands += sorted(str(p) for p in Path(base).glob("cu*/bin/nvdisasm"))
    except ImportError:
        pass
    cands += [shutil.which("nvdisasm"), "/usr/local/cuda/bin/nvdisasm"]
    return next((c for c in cands if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def disassemble(cubin: bytes) -> str:
    tool = find_nvdisasm()
    if tool is None:
        raise GateError("no SASS artifact and no nvdisasm to make one (pip install nvidia-cuda-nvdisasm)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        proc = subprocess.run([tool, "-c", f.name], capture_output=True, text=True)
    if proc.returncode:
        raise GateError(f"nvdisasm failed: {proc.stderr.strip()}")
    return proc.stdout


def _sass_text(artifact: Any, cubin: bytes) -> str:
    """The SASS artifact, or the cubin disassembled here when the DSL left only a path (cutlass-dsl
    4.8.1 skips the SASS dump when the arch comes from ``--gpu-arch`` and ``CUTE_DSL_ARCH`` is unset)."""
    if isinstance(artifact, str) and "\n" in artifact:
        return artifact
    if isinstance(artifact, str) and os.path.isfile(artifact):
        return Path(artifact).read_text()
    return disassemble(cubin)


def analyze(case_name: str, config: dict, target: str, *, ptx: str, sass: str, ptxas_log: str,
            cubin: dict[str, CubinKernel], smem_dynamic: Optional[int], smem_limit: int,
            ptxas_is_proxy: bool = False) -> CaseReport:
    """Every fact and every rule for one compiled config (pure: text and parsed cubin in, report out).

    ``ptxas_is_proxy``: the ptxas rerun is an older ptxas than the one that built the shipped cubin
    (the PTX version had to be lowered for it). Its register allocation then differs from the code
    that runs (measured: CUDA 13.0 ptxas caps a 128-thread kernel at 168 registers and spills 8 B where
    the DSL's own build uses 198 registers and no local memory). The shipped SASS decides: its
    LDL/STL are always violations; the proxy's spills are violations only when the shipped SASS has
    local memory too, else they are reported as notes."""
    rep = CaseReport(name=case_name, config=config, target=target, smem_limit=smem_limit)
    from_ptxas = parse_ptxas_verbose(ptxas_log)
    if not from_ptxas:
        raise GateError(f"{case_name}: no kernel found in the ptxas -v output:\n{ptxas_log}")
    for name in sorted(set(from_ptxas) | set(cubin)):
        p, c = from_ptxas.get(name), cubin.get(name)
        rep.kernels.append(KernelReport(
            name=name, regs=p.regs if p else None, regs_cubin=c.regs if c else None,
            spill_stores=p.spill_stores if p else 0, spill_loads=p.spill_loads if p else 0,
            stack=p.stack if p else 0, static_smem=c.static_smem if c else 0))
    rep.regs = max((k.regs for k in rep.kernels if k.regs is not None), default=None)
    rep.regs_cubin = max((k.regs_cubin for k in rep.kernels if k.regs_cubin is not None), default=None)
    rep.spill_stores = sum(k.spill_stores for k in rep.kernels)
    rep.spill_loads = sum(k.spill_loads for k in rep.kernels)
    rep.stack = max((k.stack for k in rep.kernels), default=0)
    rep.smem_static = max((k.static_smem for k in rep.kernels), default=0)
    rep.smem_dynamic = smem_dynamic
    rep.smem_bytes = None if smem_dynamic is None else smem_dynamic + rep.smem_static
    ops = sass_opcodes(sass)
    rep.families = dict(sorted(Counter(family(op) for op in ops).items(), key=lambda kv: (-kv[1], kv[0])))

    v = rep.violations
    local = {f: rep.families[f] for f in ("STL", "LDL") if f in rep.families}
    for k in rep.kernels:
        if k.spill_stores or k.spill_loads:
            where = f" in {k.name}" if len(rep.kernels) > 1 else ""
            msg = f"spills: {k.spill_stores} B stores, {k.spill_loads} B loads at {k.regs} registers{where}"
            if ptxas_is_proxy and not local:
                rep.notes.append(f"{msg} under the older ptxas only; the shipped cubin ({k.regs_cubin} registers) "
                                 "has no local memory")
            else:
                v.append(msg)
    if local:
        v.append("local memory in the shipped SASS: " + ", ".join(f"{n} {f}" for f, n in local.items()))
    if rep.smem_bytes is None:
        v.append("the provider reported no shared-memory size")
    elif rep.smem_bytes > smem_limit:
        v.append(f"shared memory {rep.smem_bytes} B per CTA (dynamic {smem_dynamic} + static {rep.smem_static}) "
                 f"> {smem_limit} B")
    if config.get("uses_mma", True) and not any(f in rep.families for f in MMA_SYNC_FAMILIES):
        v.append("no HMMA (warp-level mma.sync) in the SASS")
    for what, found in forbidden_sass(ops).items():
        v.append(f"forbidden SASS, {what}: " + ", ".join(f"{op} x{n}" for op, n in found.most_common(4)))
    for what, found in forbidden_ptx(ptx).items():
        v.append(f"forbidden PTX, {what}: " + ", ".join(f"{ins} x{n}" for ins, n in found.most_common(4)))
    for label, text in (("PTX", ptx), ("SASS", sass)):
        got = declared_target(text)
        if got != target:
            v.append(f"{label} is for {got}, not {target}")
    return rep


def check_case(provider, case, target: str, ptxas: Ptxas, ptxas_flags: Sequence[str], smem_limit: int,
               check_valid: bool = True, maxnreg: Optional[int] = None, keep_dir: Optional[Path] = None) -> CaseReport:
    """Compile one case through the provider and analyze it; a compile error is a violation."""
    name = case.name
    config = dict(case.describe())
    t0 = time.perf_counter()
    try:
        compiled, smem = provider.compile_for_conformance(case, target=target, check_valid=check_valid)
    except Exception as e:  # the config does not compile: report it, keep checking the others
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        rep = CaseReport(name=name, config=config, target=target, smem_limit=smem_limit,
                         compile_s=time.perf_counter() - t0)
        rep.violations.append(f"compile failed: {type(e).__name__}: {first}")
        return rep
    compile_s = time.perf_counter() - t0
    art = compiled.artifacts
    ptx = _text_artifact(art.PTX, "PTX")
    cubin = _cubin_bytes(art.CUBIN)
    sass = _sass_text(art.SASS, cubin)
    if keep_dir is not None:
        keep_dir.mkdir(parents=True, exist_ok=True)
        (keep_dir / f"{name}.ptx").write_text(ptx)
        (keep_dir / f"{name}.sass").write_text(sass)
        (keep_dir / f"{name}.cubin").write_bytes(cubin)
    t1 = time.perf_counter()
    log, how = ptxas.run(cap_registers(ptx, maxnreg) if maxnreg else ptx, target, ptxas_flags)
    # A register cap or extra flags make the rerun the experiment itself: its spills always count.
    proxy = " read as " in how and not maxnreg and not ptxas_flags
    rep = analyze(name, config, target, ptx=ptx, sass=sass, ptxas_log=log, cubin=cubin_kernels(cubin),
                  smem_dynamic=int(smem) if smem is not None else None, smem_limit=smem_limit,
                  ptxas_is_proxy=proxy)
    rep.ptxas = how
    rep.compile_s = compile_s
    rep.check_s = time.perf_counter() - t1
    return rep


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
def _fmt_families(families: dict) -> str:
    bad = [f for f in families if f not in SHOWN_FAMILIES and forbidden_sass([f])]
    shown = [f"{f}:{families[f]}" for f in (*SHOWN_FAMILIES, *bad) if f in families]
    return " ".join(shown) or "-"


def format_table(reports: Sequence[CaseReport]) -> str:
    head = ("config", "regs", "cubin", "spill st/ld", "stack", "smem B", "families", "compile s", "result")
    rows = []
    for r in reports:
        smem = "-" if r.smem_bytes is None else (
            f"{r.smem_bytes}" + (f" ({r.smem_dynamic}+{r.smem_static})" if r.smem_static else ""))
        rows.append((
            r.name, "-" if r.regs is None else str(r.regs), "-" if r.regs_cubin is None else str(r.regs_cubin),
            f"{r.spill_stores}/{r.spill_loads}", str(r.stack), smem, _fmt_families(r.families),
            f"{r.compile_s:.1f}", "ok" if r.ok else f"FAIL ({len(r.violations)})",
        ))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    for r in reports:
        for msg in r.violations:
            lines.append(f"  {r.name}: {msg}")
        for msg in r.notes:
            lines.append(f"  {r.name}: note: {msg}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def _parse_knobs(text: str) -> dict:
    """``head_dim=128,causal=True,dtype=bf16`` -> dict (values as Python literals, else strings)."""
    knobs = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, raw = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
        try:
            knobs[key.strip()] = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            knobs[key.strip()] = raw.strip()
    return knobs


def _smem_limit(target: str) -> int:
    from flash_attn_4_sm120.execution_model import model_for_arch_string

    return model_for_arch_string(target).smem_per_cta


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tools/conformance.py",
        description="Compile every dispatchable kernel config for an SM120 target and check registers, "
                    "spills, shared memory and SASS instruction families.",
    )
    p.add_argument("--target", default=DEFAULT_TARGET, help="compile target (default %(default)s)")
    p.add_argument("--subset", choices=("ci", "all", "candidates"), default="all",
                   help="all dispatchable cases, the CI subset, or every tuning candidate (screened before tuning)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only cases with these names (shell patterns allowed)")
    p.add_argument("--json", metavar="PATH", help="write the per-config report as JSON")
    p.add_argument("--provider", default=DEFAULT_PROVIDER, help="module with conformance_cases / "
                   "compile_for_conformance / make_case (default %(default)s)")
    p.add_argument("--make-case", action="append", type=_parse_knobs, metavar="K=V,...", default=[],
                   help="check provider.make_case(**knobs) instead of the declared cases (repeatable)")
    p.add_argument("--no-check-valid", action="store_true",
                   help="skip the provider's validity predicate (to watch the gate catch a bad config)")
    p.add_argument("--ptxas", help="ptxas binary (default: $PTXAS, PATH, /usr/local/cuda/bin/ptxas)")
    p.add_argument("--ptxas-backend", choices=("auto", "binary", "nvjitlink"), default="auto",
                   help="auto: the ptxas binary, nvJitLink if there is none or it cannot read the PTX")
    p.add_argument("--ptxas-flag", action="append", default=[], metavar="FLAG",
                   help="extra ptxas flag, e.g. --ptxas-flag=-maxrregcount=32 (repeatable)")
    p.add_argument("--maxnreg", type=int, metavar="N",
                   help="cap registers per thread at N in the PTX given to ptxas (.maxnreg; -maxrregcount is "
                        "ignored for cutlass-dsl kernels, which all declare .reqntid)")
    p.add_argument("--keep-dir", metavar="DIR", help="write each config's PTX/SASS/cubin here")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    return p


def select_cases(provider, subset: str, only: Optional[Sequence[str]]) -> list:
    if subset == "candidates":
        cases = list(provider.candidate_cases())
    else:
        cases = list(provider.conformance_cases())
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        dup = sorted(n for n, k in Counter(names).items() if k > 1)
        raise GateError(f"duplicate case names from the provider: {dup}")
    if subset == "ci":
        cases = [c for c in cases if c.subset_ci]
    if only:
        unmatched = [pat for pat in only if not any(fnmatch.fnmatchcase(c.name, pat) for c in cases)]
        if unmatched:
            raise GateError(f"--only {unmatched} matched no case of subset {subset!r}; "
                            f"cases: {', '.join(c.name for c in cases)}")
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c.name, pat) for pat in only)]
    return cases


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    for path in (REPO_ROOT / "torch-ext", REPO_ROOT):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    work = Path(tempfile.mkdtemp(prefix="conformance_"))
    # Read by cutlass-dsl when it is first imported (below, through the provider): the arch it
    # defaults to, and where --keep-* artifacts land (the current directory otherwise).
    os.environ["CUTE_DSL_ARCH"] = args.target
    os.environ["CUTE_DSL_DUMP_DIR"] = str(work)
    try:
        try:
            ptxas = Ptxas(find_ptxas(args.ptxas), args.ptxas_backend)
            provider = importlib.import_module(args.provider)
            smem_limit = _smem_limit(args.target)
            if args.make_case:
                cases = [provider.make_case(**knobs) for knobs in args.make_case]
            else:
                cases = select_cases(provider, args.subset, args.only)
        except ImportError as e:
            print(f"conformance: cannot import provider {args.provider!r}: {e}", file=sys.stderr)
            return 2
        except GateError as e:
            print(f"conformance: {e}", file=sys.stderr)
            return 2
        except Exception as e:  # unknown target, bad --make-case knobs, a provider that cannot list cases
            print(f"conformance: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        if args.list:
            for c in cases:
                print(f"{c.name}{'  [ci]' if c.subset_ci else ''}  {c.describe()}")
            return 0
        print(f"conformance: {len(cases)} config(s) from {args.provider}, target {args.target}, "
              f"smem limit {smem_limit} B, ptxas {ptxas.describe()}"
              + (f", flags {' '.join(args.ptxas_flag)}" if args.ptxas_flag else ""), flush=True)
        if any(f.lstrip("-").startswith("maxrregcount") for f in args.ptxas_flag):
            print("conformance: note: ptxas ignores -maxrregcount for kernels that declare .reqntid (every "
                  "cutlass-dsl kernel does); use --maxnreg N to cap registers", file=sys.stderr)
        reports = []
        t0 = time.perf_counter()
        for case in cases:
            try:
                rep = check_case(provider, case, args.target, ptxas, args.ptxas_flag, smem_limit,
                                 check_valid=not args.no_check_valid, maxnreg=args.maxnreg,
                                 keep_dir=Path(args.keep_dir) if args.keep_dir else None)
            except GateError as e:
                print(f"conformance: {case.name}: {e}", file=sys.stderr)
                return 2
            status = "ok" if rep.ok else "FAIL"
            print(f"  {status:4s} {rep.name}  compile {rep.compile_s:.1f}s  check {rep.check_s:.1f}s", flush=True)
            reports.append(rep)
        total = time.perf_counter() - t0
        print()
        print(format_table(reports))
        failed = [r.name for r in reports if not r.ok]
        notes = sorted({r.ptxas for r in reports if r.ptxas})
        print(f"\nptxas: {'; '.join(notes) or 'not run (nothing compiled)'}")
        print(f"{len(reports) - len(failed)}/{len(reports)} configs conform ({total:.1f}s)"
              + (f"; violations in: {', '.join(failed)}" if failed else ""))
        if args.json:
            doc = {
                "target": args.target, "provider": args.provider, "smem_limit": smem_limit,
                "ptxas": ptxas.describe(), "ptxas_flags": list(args.ptxas_flag), "seconds": round(total, 2),
                "ok": not failed, "configs": [asdict(r) for r in reports],
            }
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
