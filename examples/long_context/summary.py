#!/usr/bin/env python
"""What `make demo` prints: recall beyond token 1,024, long model vs truncated baseline, and one
test document whose far keys the long model restated exactly (reads run.sh's $OUT)."""

import json
import os
import sys

from lsg_text.errors import OneLineArgumentParser, UserError, report
from lsg_text.fileio import DataError, require_file
from lsg_text.generate_output import parse_generate_output
from lsg_text.synthetic import key_hits

PROG = "summary.py"


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def read_rows(args) -> dict:
    """results.json's rows by name, or a :class:`DataError` naming the file and what is missing."""
    what = "--report" if args.report else "OUT (not a finished run.sh OUT?)"
    path = require_file(os.path.join(args.report or os.path.join(args.out, "report"), "results.json"), what)
    try:
        with open(path, encoding="utf-8") as f:
            rows = {r["name"]: r for r in json.load(f)["rows"]}
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: not a report.py results.json ({type(e).__name__}: {e})") from None
    for flag, name in (("--model", args.model), ("--baseline", args.baseline)):
        if name not in rows:
            raise DataError(f"{flag} {name}: no such row in {path} (rows there: {', '.join(rows)})")
    return rows


def main(argv=None):
    p = OneLineArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("out", help="run.sh's OUT")
    p.add_argument("--report", help="folder of results.json (default OUT/report)")
    p.add_argument("--model", default="lsg_norm")
    p.add_argument("--baseline", default="bart_1024")
    args = p.parse_args(argv)
    try:
        rows = read_rows(args)
        jsonl = require_file(os.path.join(args.out, "long", "jsonl", "test.jsonl"), "OUT (no test split)")
        outputs = {
            name: require_file(os.path.join(args.out, "eval", name, "generate.out"), f"OUT (no evaluation of {name})")
            for name in (args.model, args.baseline)
        }
    except UserError as e:
        return report(e, PROG)
    m, b = rows[args.model], rows[args.baseline]
    with open(jsonl, encoding="utf-8") as f:
        examples = [json.loads(line) for line in f]
    print(f"Key facts recalled on {len(examples)} test documents of ~4K tokens (chance {pct(m['chance'])}):")
    print(
        f"  keys beyond token 1,024 ({m['keys_beyond_1024']}): {args.model} at 4,096 tokens "
        f"{pct(m['recall_beyond_1024'])}  |  {args.baseline} {pct(b['recall_beyond_1024'])}"
    )
    print(
        f"  keys before token 1,024:      {args.model} {pct(m['recall_before_1024'])}  |  "
        f"{args.baseline} {pct(b['recall_before_1024'])}"
    )
    print(
        f"  ROUGE-1/2/L: {args.model} {m['rouge1']:.1f}/{m['rouge2']:.1f}/{m['rougeL']:.1f}  |  "
        f"{args.baseline} {b['rouge1']:.1f}/{b['rouge2']:.1f}/{b['rougeL']:.1f}"
    )

    def hyps(name):
        with open(outputs[name], encoding="utf-8") as f:
            return {k: v.best_hypothesis for k, v in parse_generate_output(f).items()}

    hyp, base = hyps(args.model), hyps(args.baseline)
    for i, ex in enumerate(examples):  # a document with a key past ~1,100 words, restated exactly
        if any(k["token_offset"] > 1100 for k in ex["keys"]) and all(
            all(h.values()) for h in key_hits(ex["keys"], hyp.get(i) or "")
        ):
            offsets = ", ".join(str(k["token_offset"]) for k in ex["keys"])
            print(f"example: test document {i}, key sentences at words {offsets}")
            print(f"  reference:   {ex['summary']}")
            print(f"  {args.model}:    {hyp[i]}")
            print(f"  {args.baseline}:   {base.get(i)}")
            break
    else:
        print(f"no test document has all its keys right with a key past word 1,100 ({args.model})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
