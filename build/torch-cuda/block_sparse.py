"""Block-sparse attention metadata (host side): upstream FlashAttention-4's tensors, built and checked.

For each (batch, head, query block) the forward lists the key blocks it visits, in two classes: **mask**
blocks (some elements kept, some not: the kernel applies the element mask, e.g. a ``mask_mod``) and **full**
blocks (every element kept: no element mask beyond the sequence end). Blocks in neither list are skipped.
The backward walks key blocks and needs the transpose: per (batch, head, key block) the query blocks, in the
same two classes. Tensors (int32, on the inputs' device; batch and head may be 1 and broadcast):

* ``mask_block_cnt (B, H, M)``, ``mask_block_idx (B, H, M, N')`` — block indices ascending, the first
  ``cnt`` entries valid (``N'`` may be less than the block count);
* ``full_block_cnt`` / ``full_block_idx`` likewise (optional: without them every listed block is a mask block);
* ``block_size = (query rows, keys)`` of a block.

The builders here are torch code (CPU or GPU) from a dense boolean mask or a FlexAttention-style mask function
``fn(b, h, q_idx, kv_idx) -> bool tensor`` evaluated on broadcast index tensors (the traced ``mask_mod`` of
the kernels has the upstream signature; a torch twin of it describes the same mask). ``check_block_sparse``
holds a call's tensors against its shapes: blocks are multiples of the kernels' tiles (upstream asks for the
key block to equal its tile_n; here a key block may span several tiles, so FlexAttention's (128, 128) works
at every head dim). It reads shapes and dtypes only (the contents stay on the device; a kernel clamps counts
and indices, so corrupt contents never read past K/V).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, NamedTuple, Optional

import torch

from .config import SPARSE_BLOCK_K, SPARSE_BLOCK_Q

EMPTY, PARTIAL, FULL = 0, 1, 2


class BlockSparseTensorsTorch(NamedTuple):
    """Upstream FlashAttention-4's block-sparse tensors (same field names and order)."""

    mask_block_cnt: torch.Tensor
    mask_block_idx: torch.Tensor
    full_block_cnt: Optional[torch.Tensor] = None
    full_block_idx: Optional[torch.Tensor] = None
    cu_total_m_blocks: Optional[torch.Tensor] = None
    cu_block_idx_offsets: Optional[torch.Tensor] = None
    block_size: Optional[tuple] = None
    dq_write_order: Optional[torch.Tensor] = None
    dq_write_order_full: Optional[torch.Tensor] = None
    spt: Optional[bool] = None


def block_classes(mask: torch.Tensor, block_size: tuple) -> torch.Tensor:
    """(B, H, M, N) int8 classes (EMPTY, PARTIAL, FULL) of a boolean (B, H, seqlen_q, seqlen_k) mask (True =
    keep) in ``block_size = (rows, keys)`` blocks; the elements past the sequence ends of the last blocks
    count for neither class (the kernel masks them anyway)."""
    if mask.dim() != 4 or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (B, H, seqlen_q, seqlen_k), got {mask.dtype} {tuple(mask.shape)}")
    bq, bk = block_size
    b, h, sq, sk = mask.shape
    m, n = -(-sq // bq), -(-sk // bk)
    kept = torch.zeros(b, h, m * bq, n * bk, dtype=torch.int32, device=mask.device)
    valid = torch.zeros(1, 1, m * bq, n * bk, dtype=torch.int32, device=mask.device)
    kept[:, :, :sq, :sk] = mask.to(torch.int32)
    valid[:, :, :sq, :sk] = 1
    kept = kept.view(b, h, m, bq, n, bk).sum(dim=(3, 5))
    valid = valid.view(1, 1, m, bq, n, bk).sum(dim=(3, 5))
    cls = torch.full_like(kept, PARTIAL, dtype=torch.int8)
    cls[kept == 0] = EMPTY
    cls[kept == valid.expand_as(kept)] = FULL
    return cls


def _lists(cls: torch.Tensor, which: int) -> tuple:
    """Per row of ``cls`` (..., rows, cols): the count of entries of class ``which`` and their column indices,
    ascending, packed left (int32; unused slots 0)."""
    hit = cls == which
    cnt = hit.sum(dim=-1, dtype=torch.int32)
    cols = torch.arange(cls.shape[-1], device=cls.device, dtype=torch.int32).expand_as(hit)
    # hits first (in ascending column order), misses after: sort by (not hit, column)
    order = torch.argsort((~hit).to(torch.int32) * cls.shape[-1] + cols, dim=-1, stable=True)
    idx = torch.where(torch.gather(hit, -1, order), torch.gather(cols, -1, order), 0).to(torch.int32)
    return cnt.contiguous(), idx.contiguous()


def block_sparse_from_classes(cls: torch.Tensor, block_size: tuple) -> tuple:
    """The forward tensors (per query block: key blocks) and the backward tensors (per key block: query
    blocks) of block classes ``cls`` (B, H, M, N)."""
    fwd = _lists(cls, PARTIAL) + _lists(cls, FULL)
    bwd = _lists(cls.transpose(-1, -2), PARTIAL) + _lists(cls.transpose(-1, -2), FULL)
    size = tuple(block_size)
    return BlockSparseTensorsTorch(*fwd, block_size=size), BlockSparseTensorsTorch(*bwd, block_size=size)


def block_sparse_from_mask(mask: torch.Tensor, block_size: tuple) -> tuple:
    """(forward, backward) block-sparse tensors of a dense boolean (B, H, seqlen_q, seqlen_k) mask."""
    return block_sparse_from_classes(block_classes(mask, block_size), block_size)


def block_sparse_from_mask_fn(fn: Callable, batch: int, heads: int, seqlen_q: int, seqlen_k: int,
                              block_size: tuple, device=None, rows_per_chunk: int = 1024) -> tuple:
    """(forward, backward) block-sparse tensors of a FlexAttention-style mask function
    ``fn(b, h, q_idx, kv_idx)`` (broadcast int64 index tensors in, a bool tensor out, True = keep), evaluated
    ``rows_per_chunk`` query rows (rounded to whole blocks) at a time so memory stays ``B*H*chunk*seqlen_k``
    bools. ``batch`` / ``heads`` of 1 give tensors that broadcast over the call's."""
    bq, bk = block_size
    rows = max(bq, rows_per_chunk // bq * bq)
    b_idx = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h_idx = torch.arange(heads, device=device).view(1, -1, 1, 1)
    kv_idx = torch.arange(seqlen_k, device=device).view(1, 1, 1, -1)
    parts = []
    for r0 in range(0, seqlen_q, rows):
        q_idx = torch.arange(r0, min(seqlen_q, r0 + rows), device=device).view(1, 1, -1, 1)
        keep = torch.as_tensor(fn(b_idx, h_idx, q_idx, kv_idx), device=device)
        keep = keep.to(torch.bool).expand(batch, heads, q_idx.shape[2], seqlen_k)
        parts.append(block_classes(keep, block_size))
    return block_sparse_from_classes(torch.cat(parts, dim=2), block_size)


def forward_classes(t, key_block: int, seqlen_k: int) -> torch.Tensor:
    """(B', H', M, N) int8 block classes of forward lists ``t`` ((mask_cnt, mask_idx, full_cnt, full_idx), the
    first four fields of ``BlockSparseTensorsTorch``) as the forward kernel reads them: counts clamped to the
    lists' width, indices to the key blocks of ``key_block`` keys (a block in both lists counts as full)."""
    mask_cnt, mask_idx, full_cnt, full_idx = t[:4]
    n = -(-seqlen_k // key_block)
    cls = torch.zeros(*mask_cnt.shape, n + 1, dtype=torch.int32, device=mask_cnt.device)
    pairs = [(mask_cnt, mask_idx, PARTIAL)]
    if full_cnt is not None:
        pairs.append((full_cnt, full_idx, FULL))
    for c, idx, value in pairs:
        valid = torch.arange(idx.shape[-1], device=idx.device) < c.clamp(min=0)[..., None]
        cols = torch.where(valid, idx.long().clamp(0, n - 1), n)  # invalid slots land in a dummy column
        cls.scatter_reduce_(-1, cols, torch.full_like(cols, value, dtype=torch.int32), "amax")
    return cls[..., :n].to(torch.int8)


class TileRefine(NamedTuple):
    """A refinement of the backward's tile classes (``backward_lists``): ``run(tiles)`` takes the (B', H', query
    tiles, key tiles) int8 classes of the forward's lists at the backward's tiles and returns them with each
    PARTIAL tile reclassified by the call's mask_mod (EMPTY, FULL or PARTIAL; a batch or head dimension of 1 may
    grow to the call's where the mask_mod reads that argument); ``key`` names what the result depends on besides
    the lists (the mods, the aux tensors' identities and versions, the batch), ``tensors`` what the key's
    identities refer to (held with a cached result)."""

    run: Callable
    key: tuple
    tensors: tuple = ()


def backward_lists(t, block_size: tuple, heads: int, heads_kv: int, seqlen_q: int, seqlen_k: int, tile_m: int,
                   tile_n: int, refine: Optional[TileRefine] = None) -> tuple:
    """The backward main kernel's lists of forward lists ``t`` (``forward_classes``) of ``block_size`` blocks
    (``BwdSpec.block_sparse``): per (batch or 1, KV
    head, key tile), the entries ``g * query_tiles + m`` (query head ``kv_head * group + g``, query tile ``m``) of
    the tiles to visit, in two classes like the forward's; ``(mask_cnt, mask_idx, full_cnt, full_idx)``, int32.
    The blocks are whole multiples of the tiles (the backward predicate's rule); tiles past the sequences are not
    listed. ``refine``: the tiles of partial blocks classified by the mask_mod first (a causal or document
    diagonal block of 128 holds an empty and a full 64 x 64 tile beside two partial ones)."""
    bq, bk = block_size
    cls = forward_classes(t, bk, seqlen_k)  # (B', H', M, N)
    mt, nt = -(-seqlen_q // tile_m), -(-seqlen_k // tile_n)
    tiles = cls.repeat_interleave(bq // tile_m, dim=2)[:, :, :mt].repeat_interleave(bk // tile_n, dim=3)[..., :nt]
    if refine is not None:
        tiles = refine.run(tiles)
    group = heads // heads_kv
    tiles = tiles.expand(tiles.shape[0], heads, mt, nt)
    steps = tiles.reshape(tiles.shape[0], heads_kv, group, mt, nt).permute(0, 1, 4, 2, 3)
    steps = steps.reshape(tiles.shape[0], heads_kv, nt, group * mt)
    return _lists(steps, PARTIAL) + _lists(steps, FULL)


#: ``backward_lists`` results by the forward lists' identity and version (``cached_backward_lists``)
_BACKWARD_LISTS: OrderedDict = OrderedDict()
#: entries kept (a model reuses one mask per layer and step; a few masks per process)
MAX_CACHED_LISTS = 8


def versions_of(tensors) -> tuple:
    """The version counters of ``tensors`` (None for a None slot); raises ``RuntimeError`` for an inference-mode
    tensor (it tracks none)."""
    return tuple(None if x is None else x._version for x in tensors)


def cached_backward_lists(t, block_size: tuple, heads: int, heads_kv: int, seqlen_q: int, seqlen_k: int,
                          tile_m: int, tile_n: int, refine: Optional[TileRefine] = None) -> tuple:
    """``backward_lists``, remembered per forward list tensors: a training step reuses one block mask in every
    layer and step, and deriving the lists is a dozen small kernels per backward. The key holds the tensors'
    identities and version counters (an in-place change of a tensor makes a new key) and the refinement's key; an
    entry holds the tensors themselves, so no other object takes their identities while it is kept. Tensors
    without a version counter (inference-mode tensors) are not remembered."""
    tensors = tuple(t[:4])
    try:
        versions = versions_of(tensors)
    except RuntimeError:  # inference tensors track no version
        return backward_lists(t, block_size, heads, heads_kv, seqlen_q, seqlen_k, tile_m, tile_n, refine)
    key = (tuple(id(x) for x in tensors), versions, tuple(block_size), heads, heads_kv, seqlen_q, seqlen_k, tile_m,
           tile_n, None if refine is None else refine.key)
    hit = _BACKWARD_LISTS.get(key)
    if hit is not None:
        _BACKWARD_LISTS.move_to_end(key)
        return hit[1]
    lists = backward_lists(t, block_size, heads, heads_kv, seqlen_q, seqlen_k, tile_m, tile_n, refine)
    _BACKWARD_LISTS[key] = (tensors + (refine.tensors if refine is not None else ()), lists)
    while len(_BACKWARD_LISTS) > MAX_CACHED_LISTS:
        _BACKWARD_LISTS.popitem(last=False)
    return lists


def block_sparse_from_example(ex, batch: int, heads: int, seqlen_q: int, seqlen_k: int, block_size=(128, 128),
                              device=None) -> tuple:
    """(forward, backward) block-sparse tensors of a ``flex_examples.Example``'s mask (its ``torch_mask`` twin,
    which also takes the sequence lengths), for the call sizes given; pass the forward ones with the example's
    mask_mod: ``flash_attn_func(q, k, v, mask_mod=ex.mask_mod, block_sparse_tensors=fwd)``."""
    if ex.torch_mask is None:
        raise ValueError(f"example {ex.name!r} has no mask to build block-sparse tensors from")
    return block_sparse_from_mask_fn(lambda b, h, q, k: ex.torch_mask(b, h, q, k, seqlen_q, seqlen_k), batch, heads,
                                     seqlen_q, seqlen_k, block_size, device)


def check_block_sparse(t, batch: int, heads: int, seqlen_q: int, seqlen_k: int, device=None,
                       backward: bool = False) -> tuple:
    """Raise ``ValueError`` naming the problem unless ``t`` (``BlockSparseTensorsTorch`` or upstream's tuple of
    the same fields) fits a call of these sizes; returns the block size ``(query rows, keys)``. The kernels
    walk a query block in whole M tiles and a key block in whole key tiles, so the block must be a multiple
    of (SPARSE_BLOCK_Q, SPARSE_BLOCK_K): (128, 128), FlexAttention's default, and (128, 64) qualify.
    ``backward``: the transposed tensors. Reads shapes and dtypes only: the kernels clamp counts and indices,
    so corrupt contents never address memory outside K / V (they give wrong output, not a fault)."""
    kind = "block_sparse_tensors_bwd" if backward else "block_sparse_tensors"
    if not isinstance(t, tuple) or not hasattr(t, "mask_block_cnt"):
        raise ValueError(f"{kind} must be a BlockSparseTensorsTorch (flash_attn_4_sm120.block_sparse; upstream's "
                         f"named tuple of the same fields works too), got {type(t).__name__}")
    for name in ("cu_total_m_blocks", "cu_block_idx_offsets", "dq_write_order", "dq_write_order_full"):
        if getattr(t, name, None) is not None:
            raise ValueError(f"{kind}.{name}: not supported by this bundle (varlen block sparsity and a custom dQ "
                             f"write order); use dense-batch tensors (the deterministic backward keeps its own order)")
    if getattr(t, "block_size", None) is None:
        raise ValueError(f"{kind}.block_size is required: (query rows, keys) per block, e.g. (128, 128)")
    bq, bk = (int(x) for x in t.block_size)
    if bq <= 0 or bk <= 0 or bq % SPARSE_BLOCK_Q or bk % SPARSE_BLOCK_K:
        raise ValueError(f"{kind}: block_size ({bq}, {bk}) does not match the kernels' tiles: the query block must "
                         f"be a multiple of {SPARSE_BLOCK_Q} and the key block of {SPARSE_BLOCK_K} (e.g. (128, 128), "
                         f"FlexAttention's default); rebuild the tensors with such a block_size")
    m, n = -(-seqlen_q // bq), -(-seqlen_k // bk)
    rows, cols = (n, m) if backward else (m, n)
    pairs = [("mask_block", t.mask_block_cnt, t.mask_block_idx)]
    if (t.full_block_cnt is None) != (t.full_block_idx is None):
        raise ValueError(f"{kind}: full_block_cnt and full_block_idx are given together or not at all")
    if t.full_block_cnt is not None:
        pairs.append(("full_block", t.full_block_cnt, t.full_block_idx))
    for name, cnt, idx in pairs:
        for label, x, dims in ((f"{name}_cnt", cnt, 3), (f"{name}_idx", idx, 4)):
            if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.dim() != dims:
                raise ValueError(f"{kind}.{label} must be an int32 tensor of {dims} dims")
            if device is not None and x.device != device:
                raise ValueError(f"{kind}.{label} is on {x.device}; the call's tensors are on {device}")
            if x.stride(-1) != 1:
                raise ValueError(f"{kind}.{label} must be contiguous in its last dimension")
        if cnt.shape[0] not in (1, batch) or cnt.shape[1] not in (1, heads) or cnt.shape[2] != rows:
            raise ValueError(f"{kind}.{name}_cnt has shape {tuple(cnt.shape)}; expected (batch or 1, heads or 1, "
                             f"{rows}) for {'key' if backward else 'query'} blocks of {bk if backward else bq}")
        if idx.shape[:3] != cnt.shape or not 1 <= idx.shape[3] <= cols:
            raise ValueError(f"{kind}.{name}_idx has shape {tuple(idx.shape)}; expected {tuple(cnt.shape)} + (1..{cols},)")
    return bq, bk
