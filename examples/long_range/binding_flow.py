"""Does a trained encoder carry a binding to where the name is used? Change the bound animal, watch the use.

In a binding document ("The silver moose is called Nora." ... 1,024+ words ... "Nora visited Tokyo on
Monday.") an encoder that joins the two sentences must change its output at the use sentence's "Nora"
when the bound animal changes. For each key of each document this replaces its bound animal by one that
does not occur in the document (every animal is one piece) and measures the L2 change of the encoder
output at

- the use sentence's name, and
- the **baseline**: every position 1,024+ tokens (``--far``) from the binding sentence outside any
  sentence of that name (what reaches far through any path: global tokens, sparse keys, an SSM kernel),

and reports per checkpoint the median over keys of ``use / baseline`` (1: the use site hears of the
change no more than any far token; much more: the binding is routed there) and the share of keys
whose use site moved at all. The source pieces are the binarized split the models were
scored on.

``--variant order`` asks the same of the order variant ("The fox arrived." ... 1,024+ words ... "The owl
arrived."): one arrival is taken away (its "arrived" becomes the filler verb "found", so the sentence is
filler) and the other arrival's animal is watched, the later one (``forward``: does it hear that something
arrived before it?) and the earlier one (``backward``). An encoder that marks each arrival with what
arrived before or after it moves there; one that does not moves there as much as anywhere that far.
Its table also gives how well a linear readout of the encoder output tells where a token is (R^2 of
the token's index, fitted on half the documents and scored on the other half, every 8th token): an
encoder whose outputs say where they are lets the decoder compare two positions without any route
between them. One command:

    python examples/long_range/binding_flow.py --data work_dirs/long_range/binding/long \\
        --checkpoints lsg_norm=work_dirs/long_range/runs/binding.lsg_norm.s1/checkpoint_last.pt ... \\
        --split valid --out examples/long_range/pilots/.../binding_flow
"""

import json
import os
import statistics
import sys
import time

import torch

from lsg_text import provenance
from lsg_text.argtypes import int_range
from lsg_text.atomic import atomic_outputs
from lsg_text.errors import OneLineArgumentParser, UserError, report
from lsg_text.fileio import DataError, check_output_files, require_dir, require_file
from lsg_text.synthetic import ANIMALS

PROG = "binding_flow.py"

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what the table measures: a commit that touches none of these does not change it
CODE_PATHS = ("examples/long_range/binding_flow.py", *provenance.PACKAGES)

FAR = 1024  # tokens from the binding sentence: the binding variant's least gap is 1,024 words


def load(checkpoint: str, bin_dir: str, split: str):
    from fairseq import checkpoint_utils

    import lsg_fairseq  # noqa: F401  (registers the plugin's archs and task)

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": bin_dir})
    task.load_dataset(split)
    return models[0].eval(), task


def encode(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model.encoder(tokens[None], src_lengths=torch.tensor([tokens.numel()]))["encoder_out"][0][:, 0]
    return out[out.size(0) - tokens.numel() :]  # LSG puts its global tokens in front


def probe_document(model, dictionary, tokens: torch.Tensor, key: dict, far: int = FAR) -> dict:
    """The key's binding and use sites in ``tokens``, the bound animal swapped: changes per site."""
    piece = [dictionary[int(t)] for t in tokens]
    name, animal = "\u2581" + key["name"], "\u2581" + key["animal"]
    bind = next(
        i
        for i in range(3, len(piece) - 1)
        if piece[i] == "\u2581called" and piece[i + 1] == name and piece[i - 2] == animal
    )
    use = next(i for i in range(1, len(piece)) if piece[i] == "\u2581visited" and piece[i - 1] == name) - 1
    present = set(piece)
    other = next(
        a for a in ANIMALS if "\u2581" + a not in present and dictionary.index("\u2581" + a) != dictionary.unk()
    )
    changed = tokens.clone()
    changed[bind - 2] = dictionary.index("\u2581" + other)
    delta = (encode(model, tokens) - encode(model, changed)).norm(dim=-1)
    near_name = torch.zeros(len(piece), dtype=torch.bool)
    for i, p in enumerate(piece):
        if p == name:  # every sentence of this name: "is called Nora", "Nora avoided ...", "Nora visited ..."
            near_name[max(0, i - 6) : i + 6] = True
    baseline_at = ((torch.arange(len(piece)) - bind).abs() >= far) & ~near_name
    baseline = float(delta[baseline_at].median())
    return {"use": float(delta[use]), "baseline": baseline, "bind": float(delta[bind - 2]), "gap": use - bind}


def probe_order(model, dictionary, tokens: torch.Tensor, source: int, watched: int, far: int = FAR) -> dict:
    """An order document with arrival ``source`` taken away ("arrived" -> "found"): the change at arrival
    ``watched``'s animal against the median change 1,024+ tokens from ``source`` away from every arrival.
    Fields as in probe_document: ``use`` the watched site, ``bind`` the changed site."""
    piece = [dictionary[int(t)] for t in tokens]
    verbs = [i for i, p in enumerate(piece) if p == "\u2581arrived"]
    changed = tokens.clone()
    changed[verbs[source]] = dictionary.index("\u2581found")
    delta = (encode(model, tokens) - encode(model, changed)).norm(dim=-1)
    near = torch.zeros(len(piece), dtype=torch.bool)
    for i in verbs:
        near[max(0, i - 6) : i + 6] = True
    baseline_at = ((torch.arange(len(piece)) - verbs[source]).abs() >= far) & ~near
    watch = verbs[watched] - 1  # the animal: "The fox arrived."
    return {
        "use": float(delta[watch]),
        "baseline": float(delta[baseline_at].median()),
        "bind": float(delta[verbs[source]]),
        "gap": abs(watch - verbs[source]),
    }


def position_readout(model, dataset, n: int, limit: int, stride: int = 8) -> float:
    """R^2 on the odd documents of a least-squares readout of the token index, fitted on the even ones."""
    xs, ys = [[], []], [[], []]
    for i in range(n):
        out = encode(model, dataset[i]["source"][:limit])[::stride]
        xs[i % 2].append(torch.cat([out, torch.ones(len(out), 1)], dim=1).double())
        ys[i % 2].append(torch.arange(0, stride * len(out), stride, dtype=torch.float64)[:, None])
    fit = torch.linalg.lstsq(torch.cat(xs[0]), torch.cat(ys[0])).solution
    y = torch.cat(ys[1])
    return float(1 - ((torch.cat(xs[1]) @ fit - y) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def checked_inputs(args) -> tuple:
    """(the split's JSONL, the bin/ folder, [(row, checkpoint)]) with every path checked up front: a
    typo in the last checkpoint is named before minutes spent on the first ones."""
    jsonl = require_file(os.path.join(args.data, "jsonl", f"{args.split}.jsonl"), "--data (the binding set's long/)")
    bin_dir = require_dir(os.path.join(args.data, "bin"), "--data (the binding set's long/)")
    checkpoints = []
    for spec in args.checkpoints:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise DataError(f"--checkpoints: expected ROW=PATH, got {spec!r}")
        checkpoints.append((name, require_file(path, f"--checkpoints {name}")))
    check_output_files([args.out + ".md", args.out + ".json"] if args.out else [], "--out")
    return jsonl, bin_dir, checkpoints


def main(argv=None) -> int:
    p = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="the binding set's long/ folder (bin/, jsonl/)")
    p.add_argument("--checkpoints", nargs="+", required=True, metavar="ROW=PATH")
    p.add_argument("--split", default="valid", choices=("valid", "test"))
    p.add_argument(
        "--far",
        type=int_range(0),
        default=FAR,
        help="baseline positions are at least this many tokens from the binding (0 on the short set)",
    )
    p.add_argument("--variant", default="binding", choices=("binding", "order"))
    p.add_argument("--out", help="write OUT.md and OUT.json (else print the table)")
    args = p.parse_args(argv)
    try:
        return run(args, argv)
    except UserError as e:  # a checkpoint fairseq cannot load (lsg_fairseq's checkpoint_errors), a bad path
        return report(e, PROG)


def run(args, argv) -> int:
    jsonl, bin_dir, checkpoints = checked_inputs(args)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    start = time.time()
    with open(jsonl, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    rows = {}
    # order: (taken away, watched) pairs of arrival indices; the first two arrivals of each document
    probes = {"binding": [None], "order": [(0, 1), (1, 0)]}[args.variant]
    for name, path in checkpoints:
        model, task = load(path, bin_dir, args.split)
        dataset = task.datasets[args.split]
        limit = model.encoder.max_positions()  # bart_1024 reads the first 1,024 tokens only
        for probe in probes:
            row = name if probe is None else name + " " + {(0, 1): "forward", (1, 0): "backward"}[probe]
            per_doc = []
            for i, doc in enumerate(docs[: len(dataset)]):
                tokens = dataset[i]["source"][:limit]
                if probe is not None:
                    if sum(task.source_dictionary[int(t)] == "\u2581arrived" for t in tokens) >= 2:
                        per_doc.append(probe_order(model, task.source_dictionary, tokens, *probe, args.far))
                    continue  # else the second arrival lies past the encoder's limit
                for key in doc["keys"]:  # one probe per key: its animal swapped, the other keys kept
                    try:
                        per_doc.append(probe_document(model, task.source_dictionary, tokens, key, args.far))
                    except StopIteration:  # its binding or its use lies past the encoder's limit
                        continue
            if not per_doc:
                raise DataError(
                    f"--checkpoints {name}={path}: no key of {args.split}.jsonl has its binding and use within "
                    f"the encoder's {limit} tokens"
                )
            ratios = [
                d["use"] / d["baseline"] if d["baseline"] > 0 else float("inf" if d["use"] > 0 else "nan")
                for d in per_doc
            ]
            finite = [r for r in ratios if r == r]
            rows[row] = {
                "keys": len(per_doc),
                "use_over_baseline_median": statistics.median(finite) if finite else None,
                "use_moved_share": sum(d["use"] > 1e-6 for d in per_doc) / len(per_doc),
                "use_over_bind_median": statistics.median(d["use"] / d["bind"] for d in per_doc),
                "median_gap_tokens": statistics.median(d["gap"] for d in per_doc),
                # once per checkpoint: where a token is does not depend on the probe
                "position_r2": position_readout(model, dataset, len(per_doc), limit)
                if probe == probes[0] and args.variant == "order"
                else None,
                "per_doc": per_doc,
            }
            print(f"{row}: { ({k: v for k, v in rows[row].items() if k != 'per_doc'}) }", file=sys.stderr)
    head = provenance.git_stamp(REPO, CODE_PATHS)
    change = {
        "binding": "the key's bound animal swapped for one not in the document",
        "order": "one arrival taken away ('arrived' -> 'found'), the other's animal watched (forward: the "
        "later one; backward: the earlier one)",
    }[args.variant]
    order = args.variant == "order"
    lines = [
        f"{args.variant.capitalize()} flow, {args.split} split of `{args.data}`: {change}; L2 change of the "
        f"encoder output. Code at commit {head}; {time.time() - start:.0f} s.",
        f"Command: `python examples/long_range/binding_flow.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        "| row | probes | watched site moved | watched / far baseline (median) "
        "| watched / the changed token's own (median) |" + (" position readout R^2 |" if order else ""),
        "|---|---:|---:|---:|---:|" + ("---:|" if order else ""),
    ]
    for row, r in rows.items():
        ratio = "-" if r["use_over_baseline_median"] is None else f"{r['use_over_baseline_median']:.2f}"
        r2 = "" if not order else " - |" if r["position_r2"] is None else f" {r['position_r2']:.2f} |"
        lines.append(
            f"| `{row}` | {r['keys']} | {100 * r['use_moved_share']:.0f}% | {ratio} "
            f"| {r['use_over_bind_median']:.1e} |{r2}"
        )
    text = "\n".join(lines) + "\n"
    if args.out:
        with atomic_outputs([args.out + ".md", args.out + ".json"]) as (md, js):
            md.write(text)
            json.dump(rows, js, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
