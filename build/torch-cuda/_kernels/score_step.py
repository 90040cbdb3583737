"""What happens to a key block's scores between the S = Q K^T MMA and the online softmax (arch-free).

In place on the fp32 accumulator of one (tile_m, tile_n) block, in this order:
  0. user mods (``mods``; ``flex_mods``): score_mod on S * softcap_scale (the host passes the
     softmax scale there and scale_log2 = log2(e): softcap and score_mod never meet), then mask_mod, on every
     block (a block-sparse full block skips the mask_mod);
  1. softcap (``softcap``): S = tanh(S * softcap_scale). The host passes softcap_scale = scale / c and
     the softmax scale_log2 = c * log2(e), so the logits become c * tanh(scale * S / c).
  2. element mask (blocks whose ``masked`` class says they need one): entries past seqlen_k, above the
     causal diagonal or outside the local window become -inf (``mask.mask_scores``).
Every mainloop (multistage, overlapped, ping-pong, persistent) sends its scores through ``ScoreStep``:
a change to the scores before the softmax is made here alone.

``ScoreStep`` is a frozen dataclass built per CTA tile: the compile-time features (tile shape,
softcap, causal, local, packed-GQA group or None, ``FwdConfig.mask_select``) next to the runtime
values they need (softcap_scale, window bounds, seqlens, m_block) and the accumulator's coordinates
(``tScS_rc``: this thread's, ``t0ScS_rc``: thread 0's, compile-time; both (rows, cols) views of an
identity tensor partitioned like S).
"""

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from .flex_mods import apply_mods
from .fragments import acc_rows_cols
from .mask import mask_scores


@dataclass(frozen=True)
class ScoreStep:
    """Softcap and element mask of one CTA tile's score blocks (see the module docstring)."""

    tile_m: int
    tile_n: int
    softcap: bool
    causal: bool
    local: bool
    mask_select: bool
    softcap_scale: Any
    window_left: Any
    window_right: Any
    seqlen_q: Any
    seqlen_k: Any
    m_block: Any
    #: packed GQA: query heads per KV head (tile row p is query row p // group); None when not packed
    group: Any
    tScS_rc: cute.Tensor
    t0ScS_rc: cute.Tensor
    #: ``flex_mods.FlexMods`` (compile-time) or None, and what the mods read: the batch, the grid's
    #: head (the KV head when packed), ``flex_mods.SeqlenInfo``
    mods: Any = None
    batch: Any = None
    head: Any = None
    seqlen_info: Any = None
    #: the mods' aux inputs (``flex_mods.AuxInputs``)
    aux: Any = None

    @cute.jit
    def apply(self, acc_S: cute.Tensor, n_block: Int32, masked: cutlass.Constexpr[bool],
              mask_mod: cutlass.Constexpr[bool] = True):
        """S of key block ``n_block`` (the (MMA, MMA_M, MMA_N) accumulator), softcapped, and
        element-masked when ``masked``. ``mask_mod`` off: the score_mod only (a block-sparse full block)."""
        if const_expr(self.mods is not None):
            apply_mods(acc_rows_cols(acc_S), self.tScS_rc, self.mods, self.softcap_scale, self.batch, self.head,
                       self.m_block, n_block, self.tile_m, self.tile_n, self.group, self.seqlen_info,
                       self.aux, mask_mod)
        if const_expr(self.softcap):
            acc_S.store(cute.math.tanh(acc_S.load() * self.softcap_scale, fastmath=True))
        if const_expr(masked):
            mask_scores(
                acc_rows_cols(acc_S), self.tScS_rc, self.t0ScS_rc, self.m_block, n_block, self.seqlen_q,
                self.seqlen_k, self.window_left, self.window_right, self.tile_m, self.tile_n, self.causal,
                self.local, self.group, self.mask_select,
            )
