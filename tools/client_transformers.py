#!/usr/bin/env python3
"""Client check: transformers 5.20 runs tiny Llama and gpt-oss models on this bundle, loaded the way users load it.

What it checks (each model built from a config with random weights, saved with ``save_pretrained`` and
loaded back with ``AutoModelForCausalLM.from_pretrained``, exactly as a user loads a checkpoint):

* The bundle is reached through ``kernels`` only: ``LOCAL_KERNELS="sm120-kernels/flash-attn-4-sm120=<repo root>"``
  (the repo root holds ``build/torch-cuda``) makes ``kernels.get_kernel(..., version=1)`` load the shipped build,
  with no network and no trust check. The build's ``metadata.json`` must list the GPU's arch (``"9.0"`` on the
  H100) in ``backend.archs``, else kernels refuses the variant; the report says which archs it lists.
* **llama** (``LlamaConfig``: 8 query heads / 2 KV heads (GQA), head_dim 128, 2 layers) with
  ``attn_implementation="sm120-kernels/flash-attn-4-sm120"``. transformers 5.20 resolves a hub repo id by
  ``kernels.get_kernel(repo, version=1, trust_remote_code=allow_all_kernels)`` and wraps the module's
  ``flash_attn_func`` / ``flash_attn_varlen_func``. ``allow_all_kernels=True`` is what an untrusted org needs
  on the Hub; with ``LOCAL_KERNELS`` kernels skips the trust check, and the script passes it anyway, as a
  Hub user must.
* **gpt_oss** (``GptOssConfig``: sinks, sliding-window / full layers alternating, a 4-expert MoE with top-4
  routing, so routing has no discrete flips between precisions, head_dim 64, GQA 8/2). gpt-oss lists the flash
  kernels it accepts (``GptOssPreTrainedModel._compatible_flash_implementations``) and silently replaces any
  other ``attn_implementation`` containing "flash" (this bundle's repo id included) with the first one,
  ``kernels-community/vllm-flash-attn3``. The routes that reach this bundle (``--gptoss-routes``):

  - ``vllm-fa3-alias`` (default): ``LOCAL_KERNELS="kernels-community/vllm-flash-attn3=<repo root>"`` and
    ``from_pretrained(..., attn_implementation="kernels-community/vllm-flash-attn3")``. The name is in the
    model's list, so it survives the check that every nested ``PreTrainedModel.__init__`` repeats.
  - ``fa4-alias``: ``LOCAL_KERNELS="kernels-community/flash-attn4=<repo root>"``, load with
    ``attn_implementation="eager"``, then ``model.set_attn_implementation("flash_attention_4")``
    (transformers maps it to ``kernels-community/flash-attn4``, version 0, when the pip package
    ``flash-attn-4`` is not installed). Passing ``"flash_attention_4"`` to ``from_pretrained`` does not work in
    5.20: the outer ``__init__`` resolves it to ``kernels-community/flash-attn4``, which is not in the list, and
    the inner ``GptOssModel.__init__`` then replaces it with ``kernels-community/vllm-flash-attn3``. Skipped
    (reported) when ``flash-attn-4`` is importable: transformers would then call ``flash_attn.cute``.

For each model and each padding case (``nopad``: 3 sequences of one length, the mask all ones, so
transformers calls ``flash_attn_func``; ``left_pad`` as ``generate`` pads and ``right_pad``: 3 sequences of
``--lengths``, so transformers unpads and calls ``flash_attn_varlen_func`` with ``cu_seqlens``), position ids
from the mask as ``generate`` makes them:

* **logits**: the bf16 model on this bundle and the bf16 baseline (``sdpa`` for llama; ``eager`` for gpt-oss,
  which does not support sdpa) against the same weights in fp32 with ``attn_implementation="eager"`` (TF32
  off), max abs error over the non-padded positions only. Rule: ``err_ours <= 2 * err_baseline + atol``.
* **greedy generation** (``nopad`` and ``left_pad``, ``--new-tokens`` tokens, ``min_new_tokens`` = the same,
  no EOS): the tokens must equal the bf16 baseline's. A sequence may diverge only at a *tie*: at its first
  divergent step t, with common prefix P, ours picked token a and the baseline token c; let ``ref`` be the
  fp32 reference logits after P and ``e_ours`` / ``e_base`` the max abs error of each model's step-t logits
  against ``ref``. The divergence is a tie (not a failure) iff ``|ref[a] - ref[c]| <= 2 * max(e_ours, e_base)``
  (the most that either model's rounding can move the gap between two logits) and ``e_ours <= 2 * e_base +
  atol`` (ours obeys the logits rule at that step). Tokens after the first divergence are not compared.
  Every step up to and including the first divergence (all steps when none) has the same prefix in both
  runs, so the step logits there (the decode path: one query per sequence against the KV cache, varlen with
  ``cu_seqlens`` under left padding) are also held to the logits rule against the fp32 reference
  teacher-forced on that prefix: ``max err_ours <= 2 * max err_baseline + atol`` over those steps.
* **calls into the bundle**: the loaded module's ``flash_attn_func`` / ``flash_attn_varlen_func`` are wrapped
  (``functools.wraps``, so transformers' signature inspection still sees the bundle's parameters) before
  transformers loads it; each case must call the bundle (dense cases ``flash_attn_func``, padded cases
  ``flash_attn_varlen_func``), and transformers must hold the wrapped functions. The report lists the keyword
  names and the distinct ``window_size`` / ``causal`` values transformers passed (5.20 passes
  ``window_size=(w - 1, w - 1)`` with ``causal=True`` for a sliding layer when the key length exceeds ``w``,
  which is ``(w - 1, 0)``: w keys, under FlashAttention-4's convention; nothing for full layers, i.e. the
  default ``(None, None)``).
* gpt-oss also reports how much the sliding window changes the fp32 reference logits (the same weights with
  every layer full), so a kernel that ignored the window could not pass.

Prints a JSON report (versions of torch, transformers, kernels; the environment; per model / case the errors,
generation match, calls) and writes it to ``--out``. Exits 1 if any check fails, 2 if the environment is
unusable (no CUDA, transformers < 5.20, kernels outside [0.17.2, 0.18), the GPU's arch missing from metadata).

On the device (no network; transformers 5.20 ships trimmed in the devkit's ``optional/``). The whole carry is
64 MiB: ``bash tools/stage_client_kit.sh`` builds ``.kit_client`` (58 MB, the runtime, kernels and transformers;
carry it and ``source .kit_client/device-setup.sh``); or, while the tree is small enough, swap the
benchmark-only wheels for the transformers archive in the staged kit::

    # here, from the repo root
    bash /work/shared/devkit/stage.sh
    rm -f .devkit/flash_attn_4-*.whl .devkit/quack_kernels-*.whl
    cp /work/shared/devkit/optional/transformers-5.20-trim.tar.xz .devkit/
    # on the device: run(command=..., carry=[".devkit"])
    source .devkit/device-setup.sh && mkdir -p /tmp/tsite \\
      && tar -xJf .devkit/transformers-5.20-trim.tar.xz -C /tmp/tsite \\
      && export PYTHONPATH=/tmp/tsite:$PYTHONPATH \\
      && python3 tools/client_transformers.py --out $OUT/client_transformers.json

(A warm machine whose /tmp/site still holds flash-attn-4 from an earlier setup skips the ``fa4-alias``
route; the others are unaffected.) The pytest form is ``tests/test_client_transformers_gpu.py``.

Without a GPU, ``--device cpu --reference-only`` runs everything but the bundle's forward: the models, the
fp32 eager reference against the bf16 baseline (and the baseline's generation against the reference's), and
the resolution of each ``attn_implementation`` to the bundle through ``kernels`` (module loaded, wrapped and
registered; zero calls). ``--probes`` adds (no GPU needed; ``PROBES`` lists them) what transformers resolves
each candidate name to, per model and entry point (``from_pretrained``, ``set_attn_implementation``,
``from_config``), each in a fresh interpreter with its own HF cache: with only this repo id (plus the probe's
alias) in ``LOCAL_KERNELS`` and the Hub unreachable, or with no ``LOCAL_KERNELS`` against a local Hub on
127.0.0.1 (``tests/support/local_hub.py``) that serves the build from an untrusted publisher, with and
without ``allow_all_kernels=True``::

    PYTHONPATH=/tmp/tsite python tools/client_transformers.py --device cpu --reference-only --probes
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
REPO_ID = "sm120-kernels/flash-attn-4-sm120"
VLLM_FA3_ID = "kernels-community/vllm-flash-attn3"
FA4_ID = "kernels-community/flash-attn4"
MIN_TRANSFORMERS = "5.20.0"
KERNELS_MIN, KERNELS_MAX = "0.17.2", "0.18"
PAD_ID = 0
FIRST_TOKEN = 3  # ids 0..2: pad / bos / eos, never sampled as prompt tokens
PROBE_MARKER = "@@CLIENT-PROBE@@"

# gpt-oss routes: which repo id LOCAL_KERNELS points at this bundle, what from_pretrained gets, what
# set_attn_implementation gets afterwards (None: nothing), and the name transformers must end up holding.
GPTOSS_ROUTES: dict[str, dict[str, Optional[str]]] = {
    "vllm-fa3-alias": {"alias": VLLM_FA3_ID, "load": VLLM_FA3_ID, "set": None, "resolved": VLLM_FA3_ID},
    "fa4-alias": {"alias": FA4_ID, "load": "eager", "set": "flash_attention_4", "resolved": FA4_ID},
}


@dataclass
class Options:
    device: str = "cuda"
    reference_only: bool = False
    atol: float = 1e-3  # absolute slack in the logits rule (logits are O(1) here; bf16 errors ~1e-2)
    new_tokens: int = 20
    lengths: tuple = (133, 77, 20)  # > 128 (one query tile), < and > the gpt-oss window
    sliding_window: int = 40
    seed: int = 0
    repo_root: str = str(REPO_ROOT)
    workdir: Optional[str] = None
    gptoss_routes: tuple = ("vllm-fa3-alias", "fa4-alias")
    offline: bool = True


# -- environment --------------------------------------------------------------------------------------


def _vtuple(v: str) -> tuple:
    from packaging.version import Version

    return Version(v).release


def set_local_kernels(repo_root: str, repo_ids) -> str:
    """Point each repo id at ``repo_root`` in ``LOCAL_KERNELS`` (kept entries for other ids). kernels reads
    the variable at every ``get_kernel`` call, so setting it before the first load is enough."""
    root = str(Path(repo_root).resolve())
    entries = {}
    for entry in filter(None, os.environ.get("LOCAL_KERNELS", "").split(":")):
        if "=" in entry:
            k, v = entry.split("=", 1)
            entries[k] = v
    for rid in repo_ids:
        entries[rid] = root
    os.environ["LOCAL_KERNELS"] = ":".join(f"{k}={v}" for k, v in entries.items())
    return os.environ["LOCAL_KERNELS"]


def set_offline(offline: bool) -> None:
    if not offline:
        return
    os.environ["HF_HUB_OFFLINE"] = "1"
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:  # already imported: it read the variable at import
        hub_constants.HF_HUB_OFFLINE = True


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "kernels", "huggingface_hub", "nvidia-cutlass-dsl"):
        try:
            if name == "nvidia-cutlass-dsl":
                from importlib.metadata import version

                out[name] = version(name)
            else:
                mod = __import__(name)
                out[name] = getattr(mod, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            out[name] = f"unavailable ({type(e).__name__}: {e})"
    return out


def requirements_problem(device: str = "cuda") -> Optional[str]:
    """Why this machine cannot run the client check (None: it can)."""
    try:
        import transformers
    except Exception as e:  # noqa: BLE001
        return f"transformers is not importable ({e}); unpack the devkit's transformers-5.20-trim and put it on PYTHONPATH"
    if _vtuple(transformers.__version__) < _vtuple(MIN_TRANSFORMERS):
        return (f"transformers {transformers.__version__} < {MIN_TRANSFORMERS} (the first release line that takes "
                f"kernels 0.17.x); unpack the devkit's optional/transformers-5.20-trim.tar.xz onto PYTHONPATH")
    try:
        import kernels
    except Exception as e:  # noqa: BLE001
        return f"kernels is not importable ({e})"
    from transformers.utils.import_utils import is_kernels_available

    if not is_kernels_available():
        return (f"transformers {transformers.__version__} does not accept kernels {kernels.__version__} "
                f"(is_kernels_available() is False; 5.20 wants >={KERNELS_MIN},<{KERNELS_MAX})")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False); use --device cpu --reference-only"
    return None


def environment(opts: Options) -> dict:
    import torch

    meta_path = Path(opts.repo_root) / "build" / "torch-cuda" / "metadata.json"
    env: dict[str, Any] = {"repo_root": str(Path(opts.repo_root).resolve()), "device": opts.device}
    try:
        meta = json.loads(meta_path.read_text())
        env["build_id"] = meta.get("id")
        env["metadata_archs"] = meta.get("backend", {}).get("archs")
    except Exception as e:  # noqa: BLE001
        env["metadata_error"] = f"{meta_path}: {e}"
        env["metadata_archs"] = None
    if opts.device.startswith("cuda") and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = f"{major}.{minor}"
        archs = env["metadata_archs"] or []
        env["arch_listed"] = env["capability"] in archs
    try:
        from transformers.utils.import_utils import is_flash_attn_4_available, is_kernels_available

        env["transformers_accepts_kernels"] = is_kernels_available()
        # With the pip package flash-attn-4 importable, "flash_attention_4" means flash_attn.cute, not a hub kernel.
        env["pip_flash_attn_4_available"] = is_flash_attn_4_available()
    except Exception as e:  # noqa: BLE001
        env["transformers_error"] = str(e)
    env["LOCAL_KERNELS"] = os.environ.get("LOCAL_KERNELS")
    env["HF_HUB_OFFLINE"] = os.environ.get("HF_HUB_OFFLINE")
    return env


# -- the bundle, loaded through kernels, with its entry points counted ---------------------------------


@dataclass
class CallLog:
    counts: dict = field(default_factory=lambda: {"flash_attn_func": 0, "flash_attn_varlen_func": 0})
    kwarg_names: dict = field(default_factory=dict)  # fn -> sorted keyword names seen
    window_sizes: set = field(default_factory=set)
    causal: set = field(default_factory=set)
    learnable_sink: set = field(default_factory=set)  # dtypes passed, "absent" when not passed
    q_shapes: dict = field(default_factory=dict)  # fn -> a few distinct q shapes

    def snapshot(self) -> dict:
        return dict(self.counts)

    def reset_arguments(self) -> None:
        for seen in (self.kwarg_names, self.window_sizes, self.causal, self.learnable_sink, self.q_shapes):
            seen.clear()

    def summary(self) -> dict:
        return {
            "kwarg_names": {k: sorted(v) for k, v in self.kwarg_names.items()},
            "window_size_values": sorted((repr(w) for w in self.window_sizes)),
            "causal_values": sorted(repr(c) for c in self.causal),
            "learnable_sink": sorted(self.learnable_sink),
            "q_shapes": {k: sorted(v)[:8] for k, v in self.q_shapes.items()},
        }


_BUNDLE: dict[str, Any] = {}


def _wrap(module, name: str, log: CallLog):
    original = getattr(module, name)

    @functools.wraps(original)
    def counted(*args, **kwargs):
        log.counts[name] += 1
        log.kwarg_names.setdefault(name, set()).update(kwargs)
        log.window_sizes.add(tuple(kwargs["window_size"]) if "window_size" in kwargs else "default")
        log.causal.add(kwargs.get("causal", "default"))
        sink = kwargs.get("learnable_sink")
        log.learnable_sink.add(str(sink.dtype) if sink is not None else "absent")
        if args:
            log.q_shapes.setdefault(name, set()).add(str(tuple(args[0].shape)))
        return original(*args, **kwargs)

    counted.__client_counter__ = True
    setattr(module, name, counted)
    return original, counted


def load_bundle(opts: Options, aliases=()) -> dict:
    """``kernels.get_kernel(REPO_ID, version=1)`` through ``LOCAL_KERNELS`` (plus aliases that point other repo
    ids at the same root, so that transformers' loads return this very module), with counting wrappers
    installed before transformers sees the module. Idempotent per process."""
    set_offline(opts.offline)
    set_local_kernels(opts.repo_root, [REPO_ID, *aliases])
    if _BUNDLE:
        return _BUNDLE
    import kernels

    module = kernels.get_kernel(REPO_ID, version=1)
    log = CallLog()
    originals, wrappers = {}, {}
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        if getattr(getattr(module, name), "__client_counter__", False):
            raise RuntimeError(f"{module.__name__}.{name} is already wrapped by another loader")
        originals[name], wrappers[name] = _wrap(module, name, log)
    _BUNDLE.update(module=module, log=log, originals=originals, wrappers=wrappers)
    return _BUNDLE


def transformers_holds_bundle() -> dict:
    """Which functions transformers' flash wrapper will call (its module-level cache)."""
    import transformers.modeling_flash_attention_utils as mfu

    held = {"flash_attn_func": mfu._flash_fn, "flash_attn_varlen_func": mfu._flash_varlen_fn}
    out = {"loaded_implementation": mfu._loaded_implementation}
    for name, fn in held.items():
        out[name] = {
            "is_bundle_wrapper": bool(_BUNDLE) and fn is _BUNDLE["wrappers"][name],
            "module": getattr(fn, "__module__", None),
        }
    out["flash_attn_with_kvcache"] = getattr(mfu._flash_with_kvcache_fn, "__module__", None)
    return out


# -- models ------------------------------------------------------------------------------------------


def model_config(kind: str, opts: Options):
    from transformers import GptOssConfig, LlamaConfig

    common = dict(vocab_size=512, pad_token_id=PAD_ID, bos_token_id=1, eos_token_id=None, tie_word_embeddings=False,
                  max_position_embeddings=4096)
    if kind == "llama":
        return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                           num_key_value_heads=2, head_dim=128, initializer_range=0.05, **common)
    if kind == "gpt_oss":
        return GptOssConfig(hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=2, head_dim=64, num_local_experts=4, num_experts_per_tok=4,
                            sliding_window=opts.sliding_window, initializer_range=0.05, **common)
    raise ValueError(kind)


def save_checkpoint(kind: str, opts: Options, workdir: Path) -> Path:
    """A random fp32 model saved with save_pretrained (what users load)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(opts.seed)
    config = model_config(kind, opts)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if kind == "gpt_oss":
        with torch.no_grad():  # sinks that matter (the init's std is the tiny initializer_range)
            gen = torch.Generator().manual_seed(opts.seed + 1)
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=gen))
    path = workdir / kind
    model.save_pretrained(path)
    del model
    return path


def load_model(path: Path, kind: str, dtype, device: str, load_impl: str, set_impl: Optional[str] = None,
               allow_all_kernels: bool = False, **config_overrides):
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = dict(dtype=dtype, attn_implementation=load_impl, **config_overrides)
    if kind == "gpt_oss":
        kwargs["experts_implementation"] = "eager"  # the same MoE code in every precision
    if allow_all_kernels:
        kwargs["allow_all_kernels"] = True
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if set_impl is not None:
        model.set_attn_implementation(set_impl, allow_all_kernels=allow_all_kernels)
    model = model.to(device).eval()
    if dtype == torch.float32:
        assert all(p.dtype == torch.float32 for p in model.parameters())
    return model


def make_batch(opts: Options, vocab: int, case: str, device: str) -> dict:
    """3 sequences; ``nopad``: one length, mask all ones; ``left_pad`` / ``right_pad``: ``opts.lengths``."""
    import torch

    lengths = [opts.lengths[1]] * 3 if case == "nopad" else list(opts.lengths)
    total = max(lengths)
    gen = torch.Generator().manual_seed(opts.seed + 7 + len(case))
    ids = torch.full((len(lengths), total), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(lengths), total), dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens = torch.randint(FIRST_TOKEN, vocab, (n,), generator=gen)
        sl = slice(total - n, total) if case != "right_pad" else slice(0, n)
        ids[b, sl] = tokens
        mask[b, sl] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate builds them
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": position_ids.to(device),
            "lengths": lengths, "case": case}


def logits_of(model, batch) -> "torch.Tensor":
    import torch

    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"], use_cache=False)
    return out.logits.float()


def masked_max_err(a, b, mask) -> float:
    valid = mask.bool()
    diff = (a - b).abs()[valid]
    if not diff.numel():
        return 0.0
    if not diff.isfinite().all():
        return float("inf")
    return diff.max().item()


def generate(model, batch, n: int) -> dict:
    import torch

    with torch.no_grad():
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=False,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=PAD_ID, eos_token_id=None,
                             return_dict_in_generate=True, output_logits=True)
    prompt_len = batch["input_ids"].shape[1]
    return {"tokens": out.sequences[:, prompt_len:].cpu(), "logits": [x.float().cpu() for x in out.logits]}


def ref_step_logits(ref_model, prompt: list, generated: list, steps: int, device: str):
    """fp32 reference logits for generation steps 0..steps-1 (step t continues ``prompt + generated[:t]``),
    teacher-forced in one forward over the unpadded sequence: (steps, vocab)."""
    import torch

    ids = torch.tensor([prompt + generated[: steps - 1]], dtype=torch.long, device=device)
    with torch.no_grad():
        logits = ref_model(input_ids=ids, use_cache=False).logits[0].float().cpu()
    return logits[len(prompt) - 1: len(prompt) - 1 + steps]


def compare_generation(ours: dict, base: dict, ref_model, batch, opts: Options, rule: bool = True) -> dict:
    """Greedy tokens of ``ours`` against ``base``, per sequence, with the tie rule of the module docstring.

    Every step up to and including the first divergence has the same prefix in both runs, so each model's
    step logits there are compared with the fp32 reference's (teacher-forced): ``err_*_decode`` (the decode
    path: one query per step against the KV cache) must obey the logits rule too. ``rule=False`` (comparing
    two references) only reports."""
    result: dict[str, Any] = {"sequences": []}
    mask = batch["attention_mask"].cpu()
    ids = batch["input_ids"].cpu()
    n = ours["tokens"].shape[1]
    ties_ok, err_ours, err_base = True, 0.0, 0.0
    for b in range(ours["tokens"].shape[0]):
        mine, theirs = ours["tokens"][b].tolist(), base["tokens"][b].tolist()
        t_div = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), None)
        steps = n if t_div is None else t_div + 1
        prompt = ids[b][mask[b].bool()].tolist()
        ref = ref_step_logits(ref_model, prompt, mine, steps, opts.device)
        e_ours = [(ours["logits"][t][b] - ref[t]).abs().max().item() for t in range(steps)]
        e_base = [(base["logits"][t][b] - ref[t]).abs().max().item() for t in range(steps)]
        err_ours, err_base = max(err_ours, *e_ours), max(err_base, *e_base)
        seq: dict[str, Any] = {"equal": t_div is None, "steps_compared": steps, "err_ours_decode": max(e_ours),
                               "err_baseline_decode": max(e_base), "ours": mine, "baseline": theirs}
        if t_div is not None:
            a, c = mine[t_div], theirs[t_div]
            gap = abs(ref[t_div][a].item() - ref[t_div][c].item())
            tie = gap <= 2 * max(e_ours[t_div], e_base[t_div])
            if rule:
                tie = tie and e_ours[t_div] <= 2 * e_base[t_div] + opts.atol
            seq["first_divergence"] = {"step": t_div, "ours_token": a, "baseline_token": c, "ref_gap": gap,
                                       "err_ours_at_step": e_ours[t_div], "err_baseline_at_step": e_base[t_div],
                                       "tie": tie}
            ties_ok &= tie
        result["sequences"].append(seq)
    result.update(err_ours_decode=err_ours, err_baseline_decode=err_base, decode_bound=2 * err_base + opts.atol,
                  ties_ok=ties_ok)
    result["passed"] = ties_ok and err_ours <= 2 * err_base + opts.atol if rule else None
    return result


def _free():
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- the checks --------------------------------------------------------------------------------------


def _ours_plan(kind: str, route: Optional[str]) -> dict:
    """How a user points this model at the bundle: aliases for LOCAL_KERNELS, from_pretrained's
    attn_implementation, set_attn_implementation's, and the name transformers must end up with."""
    if kind == "llama":
        return {"aliases": (), "load": REPO_ID, "set": None, "resolved": REPO_ID, "allow_all_kernels": True}
    plan = dict(GPTOSS_ROUTES[route])
    return {"aliases": (plan["alias"],), "load": plan["load"], "set": plan["set"], "resolved": plan["resolved"],
            "allow_all_kernels": False}


def check_model(kind: str, opts: Optional[Options] = None, route: Optional[str] = None) -> dict:
    """Run one model's checks (see the module docstring); returns the report section with ``passed``."""
    opts = opts or Options()
    if kind == "gpt_oss" and route is None:
        route = opts.gptoss_routes[0]
    report: dict[str, Any] = {"model": kind, "route": route, "passed": False, "failures": []}
    try:
        _check_model(kind, opts, route, report)
    except Exception:  # noqa: BLE001
        report["failures"].append("exception:\n" + traceback.format_exc())
    report["passed"] = not report["failures"] and report.get("skipped") is None
    if report.get("skipped"):
        report["passed"] = None
    _free()
    return report


def _check_model(kind: str, opts: Options, route: Optional[str], report: dict) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    plan = _ours_plan(kind, route)
    report["user_code"] = _user_code(kind, plan)
    bundle = load_bundle(opts, plan["aliases"])
    report["bundle_module"] = bundle["module"].__name__
    report["bundle_version"] = getattr(bundle["module"], "__version__", None)
    log: CallLog = bundle["log"]
    log.reset_arguments()
    start = log.snapshot()

    if kind == "gpt_oss" and plan["set"] == "flash_attention_4":
        from transformers.utils.import_utils import is_flash_attn_4_available

        if is_flash_attn_4_available():
            report["skipped"] = ("the pip package flash-attn-4 is importable: transformers maps flash_attention_4 "
                                 "to flash_attn.cute, not to a hub kernel (remove it from PYTHONPATH to run this route)")
            return

    workdir = Path(opts.workdir) if opts.workdir else Path(tempfile.mkdtemp(prefix="client_transformers_"))
    workdir.mkdir(parents=True, exist_ok=True)
    path = save_checkpoint(kind, opts, workdir)
    dev = opts.device
    ref = load_model(path, kind, torch.float32, dev, "eager")
    base_impl = "sdpa" if kind == "llama" else "eager"  # gpt-oss: _supports_sdpa = False
    base = load_model(path, kind, torch.bfloat16, dev, base_impl)
    report["baseline"] = f"bf16 {base_impl}"
    report["reference"] = "fp32 eager, TF32 off"

    before = log.snapshot()
    ours = load_model(path, kind, torch.bfloat16, dev, plan["load"], plan["set"], plan["allow_all_kernels"])
    resolved = ours.config._attn_implementation
    report["attn_implementation_resolved"] = resolved
    if resolved != plan["resolved"]:
        report["failures"].append(f"transformers resolved the model to {resolved!r}, expected {plan['resolved']!r}")
    report["transformers_holds"] = transformers_holds_bundle()
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        if not report["transformers_holds"][name]["is_bundle_wrapper"]:
            report["failures"].append(f"transformers' {name} is not the bundle's ({report['transformers_holds'][name]})")
    if log.snapshot() != before:
        report["failures"].append("loading the model called the bundle")

    if kind == "gpt_oss":
        report["layer_types"] = list(ref.config.layer_types)
        report["sliding_window"] = ref.config.sliding_window

    vocab = ref.config.vocab_size
    report["logits"] = {}
    for case in ("nopad", "left_pad", "right_pad"):
        batch = make_batch(opts, vocab, case, dev)
        entry: dict[str, Any] = {"lengths": batch["lengths"]}
        ref_logits = logits_of(ref, batch)
        entry["ref_logit_absmax"] = ref_logits.abs().max().item()
        entry["err_baseline"] = masked_max_err(logits_of(base, batch), ref_logits, batch["attention_mask"])
        if not opts.reference_only:
            c0 = log.snapshot()
            entry["err_ours"] = masked_max_err(logits_of(ours, batch), ref_logits, batch["attention_mask"])
            entry["calls"] = {k: log.counts[k] - c0[k] for k in c0}
            entry["bound"] = 2 * entry["err_baseline"] + opts.atol
            entry["passed"] = entry["err_ours"] <= entry["bound"]
            expect = "flash_attn_func" if case == "nopad" else "flash_attn_varlen_func"
            if entry["calls"][expect] == 0:
                entry["passed"] = False
                report["failures"].append(f"logits/{case}: no call to the bundle's {expect}")
            if not entry["passed"] and entry["calls"][expect]:
                report["failures"].append(
                    f"logits/{case}: err_ours {entry['err_ours']:.3e} > 2 * err_baseline + atol = {entry['bound']:.3e}")
        report["logits"][case] = entry

    if kind == "gpt_oss":
        # How much the window matters: the same weights with every layer full, fp32 reference.
        full = load_model(path, kind, torch.float32, dev, "eager",
                          layer_types=["full_attention"] * ref.config.num_hidden_layers)
        batch = make_batch(opts, vocab, "left_pad", dev)
        report["window_sensitivity_ref"] = masked_max_err(logits_of(full, batch), logits_of(ref, batch),
                                                          batch["attention_mask"])
        del full
        _free()

    report["generation"] = {}
    for case in ("nopad", "left_pad"):
        batch = make_batch(opts, vocab, case, dev)
        g_base = generate(base, batch, opts.new_tokens)
        g_ref = generate(ref, batch, opts.new_tokens)
        entry = {"new_tokens": opts.new_tokens,
                 "baseline_equals_fp32_reference": bool(torch.equal(g_base["tokens"], g_ref["tokens"]))}
        if opts.reference_only:
            entry["baseline_vs_reference"] = compare_generation(g_base, g_ref, ref, batch, opts, rule=False)
        else:
            c0 = log.snapshot()
            g_ours = generate(ours, batch, opts.new_tokens)
            entry["calls"] = {k: log.counts[k] - c0[k] for k in c0}
            entry["ours_vs_baseline"] = compare_generation(g_ours, g_base, ref, batch, opts)
            entry["ours_equals_fp32_reference"] = bool(torch.equal(g_ours["tokens"], g_ref["tokens"]))
            entry["passed"] = entry["ours_vs_baseline"]["passed"]
            if sum(entry["calls"].values()) == 0:
                entry["passed"] = False
                report["failures"].append(f"generation/{case}: no call to the bundle")
            elif not entry["ours_vs_baseline"]["ties_ok"]:
                report["failures"].append(f"generation/{case}: tokens diverge from the baseline's beyond a tie")
            elif not entry["passed"]:
                cmp = entry["ours_vs_baseline"]
                report["failures"].append(f"generation/{case}: decode-step logits err_ours {cmp['err_ours_decode']:.3e} > "
                                          f"2 * err_baseline + atol = {cmp['decode_bound']:.3e}")
        report["generation"][case] = entry

    report["calls_total"] = {k: log.counts[k] - start[k] for k in start}
    report["call_arguments"] = log.summary()
    del ref, base, ours


def _user_code(kind: str, plan: dict) -> str:
    lines = []
    if plan["aliases"]:
        lines.append(f'# shell: LOCAL_KERNELS="{plan["aliases"][0]}=/path/to/flash-attn-4-sm120"')
    else:
        lines.append(f'# Hub: nothing to set; local clone: LOCAL_KERNELS="{REPO_ID}=/path/to/flash-attn-4-sm120"')
    extra = ", allow_all_kernels=True" if plan["allow_all_kernels"] else ""
    lines.append(f'model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, '
                 f'attn_implementation="{plan["load"]}"{extra})')
    if plan["set"]:
        lines.append(f'model.set_attn_implementation("{plan["set"]}")')
    return "\n".join(lines)


def check_llama(opts: Optional[Options] = None) -> dict:
    return check_model("llama", opts)


def check_gpt_oss(opts: Optional[Options] = None, route: str = "vllm-fa3-alias") -> dict:
    return check_model("gpt_oss", opts, route)


# -- resolution probes (fresh interpreters; no GPU needed) ---------------------------------------------

# Each probe: model, attn_implementation, how ("load": from_pretrained(attn_implementation=...), "set": load eager
# then set_attn_implementation, "from_config": AutoModelForCausalLM.from_config), allow_all_kernels, where the
# bundle comes from ("local": LOCAL_KERNELS with this repo id plus the aliases; "hub-untrusted": a local Hub on
# 127.0.0.1 (tests/support/local_hub.py) that serves the build with trustedKernelPublisher false, no LOCAL_KERNELS).
PROBES = [
    ("llama", REPO_ID, "load", True, "local", ()),
    ("llama", REPO_ID, "load", False, "local", ()),
    ("llama", REPO_ID, "from_config", True, "local", ()),
    ("llama", REPO_ID, "load", False, "hub-untrusted", ()),
    ("llama", REPO_ID, "load", True, "hub-untrusted", ()),
    ("gpt_oss", REPO_ID, "load", True, "local", ()),
    ("gpt_oss", REPO_ID, "set", True, "local", ()),
    ("gpt_oss", "flash_attention_4", "load", True, "local", (FA4_ID,)),
    ("gpt_oss", "flash_attention_4", "set", False, "local", (FA4_ID,)),
    ("gpt_oss", FA4_ID, "set", True, "local", (FA4_ID,)),
    ("gpt_oss", VLLM_FA3_ID, "load", False, "local", (VLLM_FA3_ID,)),
    ("gpt_oss", "local/fa4-sm120", "load", True, "local", ("local/fa4-sm120",)),
]


def _probe_one(kind: str, impl: str, how: str, ckpt: str, allow_all: str) -> dict:
    import transformers.modeling_flash_attention_utils as mfu
    from transformers import AutoConfig, AutoModelForCausalLM

    allow = allow_all == "1"
    extra = {"allow_all_kernels": True} if allow else {}
    out: dict[str, Any] = {"model": kind, "requested": impl, "how": how, "allow_all_kernels": allow}
    try:
        if how == "load":
            model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation=impl, **extra)
        elif how == "from_config":
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ckpt), attn_implementation=impl, **extra)
        else:
            model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager")
            model.set_attn_implementation(impl, **extra)
        out["resolved"] = model.config._attn_implementation
        out["inner_resolved"] = model.model.config._attn_implementation
        out["varlen_fn_module"] = getattr(mfu._flash_varlen_fn, "__module__", None)
        out["reaches_bundle"] = str(out["varlen_fn_module"]).startswith("_flash_attn_4_sm120")
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out["reaches_bundle"] = False
    return out


def run_probes(opts: Options, workdir: Path) -> list:
    """Each probe in a fresh interpreter (transformers caches the loaded flash implementation per process, even
    after a failed load), with its own HF cache; "local" probes have only this repo id plus the probe's aliases
    in LOCAL_KERNELS and the Hub unreachable."""
    ckpts = {kind: save_checkpoint(kind, opts, workdir / "probe") for kind in ("llama", "gpt_oss")}
    root = Path(opts.repo_root).resolve()
    hub = None
    results = []
    try:
        for i, (kind, impl, how, allow_all, source, aliases) in enumerate(PROBES):
            env = {k: v for k, v in os.environ.items() if k != "LOCAL_KERNELS" and not k.startswith("HF_")}
            env.update(HF_HOME=str(workdir / f"hf_home_{i}"), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
            if source == "local":
                env["LOCAL_KERNELS"] = ":".join(f"{rid}={root}" for rid in (REPO_ID, *aliases))
                env.update(HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
            else:
                if hub is None:
                    sys.path.insert(0, str(root / "tests"))
                    from support.local_hub import LocalHub, repo_from_variant

                    hub = LocalHub(repo_from_variant(REPO_ID, root / "build" / "torch-cuda"), trusted=False).__enter__()
                env["HF_ENDPOINT"] = hub.endpoint
            cmd = [sys.executable, str(Path(__file__).resolve()), "--probe-one", kind, impl, how, str(ckpts[kind]),
                   "1" if allow_all else "0"]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(PROBE_MARKER)]
            if lines:
                res = json.loads(lines[-1][len(PROBE_MARKER):])
            else:
                res = {"model": kind, "requested": impl, "how": how, "error": f"rc={proc.returncode}: {proc.stderr[-500:]}"}
            res["source"] = source
            if source == "local":
                res["LOCAL_KERNELS_ids"] = [REPO_ID, *aliases]
            results.append(res)
    finally:
        if hub is not None:
            hub.__exit__(None, None, None)
    return results


# -- main ----------------------------------------------------------------------------------------------


def _jsonable(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [_jsonable(v) for v in x]
    return x


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring (python -c 'import tools.client_transformers as m; "
                                       "help(m)') for the rules and the device command.")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (only with --reference-only)")
    p.add_argument("--reference-only", action="store_true",
                   help="skip the bundle's forward: models, fp32 reference vs bf16 baseline, resolution to the bundle")
    p.add_argument("--models", default="llama,gpt_oss", help="comma list of llama, gpt_oss")
    p.add_argument("--gptoss-routes", default=",".join(GPTOSS_ROUTES),
                   help=f"comma list of {', '.join(GPTOSS_ROUTES)} (default: all)")
    p.add_argument("--atol", type=float, default=Options.atol, help="slack in err_ours <= 2 * err_baseline + atol")
    p.add_argument("--new-tokens", type=int, default=Options.new_tokens)
    p.add_argument("--lengths", default=",".join(map(str, Options.lengths)), help="3 prompt lengths of the padded cases")
    p.add_argument("--sliding-window", type=int, default=Options.sliding_window)
    p.add_argument("--seed", type=int, default=Options.seed)
    p.add_argument("--repo-root", default=str(REPO_ROOT), help="what LOCAL_KERNELS points at (holds build/torch-cuda)")
    p.add_argument("--workdir", default=None, help="where the tiny checkpoints go (default: a temp dir)")
    p.add_argument("--online", action="store_true", help="do not set HF_HUB_OFFLINE=1")
    p.add_argument("--probes", action="store_true",
                   help="also record what transformers resolves each candidate attn_implementation to (subprocesses)")
    p.add_argument("--out", default=None, help="write the JSON report here too")
    p.add_argument("--probe-one", nargs=5, metavar=("MODEL", "IMPL", "HOW", "CKPT", "ALLOW_ALL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.probe_one:
        print(PROBE_MARKER + json.dumps(_jsonable(_probe_one(*args.probe_one))))
        return 0
    if args.device == "cpu" and not args.reference_only:
        p.error("--device cpu needs --reference-only (the bundle's kernels need CUDA)")
    opts = Options(device=args.device, reference_only=args.reference_only, atol=args.atol, new_tokens=args.new_tokens,
                   lengths=tuple(int(x) for x in args.lengths.split(",")), sliding_window=args.sliding_window,
                   seed=args.seed, repo_root=args.repo_root, workdir=args.workdir,
                   gptoss_routes=tuple(r for r in args.gptoss_routes.split(",") if r), offline=not args.online)
    if len(opts.lengths) != 3:
        p.error("--lengths takes 3 values")
    for r in opts.gptoss_routes:
        if r not in GPTOSS_ROUTES:
            p.error(f"unknown route {r!r}")
    set_offline(opts.offline)

    report: dict[str, Any] = {"tool": "tools/client_transformers.py", "mode": "reference-only" if opts.reference_only
                              else "full", "options": asdict(opts), "versions": versions()}
    problem = requirements_problem(opts.device)
    report["environment"] = environment(opts) if problem is None else {"problem": problem}
    if problem is None and report["environment"].get("arch_listed") is False:
        problem = (f"build/torch-cuda/metadata.json backend.archs {report['environment']['metadata_archs']} lacks "
                   f"{report['environment']['capability']}: kernels refuses the variant on this GPU")
    if problem is not None:
        report["passed"] = False
        report["problem"] = problem
        _emit(report, args.out)
        return 2

    checks = []
    models = [m for m in args.models.split(",") if m]
    if "llama" in models:
        checks.append(check_llama(opts))
    if "gpt_oss" in models:
        for route in opts.gptoss_routes:
            checks.append(check_gpt_oss(opts, route))
    report["checks"] = checks
    if args.probes:
        report["probes"] = run_probes(opts, Path(opts.workdir or tempfile.mkdtemp(prefix="client_probes_")))
    report["passed"] = all(c["passed"] is not False for c in checks) and any(c["passed"] for c in checks)
    report["summary"] = [{"model": c["model"], "route": c["route"], "passed": c["passed"],
                          "skipped": c.get("skipped"), "failures": [f.splitlines()[0] for f in c["failures"]]}
                         for c in checks]
    _emit(report, args.out)
    return 0 if report["passed"] else 1


def _emit(report: dict, out: Optional[str]) -> None:
    text = json.dumps(_jsonable(report), indent=1)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
