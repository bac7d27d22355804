"""What the host issues for one call of each benchmark row's model: its dispatcher ops and, of
those, the ones that run a kernel (launches), with the whole-tensor paths forced (what a GPU runs).

At batch 1 a GPU reading can be set by the host, not the device: LED's encoder at 16K had 8.0 ms
of device time under 20.5 ms of host time on an H200 (``results/h200_1817c8f/``), and every row at
4K waits on the host. Counting the ops is how a change to the host's share is predicted and held
on a machine without a GPU: the counts are the CPU dispatcher's (an FFT, a GEMM, an SDPA is one op
on every device; the SDPA's backend and a few fused kernels may differ on CUDA).

Each row's call is the benchmark's own (``bench_models.make_step``: ``enc`` the encoder without
gradients, ``train`` forward, loss and backward), counted on its second call (caches warm, as the
timed calls find them). ``gen`` counts one decoding step of beam search (fairseq's
``SequenceGenerator``, ``--beam``): the generation of 2N new tokens less that of N, over N
(``--step-tokens`` N), so the encoder and the first steps drop out. The table gives the ops, the
launches, the reads (ops whose result the host reads from the device: on a GPU each waits for
every kernel queued before it) and the launches' most frequent ops.

LOCOST's RMSNorms are HF's chain of element-wise ops on a CPU (7 ops), one fused op on CUDA
(``T5LayerNorm.fused``): its CPU counts are the higher by that.

    python benchmarks/op_count.py --arch linear bart lsg_norm led locost --modes enc \
        --lengths 4096 16384 --out benchmarks/results/op_counts.md
    python benchmarks/op_count.py --arch bart lsg_norm locost --modes gen --lengths 4096 --out /tmp/gen_ops.md
    python benchmarks/op_count.py --smoke --out /tmp/ops.md        # tiny models, 256 tokens (CI)
    python benchmarks/op_count.py --arch locost --modes train --by-module --out /tmp/ops.md

``--by-module`` also gives each row's launches by the innermost module whose forward issued them
(forward hooks); what runs outside every forward (the backward pass with its checkpoints'
recomputes, the loss, the generator's beam search) is counted as ``OUTSIDE``.
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
# Ops that hand a device value to the host (a GPU's host waits for the device to finish first).
READS = frozenset({"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "masked_select", "unique_dim", "_unique2"})
OUTSIDE = "(backward, loss, generator: outside every forward)"


class OpCounter(TorchDispatchMode):
    """Counts the dispatcher ops run under it, by name (``ops``), and those that launch (``launches``);
    with ``stack`` (module labels, the innermost last: :func:`module_stack`), the launches by module
    too (``modules``)."""

    def __init__(self, ops=None, stack=None, modules=None):
        """``ops``, ``modules``: counts to start from (a decoding step's, made by subtraction)."""
        super().__init__()
        self.ops = collections.Counter(ops or {})
        self.modules = collections.Counter(modules or {})
        self.stack = stack

    def __enter__(self):
        if self.stack:
            # a checkpoint's recompute in backward stops early, its modules' forwards unfinished
            self.stack.clear()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if self.stack is not None and name not in VIEWS:
            backward = torch._C._current_autograd_node() is not None  # checkpoint recomputes included
            self.modules[self.stack[-1] if self.stack and not backward else OUTSIDE] += 1
        return func(*args, **(kwargs or {}))

    @property
    def launches(self) -> int:
        return sum(n for name, n in self.ops.items() if name not in VIEWS)

    @property
    def reads(self) -> int:
        return sum(n for name, n in self.ops.items() if name in READS)

    def top_launches(self, n: int) -> list:
        return [(name, k) for name, k in self.ops.most_common() if name not in VIEWS][:n]


def module_stack(model) -> list:
    """The class names of the modules whose forward is running, the innermost last (forward hooks)."""
    stack: list = []

    def enter(module, _args):
        stack.append(type(module).__name__)

    def leave(_module, _args, _output):  # returns None: the output stays the module's
        stack.pop()

    for m in model.modules():
        m.register_forward_pre_hook(enter)
        m.register_forward_hook(leave)
    return stack


def count_row(
    arch: str, mode: str, length: int, args, top: int = 6, step_tokens: int = 8, by_module: bool = False
) -> dict:
    """One row's counts: of one call (``enc``, ``train``), or of one decoding step (``gen``)."""
    torch.manual_seed(0)
    model, dictionary = run.build_model(arch, length, args)
    stack = module_stack(model) if by_module else None
    with forced_path(model, run.ROWS[arch].layer_path or "whole"):
        if mode == "gen":
            ops, modules = _per_step(model, dictionary, length, args, step_tokens, stack)
            counter = OpCounter(ops, modules=modules)
        else:
            step = make_step(model, dictionary, mode, length, args, torch.device("cpu"))
            step()  # the first call builds what later calls reuse (LOCOST's spectra)
            with OpCounter(stack=stack) as counter:
                step()
        path = paths_ran(model)
    row = {
        "arch": arch,
        "mode": mode,
        "length": length,
        "path": path,
        "ops": sum(counter.ops.values()),
        "launches": counter.launches,
        "reads": counter.reads,
        "top": counter.top_launches(top),
    }
    if by_module:
        row["modules"] = counter.modules.most_common()
    return row


def _per_step(model, dictionary, length: int, args, n: int, stack=None):
    """Ops (and launches by module) of one decoding step: generating 2n tokens less generating n,
    over n (rounded)."""
    counts, modules = [], []
    for tokens in (n, 2 * n):
        step = make_step(
            model,
            dictionary,
            "gen",
            length,
            argparse.Namespace(**{**vars(args), "new_tokens": tokens}),
            torch.device("cpu"),
        )
        step()
        with OpCounter(stack=stack) as counter:
            made = step()
        if made != tokens:
            raise RuntimeError(f"gen: {made} tokens generated where {tokens} were asked")
        counts.append(counter.ops)
        modules.append(counter.modules)
    return _step_of(counts, n), _step_of(modules, n)


def _step_of(counts: list, n: int) -> collections.Counter:
    diff = collections.Counter(counts[1])
    diff.subtract(counts[0])
    return collections.Counter({name: round(k / n) for name, k in diff.items() if round(k / n)})


def markdown(result: dict) -> str:
    lines = [
        "# Dispatcher ops of one call, whole-tensor paths forced (`benchmarks/op_count.py`)",
        "",
        f"Command: `{result['command']}`  ",
        f"torch {result['torch']}, {result['machine']}, {result['seconds']:.0f} s in all; counts do not depend on the "
        "machine's load.",
        "",
        "Reads: ops whose value the host reads from the device."
        + (f" `gen`: one decoding step of beam search (beam {result['beam']})." if result.get("beam") else ""),
        "",
        "| row | mode | tokens | path | ops | launches | reads | launches vs first row | most frequent launches |",
        "|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    first = {}
    for r in result["rows"]:
        ref = first.setdefault((r["mode"], r["length"]), r["launches"])
        top = ", ".join(f"{name} {k}" for name, k in r["top"])
        lines.append(
            f"| {r['arch']} | {r['mode']} | {r['length']} | {r['path'] or '-'} | {r['ops']} | {r['launches']} "
            f"| {r['reads']} | {r['launches'] / ref:.2f}x | {top} |"
        )
    with_modules = [r for r in result["rows"] if "modules" in r]
    if with_modules:
        lines += ["", "Launches by the innermost module whose forward issued them:", ""]
        for r in with_modules:
            by = ", ".join(f"{name} {k}" for name, k in r["modules"])
            lines.append(f"- {r['arch']} {r['mode']} {r['length']}: {by}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", nargs="+", default=["linear", "bart", "lsg_norm", "led", "locost"], choices=run.ALL_ARCHS)
    p.add_argument("--modes", nargs="+", default=["enc"], choices=["enc", "train", "gen"])
    p.add_argument("--beam", type=int, default=4, help="gen: the beam size")
    p.add_argument("--step-tokens", type=int, default=8, help="gen: N, the steps counted are 2N less N")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096])
    p.add_argument("--top", type=int, default=6, help="most frequent launching ops listed per row")
    p.add_argument("--out", required=True, help="markdown table (the records beside it, .json)")
    p.add_argument("--smoke", action="store_true", help="tiny models at 256 tokens (CI)")
    p.add_argument("--by-module", action="store_true", help="each row's launches by module too")
    args = p.parse_args(argv)
    if not args.out.endswith(".md"):
        p.error(f"--out {args.out}: give a .md path (the records go beside it as .json)")
    bench_argv = ["--arch", *args.arch, "--beam", str(args.beam)] + (["--smoke"] if args.smoke else [])
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
                rows.append(count_row(arch, mode, length, settings, args.top, args.step_tokens, args.by_module))
                r = rows[-1]
                print(
                    f"{arch:>10} {mode:>5} {length:>6}: {r['ops']} ops, {r['launches']} launches, {r['reads']} reads",
                    flush=True,
                )
    result = {
        "command": "python benchmarks/op_count.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {run.cpu_name()}",
        "seconds": time.time() - start,
        "beam": settings.beam if "gen" in args.modes else None,  # --smoke sets its own
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
