#!/usr/bin/env python
"""Summarization JSONL -> fairseq parallel text ``{split}.source`` / ``{split}.target``.

One example per line; whitespace (paragraph breaks included) is collapsed to single spaces, so
sentences remain recoverable from punctuation only (see ``lsg_text/jsonl.py``), or
paragraph breaks become ``--newline-token``. All outputs are written atomically: on any error
nothing is created or replaced.

Example:
    python scripts/jsonl_to_parallel.py --input-dir ../shared/data/sumpubmed --output-dir raw/
"""

import argparse
import os
import sys

from lsg_text.argtypes import POSITIVE_INT
from lsg_text.atomic import atomic_outputs
from lsg_text.errors import report
from lsg_text.fileio import DataError, check_output_path, count_lines, progress, require_dir, require_file
from lsg_text.jsonl import flatten, read_jsonl

PROG = "jsonl_to_parallel.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input-dir", help="folder holding {split}.jsonl for every split in --splits")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="SPLIT=FILE",
        help="explicit input file for one split (repeatable); instead of --input-dir (not both), and --splits "
        "is then ignored",
    )
    p.add_argument("--output-dir", required=True, help="where {split}.source/.target are written")
    p.add_argument(
        "--splits", nargs="+", default=["train", "valid", "test"], help="splits to convert (default: train valid test)"
    )
    p.add_argument(
        "--max-examples",
        type=POSITIVE_INT,
        default=None,
        metavar="N",
        help="keep only the first N examples of each split",
    )
    p.add_argument("--document-field", default="document", help="JSON field of the source text (default: document)")
    p.add_argument("--summary-field", default="summary", help="JSON field of the target text (default: summary)")
    p.add_argument(
        "--newline-token",
        default=None,
        metavar="TOK",
        help="replace paragraph breaks by ' TOK ' instead of a space (e.g. '<n>'); default: a space",
    )
    p.add_argument(
        "--write-ids",
        action="store_true",
        help="also write {split}.id with each example's 'id' field (or its line number)",
    )
    return p


def resolve_inputs(args) -> dict:
    """Map split -> JSONL path, checking that every file exists before anything is written."""
    if args.input and args.input_dir:
        raise DataError("give --input-dir or --input SPLIT=FILE, not both")
    if args.input:
        inputs = {}
        for item in args.input:
            split, sep, path = item.partition("=")
            if not sep or not split or not path:
                raise DataError(f"--input: expected SPLIT=FILE, got {item!r}")
            if split in inputs:
                raise DataError(f"--input: split {split!r} given twice")
            inputs[split] = require_file(path, f"--input {split}")
        return inputs
    if not args.input_dir:
        raise DataError("give --input-dir DIR or at least one --input SPLIT=FILE")
    require_dir(args.input_dir, "--input-dir")
    splits = list(dict.fromkeys(args.splits))  # a split named twice is converted once
    return {s: require_file(os.path.join(args.input_dir, f"{s}.jsonl"), f"--input-dir (split {s!r})") for s in splits}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.newline_token is not None and (not args.newline_token or any(c.isspace() for c in args.newline_token)):
        return report(f"--newline-token must be a single token without spaces, got {args.newline_token!r}", PROG)
    try:
        check_output_path(args.output_dir, "--output-dir", folder=True)
        inputs = resolve_inputs(args)
        fields = (args.document_field, args.summary_field)
        outputs, exts = [], ["source", "target"] + (["id"] if args.write_ids else [])
        for split in inputs:
            outputs += [os.path.join(args.output_dir, f"{split}.{ext}") for ext in exts]
        counts = {}
        # One atomic group for all splits: a bad line in test.jsonl must not leave a fresh
        # train.source next to a stale test.source.
        with atomic_outputs(outputs, inputs=list(inputs.values())) as handles:
            for i, (split, path) in enumerate(inputs.items()):
                files = handles[i * len(exts) : (i + 1) * len(exts)]
                n = 0
                for lineno, ex in progress(read_jsonl(path, fields, args.max_examples), desc=split, unit="doc"):
                    files[0].write(flatten(ex[args.document_field], args.newline_token) + "\n")
                    files[1].write(flatten(ex[args.summary_field], args.newline_token) + "\n")
                    if args.write_ids:
                        files[2].write(" ".join(str(ex.get("id", lineno)).split()) + "\n")
                    n += 1
                if n == 0:
                    raise DataError(f"{path}: no examples")
                for h in files:
                    h.flush()
                    # flatten() never emits a newline, so a mismatch here would be a bug, not bad
                    # input; checked anyway because misaligned pairs fail silently in training.
                    written = count_lines(h.name)
                    if written != n:
                        raise DataError(f"internal error: wrote {written} lines to {h.name} for {n} examples")
                counts[split] = n
    except DataError as e:
        return report(str(e), PROG)
    for split, n in counts.items():
        print(f"{split}: {n} examples -> {os.path.join(args.output_dir, split)}.{{source,target}}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
