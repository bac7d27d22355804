"""Timing one device call for the probes (``flex_probe.py``, ``conv_probe.py``): CUDA events on a
GPU (the device's time, not the host's), the wall clock on a CPU."""

import statistics
import time

import torch


def time_calls(fn, device: str, warmup: int, repeat: int):
    """(first call seconds: the compile, if any; median milliseconds of ``repeat`` calls after
    ``warmup``; the output of the last call)."""
    cuda = device == "cuda"
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeat):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            out = fn()
            times.append(1e3 * (time.perf_counter() - t))
    return first, statistics.median(times), out
