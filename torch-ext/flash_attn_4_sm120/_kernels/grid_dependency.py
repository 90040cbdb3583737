"""Programmatic dependent launch: how a kernel of this bundle starts next to the one before it.

Every kernel here is launched with ``use_pdl`` when the execution model ``has_pdl``, and opens with
``enter_grid``: ``griddepcontrol.wait`` holds each thread until the previous grid of the stream has
finished and its memory is visible, so nothing that kernel wrote (the KV-cache append's rows and key
lengths, the split forward's partials, a user kernel's Q) is read early; then
``griddepcontrol.launch_dependents`` lets the next kernel's CTAs be placed as SMs free up, instead of after
this grid's last CTA has exited. What it buys is the launch gap between two kernels (a few microseconds,
which decode kernels of 15-60 us feel), not overlapped work: each kernel's reads still wait for its
predecessor. A kernel launched without the attribute (a part without PDL, or a launch after a host sync)
passes both instructions at once.
"""

import cutlass
import cutlass.cute as cute
from cutlass import const_expr


@cute.jit
def enter_grid(has_pdl: cutlass.Constexpr):
    """Wait for the previous grid of the stream, then let the next one launch (no-op without PDL)."""
    if const_expr(has_pdl):
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
