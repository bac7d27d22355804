"""What the host issues for one call of each benchmark row's model: its dispatcher ops and, of
those, the ones that run a kernel (launches), with the whole-tensor paths forced (what a GPU runs).

At batch 1 a GPU reading can be set by the host, not the device: LED's encoder at 16K had 8.0 ms
of device time under 20.5 ms of host time on an H200 (``results/h200_1817c8f/``), and every row at
4K waits on the host. Counting the ops is how a change to the host's share is predicted and held
on a machine without a GPU: the counts are the CPU dispatcher's (an FFT, a GEMM, an SDPA is one op
on every device; the SDPA's backend and a few fused kernels may differ on CUDA).

Each row's call is the benchmark's own (``bench_models.make_step``: ``enc`` the encoder without
gradients, ``train`` forward, loss and backward), counted on its second call (caches warm, as the
timed calls find them). The table gives the ops, the launches, and the launches' most frequent ops.

    python benchmarks/op_count.py --arch linear bart lsg_norm led locost --modes enc \
        --lengths 4096 16384 --out benchmarks/results/op_counts.md
    python benchmarks/op_count.py --smoke --out /tmp/ops.md        # tiny models, 256 tokens (CI)
"""

import argparse
import collections
import json
import os
import platform
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import run  # benchmarks/run.py, beside this script: the rows, their flags and models
from bench_models import make_step
from lsg_layers.modules.paths import forced_path, paths_ran

# Ops that only make a view, and the profiler's labels: no kernel runs for them; the rest are
# counted as launches.
VIEWS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "transpose",
        "t",
        "permute",
        "expand",
        "unsqueeze",
        "squeeze",
        "slice",
        "select",
        "alias",
        "as_strided",
        "detach",
        "split",
        "narrow",
        "view_as_real",
        "view_as_complex",
        "unbind",
        "_reshape_alias",
        "_record_function_enter_new",
        "_record_function_exit",
    }
)


class OpCounter(TorchDispatchMode):
    """Counts the dispatcher ops run under it, by name (``ops``), and those that launch (``launches``)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def launches(self) -> int:
        return sum(n for name, n in self.ops.items() if name not in VIEWS)

    def top_launches(self, n: int) -> list:
        return [(name, k) for name, k in self.ops.most_common() if name not in VIEWS][:n]


def count_row(arch: str, mode: str, length: int, args, top: int = 6) -> dict:
    torch.manual_seed(0)
    model, dictionary = run.build_model(arch, length, args)
    with forced_path(model, run.ROWS[arch].layer_path or "whole"):
        step = make_step(model, dictionary, mode, length, args, torch.device("cpu"))
        step()  # the first call builds what later calls reuse (LOCOST's spectra)
        with OpCounter() as counter:
            step()
        path = paths_ran(model)
    return {
        "arch": arch,
        "mode": mode,
        "length": length,
        "path": path,
        "ops": sum(counter.ops.values()),
        "launches": counter.launches,
        "top": counter.top_launches(top),
    }


def markdown(result: dict) -> str:
    lines = [
        "# Dispatcher ops of one call, whole-tensor paths forced (`benchmarks/op_count.py`)",
        "",
        f"Command: `{result['command']}`  ",
        f"torch {result['torch']}, {result['machine']}, {result['seconds']:.0f} s in all; counts do not depend on the "
        "machine's load.",
        "",
        "| row | mode | tokens | path | ops | launches | launches vs first row | most frequent launches |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    first = {}
    for r in result["rows"]:
        ref = first.setdefault((r["mode"], r["length"]), r["launches"])
        top = ", ".join(f"{name} {k}" for name, k in r["top"])
        lines.append(
            f"| {r['arch']} | {r['mode']} | {r['length']} | {r['path'] or '-'} | {r['ops']} | {r['launches']} "
            f"| {r['launches'] / ref:.2f}x | {top} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", nargs="+", default=["linear", "bart", "lsg_norm", "led", "locost"], choices=run.ALL_ARCHS)
    p.add_argument("--modes", nargs="+", default=["enc"], choices=["enc", "train"])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096])
    p.add_argument("--top", type=int, default=6, help="most frequent launching ops listed per row")
    p.add_argument("--out", required=True, help="markdown table (the records beside it, .json)")
    p.add_argument("--smoke", action="store_true", help="tiny models at 256 tokens (CI)")
    args = p.parse_args(argv)
    if not args.out.endswith(".md"):
        p.error(f"--out {args.out}: give a .md path (the records go beside it as .json)")
    bench_argv = ["--arch", *args.arch] + (["--smoke"] if args.smoke else [])
    settings = run.parse_args(bench_argv)  # the benchmark's row settings (block sizes, window, vocab)
    lengths = settings.lengths if args.smoke else args.lengths
    torch.set_num_threads(min(2, torch.get_num_threads()))
    start = time.time()
    rows = []
    for arch in args.arch:
        for mode in args.modes:
            if mode not in (run.ROWS[arch].modes or run.MODES):
                continue
            for length in lengths:
                rows.append(count_row(arch, mode, length, settings, args.top))
                r = rows[-1]
                print(f"{arch:>10} {mode:>5} {length:>6}: {r['ops']} ops, {r['launches']} launches", flush=True)
    result = {
        "command": "python benchmarks/op_count.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {run.cpu_name()}",
        "seconds": time.time() - start,
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(markdown(result))
    with open(args.out[: -len(".md")] + ".json", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
