"""Per-call host overhead of the forward at a tiny shape (GPU work ~microseconds), by layer.

    python benchmarks/overhead.py
"""

import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
import flash_attn_4_sm120 as fa  # noqa: E402
from flash_attn_4_sm120 import interface  # noqa: E402
from flash_attn_4_sm120.compiler import get_fwd_kernel  # noqa: E402
from flash_attn_4_sm120.config import select_fwd_config  # noqa: E402
from flash_attn_4_sm120.problem import validate_fwd  # noqa: E402


def host_us(fn, n=300):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


q = torch.randn(1, 128, 2, 64, dtype=torch.bfloat16, device="cuda")
o = torch.empty_like(q)
lse = torch.empty(1, 2, 128, dtype=torch.float32, device="cuda")
spec, shape, scale = validate_fwd(q, q, q, None, True)
model = fa.dispatch_model(q.device)
kern = get_fwd_kernel(spec, select_fwd_config(spec, model), model, model.compile_target)
rows = {
    "compiled kernel call (tvm-ffi)": lambda: kern(q, q, q, o, lse, scale / math.log(2.0)),
    "validate_fwd": lambda: validate_fwd(q, q, q, None, True),
    "flash_attn_fwd(out=, lse=)": lambda: fa.flash_attn_fwd(q, q, q, causal=True, out=o, lse=lse),
    "flash_attn_func": lambda: fa.flash_attn_func(q, q, q, causal=True),
    "custom op": lambda: interface._fwd_op(q, q, q, scale, True),
    "torch SDPA": lambda: F.scaled_dot_product_attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), is_causal=True),
    "torch.empty x2": lambda: (torch.empty_like(q), torch.empty_like(lse)),
}
for name, fn in rows.items():
    print(f"{name:34s} {host_us(fn):8.1f} us/call")
import cProfile, pstats  # noqa: E402
pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    fa.flash_attn_func(q, q, q, causal=True)
torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
