"""The conformance provider of ``tools/conformance.py``: every kernel the dispatcher can build, as named cases.

``conformance_cases(model)`` lists them: every (spec, config) ``config.dispatchable_fwd`` and
``bwd_config.dispatchable_bwd`` admit, the combine and KV-append kernels, the backward's pre- and postprocess, and
the feature families traced with examples (``flex_cases``: score / mask mods; ``sparse_cases``: block-sparse lists
and their refinement; ``dropout_cases``). ``subset_ci`` marks the small CI subset. ``candidate_cases`` adds every
tuning candidate, ``make_case`` builds one forward case from knobs, and ``compile_for_conformance`` compiles a
case through ``compiler`` keeping its PTX, CUBIN and SASS for the gate's checks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Optional

from .bwd_config import (BwdConfig, bwd_invariant_pairs, bwd_padded_head_dim, bwd_smem_bytes, candidate_bwd_configs,
                         dispatchable_bwd, select_bwd_config)
from .compiler import (compile_append, compile_bwd, compile_bwd_side, compile_combine, compile_fwd, compile_refine,
                       fwd_kernel_class)
from .config import (FwdConfig, candidate_fwd_configs, dispatch_candidates, dispatchable_fwd, fwd_smem_bytes,
                     WHOLE_CHUNK_BLOCKS, invariant_pairs, select_fwd_config)
from .execution_model import SM120, ExecutionModel, model_for_arch_string
from .problem import AppendSpec, BwdSpec, CombineSpec, FwdSpec, RefineSpec

_KEEP_ARTIFACTS = "--keep-ptx --keep-cubin --keep-sass"


def _layout_flags(s) -> str:
    """The case-name suffix of a spec's packed / seqused sides (forward and backward specs alike)."""
    flags = ("_varlen" + ("q" if s.varlen_q else "") + ("k" if s.varlen_k else "")) if s.varlen_q or s.varlen_k else ""
    if s.seqused_q or s.seqused_k:
        flags += "_used" + ("q" if s.seqused_q else "") + ("k" if s.seqused_k else "")
    return flags


@dataclass(frozen=True)
class Case:
    spec: FwdSpec
    config: FwdConfig
    model_name: str = SM120.name
    subset_ci: bool = False
    #: the mods' example name (``flex_examples``) for specs with mods
    label: str = ""

    @property
    def name(self) -> str:
        s, c = self.spec, self.config
        mask = s.mask + (f"_flex-{self.label}" if s.mods is not None else "")
        mask += "_softcap" if s.softcap else ""
        mask += "_sink" if s.has_sink else ""
        mask += _layout_flags(s)
        if s.pack_gqa:
            mask += "_packgqa"
        if s.split_kv:
            mask += ("_splitkv" if not s.split_chunk else "_chunkall" if s.split_chunk == WHOLE_CHUNK_BLOCKS
                     else f"_chunk{s.split_chunk}")
        if s.page_size:
            mask += f"_paged{s.page_size}"
        if s.kv_dtype:
            mask += f"_qkv{s.kv_dtype}" if s.fp8_mma else f"_kv{s.kv_dtype}"
        if s.block_sparse is not None:
            mask += "_sparse{}x{}{}".format(*s.block_sparse[:2], "" if s.block_sparse[2] else "_nofull")
        mask += "_dropout" if s.dropout else ""
        mask += "_latent" if s.latent_v else ""
        qr = "_qreg" if c.q_in_regs else ""
        ml = "_" + c.mainloop if c.uses_tma else ""
        ml += "" if c.frag_prefetch else "_nopf"
        ml += "_ov" if c.overlap else ""
        ml += "_pp" if c.pingpong else ""
        ml += "_ps" if c.persistent else ""
        ml += "_mbr" if c.mbarrier_release else ""
        ml += "" if c.mask_select else "_mstore"
        ml += "_keys" if c.warps_on_keys else ""
        ml += f"_dv{c.dv_warps}" if c.dv_warps > 1 else ""
        return f"fwd_{s.dtype}_d{s.head_dim}x{s.head_dim_v}_{mask}_m{c.tile_m}n{c.tile_n}w{c.num_warps}s{c.num_stages}{qr}{ml}"

    def describe(self) -> dict:
        kernel = ("fwd_wide" if self.config.dv_warps > 1 else
                  "fwd_keysplit_fp8" if self.config.warps_on_keys and self.spec.kv_dtype else
                  "fwd_keysplit" if self.config.warps_on_keys else "fwd_fp8_mma" if self.spec.fp8_mma
                  else "fwd_tma" if self.config.uses_tma else "fwd_multistage")
        return {"kernel": kernel, **asdict(self.spec), **asdict(self.config), "model": self.model_name}


@dataclass(frozen=True)
class CombineCase:
    """A split-KV combine kernel for the conformance gate (no MMA: it merges fp32 partials)."""

    spec: CombineSpec
    model_name: str = SM120.name
    subset_ci: bool = False

    @property
    def name(self) -> str:
        s = self.spec
        flags = ("_varlenq" if s.varlen_q else "") + ("_usedq" if s.seqused_q else "") + ("_sink" if s.has_sink else "")
        return f"combine_{s.dtype}_dv{s.head_dim_v}{flags}"

    def describe(self) -> dict:
        return {"kernel": "fwd_combine", **asdict(self.spec), "model": self.model_name, "uses_mma": False}


@dataclass(frozen=True)
class AppendCase:
    """A KV-cache append kernel for the conformance gate (no MMA: it copies and rotates rows)."""

    spec: AppendSpec
    model_name: str = SM120.name
    subset_ci: bool = False

    @property
    def name(self) -> str:
        s = self.spec
        flags = (f"_rot{s.rotary_dim}" + ("i" if s.rotary_interleaved else "") if s.rotary_dim else "") + \
            ("_new" if s.new_kv else "") + ("_varlen" if s.varlen_q or s.varlen_new else "") + \
            (f"_paged{s.page_size}" if s.page_size else "") + ("_starts" if s.key_starts else "") + \
            (f"_cache{s.cache_dtype}" if s.cache_dtype else "")
        return f"append_{s.dtype}_d{s.head_dim}x{s.head_dim_v}{flags}"

    def describe(self) -> dict:
        return {"kernel": "kv_append", **asdict(self.spec), "model": self.model_name, "uses_mma": False}


@dataclass(frozen=True)
class BwdCase:
    """A backward main kernel (spec, config) for the conformance gate."""

    spec: BwdSpec
    config: BwdConfig
    model_name: str = SM120.name
    subset_ci: bool = False
    #: the mods' example name (``flex_examples``) for specs with mods
    label: str = ""

    @property
    def name(self) -> str:
        s, c = self.spec, self.config
        mask = "causal" if s.causal else ("local" if s.local else "full")
        mask += f"_flex-{self.label}" if s.mods is not None else ""
        mask += "_softcap" if s.softcap else ""
        mask += _layout_flags(s)
        mask += ("_detlo" if s.lowest_first else "_detrot" if s.rotated_turns else "_det") if s.deterministic else ""
        mask += f"_gs{s.group_split}" if s.group_split > 1 else ""
        mask += "_sparse{}x{}".format(*s.block_sparse) if s.block_sparse is not None else ""
        mask += "_dropout" if s.dropout else ""
        return (f"bwd_{s.dtype}_d{s.head_dim}x{s.head_dim_v}_{mask}_m{c.tile_m}n{c.tile_n}w{c.num_warps}"
                f"q{c.stages_q}o{c.stages_do}_{c.sdp_warps_m}{c.dkv_warps_n}{c.dq_warps_m}"
                + (f"c{c.dq_chunks}" if c.dq_chunks > 1 else "") + (f"k{c.dkv_chunks}" if c.dkv_chunks > 1 else "")
                + ("_rs" if c.role_split else "") + ("d" if c.step_divisor else "") + ("r" if c.rotated_start else "")
                + ("v" if c.kv_in_regs else ""))

    def describe(self) -> dict:
        return {"kernel": "bwd_multistage", **asdict(self.spec), **asdict(self.config), "model": self.model_name}


@dataclass(frozen=True)
class BwdSideCase:
    """The backward's preprocess or postprocess kernel for the conformance gate (no MMA: row sums, scaling,
    casts; the postprocess reads the dQ accumulator in the main kernel's fragment order)."""

    which: str
    spec: BwdSpec
    config: BwdConfig
    model_name: str = SM120.name
    subset_ci: bool = False

    @property
    def name(self) -> str:
        s, c = self.spec, self.config
        flags = ("_varlenq" if s.varlen_q else "") + ("_usedq" if s.seqused_q else "") + ("_dlse" if s.has_dlse else "")
        if self.which == "preprocess":
            return f"bwd_pre_{s.dtype}_dv{s.head_dim_v}{flags}"
        return (f"bwd_post_{s.dtype}_d{bwd_padded_head_dim(s.head_dim, c)}{flags}_m{c.tile_m}w{c.num_warps}"
                f"_{c.dq_warps_m}c{c.dq_chunks}")

    def describe(self) -> dict:
        return {"kernel": f"bwd_{self.which}", **asdict(self.spec), **asdict(self.config), "model": self.model_name,
                "uses_mma": False}


@dataclass(frozen=True)
class RefineCase:
    """The block-sparse tile refinement for the conformance gate (no MMA: it evaluates a mask_mod)."""

    spec: RefineSpec
    model_name: str = SM120.name
    subset_ci: bool = False
    #: the mask_mod's example name (``flex_examples``)
    label: str = ""

    @property
    def name(self) -> str:
        return f"sparse_refine_{self.label}_m{self.spec.tile_m}n{self.spec.tile_n}"

    def describe(self) -> dict:
        return {"kernel": "sparse_refine", **asdict(self.spec), "model": self.model_name, "uses_mma": False}


def append_specs() -> list[AppendSpec]:
    """Every append code path: rotary off / GPT-NeoX / GPT-J (partial and full), dense, paged and
    read-from-starts caches, packed q / new k, the smallest and largest head dims, both dtypes."""
    specs = []
    for dtype in ("bf16", "fp16"):
        for d, dv in ((64, 64), (128, 128), (192, 128), (256, 256)):
            for rotary, inter in ((0, False), (d // 2 - d // 2 % 16, False), (d, True)):
                for paged, starts, varlen in ((16, False, True), (0, True, False), (0, False, False)):
                    specs.append(AppendSpec(dtype, d, dv, rotary_dim=rotary, rotary_interleaved=inter,
                                            rotary_q_per_row=True, rotary_seqlens=bool(rotary and starts),
                                            new_kv=True, varlen_q=varlen, varlen_new=varlen, page_size=paged,
                                            batch_idx=starts, leftpad=starts))
    # FP8 caches: new rows quantized (rotated first) into e4m3 / e5m2, paged and dense, at each head dim; a dense
    # cache read from per-sequence starts (cache_batch_idx / cache_leftpad) with and without rotary
    for cache_dtype in ("e4m3", "e5m2"):
        for d, dv in ((64, 64), (128, 128), (192, 128), (256, 256)):
            for paged in (16, 0):
                specs.append(AppendSpec("bf16", d, dv, rotary_dim=d, rotary_interleaved=False, rotary_q_per_row=True,
                                        new_kv=True, page_size=paged, cache_dtype=cache_dtype))
    for rotary in (0, 128):
        specs.append(AppendSpec("bf16", 128, 128, rotary_dim=rotary, rotary_q_per_row=True, new_kv=True,
                                batch_idx=True, leftpad=True, cache_dtype="e4m3"))
    # rows past 256 columns (two passes per warp): head dims to 512, rotary off / partial halves / full pairs, and
    # MLA's caches (64 rope keys rotated, a 512-wide latent copied)
    for d, dv, rotary, inter in ((512, 512, 0, False), (512, 512, 128, False), (512, 512, 512, True),
                                 (320, 384, 320, False), (64, 512, 64, True), (64, 512, 64, False)):
        for paged, starts, varlen in ((16, False, True), (0, True, False), (1, False, False)):
            specs.append(AppendSpec("bf16", d, dv, rotary_dim=rotary, rotary_interleaved=inter, rotary_q_per_row=True,
                                    new_kv=True, varlen_q=varlen, varlen_new=varlen, page_size=paged,
                                    batch_idx=starts, leftpad=starts))
    return specs


def combine_specs() -> list[CombineSpec]:
    """Every combine code path: both dtypes (and the public combine's fp32 output), a padded and the
    largest head dim, dense and packed Q (with seqused), with and without the sink."""
    specs = [CombineSpec(dtype, dv, varlen, varlen, sink) for dtype in ("bf16", "fp16") for dv in (72, 128, 256)
             for varlen in (False, True) for sink in (False, True)]
    # the public flash_attn_combine: fp32 and bf16 output (no sink) up to its 512 columns, dense and packed; dense
    # rows capped by seqused
    return specs + [CombineSpec(dtype, dv, varlen, varlen, False) for dtype, dv in
                    (("fp32", 72), ("fp32", 256), ("fp32", 512), ("bf16", 512)) for varlen in (False, True)] + [
        CombineSpec(dtype, 128, False, True, False) for dtype in ("bf16", "fp32")]


def conformance_cases(model: ExecutionModel = SM120) -> list[Case]:
    """Every config the dispatcher can choose under ``model`` (``config.dispatchable_fwd``, and the batch-invariant
    tiles, ``config.invariant_pairs``). The CI
    subset: bf16 at each head-dim class's largest head dim, full and causal plain, the local window
    with softcap and sink together (the largest mainloop), and causal over packed Q/K with seqused."""
    from .config import REPRESENTATIVE_HEAD_DIMS

    largest = {dims[0] for dims in REPRESENTATIVE_HEAD_DIMS.values()}
    cases = []
    for spec, cfg in dispatchable_fwd(model):
        layout = (spec.varlen_q, spec.varlen_k, spec.seqused_q, spec.seqused_k)
        plain = not (spec.softcap or spec.has_sink or spec.local) and not any(layout)
        everything = spec.local and spec.softcap and spec.has_sink
        packed = spec.causal and all(layout)
        ci = spec.dtype == "bf16" and (spec.head_dim, spec.head_dim_v) in largest and (plain or everything or packed)
        cases.append(Case(spec, cfg, model.name, subset_ci=ci))
    seen = {case.name for case in cases}
    cases += [case for case in (Case(spec, cfg, model.name) for spec, cfg in invariant_pairs(model))
              if case.name not in seen]  # batch-invariant tiles the dispatch does not already run
    for spec in combine_specs():
        ci = spec.dtype == "bf16" and spec.head_dim_v == 256 and spec.varlen_q and spec.has_sink
        cases.append(CombineCase(spec, model.name, subset_ci=ci))
    for spec in append_specs():
        ci = spec.dtype == "bf16" and spec.head_dim == 256 and spec.rotary_dim == 256 and spec.page_size > 0
        cases.append(AppendCase(spec, model.name, subset_ci=ci))
    cases += flex_cases(model)
    cases += sparse_cases(model)
    cases += dropout_cases(model)
    side = {}
    bwd_pairs = dispatchable_bwd(model)
    bwd_pairs += [pair for pair in bwd_invariant_pairs(model) if pair not in set(bwd_pairs)]  # batch-invariant tiles
    for spec, cfg in bwd_pairs:
        ci = (spec.dtype == "bf16" and spec.head_dim == spec.head_dim_v and spec.head_dim in (128, 256) and spec.causal
              and spec.group_split <= 2)
        cases.append(BwdCase(spec, cfg, model.name, subset_ci=ci))
        for which in ("preprocess", "postprocess"):
            for dlse in (False, True) if which == "preprocess" else (False,):
                case = BwdSideCase(which, dataclasses.replace(spec, has_dlse=dlse), cfg, model.name)
                side.setdefault(case.name, case)
    return cases + list(side.values())


def flex_cases(model: ExecutionModel = SM120) -> list[Case]:
    """The forward with mods: each example of ``flex_examples.gate_examples`` traced into the table's
    d128 and d64 configs, packed-GQA, varlen (packed Q and K) and the persistent ping-pong mainloop; and the
    backward main kernel with the same mods (score_mod_bwd: the example's derivative) at d128, d64 and varlen
    d128; then the heaviest examples at d96, d192/128, d256, fp16 and with a sink (forward and backward), and
    split-KV, paged and paged split-KV forwards; and the mods that read aux tensors or aux scalars. The CI subset takes ALiBi +
    causal mask at d128, forward."""
    from . import flex_examples

    forced_persistent = FwdConfig(256, 32, 8, 2, mainloop="tma", overlap=True, pingpong=True, persistent=True)
    cases = []
    for ex in flex_examples.gate_examples():
        key, bwd_key = _example_keys(ex)
        for d, pack, varlen in ((128, False, False), (64, False, False), (128, True, False), (128, False, True)):
            spec = FwdSpec("bf16", d, d, causal=False, pack_gqa=pack, varlen_q=varlen, varlen_k=varlen, mods=key)
            ci = d == 128 and not (pack or varlen) and ex.score_mod is not None and ex.mask_mod is not None
            cases.append(Case(spec, select_fwd_config(spec, model), model.name, subset_ci=ci, label=ex.name))
        spec = FwdSpec("bf16", 128, 128, causal=False, mods=key)
        cases.append(Case(spec, forced_persistent, model.name, label=ex.name))
        # the backward of the same mods: score_mod_bwd of an example is its analytic derivative
        for d, varlen in ((128, False), (64, False), (128, True)):
            bspec = BwdSpec("bf16", d, d, causal=False, varlen_q=varlen, varlen_k=varlen, mods=bwd_key)
            cases.append(BwdCase(bspec, select_bwd_config(bspec, model), model.name, label=ex.name))
    # every other head-dim class, fp16, a sink, split-KV decode and paged K/V, with the heaviest examples (a
    # transcendental score_mod; ALiBi + a mask), forward and backward (paged K/V has no backward; the backward's
    # spec has no sink: dsink is a torch reduction)
    for ex in (flex_examples.softcap(30.0), flex_examples.combined(flex_examples.alibi(8), flex_examples.causal())):
        key, bwd_key = _example_keys(ex)
        for dtype, d, dv, extra in (("bf16", 96, 96, {}), ("bf16", 192, 128, {}), ("bf16", 256, 256, {}),
                                    ("fp16", 128, 128, {}), ("bf16", 128, 128, dict(has_sink=True))):
            spec = FwdSpec(dtype, d, dv, causal=False, mods=key, **extra)
            cases.append(Case(spec, select_fwd_config(spec, model), model.name, label=ex.name))
            if not extra:
                for split in (1, 2) if d == 192 else (1,):  # the group split with mods (d256: refused)
                    bspec = BwdSpec(dtype, d, dv, causal=False, mods=bwd_key, group_split=split)
                    cases.append(BwdCase(bspec, select_bwd_config(bspec, model), model.name, label=ex.name))
        for extra in (dict(pack_gqa=True, split_kv=True), dict(page_size=16),
                      dict(page_size=16, pack_gqa=True, split_kv=True)):
            spec = FwdSpec("bf16", 128, 128, causal=False, mods=key, **extra)
            cases.append(Case(spec, select_fwd_config(spec, model), model.name, label=ex.name))
    # mods that read aux tensors (the kernels' aux slots): forward at d128 and d64, backward at d128
    for ex in flex_examples.aux_gate_examples():
        key, bwd_key = _example_keys(ex)
        for d in (128, 64):
            spec = FwdSpec("bf16", d, d, causal=False, mods=key)
            cases.append(Case(spec, select_fwd_config(spec, model), model.name, label=ex.name))
        bspec = BwdSpec("bf16", 128, 128, causal=False, mods=bwd_key)
        cases.append(BwdCase(bspec, select_bwd_config(bspec, model), model.name, label=ex.name))
    return cases


def sparse_cases(model: ExecutionModel = SM120) -> list[Case]:
    """The block-sparse forward: every config the dispatcher may pick (``dispatch_candidates``) for
    (128, 128) lists at each head-dim class, without mods, with the causal flag and with a document mask_mod;
    at d128 also (128, 64) lists without full lists, fp16, a sink, ALiBi beside the mask and the document mask
    read from an aux tensor. The CI subset takes the d128 document mask."""
    from . import flex_examples

    docs, docs_bwd = _example_keys(flex_examples.chunked_local(512))
    alibi_docs, alibi_docs_bwd = _example_keys(flex_examples.combined(flex_examples.alibi(8),
                                                                      flex_examples.chunked_local(512)))
    aux_docs = _example_keys(flex_examples.aux_gate_examples()[1])[0]
    full = (128, 128, True)
    specs = []
    for d, dv in ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256)):
        specs += [(FwdSpec("bf16", d, dv, causal=False, block_sparse=full), ""),
                  (FwdSpec("bf16", d, dv, causal=True, block_sparse=full), ""),
                  (FwdSpec("bf16", d, dv, causal=False, block_sparse=full, mods=docs), "chunked_local")]
    specs += [(FwdSpec("bf16", 128, 128, causal=False, block_sparse=(128, 64, False), mods=docs), "chunked_local"),
              (FwdSpec("fp16", 128, 128, causal=False, block_sparse=full, mods=docs), "chunked_local"),
              (FwdSpec("bf16", 128, 128, causal=False, has_sink=True, block_sparse=full, mods=docs), "chunked_local"),
              (FwdSpec("bf16", 128, 128, causal=False, block_sparse=full, mods=alibi_docs), "alibi+chunked_local"),
              (FwdSpec("bf16", 128, 128, causal=False, block_sparse=full, mods=aux_docs), "documents")]
    cases = []
    for spec, label in specs:
        ci = spec.dtype == "bf16" and spec.head_dim == 128 and label == "chunked_local" and not spec.has_sink \
            and spec.block_sparse == full
        for i, cfg in enumerate(dispatch_candidates(spec, model)):
            cases.append(Case(spec, cfg, model.name, subset_ci=ci and i == 0, label=label))
    # the backward's walk of the host's lists: each class plain, causal and with the document mask, (128, 64)
    # blocks at d128 and d64, ALiBi beside the mask at d128
    bwd = []
    for d, dv in ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256)):
        bwd += [(BwdSpec("bf16", d, dv, causal=False, block_sparse=(128, 128)), ""),
                (BwdSpec("bf16", d, dv, causal=True, block_sparse=(128, 128)), ""),
                (BwdSpec("bf16", d, dv, causal=False, block_sparse=(128, 128), mods=docs_bwd), "chunked_local")]
    bwd += [(BwdSpec("bf16", d, d, causal=False, block_sparse=(128, 64), mods=docs_bwd), "chunked_local")
            for d in (64, 128)]
    bwd.append((BwdSpec("bf16", 128, 128, causal=False, block_sparse=(128, 128), mods=alibi_docs_bwd),
                "alibi+chunked_local"))
    tiles = set()
    for spec, label in bwd:
        cfg = select_bwd_config(spec, model)
        tiles.add((cfg.tile_m, cfg.tile_n))
        cases.append(BwdCase(spec, cfg, model.name, label=label))
    # the refinement of the backward's lists by the mask_mod, at every tile those backward kernels walk, for the
    # document mask computed and read from an aux tensor
    for key, label in ((docs, "chunked_local"), (aux_docs, "documents")):
        for tile_m, tile_n in sorted(tiles):
            cases.append(RefineCase(RefineSpec(key, tile_m, tile_n), model.name, label=label,
                                    subset_ci=label == "chunked_local" and (tile_m, tile_n) == (64, 64)))
    return cases


def dropout_cases(model: ExecutionModel = SM120) -> list[Case]:
    """Dropout: every config the dispatcher may pick for a dropout spec at each head-dim class, full and
    causal, forward and backward; at d128 also a window with softcap and sink, varlen, split-KV, fp16, a document
    mask_mod, block-sparse lists and the deterministic backward. The CI subset takes d128 causal, forward and
    backward."""
    from . import flex_examples

    docs, docs_bwd = _example_keys(flex_examples.chunked_local(512))
    fwd, bwd = [], []
    for d, dv in ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256)):
        for causal in (False, True):
            fwd.append(FwdSpec("bf16", d, dv, causal=causal, dropout=True))
            bwd.append(BwdSpec("bf16", d, dv, causal=causal, dropout=True))
    fwd += [FwdSpec("bf16", 64, 64, causal=False, softcap=True, dropout=True),
            FwdSpec("bf16", 128, 128, causal=False, local=True, softcap=True, has_sink=True, dropout=True),
            FwdSpec("bf16", 128, 128, causal=True, varlen_q=True, varlen_k=True, dropout=True),
            FwdSpec("bf16", 128, 128, causal=False, split_kv=True, dropout=True),
            FwdSpec("fp16", 128, 128, causal=True, dropout=True),
            FwdSpec("bf16", 128, 128, causal=False, mods=docs, dropout=True),
            FwdSpec("bf16", 128, 128, causal=False, block_sparse=(128, 128, True), dropout=True)]
    bwd += [BwdSpec("bf16", 64, 64, causal=False, softcap=True, dropout=True),
            BwdSpec("bf16", 64, 64, causal=False, varlen_q=True, varlen_k=True, dropout=True),
            BwdSpec("bf16", 128, 128, causal=False, local=True, softcap=True, dropout=True),
            BwdSpec("bf16", 128, 128, causal=True, varlen_q=True, varlen_k=True, dropout=True),
            BwdSpec("bf16", 128, 128, causal=True, deterministic=True, dropout=True),
            BwdSpec("fp16", 128, 128, causal=True, dropout=True),
            BwdSpec("bf16", 128, 128, causal=False, mods=docs_bwd, dropout=True),
            BwdSpec("bf16", 128, 128, causal=True, block_sparse=(128, 128), dropout=True),
            # d96's and d128's kv_in_regs entries with dropout (d128's on full walks only): their features and
            # orders, and the head dims they pad
            BwdSpec("bf16", 96, 96, causal=True, varlen_q=True, varlen_k=True, dropout=True),
            BwdSpec("bf16", 96, 96, causal=True, deterministic=True, dropout=True),
            BwdSpec("bf16", 96, 96, causal=True, deterministic=True, lowest_first=True, dropout=True),
            BwdSpec("bf16", 96, 96, causal=True, varlen_q=True, varlen_k=True, deterministic=True, dropout=True),
            BwdSpec("bf16", 96, 96, causal=False, local=True, dropout=True),
            BwdSpec("fp16", 96, 96, causal=False, dropout=True),
            BwdSpec("bf16", 80, 80, causal=False, dropout=True),
            BwdSpec("bf16", 128, 128, causal=False, local=True, dropout=True),
            BwdSpec("fp16", 128, 128, causal=False, dropout=True),
            BwdSpec("bf16", 128, 128, causal=True, deterministic=True, lowest_first=True, dropout=True),
            BwdSpec("bf16", 112, 112, causal=False, dropout=True)]
    cases = []
    for spec in fwd:
        label = "chunked_local" if spec.mods is not None else ""
        ci = spec == FwdSpec("bf16", 128, 128, causal=True, dropout=True)
        for i, cfg in enumerate(dispatch_candidates(spec, model)):
            cases.append(Case(spec, cfg, model.name, subset_ci=ci and i == 0, label=label))
    for spec in bwd:
        label = "chunked_local" if spec.mods is not None else ""
        ci = spec == BwdSpec("bf16", 128, 128, causal=True, dropout=True)
        cases.append(BwdCase(spec, select_bwd_config(spec, model), model.name, subset_ci=ci, label=label))
    return cases


def _example_keys(ex) -> tuple:
    """(forward key, backward key) of a ``flex_examples`` example, registered for the compiler: the backward's
    also holds the example's score_mod_bwd (its analytic derivative)."""
    from . import flex

    mods = dict(score_mod=ex.score_mod, mask_mod=ex.mask_mod, aux_tensors=ex.aux_tensors, aux_scalars=ex.aux_scalars)
    return (flex.register(flex.ModKey.of(**mods), ex.score_mod, None, ex.mask_mod),
            flex.register(flex.ModKey.of(score_mod_bwd=ex.score_mod_bwd, **mods), ex.score_mod, ex.score_mod_bwd,
                          ex.mask_mod))


def candidate_cases(model: ExecutionModel = SM120) -> list[Case]:
    """Every tuning candidate, for both dtypes and masks (the tuner only picks conforming ones)."""
    cases = []
    for spec in dict.fromkeys(spec for spec, _ in dispatchable_fwd(model)):  # a spec may list several configs
        cases += [Case(spec, cfg, model.name) for cfg in candidate_fwd_configs(spec, model)]
    for spec in dict.fromkeys(spec for spec, _ in dispatchable_bwd(model)):
        cases += [BwdCase(spec, cfg, model.name) for cfg in candidate_bwd_configs(spec, model)]
    return cases


def make_case(
    head_dim: int = 128,
    head_dim_v: Optional[int] = None,
    tile_m: int = 128,
    tile_n: int = 64,
    num_warps: int = 8,
    num_stages: int = 2,
    q_in_regs: bool = False,
    mainloop: str = "cp_async",
    frag_prefetch: bool = True,
    overlap: bool = False,
    pingpong: bool = False,
    persistent: bool = False,
    mbarrier_release: bool = False,
    warps_on_keys: bool = False,
    dv_warps: int = 1,
    causal: bool = True,
    local: bool = False,
    softcap: bool = False,
    has_sink: bool = False,
    varlen: bool = False,
    seqused: bool = False,
    pack_gqa: bool = False,
    split_kv: bool = False,
    page_size: int = 0,
    dtype: str = "bf16",
    kv_dtype: Optional[str] = None,
    latent_v: bool = False,
    model: str = SM120.name,
) -> Case:
    spec = FwdSpec(dtype=dtype, head_dim=head_dim, head_dim_v=head_dim_v or head_dim, causal=causal and not local,
                   local=local, softcap=softcap, has_sink=has_sink, varlen_q=varlen, varlen_k=varlen and not page_size,
                   seqused_q=seqused, seqused_k=seqused or bool(page_size), pack_gqa=pack_gqa, split_kv=split_kv,
                   page_size=page_size, kv_dtype=kv_dtype, latent_v=latent_v)
    cfg = FwdConfig(tile_m=tile_m, tile_n=tile_n, num_warps=num_warps, num_stages=num_stages, q_in_regs=q_in_regs,
                    mainloop=mainloop, frag_prefetch=frag_prefetch, overlap=overlap, pingpong=pingpong,
                    persistent=persistent, mbarrier_release=mbarrier_release, warps_on_keys=warps_on_keys,
                    dv_warps=dv_warps)
    return Case(spec, cfg, model)


def compile_for_conformance(case: Case, target: str = "sm_120a", check_valid: bool = True,
                            dump_dir: Optional[str] = None):
    """Compile ``case`` for ``target`` keeping PTX/CUBIN/SASS; returns (compiled, smem bytes per CTA).

    ``check_valid=False`` skips the validity predicate so a test can feed a config that breaks a
    rule and watch the gate catch it. The DSL writes the kept artifacts (the SASS artifact is a path)
    into ``dump_dir``; by default a fresh temporary directory, never the working directory.
    """
    import tempfile

    model = model_for_arch_string(case.model_name.removeprefix("sm"))
    keep = f"{_KEEP_ARTIFACTS} --dump-dir {dump_dir or tempfile.mkdtemp(prefix='fa4sm120-conformance-')}"
    if isinstance(case, CombineCase):
        return compile_combine(case.spec, model, target, keep), 0
    if isinstance(case, AppendCase):
        return compile_append(case.spec, model, target, keep), 0
    if isinstance(case, RefineCase):
        return compile_refine(case.spec, model, target, keep), 0
    if isinstance(case, BwdSideCase):
        smem = 0 if case.which == "preprocess" else \
            case.config.tile_m * bwd_padded_head_dim(case.spec.head_dim, case.config) * 2  # the 16-bit dQ tile
        return compile_bwd_side(case.which, case.spec, case.config, model, target, keep), smem
    if isinstance(case, BwdCase):
        return (compile_bwd(case.spec, case.config, model, target, keep, check_valid=check_valid),
                bwd_smem_bytes(case.spec, case.config))
    if check_valid:
        problems = fwd_kernel_class(case.config, case.spec).can_implement(case.spec, case.config, model)
        if problems:
            raise ValueError(f"{case.name} is not a valid config: {'; '.join(problems)}")
    compiled = compile_fwd(case.spec, case.config, model, target, keep, check_valid=False)
    return compiled, fwd_smem_bytes(case.spec, case.config)
