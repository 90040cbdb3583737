"""Block-sparse forward tiles at d128 (issue 20): the random 25% block map (all listed blocks full), causal as
lists + mask_mod and documents of 512 as lists + mask_mod, each under the cp.async tiles the predicate admits
(64x64 two-stage, 64x64 one-stage, 128x64 on 8 warps two-stage: the paged-prefill entry), at the package's
SM120 occupancy; the dense / flag kernels in the same run. Writes JSON to argv[1]."""

import dataclasses
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
from bench_fwd import fa  # noqa: E402,F401  (torch-ext on the path)
from flash_attn_4_sm120 import block_sparse, config, interface  # noqa: E402
from flash_attn_4_sm120 import flex_examples as fx  # noqa: E402
from flash_attn_4_sm120.problem import validate_fwd  # noqa: E402
from timing import median_ms  # noqa: E402

B, S, HQ, HKV, D = 4, 4096, 32, 8, 128
torch.manual_seed(0)
q = torch.randn(B, S, HQ, D, dtype=torch.bfloat16, device="cuda")
k = torch.randn(B, S, HKV, D, dtype=torch.bfloat16, device="cuda")
v = torch.randn(B, S, HKV, D, dtype=torch.bfloat16, device="cuda")
table = config.fwd_table()
TILES = {"m64_2stage": table["d128_full_cp_async"], "m64_1stage": table["d128_full_m64"],
         "m128_w8_2stage": table["d128_paged"]}
n = S // 128
g = torch.Generator().manual_seed(0)
rand = (torch.rand(HQ, n, n, generator=g) < 0.25).cuda()
cases = {
    "random25": (None, block_sparse.block_sparse_from_mask_fn(lambda b, h, qi, ki: rand[h, qi // 128, ki // 128],
                                                              1, HQ, S, S, (128, 128), "cuda")[0]),
    "causal": (fx.causal(), None),
    "documents512": (fx.chunked_local(512), None),
}
rows = []
for name, (ex, fwd) in cases.items():
    if fwd is None:
        fwd, _ = block_sparse.block_sparse_from_example(ex, 1, 1, S, S, (128, 128), "cuda")
    mods = dict(score_mod=None, mask_mod=ex.mask_mod if ex else None, score_mod_bwd=None, aux_tensors=None,
                aux_scalars=None)
    spec, shape, params = validate_fwd(q, k, v, None, False, (None, None), 0.0, None)
    spec, params = interface._with_mods(spec, params, mods, False, q.device)
    spec, params = interface._with_block_sparse(spec, shape, params, fwd, False, 1, None, q.device)
    row = {"case": name, "selected": str(config.select_fwd_config(spec, interface.dispatch_model(q.device)))}
    for tile, cfg in TILES.items():
        if config.fwd_config_problems(spec, cfg, interface.dispatch_model(q.device)):
            row[tile] = "invalid"
            continue
        fn = lambda cfg=cfg: interface._launch_fwd(q, k, v, spec, shape, params, config=cfg, num_splits=1)  # noqa: E731
        fn()
        row[tile] = median_ms(fn)
    rows.append(row)
    print(row, flush=True)
ref = {"dense": lambda: fa.flash_attn_func(q, k, v), "causal_flag": lambda: fa.flash_attn_func(q, k, v, causal=True)}
for name, fn in ref.items():
    fn()
    rows.append({"case": name, "ms": median_ms(fn)})
    print(rows[-1], flush=True)
json.dump({"device": torch.cuda.get_device_name(), "shape": [B, S, HQ, HKV, D], "rows": rows},
          open(sys.argv[1], "w"), indent=1)
