"""Compiling kernels: the compile function's parameters are the cache key.

``compile_fwd(spec, config, model, target)`` builds the kernel for symbolic sizes (batch, sequence
lengths, head counts and strides are runtime values), so one compiled object serves every shape of
a spec. The compile cache key is exactly ``("fwd", spec, config, model, target)`` plus the versions
the cache folds in; nothing else influences the generated code.

The conformance gate's cases and how it compiles them are ``conformance``'s.
"""

from __future__ import annotations

from typing import Optional

from .bwd_config import BwdConfig, bwd_padded_head_dim
from .config import FwdConfig
from .execution_model import ExecutionModel
from .problem import AppendSpec, BwdSpec, CombineSpec, FwdSpec, RefineSpec

_TVM_FFI = "--enable-tvm-ffi"


def _fake_tensor(elem, shape, rows_of_vectors: bool = True):
    """A fake tensor with symbolic strides and a unit last stride. ``rows_of_vectors``: every row
    stride a multiple of a 16-byte vector and a 16-byte aligned base (Q/K/V/O, fp32 partial O); else
    any stride and 4-byte alignment (fp32 LSE)."""
    import cutlass.cute as cute

    vec = 128 // elem.width if rows_of_vectors else 1
    stride = tuple(cute.sym_int64(divisibility=vec) for _ in shape[:-1]) + (1,)
    return cute.runtime.make_fake_tensor(elem, shape, stride=stride, assumed_align=16 if rows_of_vectors else 4)


def _fake_vector(elem, n):
    """A contiguous 1-D fake tensor (cu_seqlens, seqused, sink)."""
    import cutlass.cute as cute

    return cute.runtime.make_fake_tensor(elem, (n,), stride=(1,), assumed_align=4)


#: The aux tensors a kernel with mods takes: trailing optional tensor parameters ``mAux0..mAux3``,
#: None unless the spec's ``ModKey.aux_tensors`` names one; every launch passes ``aux_args(...)``.
MAX_AUX_TENSORS = 4
#: the aux tensors' element types (torch names; ``_fake_aux`` maps them to the DSL's)
AUX_DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "uint8", "int8")


#: The aux scalars a kernel with mods takes: the runtime scalar parameters ``sAux0..sAux3`` after the aux tensors'
#: slots, None unless the spec's ``ModKey.aux_scalars`` names one.
MAX_AUX_SCALARS = 4
#: an aux scalar's kernel parameter type by the type name ``ModKey.aux_scalars`` records (Python's or the DSL's)
AUX_SCALAR_TYPES = {"int": "Int32", "Int32": "Int32", "float": "Float32", "Float32": "Float32", "bool": "Boolean",
                    "Boolean": "Boolean"}
_NO_AUX = (None,) * (MAX_AUX_TENSORS + MAX_AUX_SCALARS)


def aux_args(aux: tuple = ()) -> tuple:
    """A call's aux inputs (``FwdParams.aux``: its aux tensors, then its aux scalars as Python numbers) for the
    kernels' trailing slots: the tensors padded to ``MAX_AUX_TENSORS``, then the scalars to ``MAX_AUX_SCALARS``."""
    if not aux:
        return _NO_AUX
    tensors = [a for a in aux if not isinstance(a, (int, float))]
    scalars = [a for a in aux if isinstance(a, (int, float))]
    return (*tensors, *(None,) * (MAX_AUX_TENSORS - len(tensors)), *scalars,
            *(None,) * (MAX_AUX_SCALARS - len(scalars)))


#: The block-sparse tensors a forward kernel takes: four trailing optional tensor parameters
#: ``mBlockCnt, mBlockIdx, mFullCnt, mFullIdx`` after the aux slots; every forward launch passes
#: ``sparse_args(...)``.
SPARSE_SLOTS = 4


def sparse_args(sparse: tuple = ()) -> tuple:
    """A call's block-sparse tensors (``FwdParams.sparse``) in the forward kernels' sparse slots."""
    return tuple(sparse) if sparse else (None,) * SPARSE_SLOTS


def _fake_any(elem, ndim: int):
    """A fake tensor of ``ndim`` symbolic sizes and strides, the last dimension contiguous, aligned to its
    element (the aux and sparse slots: any shape a caller passes)."""
    import cutlass.cute as cute

    stride = tuple(cute.sym_int64() for _ in range(ndim - 1)) + (1,)
    return cute.runtime.make_fake_tensor(elem, tuple(cute.sym_int() for _ in range(ndim)), stride=stride,
                                         assumed_align=elem.width // 8)


def _fake_sparse(block_sparse) -> tuple:
    """The sparse slots' fakes: int32 (batch or 1, heads or 1, blocks) counts and (..., entries) indices, the
    last dimension contiguous (a broadcast dimension has stride 0); the full pair only when the spec has it."""
    import cutlass

    if block_sparse is None:
        return sparse_args()
    full = (_fake_any(cutlass.Int32, 3), _fake_any(cutlass.Int32, 4)) if block_sparse[2] else (None, None)
    return (_fake_any(cutlass.Int32, 3), _fake_any(cutlass.Int32, 4), *full)


def _fake_rng(dropout: bool):
    """The dropout slot's fake: int32 (seed low, seed high, offset, threshold), or None without
    dropout (the kernels' trailing ``mRng``; every launch passes the call's ``FwdParams.rng``)."""
    import cutlass

    return _fake_vector(cutlass.Int32, 4) if dropout else None


def _fake_aux(mods) -> tuple:
    """The aux slots' fakes: a tensor of the recorded (dtype, ndim) per aux tensor of ``mods`` (symbolic sizes
    and strides, unit last stride) and a runtime scalar of the recorded type per aux scalar, None for the rest."""
    import cutlass

    if mods is None or not (mods.aux_tensors or mods.aux_scalars):
        return aux_args()
    types = dict(zip(AUX_DTYPES, (cutlass.Float32, cutlass.Float16, cutlass.BFloat16, cutlass.Int32, cutlass.Int64,
                                  cutlass.Uint8, cutlass.Int8)))
    tensors = tuple(_fake_any(types[dtype], ndim) for dtype, ndim in mods.aux_tensors)
    scalars = tuple(getattr(cutlass, AUX_SCALAR_TYPES[name])(0) for name in mods.aux_scalars)
    return (*aux_args(tensors)[:MAX_AUX_TENSORS], *scalars, *(None,) * (MAX_AUX_SCALARS - len(scalars)))


def _fake_fwd_args(spec: FwdSpec):
    """Fake tensors with symbolic sizes/strides (static: head dims, unit last stride, 16 B alignment)."""
    import cutlass
    import cutlass.cute as cute

    from ._kernels import CUTLASS_DTYPES

    dtype = CUTLASS_DTYPES[spec.dtype]
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, total_q, total_k = (cute.sym_int() for _ in range(7))

    def rows(packed, seqlen, total, heads, d, elem=dtype, splits=()):
        """(batch, seqlen, heads, d) dense or (total, heads, d) packed; ``splits`` prepends the split-KV
        dimension of a partial-output workspace."""
        return _fake_tensor(elem, splits + ((total, heads, d) if packed else (batch, seqlen, heads, d)))

    def int_vector(n):
        return _fake_vector(cutlass.Int32, n)

    kv_dtype = CUTLASS_DTYPES[spec.kv_dtype] if spec.kv_dtype else dtype
    q = rows(spec.varlen_q, seqlen_q, total_q, heads_q, spec.head_dim, kv_dtype if spec.fp8_mma else dtype)
    if spec.page_size:  # (num_pages, page_size, heads_kv, d) caches, the page size static
        num_pages = cute.sym_int()
        k = _fake_tensor(kv_dtype, (num_pages, spec.page_size, heads_kv, spec.k_head_dim))
        v = _fake_tensor(kv_dtype, (num_pages, spec.page_size, heads_kv, spec.head_dim_v))
    else:
        k = rows(spec.varlen_k, seqlen_k, total_k, heads_kv, spec.k_head_dim, kv_dtype)
        v = rows(spec.varlen_k, seqlen_k, total_k, heads_kv, spec.head_dim_v, kv_dtype)
    # split-KV: fp32 partial O and LSE with a leading (num_splits,) dimension
    splits = (cute.sym_int(),) if spec.split_kv else ()
    o = rows(spec.varlen_q, seqlen_q, total_q, heads_q, spec.head_dim_v,
             cutlass.Float32 if spec.split_kv else dtype, splits)
    lse_shape = splits + ((heads_q, total_q) if spec.varlen_q else (batch, heads_q, seqlen_q))
    lse = _fake_tensor(cutlass.Float32, lse_shape, rows_of_vectors=False)
    sink = _fake_vector(cutlass.Float32, heads_q) if spec.has_sink else None
    batch_p1 = cute.sym_int()
    cu_q = int_vector(batch_p1) if spec.varlen_q else None
    cu_k = int_vector(batch_p1) if spec.varlen_k else None
    used_q = int_vector(cute.sym_int()) if spec.seqused_q else None
    used_k = int_vector(cute.sym_int()) if spec.seqused_k else None
    # page table (batch, max_pages): rows contiguous, any row stride
    page_table = (cute.runtime.make_fake_tensor(cutlass.Int32, (cute.sym_int(), cute.sym_int()),
                                                stride=(cute.sym_int64(), 1), assumed_align=4)
                  if spec.page_size else None)
    # scale_log2, softcap_scale, window_left, window_right are runtime scalars; so are max_seqlen_q,
    # num_splits, max_ctas and tile_band.
    scalars = (cutlass.Float32(1.0), cutlass.Float32(0.0), cutlass.Int32(0), cutlass.Int32(0))
    return (q, k, v, o, lse, *scalars, sink, cu_q, cu_k, used_q, used_k, page_table, cutlass.Int32(0), cutlass.Int32(1),
            cutlass.Int32(0), cutlass.Int32(1), *_fake_aux(spec.mods), *_fake_sparse(spec.block_sparse),
            _fake_rng(spec.dropout), *_fake_descales(spec.kv_dtype), cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))


def _fake_descales(kv_dtype) -> tuple:
    """The FP8 K/V descale slots' fakes: fp32 (batch, heads_kv) of K and of V, any strides (FlashAttention-3's
    per-tensor scales come as expanded views, strides 0); (None, None) for 16-bit K/V."""
    import cutlass
    import cutlass.cute as cute

    if kv_dtype is None:
        return None, None
    return tuple(cute.runtime.make_fake_tensor(cutlass.Float32, (cute.sym_int(), cute.sym_int()),
                                               stride=(cute.sym_int64(), cute.sym_int64()), assumed_align=4)
                 for _ in range(2))


def fwd_kernel_class(config: FwdConfig, spec: Optional[FwdSpec] = None):
    """The kernel class of a config's mainloop variant (FP8 MMAs: ``spec.fp8_mma``, a cp.async variant)."""
    if config.warps_on_keys and spec is not None and spec.kv_dtype:
        from ._kernels.fwd_keysplit_fp8 import FlashFwdKeySplitFP8

        return FlashFwdKeySplitFP8
    if config.warps_on_keys:
        from ._kernels.fwd_keysplit import FlashFwdKeySplit

        return FlashFwdKeySplit
    if config.dv_warps > 1:
        from ._kernels.fwd_wide import FlashFwdWide

        return FlashFwdWide
    if spec is not None and spec.fp8_mma:
        from ._kernels.fwd_fp8_mma import FlashFwdFP8Mma

        return FlashFwdFP8Mma
    if not config.uses_tma:
        from ._kernels.fwd_multistage import FlashFwdMultistage

        return FlashFwdMultistage
    if config.persistent:
        from ._kernels.fwd_persistent import FlashFwdPersistent

        return FlashFwdPersistent
    from ._kernels.fwd_tma import FlashFwdTma

    return FlashFwdTma


def compile_fwd(spec: FwdSpec, config: FwdConfig, model: ExecutionModel, target: str, extra_options: str = "",
                check_valid: bool = True, launch_smem: int = 0):
    """Trace and compile the forward kernel for ``target``; returns the JIT-compiled callable
    ``fn(q, k, v, out, lse, scale_log2, softcap_scale, window_left, window_right, sink, cu_seqlens_q,
    cu_seqlens_k, seqused_q, seqused_k, page_table, max_seqlen_q, num_splits, max_ctas, tile_band, aux0, aux1,
    aux2, aux3, the four sparse slots, rng, k_descale, v_descale)`` taking torch tensors (TVM FFI, current stream; ``*aux_args(params.aux)`` fills the aux slots);
    the optional tensors are None unless the spec's matching flag is set
    (``page_table`` with ``spec.page_size``: k / v are then (num_pages, page_size, heads_kv, d) caches). With
    ``spec.split_kv`` out/lse are the fp32 (num_splits, ...) partial workspaces. ``max_ctas`` caps the
    grid of persistent configs (``config.persistent``: one CTA per SM, so the SM count); others ignore it.
    ``tile_band``: (batch, head) pairs per band of the causal/local longest-first tile order
    (``config.tile_band``); unmasked specs ignore it. ``check_valid=False``
    skips the kernel's own check (the conformance gate compiles configs that break a rule on purpose).
    ``launch_smem``: launch with at least this much dynamic shared memory, which pins how many CTAs
    share an SM (``config.occupancy_launch_smem``: the model's CTAs per SM on a larger part)."""
    import cutlass.cute as cute

    cls = fwd_kernel_class(config, spec)
    problems = cls.can_implement(spec, config, model) if check_valid else ()
    if problems:
        raise ValueError(f"forward kernel cannot implement {spec} with {config} on {model.name}: {'; '.join(problems)}")
    kernel = cls(spec, config, model)
    kernel.launch_smem = launch_smem
    options = f"{_TVM_FFI} --gpu-arch {target} {extra_options}".strip()
    return cute.compile(kernel, *_fake_fwd_args(spec), options=options)


def get_fwd_kernel(spec: FwdSpec, config: FwdConfig, model: ExecutionModel, target: str, launch_smem: int = 0):
    """The compiled forward kernel from the compile cache (memory, then disk, then compile).
    ``launch_smem``: ``config.occupancy_launch_smem`` of the part it will run on (0 on the model's own)."""
    from .compile_cache import default_cache

    return default_cache().get(
        ("fwd", spec, config, model, target, launch_smem),
        lambda: compile_fwd(spec, config, model, target, launch_smem=launch_smem),
    )


def _fake_combine_args(spec: CombineSpec):
    """Fake tensors for the combine kernel: fp32 partials (num_splits, *O) / (num_splits, *LSE), O and
    LSE in the forward's layouts, symbolic sizes."""
    import cutlass
    import cutlass.cute as cute

    from ._kernels import CUTLASS_DTYPES

    splits, batch, seqlen, heads, total = (cute.sym_int() for _ in range(5))
    rows = (total, heads, spec.head_dim_v) if spec.varlen_q else (batch, seqlen, heads, spec.head_dim_v)
    lse_shape = (heads, total) if spec.varlen_q else (batch, heads, seqlen)
    o_part = _fake_tensor(cutlass.Float32, (splits, *rows))
    lse_part = _fake_tensor(cutlass.Float32, (splits, *lse_shape), rows_of_vectors=False)
    o = _fake_tensor(CUTLASS_DTYPES[spec.dtype], rows)
    lse = _fake_tensor(cutlass.Float32, lse_shape, rows_of_vectors=False)
    sink = _fake_vector(cutlass.Float32, heads) if spec.has_sink else None
    cu_q = _fake_vector(cutlass.Int32, cute.sym_int()) if spec.varlen_q else None
    used_q = _fake_vector(cutlass.Int32, cute.sym_int()) if spec.seqused_q else None
    return (o_part, lse_part, o, lse, sink, cu_q, used_q, cutlass.Int32(0),
            cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))


def compile_combine(spec: CombineSpec, model: ExecutionModel, target: str, extra_options: str = ""):
    """Trace and compile the split-KV combine kernel; returns ``fn(o_partial, lse_partial, out, lse,
    sink, cu_seqlens_q, seqused_q, max_seqlen_q)`` taking torch tensors (TVM FFI, current stream)."""
    from ._kernels.fwd_combine import FlashFwdCombine

    return _compile_small(FlashFwdCombine, "combine", spec, model, target, _fake_combine_args, extra_options)


def _compile_small(cls, what: str, spec, model: ExecutionModel, target: str, fake_args, extra_options: str):
    """Compile a kernel class built from (spec, model) alone (the combine, the KV-cache append) on
    ``fake_args(spec)``, after its ``can_implement``."""
    import cutlass.cute as cute

    problems = cls.can_implement(spec, model)
    if problems:
        raise ValueError(f"{what} kernel cannot implement {spec}: {'; '.join(problems)}")
    options = f"{_TVM_FFI} --gpu-arch {target} {extra_options}".strip()
    return cute.compile(cls(spec, model), *fake_args(spec), options=options)


def get_combine_kernel(spec: CombineSpec, model: ExecutionModel, target: str):
    """The compiled combine kernel from the compile cache."""
    from .compile_cache import default_cache

    return default_cache().get(("combine", spec, model, target), lambda: compile_combine(spec, model, target))


def _fake_append_args(spec: AppendSpec):
    """Fake tensors for the KV-cache append kernel (``_kernels/kv_append.py``), symbolic sizes; the
    tensors a spec does not use are None."""
    import cutlass
    import cutlass.cute as cute

    from ._kernels import CUTLASS_DTYPES

    dtype = CUTLASS_DTYPES[spec.dtype]
    batch, heads_q, heads_kv = (cute.sym_int() for _ in range(3))

    def rows(packed, heads, d):
        return _fake_tensor(dtype, (cute.sym_int(), heads, d) if packed else (batch, cute.sym_int(), heads, d))

    def int_vector(n=None):
        return _fake_vector(cutlass.Int32, n if n is not None else cute.sym_int())

    rotary = spec.rotary_dim > 0
    q = rows(spec.varlen_q, heads_q, spec.head_dim) if rotary else None
    q_out = rows(spec.varlen_q, heads_q, spec.head_dim) if rotary else None
    k_new = rows(spec.varlen_new, heads_kv, spec.head_dim) if spec.new_kv else None
    v_new = rows(spec.varlen_new, heads_kv, spec.head_dim_v) if spec.new_kv else None
    slots = (cute.sym_int(), spec.page_size or cute.sym_int())  # (num_pages, page_size) or (batch_cache, seqlen)
    cache_dtype = CUTLASS_DTYPES[spec.cache_dtype] if spec.cache_dtype else dtype
    k_cache = _fake_tensor(cache_dtype, (*slots, heads_kv, spec.head_dim))
    v_cache = _fake_tensor(cache_dtype, (*slots, heads_kv, spec.head_dim_v))
    page_table = (cute.runtime.make_fake_tensor(cutlass.Int32, (batch, cute.sym_int()), stride=(cute.sym_int64(), 1),
                                                assumed_align=4) if spec.page_size else None)
    # cos / sin (seqlen_ro, rotary_dim / 2): rows of whole 16-byte vectors
    cos, sin = ((_fake_tensor(dtype, (cute.sym_int(), spec.rotary_dim // 2)) for _ in range(2)) if rotary
                else (None, None))
    return (q, q_out, k_new, v_new, k_cache, v_cache, page_table, int_vector(batch),
            int_vector(batch) if spec.batch_idx else None, int_vector(batch) if spec.leftpad else None,
            int_vector(batch) if spec.rotary_seqlens else None, cos, sin,
            int_vector() if spec.varlen_q and rotary else None, int_vector() if spec.varlen_new and spec.new_kv else None,
            int_vector(batch), int_vector() if spec.key_starts else None, cutlass.Int32(0),
            *_fake_descales(spec.cache_dtype if spec.new_kv else None),
            cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))


def compile_append(spec: AppendSpec, model: ExecutionModel, target: str, extra_options: str = ""):
    """Trace and compile the KV-cache append kernel; returns ``fn(q, q_out, k_new, v_new, k_cache, v_cache,
    page_table, cache_seqlens, cache_batch_idx, cache_leftpad, rotary_seqlens, cos, sin, cu_seqlens_q,
    cu_seqlens_k_new, used_k, key_start, max_rows, k_descale, v_descale)`` taking torch tensors (TVM FFI, current
    stream); the descales (fp32 (batch, heads_kv)) only when new keys go into FP8 caches."""
    from ._kernels.kv_append import KVCacheAppend

    return _compile_small(KVCacheAppend, "append", spec, model, target, _fake_append_args, extra_options)


def get_append_kernel(spec: AppendSpec, model: ExecutionModel, target: str):
    """The compiled KV-cache append kernel from the compile cache."""
    from .compile_cache import default_cache

    return default_cache().get(("append", spec, model, target), lambda: compile_append(spec, model, target))


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------
def _fake_bwd_args(spec: BwdSpec, config: BwdConfig):
    """Fake arguments of the backward main kernel: Q, K, V, dO, the fp32 workspaces (LSE2 and D' rows,
    the dQ accumulator with the padded head dim), dK, dV; symbolic sizes."""
    import cutlass
    import cutlass.cute as cute

    from ._kernels import CUTLASS_DTYPES

    dtype = CUTLASS_DTYPES[spec.dtype]
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, total_q, total_k, rows_pad = (cute.sym_int() for _ in range(8))

    def rows(packed, seqlen, total, heads, d):
        return _fake_tensor(dtype, (total, heads, d) if packed else (batch, seqlen, heads, d))

    q, do = rows(spec.varlen_q, seqlen_q, total_q, heads_q, spec.head_dim), \
        rows(spec.varlen_q, seqlen_q, total_q, heads_q, spec.head_dim_v)
    # dK / dV: the KV heads, or their group_split partial copies (a size of their own)
    heads_dkv = heads_kv if spec.group_split == 1 else cute.sym_int()
    k, dk = (rows(spec.varlen_k, seqlen_k, total_k, h, spec.head_dim) for h in (heads_kv, heads_dkv))
    v, dv = (rows(spec.varlen_k, seqlen_k, total_k, h, spec.head_dim_v) for h in (heads_kv, heads_dkv))
    ws_rows = (heads_q, rows_pad) if spec.varlen_q else (batch, heads_q, rows_pad)
    lse2, dsum = (_fake_tensor(cutlass.Float32, ws_rows, rows_of_vectors=False) for _ in range(2))
    dq_acc = _fake_tensor(cutlass.Float32, (*ws_rows, bwd_padded_head_dim(spec.head_dim, config)))
    sem_shape = (heads_q, cute.sym_int()) if spec.varlen_q else (batch, heads_q, cute.sym_int())
    sem = _fake_tensor(cutlass.Int32, sem_shape, rows_of_vectors=False) if spec.deterministic else None
    batch_p1 = cute.sym_int()
    cu_q = _fake_vector(cutlass.Int32, batch_p1) if spec.varlen_q else None
    cu_k = _fake_vector(cutlass.Int32, batch_p1) if spec.varlen_k else None
    used_q = _fake_vector(cutlass.Int32, cute.sym_int()) if spec.seqused_q else None
    used_k = _fake_vector(cutlass.Int32, cute.sym_int()) if spec.seqused_k else None
    return (q, k, v, do, lse2, dsum, dq_acc, sem, dk, dv, cutlass.Float32(1.0), cutlass.Float32(1.0),
            cutlass.Float32(0.0), cutlass.Int32(0), cutlass.Int32(0), cu_q, cu_k, used_q, used_k, cutlass.Int32(0),
            cutlass.Int32(1), *_fake_aux(spec.mods),
            *_fake_sparse((*spec.block_sparse, True) if spec.block_sparse else None),
            _fake_rng(spec.dropout), cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))


def compile_bwd(spec: BwdSpec, config: BwdConfig, model: ExecutionModel, target: str, extra_options: str = "",
                check_valid: bool = True, launch_smem: int = 0):
    """Trace and compile the backward main kernel; returns ``fn(q, k, v, dout, lse2, dsum, dq_accum, semaphores,
    dk, dv, softmax_scale, scale_log2, softcap_scale, window_left, window_right, cu_seqlens_q, cu_seqlens_k,
    seqused_q, seqused_k, max_seqlen_k, band, aux0, aux1, aux2, aux3, block-sparse lists, rng)`` taking torch tensors
    (TVM FFI, current stream); ``band``: (batch, KV head) pairs per band of the longest-first key-block order
    (``bwd_schedule.bwd_tile_band``), ignored by other specs."""
    import cutlass.cute as cute

    from ._kernels.bwd_multistage import FlashBwdMultistage
    from ._kernels.bwd_rolesplit import FlashBwdRoleSplit

    cls = FlashBwdRoleSplit if config.role_split else FlashBwdMultistage
    problems = cls.can_implement(spec, config, model) if check_valid else ()
    if problems:
        raise ValueError(f"backward kernel cannot implement {spec} with {config} on {model.name}: "
                         f"{'; '.join(problems)}")
    kernel = cls(spec, config, model)
    kernel.launch_smem = launch_smem
    options = f"{_TVM_FFI} --gpu-arch {target} {extra_options}".strip()
    return cute.compile(kernel, *_fake_bwd_args(spec, config), options=options)


def get_bwd_kernel(spec: BwdSpec, config: BwdConfig, model: ExecutionModel, target: str, launch_smem: int = 0):
    """The compiled backward main kernel from the compile cache."""
    from .compile_cache import default_cache

    return default_cache().get(
        ("bwd", spec, config, model, target, launch_smem),
        lambda: compile_bwd(spec, config, model, target, launch_smem=launch_smem),
    )


def _fake_bwd_side_args(spec: BwdSpec, config: BwdConfig):
    """(preprocess args, postprocess args): O, dO, LSE, dLSE into the LSE2 / D' workspaces; the dQ
    accumulator into dQ. Symbolic sizes."""
    import cutlass
    import cutlass.cute as cute

    from ._kernels import CUTLASS_DTYPES

    dtype = CUTLASS_DTYPES[spec.dtype]
    batch, seqlen, heads, total, rows_pad = (cute.sym_int() for _ in range(5))

    def rows(d):
        return _fake_tensor(dtype, (total, heads, d) if spec.varlen_q else (batch, seqlen, heads, d))

    lse_shape = (heads, total) if spec.varlen_q else (batch, heads, seqlen)
    lse, dlse = (_fake_tensor(cutlass.Float32, lse_shape, rows_of_vectors=False) for _ in range(2))
    ws_rows = (heads, rows_pad) if spec.varlen_q else (batch, heads, rows_pad)
    lse2, dsum = (_fake_tensor(cutlass.Float32, ws_rows, rows_of_vectors=False) for _ in range(2))
    dq_acc = _fake_tensor(cutlass.Float32, (*ws_rows, bwd_padded_head_dim(spec.head_dim, config)))
    cu_q = _fake_vector(cutlass.Int32, cute.sym_int()) if spec.varlen_q else None
    used_q = _fake_vector(cutlass.Int32, cute.sym_int()) if spec.seqused_q else None
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    pre = (rows(spec.head_dim_v), rows(spec.head_dim_v), lse, dlse if spec.has_dlse else None, lse2, dsum, cu_q,
           used_q, cutlass.Int32(0), stream)
    post = (dq_acc, rows(spec.head_dim), cutlass.Float32(1.0), cu_q, used_q, cutlass.Int32(0), stream)
    return pre, post


def compile_bwd_side(which: str, spec: BwdSpec, config: BwdConfig, model: ExecutionModel, target: str,
                     extra_options: str = ""):
    """The backward's ``"preprocess"`` (``fn(out, dout, lse, dlse, lse2, dsum, cu_seqlens_q, seqused_q,
    max_seqlen_q)``) or ``"postprocess"`` (``fn(dq_accum, dq, softmax_scale, cu_seqlens_q, seqused_q,
    max_seqlen_q)``) kernel. ``config`` sets the dQ accumulator's padded head dim and, for the postprocess,
    its fragment order (the main kernel's dQ tiled MMA)."""
    import cutlass.cute as cute

    if which == "preprocess":
        from ._kernels.bwd_preprocess import FlashBwdPreprocess as cls
    else:
        from ._kernels.bwd_postprocess import FlashBwdPostprocess as cls
    problems = cls.can_implement(spec, model)
    if problems:
        raise ValueError(f"backward {which} cannot implement {spec}: {'; '.join(problems)}")
    pre, post = _fake_bwd_side_args(spec, config)
    options = f"{_TVM_FFI} --gpu-arch {target} {extra_options}".strip()
    kernel = cls(spec, model) if which == "preprocess" else cls(spec, config, model)
    return cute.compile(kernel, *(pre if which == "preprocess" else post), options=options)


def get_bwd_side_kernel(which: str, spec: BwdSpec, config: BwdConfig, model: ExecutionModel, target: str):
    """The compiled backward preprocess / postprocess kernel from the compile cache."""
    from .compile_cache import default_cache

    return default_cache().get((f"bwd_{which}", spec, config, model, target),
                               lambda: compile_bwd_side(which, spec, config, model, target))


def _fake_refine_args(spec: RefineSpec):
    """The refinement's arguments: the int8 (batch, heads, query tiles, key tiles) class grid, the sequence lengths
    and the mods' aux slots. Symbolic sizes."""
    import cutlass
    import cutlass.cute as cute

    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return (_fake_any(cutlass.Int8, 4), cutlass.Int32(0), cutlass.Int32(0), *_fake_aux(spec.mods), stream)


def compile_refine(spec: RefineSpec, model: ExecutionModel, target: str, extra_options: str = ""):
    """Trace and compile the block-sparse tile refinement (``_kernels/sparse_refine``); returns ``fn(tiles,
    seqlen_q, seqlen_k, aux0, aux1, aux2, aux3)`` rewriting the int8 class grid ``tiles`` in place."""
    from ._kernels.sparse_refine import SparseTileRefine

    return _compile_small(SparseTileRefine, "sparse refine", spec, model, target, _fake_refine_args, extra_options)


def get_refine_kernel(spec: RefineSpec, model: ExecutionModel, target: str):
    """The compiled block-sparse tile refinement from the compile cache."""
    from .compile_cache import default_cache

    return default_cache().get(("sparse_refine", spec, model, target), lambda: compile_refine(spec, model, target))
