"""How many graphs the compiled encoder layers (``run.py --compile-layers``) compile: at one input
length, call after call, and over a run of lengths as fairseq's batches bring them.

Dynamo compiles a graph for each set of guards a call fails; the counts are dynamo's frames
(``torch._dynamo.utils.counters``), the same with any backend, so the graphs run on ``aot_eager``
(no code generated) and the models are the benchmark's tiny ``--smoke`` rows (32-token blocks,
window 64) at batch 1, the benchmark's batch. Two questions:

- a timed row: does every compile happen in its warm-up (``run.py``'s two calls before the timed
  ones)? ``tests/test_compiled_layers.py`` holds that for a padded batch of two;
- a user flag for ``fairseq-train``, whose batches come in many lengths: does a new length compile
  again, with ``dynamic`` None (static until a second length) and True (symbolic lengths)?

    python benchmarks/compile_counts.py --out benchmarks/results/compile_counts.md
"""

import argparse
import json
import os
import platform
import sys
import time

import torch
from torch._dynamo.utils import counters

import run  # benchmarks/run.py, beside this script: the rows and their tiny models
from bench_models import make_step
from lsg_fairseq.models.compiled_layers import compile_encoder_layers
from lsg_layers.modules.paths import forced_path

DYNAMIC = {"static": False, "none": None, "true": True}


def graphs_by_call(arch: str, mode: str, lengths: list, dynamic, settings) -> list:
    """Dynamo's frames compiled so far after each call, one call per entry of ``lengths``."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model, dictionary = run.build_model(arch, max(lengths), settings)
    after = []
    with forced_path(model, run.ROWS[arch].layer_path or "whole"):
        compile_encoder_layers(model, dynamic=dynamic, backend="aot_eager")
        for length in lengths:
            make_step(model, dictionary, mode, length, settings, torch.device("cpu"))()
            after.append(run.dynamo_frames())
    if sum(counters["graph_break"].values()):
        raise RuntimeError(f"{arch} {mode}: graph breaks {dict(counters['graph_break'])}")
    return after


def markdown(result: dict) -> str:
    lines = [
        "# Graphs the compiled encoder layers compile (`benchmarks/compile_counts.py`)",
        "",
        f"Command: `{result['command']}`  ",
        f"torch {result['torch']}, {result['machine']}, {result['seconds']:.0f} s in all; counts do not depend on "
        "the machine or the backend (dynamo's frames; here `aot_eager`, the benchmark's tiny `--smoke` models, "
        "batch 1).",
        "",
        "The graphs compiled so far after each call (the layers of one model, `compile_encoder_layers`), one call",
        "per length listed; `static` is `dynamic=False`, what `run.py --compile-layers` asks.",
        "",
        "| row | mode | dynamic | tokens, call by call | graphs after each call |",
        "|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        tokens, graphs = (", ".join(str(n) for n in r[k]) for k in ("lengths", "graphs"))
        lines.append(f"| {r['arch']} | {r['mode']} | {r['dynamic']} | {tokens} | {graphs} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", nargs="+", default=["linear", "bart", "lsg_norm", "led"])
    p.add_argument("--modes", nargs="+", default=["enc", "train"], choices=["enc", "train"])
    p.add_argument("--repeat", type=int, default=4, help="calls at one length (the first of --lengths)")
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 320, 384, 300, 448, 256, 320])
    p.add_argument("--dynamic", nargs="+", default=["none", "true"], choices=sorted(DYNAMIC))
    p.add_argument("--out", required=True, help="markdown table (the records beside it, .json)")
    args = p.parse_args(argv)
    if not args.out.endswith(".md"):
        p.error(f"--out {args.out}: give a .md path (the records go beside it as .json)")
    settings = run.parse_args(["--smoke", "--arch", *args.arch])
    torch.set_num_threads(1)
    start = time.time()
    rows = []
    cases = [(mode, "static", [args.lengths[0]] * args.repeat) for mode in args.modes]
    cases += [("train", dyn, args.lengths) for dyn in args.dynamic]
    for arch in args.arch:
        for mode, dyn, lengths in cases:
            graphs = graphs_by_call(arch, mode, lengths, DYNAMIC[dyn], settings)
            rows.append({"arch": arch, "mode": mode, "dynamic": dyn, "lengths": lengths, "graphs": graphs})
            print(f"{arch:>9} {mode:>5} dynamic={dyn:<6} graphs after each call: {graphs}", flush=True)
    result = {
        "command": "python benchmarks/compile_counts.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {run.cpu_name()}",
        "seconds": time.time() - start,
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out[: -len(".md")] + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(args.out, "w") as f:
        f.write(markdown(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
