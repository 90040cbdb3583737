"""`make demo`: load the bundle the way users do (kernels.get_kernel) and show what it does here.

With a CUDA GPU: run attention on a few shapes, compare with the fp32 reference, and time it beside
PyTorch SDPA.

Without one (about 30 s on 2 cores): compile three representative kernels of the loaded bundle for
sm_120a on this CPU (a d128 causal forward, a d128 causal backward, a paged-KV decode forward) and
print each one's registers, shared memory and SASS instruction families, checked against the SM120
rules. The checking is the conformance gate's own (tools/conformance.py: ``check_case``,
``format_table``); `make conformance` runs the same gate over every config the dispatcher can choose.

Works offline: the bundle is loaded from this checkout through LOCAL_KERNELS.
"""

import gzip
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "sm120-kernels/flash-attn-4-sm120"
TARGET = "sm_120a"

#: What the CPU demo compiles: a title and the knobs a declared conformance case must have (the first
#: declared case that matches is used, so the demo follows the dispatch tables as they are tuned).
_PLAIN_FWD = dict(dtype="bf16", head_dim=128, head_dim_v=128, local=False, softcap=False, has_sink=False,
                  varlen_q=False, varlen_k=False, seqused_q=False, seqused_k=False, mods=None, block_sparse=None,
                  dropout=False)
SHOWCASE = (
    ("forward, d128 causal (prefill / training)",
     dict(_PLAIN_FWD, causal=True, pack_gqa=False, split_kv=False, page_size=0)),
    ("backward, d128 causal (training)",
     dict(kernel="bwd_multistage", dtype="bf16", head_dim=128, head_dim_v=128, causal=True, local=False,
          softcap=False, varlen_q=False, varlen_k=False, seqused_q=False, seqused_k=False, deterministic=False,
          group_split=1, mods=None, block_sparse=None, dropout=False)),
    ("paged-KV decode, d128 (serving: packed GQA, split KV, 256-token pages)",
     dict(_PLAIN_FWD, causal=True, seqused_k=True, pack_gqa=True, split_kv=True, page_size=256)),
)


#: What the SASS families in the table are (the table's own column names the families; this only reads them).
FAMILIES = {"HMMA": "= mma.sync", "LDSM": "= ldmatrix", "STSM": "= stmatrix", "LDGSTS": "= cp.async",
            "UTMALDG": "= TMA load", "UTMASTG": "= TMA store", "SYNCS": "= mbarrier", "USETMAXREG": "= setmaxnreg"}


def load_bundle():
    os.environ["LOCAL_KERNELS"] = f"{REPO_ID}={ROOT}"
    import kernels

    t = time.perf_counter()
    fa = kernels.get_kernel(REPO_ID, version=1)
    print(f"loaded {REPO_ID} version=1 via kernels {kernels.__version__}: module {fa.__name__}, "
          f"bundle {fa.__version__} ({(time.perf_counter() - t) * 1e3:.0f} ms)", flush=True)
    return fa


def gpu_demo(fa):
    import torch
    import torch.nn.functional as F

    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
    from reference import attention_ref
    from timing import median_ms

    print(f"GPU: {torch.cuda.get_device_name()}  execution model: {fa.dispatch_model(torch.device('cuda')).name}")
    print(f"{'shape (b, sq, sk, hq/hkv, d)':34s} {'causal':6s} {'max|out-ref|':>12s} {'first call':>10s} "
          f"{'ours ms':>8s} {'SDPA ms':>8s}")
    for b, sq, sk, hq, hkv, d, causal in [(2, 1000, 1000, 16, 4, 128, True), (4, 2048, 2048, 16, 16, 64, False),
                                          (1, 333, 777, 8, 1, 128, False)]:
        q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda")
        t = time.perf_counter()
        out, _ = fa.flash_attn_func(q, k, v, causal=causal)
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        ref, _ = attention_ref(q, k, v, causal=causal)
        err = (out.float() - ref.float()).abs().max().item()
        ours = median_ms(lambda: fa.flash_attn_func(q, k, v, causal=causal))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        # SDPA with its default backend choice
        sdpa = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=hq != hkv))
        print(f"{str((b, sq, sk, f'{hq}/{hkv}', d)):34s} {str(causal):6s} {err:12.2e} {first:9.2f}s "
              f"{ours:8.3f} {sdpa:8.3f}")
        if not err < 0.05:
            raise SystemExit(f"mismatch against the reference: {err}")


def pick_cases(cases):
    """(title, case) for each SHOWCASE entry: the first declared case whose ``describe()`` has those knobs."""
    picked = []
    for title, knobs in SHOWCASE:
        case = next((c for c in cases if all(c.describe().get(k, object()) == v for k, v in knobs.items())), None)
        if case is None:
            raise SystemExit(f"no declared conformance case matches {title!r} ({knobs})")
        picked.append((title, case))
    return picked


def newest_full_report() -> str:
    """The newest saved full-gate report under benchmarks/results, summarized in one line ('' if none)."""
    found = sorted((ROOT / "benchmarks" / "results").glob(f"conformance_{TARGET.replace('_', '')}_*.json.gz"))
    if not found:
        return ""
    path = found[-1]
    try:
        doc = json.loads(gzip.open(path).read())
    except (OSError, ValueError):
        return f"{path.relative_to(ROOT)}"
    ok = sum(1 for c in doc.get("configs", []) if not c.get("violations"))
    return f"{path.relative_to(ROOT)} ({len(doc.get('configs', []))} configs, {ok} conform)"


def cpu_demo(fa) -> int:
    sys.path.insert(0, str(ROOT / "tools"))
    import conformance as gate

    print(f"\nno CUDA GPU here: compiling representative kernels of the loaded bundle for {TARGET} on this CPU and "
          "checking them\nagainst the SM120 rules (no spills or local memory, shared memory within the per-CTA "
          "budget, warp-level\nmma.sync present, no wgmma / tcgen05 / TMEM / TMA multicast, code for the requested "
          "target)", flush=True)
    # The gate's provider module, taken from the loaded bundle: the kernels compiled here are the code
    # get_kernel loaded.
    submodule = gate.DEFAULT_PROVIDER.split(".", 1)[1]
    try:
        provider = importlib.import_module(f"{fa.__name__}.{submodule}")
    except ModuleNotFoundError as e:
        raise SystemExit(f"the loaded bundle has no {submodule} module ({e}): build/torch-cuda is older than "
                         "torch-ext; `make build` regenerates it") from None
    smem_limit = importlib.import_module(f"{fa.__name__}.execution_model").model_for_arch_string(TARGET).smem_per_cta
    try:
        ptxas = gate.Ptxas(gate.find_ptxas())
    except gate.GateError as e:
        raise SystemExit(f"demo: {e}") from None
    cases = provider.conformance_cases()
    print(f"ptxas: {ptxas.describe()}; shared memory per CTA on SM120: {smem_limit} B\n", flush=True)

    reports = []
    for title, case in pick_cases(cases):
        print(f"  {title}: {case.name} ...", end=" ", flush=True)
        rep = gate.check_case(provider, case, TARGET, ptxas, [], smem_limit)
        print(f"compiled in {rep.compile_s:.1f} s, {'conforms' if rep.ok else 'VIOLATES THE RULES'}", flush=True)
        reports.append(rep)
    print()
    print(gate.format_table(reports))
    shown = {f for r in reports for f in r.families}
    print(f"\nregs: ptxas -v on the PTX ({'; '.join(sorted({r.ptxas for r in reports}))}); cubin: the shipped "
          "cubin's registers (the code that runs).\nsmem B: per CTA, dynamic + static. families: "
          + ", ".join(f"{f} {what}" for f, what in FAMILIES.items() if f in shown) + ".")

    n_ci = sum(1 for c in cases if c.subset_ci)
    report = newest_full_report()
    print(f"\nThe whole gate is `make conformance`: all {len(cases)} configs the dispatcher can choose (about 45 min "
          f"on 2 cores);\n`make check` runs its CI subset ({n_ci} configs). Saved reports: "
          f"benchmarks/results/conformance_*{TARGET.replace('_', '')}_*.json.gz"
          + (f";\nthe newest full run: {report}." if report else "."))
    return 0 if all(r.ok for r in reports) else 1


def main():
    import torch

    if not torch.cuda.is_available():
        # Read by cutlass-dsl when the bundle first imports it: the arch it compiles for, and where the
        # kept PTX/SASS land (the current directory otherwise).
        os.environ["CUTE_DSL_ARCH"] = TARGET
        os.environ["CUTE_DSL_DUMP_DIR"] = work = tempfile.mkdtemp(prefix="fa4sm120-demo-")
    fa = load_bundle()
    if torch.cuda.is_available():
        gpu_demo(fa)
        return
    try:
        sys.exit(cpu_demo(fa))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
