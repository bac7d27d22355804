"""One base attention layer's dispatcher ops on the whole-tensor path, and the two forms of LSG's
sparse-row copies timed on this CPU: the figures behind the host-op changes of
``flex_gpu_notes.md`` ("fewer ops for the host to issue").

- ops: ``layer_probe.py``'s base attention layers (lsg: norm sparsity, one global token; led:
  window 1,024, the first token global), each called a second time with the first call's tables
  (as a later layer of the encoder is), counted on ``cpu`` and on ``meta``. A ``meta`` tensor
  takes the form a GPU takes where a layer chooses by device (``ops.sparse.gather_rows``); meta
  decomposes a few ops, so compare counts within a device, not across.
- ``gather_rows``' two copy forms (``index_select`` on rows, ``gather`` by an expanded index) at
  base width on this CPU, interleaved, one thread: why the CPU keeps ``index_select``.

    python benchmarks/layer_ops.py --out benchmarks/results/layer_ops.md
    git worktree add /tmp/old <commit> && cp benchmarks/layer_ops.py benchmarks/op_count.py /tmp/old/benchmarks/ \
        && cd /tmp/old && PYTHONPATH=$PWD python benchmarks/layer_ops.py --copy-lengths --out /tmp/old.md  # before
"""

import argparse
import os
import platform
import statistics
import sys
import time

import torch

from layer_probe import build  # benchmarks/layer_probe.py and op_count.py, beside this script
from lsg_layers.ops import sparse
from lsg_text.provenance import cpu_name
from op_count import OpCounter


def layer_ops(pattern: str, length: int, device: str) -> tuple:
    """(ops, launches) of a later layer's call: the second, with the first call's tables
    (``layer_probe.build``'s base layer and input, float32)."""
    layer, call_of = build(pattern, length, 768, 12, device, torch.float32, torch.Generator().manual_seed(0))
    layer.path = "whole"
    call = call_of(layer)
    with torch.no_grad():
        call()
        with OpCounter() as counter:
            call()
    return sum(counter.ops.values()), counter.launches


def copy_forms(length: int, rounds: int) -> dict:
    """Median ms of each form of the sparse-row copies (k and v: (1, length, 12, 64), a quarter of
    the rows taken), interleaved over ``rounds``."""
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, length, 12, 64, generator=g), torch.randn(1, length, 12, 64, generator=g)
    idx = torch.randint(0, length, (1, length // 4, 12), generator=g)
    forms = {"index_select": sparse._rows_by_index, "gather": sparse._rows_by_gather}
    times: dict = {name: [] for name in forms}
    for _ in range(rounds):
        for name, form in forms.items():
            form(k, v, idx)  # warm
            t = time.perf_counter()
            for _ in range(10):
                form(k, v, idx)
            times[name].append(100 * (time.perf_counter() - t))  # ms a call
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--copy-lengths", type=int, nargs="*", default=[4096, 16384], help="none: no copy timing")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", required=True, help="markdown table")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    start, load = time.time(), os.getloadavg()
    lines = [
        "# One layer's ops, and the sparse-row copy forms on this CPU (`benchmarks/layer_ops.py`)",
        "",
        f"Command: `python benchmarks/layer_ops.py {' '.join(argv if argv is not None else sys.argv[1:])}`  ",
        f"torch {torch.__version__}, {platform.machine()} {cpu_name()}, 1 thread, load average at the start "
        f"{load[0]:.2f}.",
        "",
        f"A later layer's call at {args.length} tokens, whole-tensor path (dispatcher ops / launches):",
        "",
        "| layer | cpu | meta (a GPU's forms) |",
        "|---|---:|---:|",
    ]
    for pattern in ("lsg", "led"):
        counts = [layer_ops(pattern, args.length, device) for device in ("cpu", "meta")]
        cells = [f"{ops} / {launches}" for ops, launches in counts]
        lines.append(f"| {pattern} | {cells[0]} | {cells[1]} |")
    if args.copy_lengths:
        lines += ["", f"Sparse-row copies, median ms a call over {args.rounds} interleaved rounds:", ""]
        lines += ["| tokens | index_select | gather | gather / index_select |", "|---:|---:|---:|---:|"]
    for length in args.copy_lengths:
        t = copy_forms(length, args.rounds)
        ratio = t["gather"] / t["index_select"]
        lines.append(f"| {length} | {t['index_select']:.2f} | {t['gather']:.2f} | {ratio:.2f}x |")
    lines += ["", f"Wall: {time.time() - start:.0f} s, load average at the end {os.getloadavg()[0]:.2f}."]
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
