#!/usr/bin/env python3
"""Client check: transformers 5.20 continuous batching (``generate_batch``, its paged cache) on this bundle.

transformers' continuous batching takes its decode fast path when the attention kernel module has a
``flash_attn_with_kvcache``: prefill steps call ``flash_attn_varlen_func`` over the packed batch, decode
steps call ``flash_attn_with_kvcache(q, k_cache, v_cache, k, v, block_table=..., cache_seqlens=...,
max_seqlen_q=..., max_seqlen_k=...)``, which appends the step's keys into the paged cache and attends.
Without the function it warns "... does not support block tables, so the full performances of continuous
batching will not be achieved" and stays on the varlen path.

What it checks, on a tiny random Llama (GQA 8/2, head_dim 128, the checkpoint of ``client_transformers.py``)
loaded with ``attn_implementation="sm120-kernels/flash-attn-4-sm120"`` through ``LOCAL_KERNELS``:
* no transformers warning about block tables or an unavailable decode fast path (``max_blocks_per_request``
  is set explicitly, so transformers warns if it cannot take the path);
* the bundle's ``flash_attn_with_kvcache`` is called (decode) and ``flash_attn_varlen_func`` too (prefill);
* greedy tokens of ``generate_batch`` over prompts of different lengths equal the bf16 SDPA model's
  ``generate`` run per prompt; a sequence may diverge only at a tie: at its first divergent step, the fp32
  reference's logit gap between the two tokens is at most ``3 * e_base + atol``, ``e_base`` the SDPA
  model's logit error at that step against the reference (teacher-forced on the common prefix).

    python3 tools/client_continuous_batching.py [--out report.json]   (device command: client_transformers.py)
Exits 1 if a check fails, 2 if the environment is unusable.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _client_module():
    spec = importlib.util.spec_from_file_location("client_transformers", HERE / "client_transformers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def check(prompt_lengths=(7, 19, 33, 12, 50), new_tokens=16, page_size=16, workdir="/tmp/fa4sm120_cb") -> dict:
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    ct = _client_module()
    opts = ct.Options(device="cuda", workdir=workdir)
    problem = ct.requirements_problem("cuda")
    if problem is not None:
        return {"passed": None, "skipped": problem}
    bundle = ct.load_bundle(opts)
    if "flash_attn_with_kvcache" not in bundle["wrappers"]:  # counted like the other two entries
        bundle["log"].counts.setdefault("flash_attn_with_kvcache", 0)
        bundle["originals"]["flash_attn_with_kvcache"], bundle["wrappers"]["flash_attn_with_kvcache"] = ct._wrap(
            bundle["module"], "flash_attn_with_kvcache", bundle["log"])
    collect = _Collect()
    logging.getLogger("transformers").addHandler(collect)
    path = Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    ckpt = ct.save_checkpoint("llama", opts, path)
    gen = torch.Generator().manual_seed(opts.seed + 3)
    prompts = [torch.randint(ct.FIRST_TOKEN, 512, (n,), generator=gen).tolist() for n in prompt_lengths]

    ours_model = ct.load_model(ckpt, "llama", torch.bfloat16, "cuda", ct.REPO_ID, allow_all_kernels=True)
    gen_cfg = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=ct.PAD_ID)
    cb_cfg = ContinuousBatchingConfig(page_size=page_size, max_blocks_per_request=8)
    before = bundle["log"].snapshot()
    with torch.no_grad():
        results = ours_model.generate_batch(prompts, generation_config=gen_cfg, continuous_batching_config=cb_cfg)
    ours = [None] * len(prompts)
    for out in results.values():
        ours[[i for i, p in enumerate(prompts) if p == out.prompt_ids][0]] = list(out.generated_tokens)
    calls = {k: v - before.get(k, 0) for k, v in bundle["log"].snapshot().items()}
    arguments = bundle["log"].summary()
    del ours_model
    ct._free()

    base_model = ct.load_model(ckpt, "llama", torch.bfloat16, "cuda", "sdpa")
    ref_model = ct.load_model(ckpt, "llama", torch.float32, "cuda", "eager")
    torch.backends.cuda.matmul.allow_tf32 = False
    sequences, ties_ok = [], True
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt], device="cuda")
        with torch.no_grad():
            out = base_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=ct.PAD_ID,
                                      eos_token_id=None, return_dict_in_generate=True, output_logits=True)
        base = out.sequences[0, len(prompt):].tolist()
        mine = ours[i] or []
        t_div = next((t for t, (x, y) in enumerate(zip(mine, base)) if x != y), None)
        seq = {"prompt_length": len(prompt), "equal": mine == base, "ours": mine, "baseline": base}
        if len(mine) != len(base):
            seq["error"] = f"{len(mine)} tokens generated, {len(base)} expected"
            ties_ok = False
        elif t_div is not None:
            ref = ct.ref_step_logits(ref_model, prompt, mine, t_div + 1, "cuda")[t_div]
            e_base = (out.logits[t_div][0].float().cpu() - ref).abs().max().item()
            gap = abs(ref[mine[t_div]].item() - ref[base[t_div]].item())
            tie = gap <= 3 * e_base + opts.atol
            seq["first_divergence"] = {"step": t_div, "ref_gap": gap, "err_baseline_at_step": e_base, "tie": tie}
            ties_ok &= tie
        sequences.append(seq)
    warnings = [m for m in collect.messages if "block table" in m or "fast path" in m]
    report = {
        "versions": ct.versions(),
        "device": torch.cuda.get_device_name(),
        "prompt_lengths": list(prompt_lengths),
        "new_tokens": new_tokens,
        "page_size": page_size,
        "calls": calls,
        "arguments": arguments,
        "transformers_holds": ct.transformers_holds_bundle(),
        "warnings": warnings,
        "sequences": sequences,
        "all_equal": all(s["equal"] for s in sequences),
    }
    report["passed"] = bool(ties_ok and not warnings and calls.get("flash_attn_with_kvcache", 0) > 0
                            and calls.get("flash_attn_varlen_func", 0) > 0)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out")
    p.add_argument("--page-size", type=int, default=16)
    args = p.parse_args(argv)
    report = check(page_size=args.page_size)
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if report["passed"] is None:
        return 2
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
