"""The one timing rule for every script: median over ``reps`` batches of ``iters`` back-to-back calls,
CUDA events around each batch, after ``warmup`` calls. Back-to-back calls let the host's launch cost
overlap GPU work, as in a model; the median resists clock and neighbour noise."""

import statistics

import torch


def median_ms(fn, iters: int = 10, reps: int = 7, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)
