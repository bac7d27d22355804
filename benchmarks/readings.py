"""What one benchmark measurement reads besides its time (``benchmarks/run.py``): the peak memory
(VmHWM on CPU, the allocator's peak on a GPU), LOCOST's S4D split from the profiler's labels, and
a profile table of one call.
"""

import gc
import os
import time

import torch


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak(device) -> float:
    """Start a new peak window; returns the current resident MiB (the baseline)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass  # the peak then also covers model construction: an over-estimate, never an under-
    return _status_kb("VmRSS") / 1024


def read_peak(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    return _status_kb("VmHWM") / 1024


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


SSM_LABELS = ("s4d.layer", "s4d.kernel", "s4d.projection")


def ssm_breakdown(model, step, device) -> dict:
    """One more encoder call under ``torch.profiler``, the S4D token mixer's own work summed from its
    labels (``lsg_layers.modules.s4d``): ``s4d.layer`` (every call), ``s4d.kernel`` (SSM kernel
    generation) and ``s4d.projection`` (its k/q/output projections); :func:`breakdown_from_rows`
    does the arithmetic. So ``kernel + conv`` is everything the SSM adds over a token mixer made of
    linear layers. The total is the profiled call's own (the profiler's overhead is in both).
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        sync(device)
        t = time.perf_counter()  # inside: the profiler's start and its processing are not the call's
        step()
        sync(device)
        total = time.perf_counter() - t
    return breakdown_from_rows(prof.key_averages(), cuda, total)


def breakdown_from_rows(rows, cuda: bool, total: float) -> dict:
    """The S4D split from profiler rows (``key_averages()``: ``key``, ``device_type``,
    ``cpu_time_total``, ``device_time_total`` in us) of a call that took ``total`` seconds.

    Only the host-side (CPU) rows of the labels count: their host time on CPU, their device time on
    a GPU, and both include what nested labels ran (a CPU row's device time sums the kernels launched
    inside it, children included). A GPU run also has "GPU user annotation" rows under the same keys,
    which credit each kernel to the innermost label only: mixing them in would subtract the kernel
    twice. conv = layer - kernel - projections: padding mask, kernel layout and FFT, transposes,
    FFTs, product, gate (never below 0; a few us of jitter at most).
    """
    totals = dict.fromkeys(SSM_LABELS, 0.0)
    for row in rows:
        if row.key in totals and str(row.device_type).endswith("CPU"):
            totals[row.key] += (row.device_time_total if cuda else row.cpu_time_total) / 1e6
    kernel, proj = totals["s4d.kernel"], totals["s4d.projection"]
    conv = max(0.0, totals["s4d.layer"] - kernel - proj)
    return {
        "ssm_total_s": total,
        "ssm_layer_s": totals["s4d.layer"],
        "ssm_kernel_s": kernel,
        "ssm_conv_s": conv,
        "ssm_proj_s": proj,
        "ssm_share": (kernel + conv) / total,
        "ssm_conv_is": "S4D.forward minus its k/q/output projections and the kernel (mask, transposes, "
        "FFTs, product, gate), from the host-side rows of the s4d.* profiler labels "
        "(device time on a GPU)",
    }


def profile_table(step, arch, mode, length, args) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
    sort = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=25)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"profile_{arch}_{mode}_{length}.txt")
    with open(path, "w") as f:
        f.write(table)
    return path
