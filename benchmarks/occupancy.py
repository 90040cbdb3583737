"""Run the peers at an SM120's CTAs per SM on the H100 (benchmark harness, not part of the package).

Why: an SM120 SM has 100 KB of shared memory, an H100 SM 228 KB. A 64 KB FA2 CTA or a 99 KB one of ours
runs twice per H100 SM and once per SM120 SM, and two co-resident CTAs hide each other's softmax (the
H100 gains 10-25% from it). Our kernels pad their launch to the model's CTAs per SM themselves
(``ExecutionModel.occupancy_launch_smem``); the peers' launches cannot be padded, so their occupancy is
set through the context's cache preference (``cuCtxSetCacheConfig``), which the driver honours when it
sizes an SM's shared-memory carveout (seen with ncu on the H100, 2026-11-23,
``benchmarks/results/carveout_probe_h100_2026-11-23.json.gz``):
  * no preference: the carveout that fits the most CTAs (FA2 d=128, 64 KB: 132 KB, 2 CTAs per SM);
  * L1 preferred: the smallest carveout that fits one CTA (64 KB CTA: 100 KB, 1 CTA per SM).
Per peer and case ``faithful_preference`` reads the peer's kernel (shared memory, registers, threads)
from the profiler and picks the preference under which the H100 holds as many of its CTAs per SM as
an SM120 would; when neither does, the case is reported as not emulated.
"""

import contextlib
import ctypes
import json
import os
import tempfile

import torch

#: The H100's shared-memory carveouts per SM (KB), its shared memory per SM, threads per SM; an SM120's
#: threads per SM (its shared memory per SM comes from the execution model).
H100_CARVEOUTS_KB = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)
H100_SMEM_PER_SM, H100_THREADS_PER_SM, SM120_THREADS_PER_SM = 228 * 1024, 2048, 1536
REGS_PER_SM, RESERVED_PER_CTA = 65536, 1024
#: CUfunc_cache values (cuda.h)
PREFERENCES = {"none": 0, "shared": 1, "l1": 2, "equal": 3}


def set_cache_config(pref: str) -> None:
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuCtxSetCacheConfig(ctypes.c_int(PREFERENCES[pref]))
    got = ctypes.c_int(-1)
    cuda.cuCtxGetCacheConfig(ctypes.byref(got))
    if rc != 0 or got.value != PREFERENCES[pref]:
        raise RuntimeError(f"cuCtxSetCacheConfig({pref}) -> CUresult {rc}, the context reads {got.value}")


@contextlib.contextmanager
def cache_preference(pref: str):
    torch.cuda.synchronize()
    set_cache_config(pref)
    try:
        yield
    finally:
        torch.cuda.synchronize()
        set_cache_config("none")


def kernel_launches(fn) -> list[dict]:
    """The CUDA kernels one call of ``fn`` launches (after a warm-up call), with the attributes the
    profiler records: name, duration (us), shared memory per CTA (static + dynamic), registers per
    thread, threads per CTA."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    out = []
    for e in events:
        args = e.get("args", {})
        if e.get("cat") == "kernel" and "shared memory" in args:
            block = args.get("block", [1, 1, 1])
            out.append({"name": e["name"][:120], "us": e.get("dur", 0), "smem": int(args["shared memory"]),
                        "regs": int(args.get("registers per thread", 0)), "threads": block[0] * block[1] * block[2]})
    return out


def ctas_per_sm(smem: int, regs: int, threads: int, smem_per_sm: int, threads_per_sm: int) -> int:
    warps = -(-threads // 32)
    warp_regs = -(-max(regs, 1) * 32 // 256) * 256  # allocated per warp in units of 256
    by_regs = (REGS_PER_SM // warp_regs) // warps
    return max(0, min(by_regs, threads_per_sm // threads, smem_per_sm // (smem + RESERVED_PER_CTA)))


def faithful_preference(fn, model) -> dict:
    """The cache preference under which the H100 runs ``fn``'s longest kernel at the CTAs per SM an SM
    of ``model`` would (``pref`` None when neither preference does), with the counts it compared."""
    launches = kernel_launches(fn)
    if not launches:
        return {"pref": None, "reason": "no kernel seen"}
    k = max(launches, key=lambda r: r["us"])
    need = k["smem"] + RESERVED_PER_CTA
    sm120 = ctas_per_sm(k["smem"], k["regs"], k["threads"], model.smem_per_sm, SM120_THREADS_PER_SM)
    l1_carveout = next((c * 1024 for c in H100_CARVEOUTS_KB if c * 1024 >= need), H100_SMEM_PER_SM)
    h100 = {"none": ctas_per_sm(k["smem"], k["regs"], k["threads"], H100_SMEM_PER_SM, H100_THREADS_PER_SM),
            "l1": ctas_per_sm(k["smem"], k["regs"], k["threads"], l1_carveout, H100_THREADS_PER_SM)}
    pref = next((p for p, n in h100.items() if n == sm120), None)
    return {"pref": pref, "kernel": k, "sm120_ctas_per_sm": sm120, "h100_ctas_per_sm": h100}
