#!/usr/bin/env python
"""Recall of the synthetic set's key facts by position: did the model read that part of the document?

Each test document of scripts/make_synthetic_data.py hides 2-3 key sentences ("The red fox
visited Paris on Monday.") at random places, and stores them under "keys" with their offsets. For
every key, each of its four facts (colour, animal, city, weekday) counts as recalled when the
generated summary's key sentence of the same rank has the same word there. Recall is reported
overall, per bin of source positions, and for the keys at or beyond --beyond (the part a model
truncated to that many tokens never sees). A uniform guess recalls 8.8%.

Positions are model tokens (sentencepiece pieces, counting the <s> the task prepends) with
--spm-model, else whitespace words.

Example:
    fairseq-generate ... > gen.out
    python scripts/key_recall.py --jsonl data/test.jsonl --generate-output gen.out \\
        --spm-model bin/spm.model --name lsg_norm --json eval/recall.json
"""

import argparse
import json
import sys

from lsg_text.argtypes import NON_NEGATIVE_INT, POSITIVE_INT
from lsg_text.atomic import atomic_outputs
from lsg_text.errors import report
from lsg_text.fileio import DataError, check_output_files, check_utf8, require_file
from lsg_text.generate_output import parse_generate_output
from lsg_text.jsonl import read_jsonl
from lsg_text.offline_bpe import load_sentencepiece
from lsg_text.synthetic import FIELDS, chance_recall, key_hits

PROG = "key_recall.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jsonl", required=True, help="the synthetic split with its 'keys' (e.g. test.jsonl)")
    p.add_argument(
        "--generate-output", required=True, help="fairseq-generate stdout on that split (ids = line numbers of --jsonl)"
    )
    p.add_argument("--spm-model", help="sentencepiece model: positions in pieces (+1 for <s>) instead of words")
    p.add_argument("--no-bos", action="store_true", help="with --spm-model: no <s> before the source (LOCOST)")
    p.add_argument("--bin-size", type=POSITIVE_INT, default=512, help="width of the position bins (default: 512)")
    p.add_argument(
        "--beyond",
        type=NON_NEGATIVE_INT,
        default=1024,
        help="also report recall of the keys at positions >= this (default: 1024)",
    )
    p.add_argument("--name", default="model", help="label stored in the report")
    p.add_argument("--json", help="write the report here (atomically)")
    return p


def is_key(key) -> bool:
    """A key of make_synthetic_data.py's "keys" list: its word offset and the facts scored."""
    offset = key.get("token_offset") if isinstance(key, dict) else None
    return (
        isinstance(offset, int)
        and not isinstance(offset, bool)
        and offset >= 0
        and all(isinstance(key.get(f), str) for f in FIELDS)
    )


def key_positions(document: str, keys, sp, bos: bool):
    """Source position of each key: its word offset, or its piece index in the model's input."""
    if sp is None:
        return [k["token_offset"] for k in keys]
    words = document.split()
    # sentencepiece splits on whitespace first, so a prefix's pieces are the document's first pieces
    return [len(sp.encode(" ".join(words[: k["token_offset"]]))) + int(bos) for k in keys]


def recall_report(examples, hypotheses, positions, bin_size: int, beyond: int, name: str) -> dict:
    bins = {}
    fields = {f: [0, 0] for f in FIELDS}
    far = [0, 0]
    total = [0, 0]
    for ex, hyp, pos in zip(examples, hypotheses, positions):
        for hits, p in zip(key_hits(ex["keys"], hyp or ""), pos):
            n_hit = sum(hits.values())
            for acc in (bins.setdefault(p // bin_size, [0, 0]), total) + ((far,) if p >= beyond else ()):
                acc[0] += n_hit
                acc[1] += len(FIELDS)
            for f in FIELDS:
                fields[f][0] += hits[f]
                fields[f][1] += 1
    rate = lambda a: a[0] / a[1] if a[1] else None  # noqa: E731
    return {
        "name": name,
        "documents": len(examples),
        "keys": total[1] // len(FIELDS),
        "recall": rate(total),
        "recall_beyond": rate(far),
        "keys_beyond": far[1] // len(FIELDS),
        "beyond": beyond,
        "chance": chance_recall(),
        "fields": {f: rate(v) for f, v in fields.items()},
        "bin_size": bin_size,
        "bins": [
            {"start": b * bin_size, "end": (b + 1) * bin_size, "facts": bins[b][1], "recall": rate(bins[b])}
            for b in sorted(bins)
        ],
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        require_file(args.jsonl, "--jsonl")
        require_file(args.generate_output, "--generate-output")
        # --json and --jsonl differ by one letter
        check_output_files([args.json], "--json", inputs=[args.jsonl, args.generate_output, args.spm_model])
        sp = None
        if args.spm_model:
            # any sentencepiece model: positions are counted, never looked up in a dict.txt
            sp = load_sentencepiece(args.spm_model, "--spm-model", check_specials=False)
        examples = []
        for line, ex in read_jsonl(args.jsonl, fields=("document", "summary")):
            if not isinstance(ex.get("keys"), list):
                raise DataError(
                    f"{args.jsonl}: example {len(examples)} has no 'keys' list "
                    "(not a scripts/make_synthetic_data.py file)"
                )
            for key in ex["keys"]:
                if not is_key(key):
                    raise DataError(
                        f"{args.jsonl}:{line}: a key {json.dumps(key)[:80]} is not an object with a whole "
                        f"token_offset >= 0 and the strings {', '.join(FIELDS)} (as make_synthetic_data.py writes)"
                    )
            examples.append(ex)
        check_utf8(args.generate_output, "--generate-output")
        with open(args.generate_output, encoding="utf-8") as f:
            generated = parse_generate_output(f, args.generate_output)
        extra = sorted(i for i in generated if i >= len(examples))
        if extra:
            raise DataError(
                f"{args.generate_output}: example id {extra[0]} but --jsonl has {len(examples)} "
                "examples (another split?)"
            )
        hyps = [generated[i].best_hypothesis if i in generated else None for i in range(len(examples))]
    except DataError as e:
        return report(str(e), PROG)
    positions = [key_positions(ex["document"], ex["keys"], sp, not args.no_bos) for ex in examples]
    rep = recall_report(examples, hyps, positions, args.bin_size, args.beyond, args.name)
    if args.json:
        with atomic_outputs([args.json]) as (f,):
            json.dump(rep, f, indent=1)
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731  (no keys, or none that far)
    print(
        f"{args.name}: key recall {pct(rep['recall'])} over {rep['keys']} keys; at positions >= "
        f"{args.beyond}: {pct(rep['recall_beyond'])} ({rep['keys_beyond']} keys); "
        f"chance {100 * rep['chance']:.1f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
