"""LOCOST base encoder forward (no grad, batch 1): time, peak memory, share of kernel + FFT conv.

The released LOCOST shape (d 768, N 512 -> 256 complex modes, d_ff 2048, 12 SSM layers), built
from the pure-torch modules (``lsg_fairseq.modules.locost_blocks``), random weights, fp32. Each
length runs in a fresh subprocess so that the peak RSS (CPU) / peak allocated memory (GPU) belongs
to that length alone. Two passes per length: the first generates the SSM kernels, the second may
reuse them from the per-layer eval cache (only while one layer's kernel FFT fits in
``--kernel-cache-mb``).

    python benchmarks/locost_encoder.py                        # 1K / 4K / 16K
    python benchmarks/locost_encoder.py --lengths 65536 262144 --device cuda

Prints a markdown table. "kernel" = kernel generation (``S4DKernel.forward``), "conv" = the FFT
convolution incl. D skip (``S4D._conv``); their share is of the first (uncached) pass. Needs only
torch: fairseq is not imported.
"""
import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import time
import types

import torch
import torch.nn as nn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_modules():
    """Import the pure-torch modules without running the package's fairseq registrations."""
    if "lsg_fairseq" not in sys.modules:
        pkg = types.ModuleType("lsg_fairseq")
        pkg.__path__ = [os.path.join(REPO, "lsg_fairseq")]
        sys.modules["lsg_fairseq"] = pkg
    blocks = importlib.import_module("lsg_fairseq.modules.locost_blocks")
    s4d = importlib.import_module("lsg_fairseq.modules.s4d")
    t5 = importlib.import_module("lsg_fairseq.modules.t5_layers")
    return blocks, s4d, t5


class Timers:
    """Accumulates wall time spent in wrapped functions (synchronising CUDA around each call)."""

    def __init__(self, device):
        self.device, self.total = device, {}

    def wrap(self, owner, name, key):
        original = getattr(owner, name)
        timers = self

        def timed(*args, **kwargs):
            timers.sync()
            t = time.perf_counter()
            out = original(*args, **kwargs)
            timers.sync()
            timers.total[key] = timers.total.get(key, 0.0) + time.perf_counter() - t
            return out

        setattr(owner, name, timed)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def run_single(length: int, args) -> dict:
    blocks, s4d, t5 = import_modules()
    device = torch.device(args.device)
    torch.manual_seed(0)
    d, vocab = 768, 32100
    embed = nn.Embedding(vocab, d)
    layers = nn.ModuleList(
        blocks.LOCOSTEncoderBlock(d, 512, 2048, 0.0, 1e-6, kernel_cache_mb=args.kernel_cache_mb)
        for _ in range(args.layers)
    )
    norm = t5.T5LayerNorm(d)
    for m in (embed, layers, norm):
        m.to(device).eval()
    timers = Timers(device)
    timers.wrap(s4d.S4DKernel, "forward", "kernel")
    timers.wrap(s4d.S4D, "_conv", "conv")
    tokens = torch.randint(3, vocab, (1, length), device=device)

    def forward():
        x = embed(tokens)
        for layer in layers:
            x = layer(x)
        return norm(x)

    passes = []
    with torch.no_grad():
        for _ in range(2):
            timers.total = {}
            timers.sync()
            t = time.perf_counter()
            forward()
            timers.sync()
            passes.append((time.perf_counter() - t, dict(timers.total)))
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated() / 2 ** 20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    (t1, parts1), (t2, _) = passes
    return {"length": length, "first_s": t1, "second_s": t2, "peak_mb": peak_mb,
            "kernel_s": parts1.get("kernel", 0.0), "conv_s": parts1.get("conv", 0.0)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--layers", type=int, default=12, help="encoder layers (released model: 12)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--kernel-cache-mb", type=float, default=64.0, help="per-layer kernel cache budget")
    p.add_argument("--single", type=int, help=argparse.SUPPRESS)  # internal: one length, JSON out
    args = p.parse_args()
    if args.single:
        print(json.dumps(run_single(args.single, args)))
        return
    rows = []
    for length in args.lengths:
        cmd = [sys.executable, os.path.abspath(__file__), "--single", str(length), "--layers", str(args.layers),
               "--device", args.device, "--kernel-cache-mb", str(args.kernel_cache_mb)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            tail = (res.stderr.strip().splitlines() or ["?"])[-1]
            rows.append(f"| {length:,} | failed: {tail} | | | | |")
            continue
        r = json.loads(res.stdout.strip().splitlines()[-1])
        share = (r["kernel_s"] + r["conv_s"]) / r["first_s"]
        rows.append(
            f"| {length:,} | {r['first_s']:.2f} | {r['second_s']:.2f} | {r['peak_mb']:,.0f} | "
            f"{r['kernel_s']:.2f} + {r['conv_s']:.2f} | {100 * share:.0f}% |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    mem = "peak GPU MiB" if args.device.startswith("cuda") else "peak RSS MiB"
    print(f"LOCOST encoder, {args.layers} layers, d 768, N 512, batch 1, fp32, no grad, {args.device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(f"| tokens | 1st pass s | 2nd pass s (cache) | {mem} | kernel + conv s (1st) | kernel+conv share |")
    print("|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
