"""User score and mask modifications traced into the score step (arch-free).

Upstream FlashAttention-4's conventions (docs/design-flex.md, "Contract"):

* ``score_mod(score, b, h, q_idx=, kv_idx=, seqlen_info=, aux_tensors=[, aux_scalars=])`` on ``TensorSSA``
  vectors of ``vec`` adjacent columns (Float32 scores already times the softmax scale, Int32 indices), returning the
  modified scores; the softmax then exponentiates with log2(e) only (the host passes that scale).
* ``mask_mod(b, h, q_idx, kv_idx, seqlen_info, aux_tensors[, aux_scalars])`` on one-element vectors, returning a
  Boolean vector: False sets the score to -inf.
* ``aux_scalars`` (the call's, from the kernels' scalar slots: runtime Int32 / Float32 / Boolean values) reach the
  mods only when the call passes some, so mods written without the parameter keep working.

Indices are positions within the sequence (a varlen mod adds ``seqlen_info.offset_q`` / ``offset_k``); with
aux tensors (``aux_tensors``: the call's, from the kernels' aux slots) they are held to the sequence
(``_in_range``); with packed GQA (tile row p = query row p // group of query head head_kv * group + p % group)
the mods see the logical query row and head. The callables are compile-time constants of the kernel
(``FlexMods``), so the traced code is the user's, inlined.
"""

from dataclasses import dataclass
from typing import Any, Callable, Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr


@dataclass(frozen=True)
class FlexMods:
    """A kernel's mods (compile-time): the callables and the score vector width."""

    score_mod: Optional[Callable] = None
    mask_mod: Optional[Callable] = None
    score_vec: int = 1


@dataclass(frozen=True)
class SeqlenInfo:
    """What a mod may read about its sequence (upstream's field names): the sequence's first row of the packed
    Q / K tensors (0 when dense) and its lengths (``seqused`` honoured)."""

    offset_q: Any
    offset_k: Any
    seqlen_q: Any
    seqlen_k: Any

    @staticmethod
    def of(batch, mCuSeqlensQ, mCuSeqlensK, seqlen_q, seqlen_k) -> "SeqlenInfo":
        """Sequence ``batch``'s: offsets from the cu_seqlens of a packed side (0 for a dense one)."""
        return SeqlenInfo(offset_q=mCuSeqlensQ[batch] if const_expr(mCuSeqlensQ is not None) else Int32(0),
                          offset_k=mCuSeqlensK[batch] if const_expr(mCuSeqlensK is not None) else Int32(0),
                          seqlen_q=seqlen_q, seqlen_k=seqlen_k)


@dataclass(frozen=True)
class AuxInputs:
    """The mods' runtime inputs (trace time): ``tensors`` (a list, None when the call has none: upstream's value
    then) and ``scalars`` (a tuple of runtime numerics, None when the call has none: the mods are then called
    without ``aux_scalars``)."""

    tensors: Any = None
    scalars: Any = None

    def score_kwargs(self) -> dict:
        """The keywords a score_mod / score_mod_bwd takes them by."""
        if self.scalars is None:
            return dict(aux_tensors=self.tensors)
        return dict(aux_tensors=self.tensors, aux_scalars=self.scalars)

    def mask_args(self) -> tuple:
        """The trailing positional arguments a mask_mod takes them by."""
        return (self.tensors,) if self.scalars is None else (self.tensors, self.scalars)


def aux_inputs(mAux0, mAux1, mAux2, mAux3, sAux0, sAux1, sAux2, sAux3) -> AuxInputs:
    """The mods' ``AuxInputs`` from a kernel's aux slots: the given tensors and scalars in order."""
    tensors = [t for t in (mAux0, mAux1, mAux2, mAux3) if t is not None]
    scalars = tuple(x for x in (sAux0, sAux1, sAux2, sAux3) if x is not None)
    return AuxInputs(tensors if tensors else None, scalars if scalars else None)


def _in_range(idx, n, aux: AuxInputs):
    """With aux tensors, ``idx`` held to [0, n - 1] (the sequence's positions): a mod may index an aux tensor
    with it, and the tile's rows / columns past the sequence (whose results are discarded) must not read past
    it; without aux tensors, ``idx`` unchanged (upstream wraps the same indices when aux tensors are given)."""
    if aux is None or aux.tensors is None:
        return idx
    return cutlass.min(cutlass.max(idx, Int32(0)), cutlass.max(n - 1, Int32(0)))


def _vector(values, dtype):
    """A ``TensorSSA`` of the scalar ``values``."""
    t = cute.make_rmem_tensor((len(values),), dtype)
    for i, v in enumerate(values):
        t[i] = v
    return t.load()


def _modify_row(dst_rc, r, vec, srcs, scale, fn, batch, head, q_idx, n_block, tile_n, tScS_rc, seqlen_info,
                aux: AuxInputs):
    """Row ``r`` of ``dst_rc``, ``vec`` adjacent columns at a time: ``fn(*inputs, b, h, q_idx=, kv_idx=,
    seqlen_info=, aux_tensors=[, aux_scalars=])`` on vectors (upstream's call of score_mod and score_mod_bwd), the
    inputs read from the (rows, cols) views ``srcs``, the first times ``scale`` when one is given. Plain Python,
    called from the ``cute.jit`` bodies below while they trace (so its loops are Python's, unrolled)."""
    q_idx = _in_range(q_idx, seqlen_info.seqlen_q, aux)
    for c0 in range(0, cute.size(dst_rc, mode=[1]), vec):  # plain Python: unrolled while tracing
        cols = [_in_range(n_block * tile_n + tScS_rc[r, c0 + j][1], seqlen_info.seqlen_k, aux)
                for j in range(vec)]
        inputs = [_vector([src[r, c0 + j] for j in range(vec)], Float32) for src in srcs]
        if scale is not None:
            inputs[0] = _vector([srcs[0][r, c0 + j] * scale for j in range(vec)], Float32)
        out = fn(*inputs, _vector([batch] * vec, Int32), _vector([head] * vec, Int32),
                 q_idx=_vector([q_idx] * vec, Int32), kv_idx=_vector(cols, Int32),
                 seqlen_info=seqlen_info, **(aux or AuxInputs()).score_kwargs())
        res = cute.make_rmem_tensor((vec,), Float32)
        res.store(out.to(Float32))
        for j in range(vec):
            dst_rc[r, c0 + j] = res[j]


def mask_keeps(mask_mod, batch, head, q_idx, kv_idx, seqlen_info: SeqlenInfo, aux: AuxInputs):
    """``mask_mod`` at one element (upstream's call: one-element vectors in), as a Boolean scalar. Plain Python,
    called while a ``cute.jit`` body traces."""
    keep = mask_mod(_vector([batch], Int32), _vector([head], Int32), _vector([q_idx], Int32),
                    _vector([kv_idx], Int32), seqlen_info, *(aux or AuxInputs()).mask_args())
    kept = cute.make_rmem_tensor((1,), cutlass.Boolean)
    kept.store(keep)
    return kept[0]


@cute.jit
def apply_mods(
    acc_S_rc: cute.Tensor,
    tScS_rc: cute.Tensor,
    mods: cutlass.Constexpr,
    score_scale: Float32,
    batch: Int32,
    head: Int32,
    m_block: Int32,
    n_block: Int32,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    group: Int32,
    seqlen_info: SeqlenInfo,
    aux=None,
    with_mask: cutlass.Constexpr[bool] = True,
):
    """In place on this thread's (rows, cols) view of a score block: ``score_mod`` (scores scaled by
    ``score_scale`` first), then ``mask_mod`` (unless ``with_mask`` is off: a block-sparse full block).
    ``group``: packed GQA's query heads per KV head (``head`` is then the KV head), None when unpacked (``head``
    is the query head)."""
    for r in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[0])):
        row = m_block * tile_m + tScS_rc[r, 0][0]
        q_idx, h_idx = row, head
        if const_expr(group is not None):
            q_idx = row // group
            h_idx = head * group + (row - q_idx * group)
        if const_expr(mods.score_mod is not None):
            _modify_row(acc_S_rc, r, mods.score_vec, (acc_S_rc,), score_scale, mods.score_mod, batch, h_idx, q_idx,
                        n_block, tile_n, tScS_rc, seqlen_info, aux)
        if const_expr(mods.mask_mod is not None and with_mask):
            q_in = _in_range(q_idx, seqlen_info.seqlen_q, aux)
            for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
                col = _in_range(n_block * tile_n + tScS_rc[r, c][1], seqlen_info.seqlen_k, aux)
                s = acc_S_rc[r, c]
                acc_S_rc[r, c] = s if mask_keeps(mods.mask_mod, batch, h_idx, q_in, col, seqlen_info,
                                                 aux) else -Float32.inf


@cute.jit
def apply_score_mod_bwd(
    dS_rc: cute.Tensor,
    pre_rc: cute.Tensor,
    tScS_rc: cute.Tensor,
    score_mod_bwd: cutlass.Constexpr,
    vec: cutlass.Constexpr[int],
    batch: Int32,
    head: Int32,
    m_block: Int32,
    n_block: Int32,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    seqlen_info: SeqlenInfo,
    aux=None,
):
    """In place: dS (the gradient with respect to the modified scores) becomes the gradient with respect to the
    scaled pre-mod scores ``pre``: ``score_mod_bwd(grad, score, b, h, q_idx=, kv_idx=, seqlen_info=,
    aux_tensors=[, aux_scalars=])`` on ``vec``-wide vectors (upstream's convention). The backward walks unpacked query
    heads."""
    for r in cutlass.range_constexpr(cute.size(dS_rc, mode=[0])):
        _modify_row(dS_rc, r, vec, (dS_rc, pre_rc), None, score_mod_bwd, batch, head, m_block * tile_m + tScS_rc[r, 0][0],
                    n_block, tile_n, tScS_rc, seqlen_info, aux)
