"""What the probes (``flex_probe.py``, ``conv_probe.py``) share: timing one device call (CUDA events
on a GPU: the device's time, not the host's; the wall clock on a CPU), and writing the results
after every row, so that a probe cut off by its stage's time limit keeps the rows it measured."""

import json
import os
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


def write(result: dict, out: str, markdown) -> None:
    """``out`` (JSON) and its table beside it (``.md``, ``markdown(result)``), each replaced whole."""
    for path, text in ((out, json.dumps(result, indent=1)), (os.path.splitext(out)[0] + ".md", markdown(result))):
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
