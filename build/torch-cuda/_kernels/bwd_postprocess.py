"""Backward postprocess: dQ = scale * the fp32 accumulator, in Q's dtype and layout (no MMA).

The main kernel adds every key block's dS K into the fp32 accumulator of each query block in MMA-fragment
order (``dq_accum``); this kernel reads a block back with the same tiled MMA partition (16-byte loads, a
warp reading 512 contiguous bytes), scales by the softmax scale once (it commutes with the sums),
converts, and writes the block through shared memory as 16-byte rows. Rows past the sequence's length
are not written (the caller zero-fills dQ where such rows exist, i.e. with seqused_q), nor are the
padded head-dim columns. One CTA = one main-kernel query block (``tile_m`` rows, ``num_warps`` warps)
of one (sequence, head).
"""

from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ..bwd_config import BwdConfig, bwd_padded_head_dim
from ..execution_model import ExecutionModel
from ..problem import BwdSpec
from . import CUTLASS_DTYPES
from .dq_accum import dq_tiled_mma, load_fragment, slice_offset
from .fragments import convert
from .grid_dependency import enter_grid
from .seqlen_info import num_batches, num_heads, sequence_heads, workspace_row
from .tile_io import g2s_tiled_copy, smem_layout_atom, store_rows


class FlashBwdPostprocess:
    def __init__(self, spec: BwdSpec, config: BwdConfig, model: ExecutionModel):
        self.spec = spec
        self.config = config
        self.model = model
        self.dtype = CUTLASS_DTYPES[spec.dtype]
        self.head_dim = bwd_padded_head_dim(spec.head_dim, config)
        self.tile_m = config.tile_m
        self.num_threads = config.num_threads

    @staticmethod
    def can_implement(spec: BwdSpec, model: ExecutionModel) -> tuple[str, ...]:
        return () if spec.head_dim % 8 == 0 else (f"head_dim={spec.head_dim} is not a multiple of 8",)

    @cute.jit
    def __call__(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32,
                 mCuSeqlensQ: Optional[cute.Tensor], mSeqUsedQ: Optional[cute.Tensor], max_seqlen_q: Int32,
                 stream: cuda.CUstream):
        packed = mCuSeqlensQ is not None
        rows = max_seqlen_q if const_expr(packed) else mdQ.shape[1]
        self.sdQ_layout = cute.tile_to_shape(smem_layout_atom(self.dtype, self.head_dim), (self.tile_m, self.head_dim),
                                             (0, 1))
        grid = (cute.ceil_div(rows, self.tile_m), num_heads(mdQ, packed), num_batches(mdQ, mCuSeqlensQ))
        self.kernel(mdQacc, mdQ, softmax_scale, mCuSeqlensQ, mSeqUsedQ, self.sdQ_layout).launch(
            grid=grid, block=[self.num_threads, 1, 1], smem=cute.cosize(self.sdQ_layout) * self.dtype.width // 8,
            use_pdl=self.model.has_pdl, stream=stream)

    @cute.kernel
    def kernel(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32,
               mCuSeqlensQ: Optional[cute.Tensor], mSeqUsedQ: Optional[cute.Tensor], sdQ_layout: cute.ComposedLayout):
        enter_grid(self.model.has_pdl)
        tidx, _, _ = cute.arch.thread_idx()
        m, head, batch = cute.arch.block_idx()
        mdQ_s, seqlen = sequence_heads(mdQ, batch, mCuSeqlensQ, mSeqUsedQ)
        if m * self.tile_m < seqlen:
            gAcc = workspace_row(mdQacc, batch, head, mCuSeqlensQ, mdQ.shape[0])
            smem = cutlass.memory.SmemAllocator()
            sdQ = smem.allocate_tensor(self.dtype, sdQ_layout, byte_alignment=1024)
            tiled_mma = dq_tiled_mma(self.dtype, self.config)
            thr_mma = tiled_mma.get_slice(tidx)
            r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                                             num_bits_per_copy=2 * self.dtype.width), tiled_mma)
            thr_r2s = r2s.get_slice(tidx)
            chunks = self.config.dq_chunks
            width = self.head_dim // chunks
            for ch in cutlass.range_constexpr(chunks):
                acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.tile_m, width)), Float32)
                load_fragment(acc, gAcc.iterator + slice_offset(m, ch, self.tile_m, self.head_dim, width), tidx,
                              self.num_threads)
                acc.store(acc.load() * softmax_scale)
                sdQ_ch = cute.local_tile(sdQ, (self.tile_m, width), (0, ch))
                cute.copy(r2s, thr_r2s.retile(convert(acc, self.dtype)), thr_r2s.partition_D(sdQ_ch))
            cute.arch.sync_threads()
            s2g = g2s_tiled_copy(self.dtype, smem_layout_atom(self.dtype, self.head_dim).outer.shape[1],
                                 self.num_threads, cute.nvgpu.CopyUniversalOp())
            gdQ = cute.local_tile(mdQ_s[None, head, None], (self.tile_m, self.head_dim), (m, 0))
            store_rows(s2g, tidx, sdQ, gdQ, (self.tile_m, self.head_dim), self.spec.head_dim,
                       seqlen - m * self.tile_m)
