"""How far each row's encoder mixes, measured: change one source token, see which encoder outputs move.

The binding variant puts a name's use 1,024+ words after its binding, so an encoder can only join the
two if some layer lets the use site see (a token carrying) the binding. This measures that per row,
at the rows' own shapes (``examples/long_context/common.sh``'s ``arch_flags``) and random weights:

- **one layer** (``--encoder-layers 1``): the farthest output that moves when one token changes,
  the direct reach of a layer. Global tokens pass nothing on in layer 1 (LSG's take their input from
  learned embeddings); the first token's output, LED's global one, which sees every token, is left out;
- **the row's layers**: the share of outputs 1,024+ tokens away that move at all, and how much they
  move against the changed token's own output (median ratio of the L2 changes): what reaches far
  through global tokens, sparse keys or an SSM kernel after all layers.

Weights are random, so the ratio says which paths exist and how wide they start, not what training
makes of them. One command, seeded; ``--out`` writes the table (markdown) and the numbers (json):

    python examples/long_range/reach.py --out examples/long_range/reach
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import time

import torch

from lsg_text import provenance
from lsg_text.argtypes import POSITIVE_INT, int_range
from lsg_text.atomic import atomic_outputs
from lsg_text.errors import OneLineArgumentParser, UserError, report
from lsg_text.fileio import check_output_files

PROG = "reach.py"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what the table measures: a commit that touches none of these does not change it
CODE_PATHS = ("examples/long_range/reach.py", "examples/long_context/common.sh", *provenance.PACKAGES)
ROWS = ("local_8", "bart_1024", "full_4096", "lsg_norm", "lsg_wide", "led", "locost")
FAR = 1024  # tokens: the binding variant's least gap is 1,024 words (more pieces)
REPLACEMENTS = 8  # words tried in place of each probed token (one layer)
MOVED = 1e-6  # an output "moves" when some coordinate changes by more than this (fp32 noise is far below)


def arch_flags(row: str) -> list:
    """The row's fairseq flags, from the one place the experiment reads them."""
    cmd = 'source examples/long_context/common.sh > /dev/null && arch_flags "$1"'
    out = subprocess.run(["bash", "-c", cmd, "_", row], capture_output=True, text=True, check=True, cwd=REPO)
    return out.stdout.split()


def build_encoder(flags: list, vocab: int = 200):
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_MODEL_REGISTRY

    import lsg_fairseq  # noqa: F401  (registers the plugin's archs)

    dictionary = Dictionary()  # <s>=0 <pad>=1 </s>=2 <unk>=3
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")

    class Task:
        source_dictionary = target_dictionary = dictionary

    argv = ["/nonexistent", "--task", "translation", "--max-target-positions", "128"] + flags
    ns = options.parse_args_and_arch(options.get_training_parser(), argv)
    return ARCH_MODEL_REGISTRY[ns.arch].build_model(ns, Task()).encoder.eval(), ns


def moved_by(encoder, tokens: torch.Tensor, at: int, shift: int = 1) -> tuple:
    """Per source position, the L2 and the largest change of the encoder output when token ``at`` is
    replaced by another ordinary word (``shift`` picks which)."""
    changed = tokens.clone()
    changed[0, at] = 4 + (int(tokens[0, at]) - 4 + shift) % 100
    length = torch.tensor([tokens.size(1)])
    with torch.no_grad():
        a = encoder(tokens, src_lengths=length)["encoder_out"][0][:, 0]
        b = encoder(changed, src_lengths=length)["encoder_out"][0][:, 0]
    extra = a.size(0) - tokens.size(1)  # global tokens put in front of the outputs (LSG)
    diff = a[extra:] - b[extra:]
    return diff.norm(dim=-1), diff.abs().amax(-1)


def measure(row: str, length: int, probes: list, seed: int, extra: tuple = ()) -> dict:
    """The row's reach; ``extra`` flags go after its own (e.g. another --sparsity-factor)."""
    flags = arch_flags(row) + list(extra)
    res = {"row": row, "flags": " ".join(flags)}
    torch.manual_seed(seed)
    one, ns = build_encoder(flags + ["--encoder-layers", "1"])
    length = min(length, ns.max_source_positions)  # bart_1024 reads its first 1,024 tokens only
    tokens = torch.randint(4, 104, (1, length), generator=torch.Generator().manual_seed(seed))
    tokens[0, -1] = 2  # </s>
    reach = 0
    for at in probes:
        at = min(at, length - 2)
        # Several replacements: LSG's norm keys are a selection (the largest of each group), and only a
        # token that is selected is seen from far away
        for shift in range(1, REPLACEMENTS + 1):
            _, peak = moved_by(one, tokens, at, shift)
            moved = (peak[1:] > MOVED).nonzero().flatten() + 1  # the first token is LED's global one: it sees all
            reach = max(reach, int((moved - at).abs().max()))
    res["one_layer_reach"] = reach
    torch.manual_seed(seed)
    full, ns = build_encoder(flags)
    res["layers"] = ns.encoder_layers
    far_share, far_ratio = [], []
    for at in probes:
        at = min(at, length - 2)
        change, peak = moved_by(full, tokens, at)
        far = (torch.arange(length) - at).abs() >= FAR
        if far.any():
            far_share.append(float((peak[far] > MOVED).float().mean()))
            far_ratio.append(float((change[far] / change[at]).median()))
    res["far_moved_share"] = statistics.mean(far_share) if far_share else None
    res["far_change_ratio"] = statistics.median(far_ratio) if far_ratio else None
    res["length"] = length
    return res


def table(results: list, args, wall: float) -> str:
    lines = [
        f"Encoder reach at random weights, {args.length}-token input, one token changed at "
        f"{', '.join(map(str, args.probes))} (seed {args.seed}).",
        f"Command: `python examples/long_range/reach.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`, code at "
        f"commit {provenance.git_stamp(REPO, CODE_PATHS)}; {wall:.0f} s on {provenance.cpu_name()}, "
        f"load {os.getloadavg()[0]:.2f}.",
        "",
        "| row | one layer reaches (tokens each side) | layers | outputs 1,024+ tokens away that move "
        "| their change / the changed token's (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        share = "-" if r["far_moved_share"] is None else f"{100 * r['far_moved_share']:.0f}%"
        ratio = "-" if r["far_change_ratio"] is None else f"{r['far_change_ratio']:.1e}"
        reach = "all" if r["one_layer_reach"] >= r["length"] - 2 - min(args.probes) else r["one_layer_reach"]
        lines.append(f"| `{r.get('label', r['row'])}` | {reach} | {r['layers']} | {share} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    # 3: a token to change between the first (LED's global) and the last (</s>)
    p.add_argument("--length", type=int_range(3), default=4096)
    p.add_argument(
        "--probes",
        type=POSITIVE_INT,  # one past the input is moved to its last ordinary token (bart_1024 reads 1,024)
        nargs="+",
        default=[1100, 2048, 2999],
        help="positions of the changed token (several: block layouts differ by offset)",
    )
    p.add_argument(
        "--also",
        nargs="+",
        default=[],
        metavar="ROW:FLAGS",
        help="more rows: a row's flags with FLAGS after them, e.g. 'lsg_norm:--sparsity-factor 32'",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write OUT.md and OUT.json (else print the table)")
    args = p.parse_args(argv)
    outputs = [args.out + ".md", args.out + ".json"] if args.out else []
    try:
        check_output_files(outputs, "--out")  # before minutes of measuring, not in the write after them
    except UserError as e:
        return report(e, PROG)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    start = time.time()
    results = []
    runs = [(row, ()) for row in args.rows]
    for spec in args.also:
        row, _, flags = spec.partition(":")
        if row not in ROWS or not flags.strip():
            p.error(f"--also {spec!r}: want ROW:FLAGS with ROW one of {', '.join(ROWS)}")
        runs.append((row, tuple(flags.split())))
    for row, extra in runs:
        results.append(measure(row, args.length, args.probes, args.seed, extra))
        results[-1]["label"] = " ".join((row,) + extra)
        print(f"{row}: {results[-1]}", file=sys.stderr)
    text = table(results, args, time.time() - start)
    if outputs:
        with atomic_outputs(outputs) as (md, js):
            md.write(text)
            json.dump(
                {"results": results, "length": args.length, "probes": args.probes, "seed": args.seed}, js, indent=1
            )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
