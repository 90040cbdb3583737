"""Peak rate of warp-level ``mma.sync`` with fp32 accumulators, written in CuTe DSL (a script, not a test).

What it measures: the ceiling every kernel of this bundle runs under (the SM120 execution model has
no wgmma), on whatever GPU runs it. The README compares attention TFLOPS against this number. Operand
types (``--dtype``): bf16 (``m16n8k16``, HMMA), and FP8 e4m3 / e5m2 (``m16n8k32``, QMMA: sm_89 and newer;
an SM120 runs it at twice its bf16 rate).

Kernel (``MmaPeak``), per warp, all in registers:
  1. A (warp_tile_m x K) and B (warp_tile_n x K) fragments of one ``TiledMma`` over
     ``cute.nvgpu.warp.MmaF16BF16Op`` or ``MmaFP8Op`` (one warp per atom; K = 16 for bf16, 32 for FP8),
     filled from the thread index (unknown at compile time), and (warp_tile_m/16) x (warp_tile_n/8) fp32
     accumulator atoms set to zero;
  2. ``iters`` trips of a dynamic loop whose body is ``unroll`` unrolled ``cute.gemm`` calls: each is
     (warp_tile_m/16) * (warp_tile_n/8) independent MMAs (one per accumulator atom, so that many
     dependency chains are in flight per warp; 8 by default);
  3. every accumulator is summed and stored to ``out[thread]``: nothing can be optimized away.
Every warp of every CTA does the same work; the grid is ``ctas_per_sm`` CTAs per SM.

TFLOPS = 2*16*8*K * mma_count / time, mma_count = CTAs * warps * iters * unroll * atoms per gemm;
time from benchmarks/timing.py (median of CUDA-event timings after warm-up).

A rate is reported only when the timed SASS holds the instruction it claims (``mma_sass``: HMMA.16816 for
bf16, QMMA.16832 for FP8). sm_90a has no FP8 ``mma.sync`` in hardware: ptxas lowers each m16n8k32 to two
f16 HMMA.16816 products added to the accumulator by FADDs (operands widened by F2FP unpacks), and with the
probe's loop-invariant operands it computes each product once per trip, so a "rate" there would count FADDs.
On such a target the probe reports the FP8 row as emulated and times nothing (checked on the CPU by
``tests/test_mma_peak_compiles.py``).

    python benchmarks/probes/mma_peak.py [--dtype bf16|e4m3|e5m2] [--warps 8] [--warp-tile 32 32] [--unroll 16]
                                          [--ctas-per-sm 4] [--iters 4096] [--sweep] [--out results.json]

``--sweep`` times a small grid of warps x warp tiles x CTAs per SM and reports the best. ``compile_mma_peak``
works without a GPU (``tests/test_mma_peak_compiles.py`` checks the sm_120a SASS on the CPU).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
from pathlib import Path

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float8E5M2, Float32, Int32
from cutlass.cute.nvgpu import warp

MMA_M, MMA_N = 16, 8
#: operand type -> (DSL type, MMA K, the PTX instruction timed)
DTYPES = {
    "bf16": (BFloat16, 16, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    "e4m3": (Float8E4M3FN, 32, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    "e5m2": (Float8E5M2, 32, "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32"),
}
MMA_K = DTYPES["bf16"][1]
FLOPS_PER_MMA = 2 * MMA_M * MMA_N * MMA_K  # bf16's; an instance's own is MmaPeak.flops_per_mma


class MmaPeak:
    """Back-to-back ``mma.sync.m16n8k16`` on register fragments; see the module docstring."""

    def __init__(self, num_warps: int = 8, warp_tile_m: int = 32, warp_tile_n: int = 32, unroll: int = 16,
                 dtype: str = "bf16"):
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: one of {', '.join(DTYPES)}")
        if num_warps < 1 or num_warps > 32:
            raise ValueError(f"num_warps={num_warps}: a CTA has 1 to 32 warps")
        if warp_tile_m % MMA_M or warp_tile_n % MMA_N or warp_tile_m <= 0 or warp_tile_n <= 0:
            raise ValueError(f"warp tile {warp_tile_m}x{warp_tile_n} is not a multiple of the {MMA_M}x{MMA_N} atom")
        if unroll < 1:
            raise ValueError(f"unroll={unroll} must be >= 1")
        self.dtype = dtype
        self.ab_type, self.mma_k, self.instruction = DTYPES[dtype]
        self.flops_per_mma = 2 * MMA_M * MMA_N * self.mma_k
        self.num_warps = num_warps
        self.num_threads = 32 * num_warps
        self.warp_tile_m, self.warp_tile_n = warp_tile_m, warp_tile_n
        self.unroll = unroll
        #: MMAs per warp per cute.gemm: one per accumulator atom, i.e. independent dependency chains.
        self.chains = (warp_tile_m // MMA_M) * (warp_tile_n // MMA_N)
        #: MMAs per warp per trip of the dynamic loop (the unrolled body the SASS test counts).
        self.mmas_per_trip = self.chains * unroll

    def mma_count(self, ctas: int, iters: int) -> int:
        return ctas * self.num_warps * iters * self.mmas_per_trip

    @cute.jit
    def __call__(self, out: cute.Tensor, iters: Int32, stream):
        # One warp per atom: every warp runs the whole warp tile on its own registers.
        shape_mnk = (MMA_M, MMA_N, self.mma_k)
        if cutlass.const_expr(self.dtype == "bf16"):
            op = warp.MmaF16BF16Op(self.ab_type, Float32, shape_mnk)
        else:
            op = warp.MmaFP8Op(self.ab_type, Float32, shape_mnk)
        tiled_mma = cute.make_tiled_mma(op, (1, 1, 1))
        self.kernel(tiled_mma, out, iters).launch(
            grid=[cute.ceil_div(out.shape[0], self.num_threads), 1, 1],
            block=[self.num_threads, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, out: cute.Tensor, iters: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        thr_mma = tiled_mma.get_slice(tidx % 32)
        tile_m, tile_n = self.warp_tile_m, self.warp_tile_n
        k = self.mma_k
        tCrA = cute.make_rmem_tensor(thr_mma.partition_shape_A((tile_m, k)), self.ab_type)  # (MMA, MMA_M, MMA_K)
        tCrB = cute.make_rmem_tensor(thr_mma.partition_shape_B((tile_n, k)), self.ab_type)  # (MMA, MMA_N, MMA_K)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((tile_m, tile_n)), Float32)  # (MMA, MMA_M, MMA_N)
        # Operands depend on the thread index, so the compiler cannot fold any product; they are written in fp32
        # and converted to the operand type as whole fragments.
        seed = Float32(tidx) * Float32(1.0 / 1024.0)
        srcA = cute.make_rmem_tensor(tCrA.layout, Float32)
        srcB = cute.make_rmem_tensor(tCrB.layout, Float32)
        for i in cutlass.range_constexpr(cute.size(tCrA)):
            srcA[i] = seed + Float32(i * 0.125)
        for i in cutlass.range_constexpr(cute.size(tCrB)):
            srcB[i] = seed - Float32(i * 0.0625)
        tCrA.store(srcA.load().to(self.ab_type))
        tCrB.store(srcB.load().to(self.ab_type))
        acc.fill(0.0)
        for _ in cutlass.range(iters, unroll=1):
            for _ in cutlass.range_constexpr(self.unroll):
                cute.gemm(tiled_mma, acc, tCrA, tCrB, acc)  # self.chains independent MMAs
        total = Float32(0.0)
        for i in cutlass.range_constexpr(cute.size(acc)):
            total += acc[i]
        i_out = bidx * self.num_threads + tidx
        if i_out < out.shape[0]:
            out[i_out] = total


def _gate():
    """``tools/conformance.py`` (SASS parsing, disassembly), loaded by path."""
    import importlib.util

    name = "conformance_gate"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "tools" /
                                                      "conformance.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def mma_sass(kernel: MmaPeak, sass: str) -> dict:
    """What the compiled loop executes: the MMA opcodes in ``sass`` and whether the operand type runs as one
    native warp-level MMA (HMMA.16816.*.BF16 for bf16, QMMA.16832.* for FP8) or is emulated."""
    gate = _gate()
    mmas = {}
    for op in gate.sass_opcodes(sass):
        if "MMA" in gate.family(op):
            mmas[op] = mmas.get(op, 0) + 1
    if kernel.dtype == "bf16":
        native = any(op.startswith("HMMA.16816") and op.endswith(".BF16") for op in mmas)
    else:
        native = any(op.startswith("QMMA.16832") for op in mmas)
    return {"native": native, "mma_opcodes": mmas}


def compile_mma_peak(kernel: MmaPeak, target: str, extra_options: str = ""):
    """``cute.compile`` for ``target`` on a fake fp32 output of symbolic length (no GPU needed); the
    result takes ``(out: torch fp32 tensor of CTAs*threads elements, iters: int)`` on the current stream."""
    n = cute.sym_int()
    out = cute.runtime.make_fake_tensor(Float32, (n,), stride=(1,), assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    options = f"--enable-tvm-ffi --gpu-arch {target} {extra_options}".strip()
    return cute.compile(kernel, out, Int32(1), stream, options=options)


def measure(kernel: MmaPeak, ctas_per_sm: int, iters: int, target: str) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
    from timing import median_ms

    import tempfile

    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    ctas = sms * ctas_per_sm
    with tempfile.TemporaryDirectory(prefix="mma_peak_") as dump:
        # the cubin, disassembled by whatever nvdisasm is found (the DSL's own SASS dump wants nvdisasm >= 13.4)
        fn = compile_mma_peak(kernel, target, f"--keep-cubin --dump-dir {dump}")
        gate = _gate()
        sass = gate.disassemble(gate._cubin_bytes(fn.artifacts.CUBIN))
    code = mma_sass(kernel, sass)
    if not code["native"]:
        return {"dtype": kernel.dtype, "num_warps": kernel.num_warps, "ctas_per_sm": ctas_per_sm,
                "emulated": True, "tflops": None, **code}
    out = torch.empty(ctas * kernel.num_threads, dtype=torch.float32, device="cuda")
    ms = median_ms(lambda: fn(out, iters), iters=3, reps=7, warmup=2)
    if not torch.isfinite(out).all():
        raise RuntimeError("non-finite accumulator sums: the kernel did not run as written")
    mmas = kernel.mma_count(ctas, iters)
    return {
        "dtype": kernel.dtype, "num_warps": kernel.num_warps, "warp_tile": [kernel.warp_tile_m, kernel.warp_tile_n],
        "chains_per_warp": kernel.chains, "unroll": kernel.unroll, "ctas_per_sm": ctas_per_sm, "ctas": ctas,
        "iters": iters, "mma_count": mmas, "ms": ms, "tflops": kernel.flops_per_mma * mmas / (ms * 1e-3) / 1e12,
        **code,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Peak warp-level mma.sync TFLOPS with fp32 accumulators (CuTe DSL)")
    ap.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["bf16"],
                    help="operand types, each timed in the same run (default bf16)")
    ap.add_argument("--warps", type=int, default=8, help="warps per CTA (default 8)")
    ap.add_argument("--warp-tile", type=int, nargs=2, default=[32, 32], metavar=("M", "N"),
                    help="per-warp accumulator tile; (M/16)*(N/8) independent chains (default 32 32: 8 chains)")
    ap.add_argument("--unroll", type=int, default=16, help="cute.gemm calls per loop trip (default 16)")
    ap.add_argument("--ctas-per-sm", type=int, default=4, help="grid = this x the SM count (default 4)")
    ap.add_argument("--iters", type=int, default=4096, help="loop trips per launch (default 4096)")
    ap.add_argument("--target", default=None, help="compile target (default: sm_<major><minor>a of the GPU)")
    ap.add_argument("--sweep", action="store_true", help="time warps x warp tiles x CTAs per SM; report the best")
    ap.add_argument("--out", type=Path, help="write the results as JSON (device, date, rows, best)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("mma_peak: needs a CUDA GPU (compile-only checks: tests/test_mma_peak_compiles.py)", file=sys.stderr)
        return 2
    major, minor = torch.cuda.get_device_capability()
    target = args.target or f"sm_{major}{minor}a"
    if args.sweep:
        configs = list(itertools.product((4, 8, 16), ((16, 32), (32, 32), (64, 32)), (1, 2, 4)))
    else:
        configs = [(args.warps, tuple(args.warp_tile), args.ctas_per_sm)]
    device = torch.cuda.get_device_name()
    per_dtype = {}
    for dtype in args.dtype:
        rows = []
        for num_warps, (tm, tn), ctas_per_sm in configs:
            kernel = MmaPeak(num_warps, tm, tn, args.unroll, dtype)
            row = measure(kernel, ctas_per_sm, args.iters, target)
            rows.append(row)
            if row["tflops"] is None:
                print(f"{dtype:5s} {target} has no native {DTYPES[dtype][2]}: the SASS emulates it with "
                      f"{row['mma_opcodes']}; not timed", flush=True)
                break
            print(f"{dtype:5s} warps {num_warps:2d}  warp tile {tm}x{tn} ({row['chains_per_warp']:2d} chains)  "
                  f"CTAs/SM {ctas_per_sm}  {row['ms']:8.3f} ms  {row['tflops']:7.1f} TFLOPS", flush=True)
        timed = [r for r in rows if r["tflops"] is not None]
        best = max(timed, key=lambda r: r["tflops"]) if timed else None
        per_dtype[dtype] = {"instruction": DTYPES[dtype][2], "native": bool(timed),
                            "best_tflops": best["tflops"] if best else None, "best": best, "rows": rows}
        if best:
            print(f"peak {DTYPES[dtype][2]} on {device} ({target}): {best['tflops']:.1f} TFLOPS")
    if args.out:
        result = {
            "device": device, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "cutlass_dsl": _version("nvidia-cutlass-dsl"), "target": target,
            "flops_formula": "2*16*8*K * CTAs * warps * iters * unroll * chains / time (K: 16 bf16, 32 FP8)",
            "dtypes": per_dtype,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
