"""Host-side description of a forward call: validation of user tensors and the frozen spec.

``FwdSpec`` holds exactly the facts that change generated code (dtype, head dims, causal). Sizes
(batch, sequence lengths, head counts) are runtime values: one compiled kernel serves them all.
Pure host code: no CUDA calls, no allocation.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Optional

import torch

from . import manifest
from .flex import ModKey

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
#: FP8 K/V element types (``FwdSpec.kv_dtype``): read as stored, dequantized in the kernel, scaled by the
#: call's ``k_descale`` / ``v_descale`` (FlashAttention-3's convention)
FP8_DTYPES = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


@dataclass(frozen=True)
class FwdSpec:
    dtype: str  # "bf16" | "fp16"
    head_dim: int
    head_dim_v: int
    causal: bool
    #: sliding window (left, right) bounds, runtime values; causal + window is local with right = 0
    local: bool = False
    #: logits = softcap * tanh(scores / softcap); the softcap value itself is a runtime value
    softcap: bool = False
    #: a learnable per-head sink logit in the softmax denominator (gpt-oss)
    has_sink: bool = False
    #: packed (total, heads, d) Q/O with cu_seqlens_q, and/or packed K/V with cu_seqlens_k (varlen)
    varlen_q: bool = False
    varlen_k: bool = False
    #: per-sequence used lengths (seqused_q / seqused_k)
    seqused_q: bool = False
    seqused_k: bool = False
    #: GQA packing: the query heads of a KV group share one M tile (row p = query p // group, head
    #: p % group); chosen per call by ``config.use_pack_gqa`` (short queries) or the caller
    pack_gqa: bool = False
    #: split-KV: the grid also splits each tile's key blocks into ``num_splits`` ranges (a runtime
    #: value); every split writes fp32 partial O and LSE, merged by the combine kernel
    #: (``CombineSpec``), which also adds the learnable sink: a split spec never has one
    split_kv: bool = False
    #: split-KV in fixed chunks (batch invariance, ``config.INVARIANT_CHUNK_KEYS``): split ``s`` visits the key
    #: blocks ``[s * split_chunk, (s + 1) * split_chunk)`` of every tile, whatever the call's length, so a row's
    #: partials start at the same keys in every call; 0 = each tile's blocks cut into ``num_splits`` even pieces
    split_chunk: int = 0
    #: paged K/V: keys per page of the (num_pages, page_size, heads_kv, d) caches, addressed through a page
    #: table (batch, max_pages); 0 = K/V dense or packed. Compile-time (a constant divisor), one build per
    #: page size a serving engine uses
    page_size: int = 0
    #: the identity of the call's score_mod / mask_mod (``flex.ModKey``; the callables are traced into
    #: the kernel, compiled from ``flex.callables``), None without mods
    mods: Optional[ModKey] = None
    #: block sparsity, ``(query block, key block, full lists given)`` of the call's block-sparse
    #: tensors (compile-time: the kernel divides by the block sizes); None without
    block_sparse: Optional[tuple] = None
    #: attention dropout (``dropout.py``'s mask; the seed, offset and threshold are runtime values in the
    #: kernels' dropout slot). False compiles exactly the kernel without dropout
    dropout: bool = False
    #: FP8 K/V ("e4m3" | "e5m2"), None when K/V have ``dtype``: the kernel copies the FP8 tiles to shared
    #: memory, widens each thread's own copies to ``dtype`` there (exact: every FP8 value is a bf16 / fp16
    #: value) and runs the 16-bit MMAs; ``k_descale`` folds into the softmax scale, ``v_descale`` into O's
    #: normalization, per (batch, KV head) (``_kernels/kv_dequant``)
    kv_dtype: Optional[str] = None
    #: Q, K and V all e4m3 (``kv_dtype`` "e4m3"; ``dtype`` is O's, bf16): both GEMMs are FP8 ``mma.sync``
    #: (m16n8k32), P is rounded to e4m3 in registers, as FlashAttention-3's FP8 forward does; the tiles move and
    #: are read by ldmatrix as 16-bit tiles of byte pairs (``_kernels/fwd_fp8_mma``). False: Q has ``dtype``
    fp8_mma: bool = False
    #: MLA's absorbed attention (``qv``): each key's ``head_dim``-wide row is [latent | rope], stored as V (the
    #: latent, ``head_dim_v`` columns) and K (the rope, ``LATENT_ROPE_DIM`` columns); V is the latent itself, read
    #: once into the key tile for both GEMMs; q is [qv | q]
    latent_v: bool = False

    @property
    def k_head_dim(self) -> int:
        """K's own head dim: the rope part of an MLA key (``latent_v``), else ``head_dim``."""
        return self.head_dim - self.head_dim_v if self.latent_v else self.head_dim

    @property
    def mask(self) -> str:
        """The mask kind: "causal", "local" (a window, causal or not) or "full"."""
        return "causal" if self.causal else ("local" if self.local else "full")

    @property
    def longest_first(self) -> bool:
        """Whether the forward's tiles run longest first (``_kernels/tile_scheduler``): their key ranges differ
        between query blocks under a causal mask or a window (the diagonal) and under block-sparse lists, whose
        usual patterns (causal, prefix-LM, chunked or sliding windows as mask_mods) grow with the query block
        as causal does; lists of equal lengths (documents, random maps) lose nothing by the order."""
        return self.causal or self.local or self.block_sparse is not None


@dataclass(frozen=True)
class CombineSpec:
    """What changes the code of the split-KV combine kernel: the output dtype and head dim, the Q
    layout (dense or packed with cu_seqlens_q, seqused_q) and the sink. The split count is runtime."""

    dtype: str
    head_dim_v: int
    varlen_q: bool = False
    seqused_q: bool = False
    has_sink: bool = False

    @staticmethod
    def of(spec: FwdSpec, has_sink: bool) -> "CombineSpec":
        return CombineSpec(dtype=spec.dtype, head_dim_v=spec.head_dim_v, varlen_q=spec.varlen_q,
                           seqused_q=spec.seqused_q, has_sink=has_sink)


@dataclass(frozen=True)
class RefineSpec:
    """What changes the code of the block-sparse tile refinement (``_kernels/sparse_refine``): the
    call's mods (the mask_mod's digest and the aux tensors' types) and the backward's tile, whose sub-blocks of
    the forward's partial blocks it classifies. Sequence lengths are runtime values."""

    mods: ModKey
    tile_m: int
    tile_n: int


@dataclass(frozen=True)
class BwdSpec:
    """What changes the code of the backward kernels (``_kernels/bwd_*``): the forward's features of the
    call being differentiated. Sizes, scales and window bounds are runtime
    values. Packed GQA and split-KV are forward schedules, not features: the backward of such a call is
    the plain backward of its spec. A learnable sink changes no backward code: it enters the kernels only
    through the LSE, and its gradient is a reduction over the preprocess's D (``backward``)."""

    dtype: str
    head_dim: int
    head_dim_v: int
    causal: bool
    local: bool = False
    softcap: bool = False
    varlen_q: bool = False
    varlen_k: bool = False
    seqused_q: bool = False
    seqused_k: bool = False
    #: the caller differentiates through the returned LSE (the preprocess folds dLSE into D)
    has_dlse: bool = False
    #: bitwise-reproducible gradients: the key blocks of a query block add their dQ in a fixed order
    #: (a semaphore per query block; ``_kernels/dq_accum``)
    deterministic: bool = False
    #: the deterministic mode's order (``bwd_schedule.bwd_det_order``; causal, no window): the lowest key block of a
    #: query block adds first, the key blocks launch lowest first in the banded longest-first order and walk their
    #: query blocks last first, heads inner; else the highest adds first, the key blocks launch highest first, one
    #: pair after another, and walk their query blocks first to last (``_kernels/dq_accum``)
    lowest_first: bool = False
    #: the deterministic mode's rotated order (no mask, no window, no lists; ``bwd_schedule.bwd_rotated_turns``): key
    #: block n walks its query blocks from block n, and query block m takes its additions from key block m (or the
    #: last) down, wrapping, so every key block's predecessor reached the block steps earlier; where a sequence has
    #: more key blocks than query blocks, the highest-first order (``_kernels/dq_accum.turn_rank``)
    rotated_turns: bool = False
    #: the forward's mods (``flex.ModKey``): the backward recomputes the modified scores and applies
    #: score_mod_bwd to dS
    mods: Optional[ModKey] = None
    #: the main kernel's query-head group split (``bwd_schedule.bwd_group_split``): each KV head's CTAs come
    #: ``group_split`` times, each walking ``group / group_split`` query heads into its own partial dK / dV head
    #: (the host sums them); a compile-time divisor, so 1 is exactly the unsplit kernel
    group_split: int = 1
    #: block sparsity, the forward's (query block, key block); the main kernel walks per (batch, KV
    #: head, key tile) lists of (query head, query tile) steps the host derives from the forward's lists
    #: (``block_sparse.backward_lists``), which needs tiles dividing the blocks. None without
    block_sparse: Optional[tuple] = None
    #: the forward's dropout: the backward regenerates its keep mask (``_kernels/dropout_mask``)
    dropout: bool = False

    @property
    def longest_first(self) -> bool:
        """Whether the main kernel's key blocks run in the banded longest-first order
        (``_kernels/tile_scheduler.KeyBlockScheduler``): under a causal mask key block n is visited by the query
        blocks from its diagonal on, so the CTAs' lengths fall with n; block-sparse lists too, as in the forward
        (their usual patterns -- causal, prefix-LM, chunked or sliding windows as mask_mods -- fall with n as
        causal does; lists of equal lengths lose nothing by the order). The deterministic mode in its lowest-first
        order only (``lowest_first``; its highest-first order launches a pair's key blocks highest first). Not under
        a window without lists (lengths about equal)."""
        if self.deterministic and not self.lowest_first:
            return False
        return self.block_sparse is not None or (self.causal and not self.local)

    @staticmethod
    def of(spec: "FwdSpec", has_dlse: bool = False, deterministic: bool = False) -> "BwdSpec":
        if spec.page_size:
            raise NotImplementedError("backward through paged K/V: paged caches are an inference layout; "
                                      "train with dense or packed (cu_seqlens_k) K/V")
        if spec.kv_dtype:
            raise NotImplementedError("backward through FP8 K/V: FP8 K/V serve inference; train in bfloat16 or "
                                      "float16")
        if max(spec.head_dim, spec.head_dim_v) > MAX_BWD_HEAD_DIM:  # the manifest's head_dim_512+backward
            manifest.check_combination(["head_dim_512", "backward"])
        return BwdSpec(dtype=spec.dtype, head_dim=spec.head_dim, head_dim_v=spec.head_dim_v, causal=spec.causal,
                       local=spec.local, softcap=spec.softcap, varlen_q=spec.varlen_q,
                       varlen_k=spec.varlen_k, seqused_q=spec.seqused_q, seqused_k=spec.seqused_k,
                       has_dlse=has_dlse, deterministic=deterministic, mods=spec.mods,
                       block_sparse=spec.block_sparse[:2] if spec.block_sparse is not None else None,
                       dropout=spec.dropout)


@dataclass(frozen=True)
class FwdShape:
    """Runtime sizes of one call (not part of any compile key)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    num_heads: int
    num_heads_kv: int


#: The forward's and the combine's (upstream's combine too); past 256 the forward runs ``_kernels/fwd_wide``
MAX_HEAD_DIM = 512
#: The backward's: past it a CTA's K / V tiles with their fp32 gradients exceed an SM120 CTA (``BwdSpec.of``)
MAX_BWD_HEAD_DIM = 256
#: MLA's rope head dim (``FwdSpec.latent_v``): DeepSeek-V2 / V3 and Kimi-K2 keep 64 of each key's 576 columns
LATENT_ROPE_DIM = 64


def check_head_dim(name: str, d: int) -> None:
    """The one head-dim rule: multiples of 8 (16-byte rows) from 8 to 512."""
    if d % 8 != 0 or not 8 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{name} {d}: head dims must be multiples of 8 between 8 and {MAX_HEAD_DIM} "
                         "(16-byte rows); pad the head dim with zeros to the next multiple of 8")


def _check_tensor(name: str, t, expected_rank: int = 4, fp8: bool = False) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != expected_rank:
        layout = "(batch, seqlen, heads, head_dim)" if expected_rank == 4 else "(total_tokens, heads, head_dim) with cu_seqlens"
        raise ValueError(f"{name} must have rank {expected_rank} {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES and not (fp8 and t.dtype in FP8_DTYPES):
        also = " (k and v also torch.float8_e4m3fn / torch.float8_e5m2)" if fp8 else ""
        raise TypeError(f"{name} has dtype {t.dtype}; flash_attn_4_sm120 supports torch.bfloat16 and torch.float16"
                        f"{also}")
    shape, stride = t.shape, t.stride()
    check_head_dim(f"{name} head dim", shape[-1])
    if t.dtype in FP8_DTYPES and shape[-1] % 16:
        raise ValueError(f"{name} head dim {shape[-1]}: FP8 rows are copied as 16-byte vectors, so FP8 head dims are "
                         "multiples of 16; pad the head dim with zeros to the next multiple of 16")
    if stride[-1] != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension (stride {stride[-1]}); call .contiguous() first"
        )
    # 16-byte vector loads: the base address and every row stride must be multiples of 16 bytes.
    if t.data_ptr() % 16 != 0:
        raise ValueError(
            f"{name} data pointer is not 16-byte aligned (address % 16 = {t.data_ptr() % 16}); "
            "pass a tensor that starts on a 16-byte boundary (e.g. .clone())"
        )
    d = misaligned_row_dim(t)
    if d is not None:
        raise ValueError(
            f"{name} stride {stride[d]} of dim {d} is not a multiple of 16 bytes; call .contiguous() first"
        )


def kernel_layout(t):
    """``t`` itself, or a contiguous copy when the kernels cannot read it in place: a last dimension
    that is not contiguous (a transposed view), or a base address or row stride that is not a multiple
    of 16 bytes. Upstream FlashAttention-4 copies such inputs too; the copy costs one pass over the
    tensor (and its memory), so callers that care pass contiguous tensors. Anything else is returned
    as is and left to validation."""
    if (not isinstance(t, torch.Tensor) or (t.dtype not in _DTYPES and t.dtype not in FP8_DTYPES) or t.dim() == 0
            or t.numel() == 0):
        return t
    if t.data_ptr() % 16 == 0 and t.is_contiguous():  # the common case, decided in two cheap calls
        return t  # (contiguous rows of 8-multiple head dims are 16-byte multiples)
    if t.stride(-1) != 1 or t.data_ptr() % 16 or misaligned_row_dim(t) is not None:
        return t.clone(memory_format=torch.contiguous_format)
    return t


def misaligned_row_dim(t) -> Optional[int]:
    """The first dim (of size > 1, last excluded) whose stride is not a multiple of 16 bytes, or None:
    the kernels load and store rows as 16-byte vectors."""
    vec = 16 // t.element_size()
    shape, stride = t.shape, t.stride()
    for d in range(len(shape) - 1):
        if stride[d] % vec and shape[d] > 1:
            return d
    return None


@dataclass(frozen=True)
class FwdParams:
    """Runtime scalars/tensors of one call, in the units the kernel takes."""

    softmax_scale: float
    #: exp2 scale of the stored scores: scale*log2(e), or softcap*log2(e) when the softcap is on
    scale_log2: float
    #: multiplier inside tanh (scale / softcap); 0 without softcap
    softcap_scale: float
    window_left: int
    window_right: int
    sink: Optional[torch.Tensor]
    #: the mods' aux tensors, in the kernels' trailing aux slots (``compiler.MAX_AUX_TENSORS``)
    aux: tuple = ()
    #: block sparsity: (mask_block_cnt, mask_block_idx, full_block_cnt, full_block_idx), the last two
    #: None without full lists; () without block sparsity
    sparse: tuple = ()
    #: dropout: the kernels' int32 (seed low, seed high, offset, threshold) slot
    #: (``dropout.rng_tensor``); None without dropout
    rng: Optional[torch.Tensor] = None
    #: FP8 K/V: fp32 (batch, heads_kv) scales of K (times q's, for FP8 q) and of V, any strides
    #: (``validation.fp8_scales``); () for 16-bit K/V
    descale: tuple = ()


#: log2(e): natural-log quantities times this are exp2 / log2 quantities (host and kernels)
LOG2_E = 1.0 / math.log(2.0)


def _window_entry(x) -> Optional[int]:
    """None or an integer (Python, NumPy or a 0-d integer tensor: anything with ``__index__``)."""
    if x is None:
        return None
    if not isinstance(x, bool):
        try:
            return operator.index(x)
        except TypeError:
            pass
    raise TypeError(f"window_size entries must be int or None, got {x!r}")


def resolve_window(causal: bool, window_size) -> tuple[bool, bool, Optional[int], Optional[int]]:
    """FlashAttention-4's window convention: ``(causal_mask, local, left, right)`` for the user's
    ``causal`` and ``window_size=(left, right)``; None is unbounded.

    Query row i sees key j iff ``i + off - left <= j <= i + off + right`` (``off = seqlen_k - seqlen_q``),
    a missing bound dropping its side. A negative bound is a real offset: ``(None, -w)`` ends each
    row's keys w before the diagonal, ``(-w, None)`` starts them w after it. ``causal`` sets
    ``right = 0``. Only when both bounds are given and ``left + right < 0`` does the pair mean "no
    window" (so FA2's ``(-1, -1)`` stays unbounded, also with ``causal``). ``(None, 0)`` is the causal
    mask."""
    if window_size is None:
        window_size = (None, None)
    window_size = tuple(window_size)
    if len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    left, right = (_window_entry(x) for x in window_size)
    if causal:
        right = 0
    if left is not None and right is not None and left + right < 0:
        left = right = None
    if left is None and right == 0:
        return True, False, None, None
    if left is None and right is None:
        return bool(causal), False, None, None
    return False, True, left, right


def element_types(q, k) -> dict:
    """The spec's element-type fields for validated ``q`` / ``k``: ``dtype`` (O's), FP8 K/V's ``kv_dtype`` and,
    for an e4m3 q, ``fp8_mma`` (O in bf16, as FlashAttention-3 returns for FP8 inputs)."""
    if q.dtype in FP8_DTYPES:
        return dict(dtype="bf16", kv_dtype=FP8_DTYPES[k.dtype], fp8_mma=True)
    return dict(dtype=_DTYPES[q.dtype], kv_dtype=FP8_DTYPES.get(k.dtype))


def _check_heads_and_dims(q, k, v, heads_q: int, heads_kv: int) -> None:
    if k.dtype != v.dtype or (q.dtype != k.dtype and k.dtype not in FP8_DTYPES):
        raise TypeError(f"q, k, v must share a dtype (or k and v be FP8 beside a bf16 / fp16 q), got {q.dtype}, "
                        f"{k.dtype}, {v.dtype}")
    if q.dtype in FP8_DTYPES and q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"q, k, v are {q.dtype}: FP8 MMAs take e4m3 inputs (P is rounded to e4m3 too); pass "
                        "torch.float8_e4m3fn, or a bf16 q beside the FP8 K/V")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q head_dim {q.shape[-1]} != k head_dim {k.shape[-1]}")
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"num_heads_q ({heads_q}) must be a multiple of num_heads_kv ({heads_kv}) for MHA/GQA/MQA")


def _runtime_params(q, num_heads, softmax_scale, causal, window_size, softcap, learnable_sink, unbounded):
    """(FwdParams, local, causal_mask) from the user's scalars; ``unbounded`` bounds a window side."""
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    softmax_scale = float(softmax_scale)
    if not math.isfinite(softmax_scale) or softmax_scale <= 0.0:
        raise ValueError(f"softmax_scale must be a finite positive number, got {softmax_scale}")
    softcap = float(softcap or 0.0)
    if not math.isfinite(softcap) or softcap < 0.0:
        raise ValueError(f"softcap must be 0 (off) or a finite positive number, got {softcap}")
    causal_mask, local, left, right = resolve_window(causal, window_size)
    sink = None
    if learnable_sink is not None:
        if not isinstance(learnable_sink, torch.Tensor) or learnable_sink.shape != (num_heads,):
            raise ValueError(f"learnable_sink must be a tensor of shape (num_heads,) = ({num_heads},), "
                             f"got {getattr(learnable_sink, 'shape', type(learnable_sink))}")
        if not learnable_sink.is_floating_point() or learnable_sink.device != q.device:
            raise ValueError(f"learnable_sink must be a floating-point tensor on {q.device}")
        sink = learnable_sink.detach().to(torch.float32).contiguous()
    if q.device.type != "cuda":
        raise ValueError(f"flash_attn_4_sm120 runs on CUDA tensors; got tensors on {q.device}")
    params = FwdParams(
        softmax_scale=softmax_scale,
        scale_log2=(softcap if softcap > 0.0 else softmax_scale) * LOG2_E,
        softcap_scale=softmax_scale / softcap if softcap > 0.0 else 0.0,
        window_left=_clamp_bound(left, unbounded),
        window_right=_clamp_bound(right, unbounded),
        sink=sink,
    )
    return params, local, causal_mask, softcap > 0.0


def _clamp_bound(x: Optional[int], unbounded: int) -> int:
    """A window bound in the kernel's Int32 range: None, and anything wider than every sequence the
    tensors can hold (``unbounded`` = rows of Q plus rows of K), become ``unbounded``; a bound more
    negative than that hides every key, as ``-unbounded`` does."""
    return unbounded if x is None else max(-unbounded, min(x, unbounded))


def validate_fwd(q, k, v, softmax_scale: Optional[float], causal: bool, window_size=(None, None),
                 softcap: float = 0.0, learnable_sink=None) -> tuple[FwdSpec, FwdShape, FwdParams]:
    """Check dense (batch, seqlen, heads, d) inputs; return the compile spec, runtime shape and parameters."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, fp8=True)
    batch, seqlen_q, num_heads, head_dim = q.shape
    bk, seqlen_k, num_heads_kv, _ = k.shape
    if tuple(v.shape[:3]) != (bk, seqlen_k, num_heads_kv):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in (batch, seqlen_k, heads_kv)")
    if bk != batch:
        raise ValueError(f"q has batch {batch} but k/v have batch {bk}")
    _check_heads_and_dims(q, k, v, num_heads, num_heads_kv)
    params, local, causal_mask, capped = _runtime_params(q, num_heads, softmax_scale, causal, window_size, softcap,
                                                         learnable_sink, seqlen_q + seqlen_k)
    spec = FwdSpec(head_dim=head_dim, head_dim_v=v.shape[3], causal=causal_mask, local=local, softcap=capped,
                   has_sink=params.sink is not None, **element_types(q, k))
    return spec, FwdShape(batch, seqlen_q, seqlen_k, num_heads, num_heads_kv), params


def _check_index_vector(name: str, t, length: Optional[int], device) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
        raise TypeError(f"{name} must be a 1-D torch.int32 tensor, got "
                        f"{getattr(t, 'dtype', type(t).__name__)} with shape {tuple(getattr(t, 'shape', ()))}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries, got {t.shape[0]}")
    if t.device != device or t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous and on {device}")


def validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                    softmax_scale, causal, window_size=(None, None), softcap=0.0, learnable_sink=None,
                    page_table=None):
    """Check varlen inputs: each side (Q/O, K/V) is packed (total, heads, d) with cu_seqlens (batch+1,)
    or dense (batch, seqlen, heads, d); seqused_* (batch,) cap the lengths. Returns (spec, shape, params);
    shape.seqlen_q / seqlen_k are the maxima (``max_seqlen_*``, computed with a device sync when None).
    With ``page_table`` (batch, max_pages) int32, k / v are paged caches (num_pages, page_size, heads_kv,
    d) (``check_page_table``); sequence b's keys are its first ``seqused_k[b]`` (else max_pages *
    page_size) keys through its table row."""
    paged = page_table is not None
    if paged and cu_seqlens_k is not None:
        raise ValueError("page_table with cu_seqlens_k: paged K/V are (num_pages, page_size, heads_kv, head_dim) "
                         "caches whose per-sequence lengths come from seqused_k; pass seqused_k instead of cu_seqlens_k")
    packed_q, packed_k = cu_seqlens_q is not None, cu_seqlens_k is not None
    _check_tensor("q", q, 3 if packed_q else 4, fp8=True)
    _check_tensor("k", k, 3 if packed_k else 4, fp8=True)
    _check_tensor("v", v, 3 if packed_k else 4, fp8=True)
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in all but the head dim")
    _check_heads_and_dims(q, k, v, heads_q, heads_kv)
    batch = None
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu is not None:
            _check_index_vector(name, cu, None if batch is None else batch + 1, q.device)
            batch = cu.shape[0] - 1
    for name, dense in (("q", None if packed_q else q), ("k", None if packed_k or paged else k)):
        if dense is not None:
            if batch is not None and dense.shape[0] != batch:
                raise ValueError(f"dense {name} has batch {dense.shape[0]} but cu_seqlens give {batch} sequences")
            batch = dense.shape[0]
    for name, used in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if used is not None:
            _check_index_vector(name, used, batch, q.device)
    if paged:
        check_page_table(page_table, k, q.device, batch)

    capacity = page_table.shape[1] * k.shape[1] if paged else None  # keys one table row reaches

    def longest(cu, dense, given):
        if given is not None:
            return int(given) if capacity is None or dense is q else min(int(given), capacity)
        if cu is None:
            return capacity if capacity is not None and dense is k else dense.shape[1]
        return int((cu[1:] - cu[:-1]).max().item()) if cu.shape[0] > 1 else 0  # device sync: pass max_seqlen

    max_q = longest(cu_seqlens_q, q, max_seqlen_q)
    max_k = longest(cu_seqlens_k, k, max_seqlen_k)
    if max_q < 0 or max_k < 0:
        raise ValueError("max_seqlen_q / max_seqlen_k must be non-negative")
    # Window bounds are clamped against the rows the tensors hold, not max_seqlen_*: the kernels clamp
    # every sequence to those extents, so no (even corrupt) metadata makes a clamped bound too narrow.
    extent = (q.shape[0] if packed_q else q.shape[1]) + (capacity if paged else k.shape[0] if packed_k else k.shape[1])
    params, local, causal_mask, capped = _runtime_params(q, heads_q, softmax_scale, causal, window_size, softcap,
                                                         learnable_sink, extent)
    spec = FwdSpec(head_dim=q.shape[-1], head_dim_v=v.shape[-1], causal=causal_mask,
                   local=local, softcap=capped, has_sink=params.sink is not None, varlen_q=packed_q,
                   varlen_k=packed_k, seqused_q=seqused_q is not None, seqused_k=seqused_k is not None,
                   page_size=k.shape[1] if paged else 0, **element_types(q, k))
    return spec, FwdShape(batch, max_q, max_k, heads_q, heads_kv), params


def check_page_table(page_table, k, device, batch: int) -> None:
    """A page table the kernels can index: (batch, max_pages) int32 on ``device``, rows contiguous, over
    paged caches that hold at least one page when the table reaches any key. Its entries are clamped
    into the caches' pages in the kernels (``kv_source.PagedKV``); ``metadata.check_page_table_entries``
    checks them on request."""
    if not isinstance(page_table, torch.Tensor) or page_table.dtype != torch.int32 or page_table.dim() != 2:
        raise TypeError(f"page_table must be a 2-D torch.int32 tensor (batch, max_pages), got "
                        f"{getattr(page_table, 'dtype', type(page_table).__name__)} with shape "
                        f"{tuple(getattr(page_table, 'shape', ()))}")
    if page_table.shape[0] != batch:
        raise ValueError(f"page_table has {page_table.shape[0]} rows but q has batch {batch}: one row per sequence")
    if page_table.device != device or (page_table.shape[1] > 1 and page_table.stride(1) != 1):
        raise ValueError(f"page_table must be on {device} with contiguous rows (stride 1 along max_pages)")
    if k.shape[1] == 0:
        raise ValueError(f"paged k {tuple(k.shape)} has page_size 0: k_cache / v_cache are (num_pages, page_size, "
                         "heads_kv, head_dim) with page_size >= 1")
    if k.shape[0] == 0 and page_table.numel():
        raise ValueError(f"page_table {tuple(page_table.shape)} points into paged caches with no pages "
                         f"(k {tuple(k.shape)})")


@dataclass(frozen=True)
class AppendSpec:
    """What changes the code of the KV-cache append kernel (``_kernels/kv_append.py``), which runs
    ahead of ``flash_attn_with_kvcache``'s attention: writes the new keys/values into the cache,
    applies the rotary embedding to q and the new keys, and derives the attention's per-sequence
    key lengths (and starts, for a dense cache with ``cache_batch_idx`` / ``cache_leftpad``)."""

    dtype: str
    head_dim: int
    head_dim_v: int
    #: columns rotated (2 * rotary_cos.shape[1]); 0 = no rotary embedding
    rotary_dim: int = 0
    #: GPT-J pairs (2i, 2i + 1) when True, GPT-NeoX halves (i, i + rotary_dim / 2) when False
    rotary_interleaved: bool = False
    #: q row i sits at position base + i (causal / local attention); else every row at base
    rotary_q_per_row: bool = False
    #: per-sequence rotary base positions (``rotary_seqlens``) instead of ``cache_seqlens``
    rotary_seqlens: bool = False
    #: new keys/values to write at ``cache_seqlens``
    new_kv: bool = False
    #: q packed (total, heads, d) with cu_seqlens_q; new k/v packed with cu_seqlens_k_new
    varlen_q: bool = False
    varlen_new: bool = False
    #: paged cache (num_pages, page_size, heads_kv, d); 0 = dense (batch_cache, seqlen_cache, heads_kv, d)
    page_size: int = 0
    #: dense cache rows of sequence b are ``cache_batch_idx[b]``'s; keys start at ``cache_leftpad[b]``
    batch_idx: bool = False
    leftpad: bool = False
    #: FP8 caches ("e4m3" | "e5m2"; None: the caches have ``dtype``): new keys / values are divided by their
    #: (batch, KV head) scale and rounded to the cache's type, saturating (``_kernels/kv_append``)
    cache_dtype: Optional[str] = None

    @property
    def key_starts(self) -> bool:
        """The attention reads the dense cache as packed rows from per-sequence starts."""
        return self.batch_idx or self.leftpad
