"""`make demo`: load the bundle the way users do (kernels.get_kernel) and show what it does here.

With a CUDA GPU: run attention on a few shapes, compare with the fp32 reference, and time it beside
PyTorch SDPA. Without one: print the SM120 conformance report (sm_120a code compiled on this CPU).
Works offline: the bundle is loaded from this checkout through LOCAL_KERNELS.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "sm120-kernels/flash-attn-4-sm120"


def load_bundle():
    os.environ["LOCAL_KERNELS"] = f"{REPO_ID}={ROOT}"
    import kernels

    t = time.perf_counter()
    fa = kernels.get_kernel(REPO_ID, version=1)
    print(f"loaded {REPO_ID} version=1 via kernels {kernels.__version__}: module {fa.__name__}, "
          f"bundle {fa.__version__} ({(time.perf_counter() - t) * 1e3:.0f} ms)")
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
        sdpa = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=hq != hkv))  # default backend
        print(f"{str((b, sq, sk, f'{hq}/{hkv}', d)):34s} {str(causal):6s} {err:12.2e} {first:9.2f}s "
              f"{ours:8.3f} {sdpa:8.3f}")
        if not err < 0.05:
            raise SystemExit(f"mismatch against the reference: {err}")


def main():
    fa = load_bundle()
    import torch

    if torch.cuda.is_available():
        gpu_demo(fa)
    else:
        print("no CUDA GPU here: SM120 conformance report (sm_120a code compiled on this CPU) for the CI subset\n"
              "(each head-dim class: full, causal, window+softcap+sink, packed varlen); `make conformance`\n"
              "compiles every dispatchable config (~6 min on 2 cores)")
        sys.exit(subprocess.call([sys.executable, str(ROOT / "tools" / "conformance.py"), "--subset", "ci"]))


if __name__ == "__main__":
    main()
