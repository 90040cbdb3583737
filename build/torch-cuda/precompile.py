"""Precompile: fill the compile cache before serving starts, on the serving GPU or on a CPU build box.

``precompile(dtypes, head_dims, causal, head_dim_v, target, model)`` compiles every forward kernel the
dispatcher may pick for those specs (``config.dispatch_candidates``) through the compile cache, so the
first ``flash_attn_func`` call of each spec in a later process loads an object from disk instead of
compiling (see ``compile_cache``: the key is spec, config, execution model, compile target and the launch's
occupancy padding (``config.occupancy_launch_smem``: 0 on an SM120; computed for the current GPU when the model is
its own, else 0), plus the
package, cutlass-dsl and tvm-ffi versions, the host CPU and a digest of the package sources; a cache
filled on a build box serves a GPU node only when all of those agree). Precompile with the very build
you serve: a Hub build's ``_ops.py`` carries its namespace, so a cache filled from a ``torch-ext``
checkout misses in the Hub-loaded module and vice versa.

Algorithm:
  1. Resolve the execution model: ``model`` (an ``ExecutionModel`` or an arch string like ``"sm_120"``),
     else the current GPU's dispatch model (``launch.dispatch_model``, which honours
     ``FA4_SM120_DISPATCH_ARCH``). Without a GPU the model must be given.
  2. Resolve the compile target: ``target``, else ``FA4_SM120_COMPILE_TARGET``, else the model's own
     (``sm_120a`` for SM120): the same rule the API applies at call time, so the keys match.
  3. Build the ``FwdSpec`` of every (dtype, head_dim, causal) combination and check all of them before
     compiling anything: head dims outside what the API accepts raise its ``ValueError``; a feature the
     shipped manifest lists as planned raises its ``NotImplementedError`` message.
  4. With ``decode=True`` (``--decode``) add each spec's decode variants (packed GQA, split-KV, both) and
     the split-KV combine kernel of each (dtype, head_dim_v): what decode steps of a serving stack run.
  5. For each kernel: ``compiler.get_fwd_kernel(spec, cfg, model, target)`` per ``dispatch_candidates(spec, model)``
     (or ``get_combine_kernel``), timed, and classified from the ``compile_cache.default_cache().stats``
     deltas as a ``"memory"`` hit, a ``"disk"`` hit or a ``"compile"``; ``on_disk`` says whether the entry
     is now on disk.

Counters are per process: do not run two precompiles of one process in parallel threads.

Usage, from a checkout (the package imports relatively, so ``torch-ext`` must be on the path)::

    PYTHONPATH=torch-ext python -m flash_attn_4_sm120.precompile --dtypes bf16 fp16 --head-dims 64 128 \\
        --causal both [--head-dim-v 64] [--decode] [--arch sm_120] [--target sm_120a] [--json out.json]

``PYTHONPATH=build/torch-cuda`` runs the built variant instead; it fills the same entries as the Hub
module of that build (checked: one fills, the other loads).

From Python, or a Hub-loaded module (``fa = kernels.get_kernel(...)``)::

    importlib.import_module(fa.__name__ + ".precompile").precompile(head_dims=(128,), model="sm_120")

Pure host module: importing it compiles nothing, imports no cutlass and reads no environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from typing import Iterable, Optional, Sequence, Union

from . import compiler, manifest
from .config import dispatch_candidates, occupancy_launch_smem
from .execution_model import (
    COMPILE_TARGET_ENV,
    OCCUPANCY_ENV,
    ExecutionModel,
    UnsupportedDeviceError,
    model_for_arch_string,
    resolve_compile_target,
)
from .problem import CombineSpec, FwdSpec, check_head_dim

#: Spellings accepted for the dtypes, mapped to ``FwdSpec.dtype``.
DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16"}
#: The base head dims; any other head dim needs the ``head_dim_any`` or
#: ``head_dim_256`` feature of the manifest.
_BASE_HEAD_DIMS = (64, 128)


def _dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    try:
        return DTYPE_ALIASES[name]
    except KeyError:
        raise TypeError(f"dtype {dtype!r}: flash_attn_4_sm120 supports bf16 (torch.bfloat16) and "
                        f"fp16 (torch.float16)") from None


def _as_tuple(x) -> tuple:
    """A scalar (None, a bool, an int, a string, a torch dtype) as a 1-tuple; a sequence as a tuple."""
    if isinstance(x, (str, bytes)) or not isinstance(x, Iterable):
        return (x,)
    return tuple(x)


def fwd_specs(dtypes: Iterable = ("bf16",), head_dims: Iterable[int] = (64, 128),
              causal: Union[bool, Iterable[bool]] = (False, True),
              head_dim_v: Union[None, int, Iterable[int]] = None) -> list[FwdSpec]:
    """Every (dtype, head_dim, head_dim_v, causal) combination as the ``FwdSpec`` the API derives from
    such a call (dense, no window, no softcap, no sink). ``head_dim_v=None`` means ``head_dim``."""
    specs = []
    for dt, d, dv, c in itertools.product(_as_tuple(dtypes), _as_tuple(head_dims), _as_tuple(head_dim_v),
                                          _as_tuple(causal)):
        for name, value in (("head_dim", d), ("head_dim_v", dv)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if not isinstance(c, bool):
            raise TypeError(f"causal must be a bool or a sequence of bools, got {c!r}")
        spec = FwdSpec(dtype=_dtype_name(dt), head_dim=d, head_dim_v=d if dv is None else dv, causal=c)
        if spec not in specs:
            specs.append(spec)
    return specs


def check_fwd_spec(spec: FwdSpec) -> None:
    """Raise what ``flash_attn_func`` raises for a call with this spec: ``ValueError`` for head dims it
    never accepts, the manifest's ``NotImplementedError`` for a feature this version does not have."""
    for name, d in (("head_dim", spec.head_dim), ("head_dim_v", spec.head_dim_v)):
        check_head_dim(name, d)
    manifest.require("forward")
    if spec.causal:
        manifest.require("causal")
    if spec.head_dim_v != spec.head_dim:
        manifest.require("head_dim_v_differs")
    if max(spec.head_dim, spec.head_dim_v) > 128:
        manifest.require("head_dim_256")
    elif spec.head_dim not in _BASE_HEAD_DIMS or spec.head_dim_v not in _BASE_HEAD_DIMS:
        manifest.require("head_dim_any")


def resolve_model(model: Union[None, str, ExecutionModel] = None) -> ExecutionModel:
    """``model`` as an ``ExecutionModel``; None: the current GPU's dispatch model."""
    if isinstance(model, ExecutionModel):
        return model
    if isinstance(model, str):
        return model_for_arch_string(model)
    if model is not None:
        raise TypeError(f"model must be an ExecutionModel, an arch string like 'sm_120', or None; got {model!r}")
    import torch

    from .launch import dispatch_model

    try:
        return dispatch_model(torch.device("cuda"))
    except UnsupportedDeviceError as e:
        raise UnsupportedDeviceError(
            f"{e} To precompile without a GPU, name the part to compile for: "
            "precompile(model=execution_model.SM120, target='sm_120a') or --arch sm_120 on the command line."
        ) from None


def _device_smem_for(model: ExecutionModel) -> Optional[tuple[int, int]]:
    """The current GPU's shared memory (``launch.device_smem``) when ``model`` is what it dispatches
    to, so the keys are the ones the API looks up there; None on a build box compiling for another part
    (its kernels launch as compiled on the model's own part)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from .launch import device_smem, dispatch_model

    try:
        if dispatch_model(torch.device("cuda")) != model:
            return None
    except UnsupportedDeviceError:  # a build box whose GPU cannot run the model compiles for another part
        return None
    return device_smem(torch.cuda.current_device(), os.environ.get(OCCUPANCY_ENV))


def spec_name(spec: FwdSpec) -> str:
    extra = ("_packgqa" if spec.pack_gqa else "") + ("_splitkv" if spec.split_kv else "")
    return f"fwd_{spec.dtype}_d{spec.head_dim}x{spec.head_dim_v}_{'causal' if spec.causal else 'full'}{extra}"


def decode_specs(spec: FwdSpec) -> list[FwdSpec]:
    """The variants a decode / short-query call of ``spec``'s shape can dispatch to: packed GQA (short
    GQA queries), split-KV (grids too small for the GPU), both."""
    return [dataclasses.replace(spec, pack_gqa=p, split_kv=s) for p, s in ((True, False), (False, True), (True, True))]


def precompile(dtypes: Iterable = ("bf16",), head_dims: Iterable[int] = (64, 128),
               causal: Union[bool, Iterable[bool]] = (False, True),
               head_dim_v: Union[None, int, Iterable[int]] = None, target: Optional[str] = None,
               model: Union[None, str, ExecutionModel] = None, decode: bool = False) -> list[dict]:
    """Compile (or load) the dispatcher's forward kernel for every spec into the compile cache.

    ``decode``: also the decode variants of every spec (``decode_specs``: packed GQA, split-KV) and the
    split-KV combine kernel of each (dtype, head_dim_v) -- what a serving stack's decode steps use.

    Returns one dict per spec, in order: ``name``, ``spec``, ``config`` (dicts), ``model``, ``target``,
    ``source`` (``"memory"``, ``"disk"`` or ``"compile"``), ``on_disk`` (the entry is in the disk cache
    now) and ``seconds`` (wall-clock for this spec). All specs are checked before anything compiles.
    """
    from .compile_cache import default_cache

    model = resolve_model(model)
    target = resolve_compile_target(model, target or os.environ.get(COMPILE_TARGET_ENV))
    specs = fwd_specs(dtypes, head_dims, causal, head_dim_v)
    for spec in specs:
        check_fwd_spec(spec)
    if decode:
        specs += [variant for spec in specs for variant in decode_specs(spec)]
    # (name, spec dict, config dict, compile-or-load thunk) per kernel
    plans = []
    smem = _device_smem_for(model)
    for spec in specs:
        for cfg in dispatch_candidates(spec, model):  # the tile-efficiency rule picks among them per call shape
            launch_smem = occupancy_launch_smem(spec, cfg, model, smem)
            plans.append((spec_name(spec), dataclasses.asdict(spec), dataclasses.asdict(cfg),
                          lambda spec=spec, cfg=cfg, ls=launch_smem: compiler.get_fwd_kernel(spec, cfg, model, target,
                                                                                              ls)))
    if decode:
        for cspec in dict.fromkeys(CombineSpec.of(spec, False) for spec in specs):
            plans.append((f"combine_{cspec.dtype}_dv{cspec.head_dim_v}", dataclasses.asdict(cspec), {},
                          lambda cspec=cspec: compiler.get_combine_kernel(cspec, model, target)))
    stats = default_cache().stats
    results = []
    for name, spec_dict, cfg_dict, load in plans:
        before = dataclasses.replace(stats)
        t0 = time.perf_counter()
        load()
        seconds = time.perf_counter() - t0
        if stats.compiles > before.compiles:
            source = "compile"
        elif stats.disk_hits > before.disk_hits:
            source = "disk"
        else:
            source = "memory"
        # A memory hit says nothing about the disk; ask the counters of the call that put it in memory.
        on_disk = stats.disk_writes > before.disk_writes or source == "disk"
        results.append({
            "name": name,
            "spec": spec_dict,
            "config": cfg_dict,
            "model": model.name,
            "target": target,
            "source": source,
            "on_disk": on_disk if source != "memory" else None,
            "seconds": seconds,
        })
    return results


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------
_CAUSAL_CHOICES = {"both": (False, True), "true": (True,), "false": (False,), "causal": (True,), "full": (False,)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m flash_attn_4_sm120.precompile",
        description="Compile the forward kernels the dispatcher picks for these specs into the compile "
                    "cache (FA4_SM120_CACHE_DIR, else $XDG_CACHE_HOME/flash_attn_4_sm120, else "
                    "~/.cache/flash_attn_4_sm120).",
    )
    p.add_argument("--dtypes", nargs="+", default=["bf16"], choices=sorted(DTYPE_ALIASES), metavar="DTYPE",
                   help="bf16 and/or fp16 (default: bf16)")
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128], metavar="D",
                   help="head dims of Q/K (default: 64 128)")
    p.add_argument("--head-dim-v", nargs="+", type=int, default=None, metavar="DV",
                   help="head dims of V (default: the same as --head-dims)")
    p.add_argument("--causal", default="both", choices=sorted(_CAUSAL_CHOICES),
                   help="which masks: both (default), true, false")
    p.add_argument("--arch", default=None,
                   help="part to compile for, e.g. sm_120, sm_121, sm_90 (default: this machine's GPU, "
                        "or FA4_SM120_DISPATCH_ARCH); required without a GPU")
    p.add_argument("--target", default=None,
                   help="cute.compile target, e.g. sm_120a (default: FA4_SM120_COMPILE_TARGET, else the part's own)")
    p.add_argument("--decode", action="store_true",
                   help="also the decode variants (packed GQA, split-KV) and the split-KV combine kernels")
    p.add_argument("--json", metavar="PATH", help="also write the per-spec results as JSON here")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Exit status: 0 every kernel is in the disk cache, 1 some kernel is only in memory (disk cache off
    or refused), 2 a spec is refused or there is no part to compile for."""
    from .compile_cache import default_cache, default_cache_root

    args = build_parser().parse_args(argv)
    try:
        results = precompile(dtypes=args.dtypes, head_dims=args.head_dims, causal=_CAUSAL_CHOICES[args.causal],
                             head_dim_v=args.head_dim_v, target=args.target, model=args.arch, decode=args.decode)
    except (NotImplementedError, ValueError, TypeError, UnsupportedDeviceError) as e:
        print(f"precompile: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    width = max(len(r["name"]) for r in results)
    for r in results:
        c = r["config"]
        tiles = (f"m{c['tile_m']}n{c['tile_n']}w{c['num_warps']}s{c['num_stages']}{'_qreg' if c['q_in_regs'] else ''}"
                 if c else "-")
        print(f"{r['name']:<{width}}  {tiles:<18} {r['source']:<8} {r['seconds']:7.2f} s")
    total = sum(r["seconds"] for r in results)
    where = default_cache_root() if any(r["on_disk"] for r in results) else "memory only"
    print(f"{len(results)} kernels for {results[0]['model']} / {results[0]['target']} in {total:.2f} s; "
          f"cache: {where}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "cache": repr(default_cache())}, f, indent=1)
    missing = [r["name"] for r in results if r["on_disk"] is False]
    if missing:
        print(f"precompile: not written to the disk cache (disabled, refused or not writable; see the warnings "
              f"above): {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
