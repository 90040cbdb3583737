"""FP8 K/V: a loader whose copies land in FP8 staging stages and are widened to 16 bits in shared memory
(arch-free building blocks).

The MMAs of an FP8 K/V tile are the 16-bit ones (q stays bf16 / fp16): every e4m3 and e5m2 value is exactly a
bf16 and an fp16 value, so widening loses nothing, and the scales stay out of the mainloop (``k_descale`` folds
into the softmax scale, ``v_descale`` into O's normalization; ``FlashFwdMultistage.kernel``). What changes is
where a tile's bytes go:

  * the cp.async copies of ``kv_source`` (dense, packed or paged: any source) move vectors of FP8 into the
    staging stages ``(tile_n, d, num_stages)`` at one byte per element: 16 bytes past L1 where the head dims and
    tile allow (``config.fp8_kv_copy``), else 8 bytes in the 16-bit copies' thread layout. The 16-bit side is
    partitioned in the same thread layout, so a thread's FP8 vectors and its 16-bit vectors of the MMAs' buffers
    cover the same elements;
  * after the wait for a tile (``cp.async.wait_group``, which makes a thread's own copies visible to it) and
    before the CTA barrier that publishes the tile, each thread widens its own vectors into the 16-bit buffer
    of the step that reads them (``widen``). No thread reads another's staging bytes, so no barrier is added.
    The 16-bit buffers are two: step ``it`` reads buffer it % 2 while a warp that reached the end of the step
    widens the next tile into the other, which every warp finished reading before the previous barrier.

Bounded loads zero-fill V rows past the sequence in the staging stage (widened to zeros), and the K columns
past a padded head dim are zeroed once there (``zero_k_padding``), so the 16-bit tiles hold exactly what the
16-bit loaders would have written.
"""

from dataclasses import dataclass, replace
from typing import Any, Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from ..config import FP8_KV_MMA_BUFFERS
from .kv_source import CpAsyncKV

#: 16-bit buffers the MMAs read (``widen``): the one of this step and the one being filled for the next
MMA_BUFFERS = FP8_KV_MMA_BUFFERS


@dataclass(frozen=True)
class DequantKV:
    """A cp.async loader (``inner``, built on the FP8 staging stages) plus this thread's partitions of the
    16-bit buffers the MMAs read, ``tKsK`` / ``tVsV`` (CPY, CPY_ROWS, CPY_COLS, ``MMA_BUFFERS``), formed by
    the 16-bit copy of the same thread layout; ``dtype`` the 16-bit element type, ``num_stages`` the staging
    stages."""

    inner: CpAsyncKV
    tKsK: cute.Tensor
    tVsV: cute.Tensor
    dtype: Any
    num_stages: int

    def padded(self, k_cols: Optional[int], v_cols: Optional[int]) -> "DequantKV":
        return replace(self, inner=self.inner.padded(k_cols, v_cols))

    @cute.jit
    def zero_k_padding(self, num_stages: cutlass.Constexpr[int]):
        """Zero the K columns past the head dim in every staging stage (widened into zeros)."""
        self.inner.zero_k_padding(self.num_stages)

    @cute.jit
    def lookahead(self, n_block: Int32):
        self.inner.lookahead(n_block)

    @cute.jit
    def load_k(self, n_block: Int32, stage: Int32, bounded: cutlass.Constexpr[bool],
               looked_up: cutlass.Constexpr[bool] = False):
        self.inner.load_k(n_block, stage, bounded, looked_up)

    @cute.jit
    def load_v(self, n_block: Int32, stage: Int32, bounded: cutlass.Constexpr[bool],
               looked_up: cutlass.Constexpr[bool] = False):
        self.inner.load_v(n_block, stage, bounded, looked_up)

    def mma_buffer(self, it: Int32):
        """The 16-bit buffer step ``it`` reads."""
        return it % MMA_BUFFERS

    @cute.jit
    def widen(self, stage: Int32, buffer: Int32):
        """This thread's FP8 vectors of staging stage ``stage`` (landed: the caller waited for their group),
        widened into 16-bit buffer ``buffer``: a shared load, the hardware conversions (``cvt`` e4m3 / e5m2 to
        f16 pairs, then to bf16 for a bf16 q) and the 16-byte shared stores per vector. Integer widening (byte
        permutes, masks and a rebiasing multiply, all full-rate ALU work) measured 5% slower on the H200."""
        for src_all, dst_all in ((self.inner.tKsK, self.tKsK), (self.inner.tVsV, self.tVsV)):
            src, dst = src_all[None, None, None, stage], dst_all[None, None, None, buffer]
            for m in cutlass.range_constexpr(cute.size(src, mode=[1])):
                for k in cutlass.range_constexpr(cute.size(src, mode=[2])):
                    raw = cute.make_rmem_tensor_like(src[None, m, k])
                    cute.autovec_copy(src[None, m, k], raw)
                    wide = cute.make_rmem_tensor_like(dst[None, m, k], self.dtype)
                    wide.store(raw.load().to(self.dtype))
                    cute.autovec_copy(wide, dst[None, m, k])


def staged_loader(inner: CpAsyncKV, tidx, sK: cute.Tensor, sV: cute.Tensor, g2s_k: cute.TiledCopy,
                  g2s_v: cute.TiledCopy, dtype, num_stages: int) -> DequantKV:
    """``inner`` (loading into the staging stages) with thread ``tidx``'s partitions of the 16-bit buffers
    ``sK`` / ``sV`` (tile_n, d, ``MMA_BUFFERS``) by the 16-bit copies ``g2s_k`` / ``g2s_v``."""
    return DequantKV(inner=inner, tKsK=g2s_k.get_slice(tidx).partition_D(sK),
                     tVsV=g2s_v.get_slice(tidx).partition_D(sV), dtype=dtype, num_stages=num_stages)
