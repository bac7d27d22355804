#!/usr/bin/env python
"""Write the seeded long-range synthetic summarization set as {train,valid,test}.jsonl.

Documents are filler sentences with a few key sentences ("The red fox visited Paris on Monday.")
at uniformly random positions; the summary restates the key sentences in document order. See
lsg_text/synthetic/. Same arguments -> byte-identical files. The defaults (300/20/20
documents of 2K-8K tokens) take a few seconds to generate.

Files already in --output-dir are never replaced without --force: an existing {split}.jsonl that
this run would write is refused. A split of size 0 is not written, and an older file of it is kept.

Example:
    python scripts/make_synthetic_data.py --output-dir data/synthetic
    python scripts/jsonl_to_parallel.py --input-dir data/synthetic --output-dir data/synthetic/raw
"""

import argparse
import json
import os
import sys
import time

from lsg_text.argtypes import NON_NEGATIVE_INT, POSITIVE_INT
from lsg_text.atomic import atomic_outputs
from lsg_text.errors import report
from lsg_text.fileio import DataError, check_output_files, check_output_path, progress, refuse_existing
from lsg_text.synthetic import VARIANTS, SyntheticConfig, make_split

PROG = "make_synthetic_data.py"


def build_parser() -> argparse.ArgumentParser:
    d = SyntheticConfig()
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", required=True, help="where train.jsonl, valid.jsonl and test.jsonl are written")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the {split}.jsonl files that this run writes when --output-dir already has them",
    )
    p.add_argument("--train", type=NON_NEGATIVE_INT, default=300, help="training documents (default: 300)")
    p.add_argument("--valid", type=NON_NEGATIVE_INT, default=20, help="validation documents (default: 20)")
    p.add_argument("--test", type=NON_NEGATIVE_INT, default=20, help="test documents (default: 20)")
    p.add_argument(
        "--min-tokens",
        type=POSITIVE_INT,
        default=d.min_tokens,
        help=f"shortest document, whitespace tokens (default: {d.min_tokens})",
    )
    p.add_argument(
        "--max-tokens",
        type=POSITIVE_INT,
        default=d.max_tokens,
        help=f"longest document, whitespace tokens (default: {d.max_tokens})",
    )
    p.add_argument(
        "--min-keys",
        type=POSITIVE_INT,
        default=d.min_keys,
        help=f"fewest key sentences per document (default: {d.min_keys})",
    )
    p.add_argument(
        "--max-keys",
        type=POSITIVE_INT,
        default=d.max_keys,
        help=f"most key sentences per document (default: {d.max_keys})",
    )
    p.add_argument(
        "--variant",
        choices=VARIANTS,
        default=d.variant,
        help=f"retrieval: key sentences restated; binding: name bound early, used late; count: "
        f"mentions counted; order: order of arrival (lsg_text/synthetic/; default: {d.variant})",
    )
    p.add_argument(
        "--min-gap",
        type=NON_NEGATIVE_INT,
        default=d.min_gap,
        help=f"binding: words from a name's binding to its use; order: between consecutive arrivals; "
        f"at least (default: {d.min_gap})",
    )
    p.add_argument(
        "--holdout",
        action="store_true",
        help="retrieval, binding: train and valid/test draw their (colour, animal) pairs from "
        "disjoint sets; order: their sets of arriving animals",
    )
    p.add_argument(
        "--decoy-names",
        type=NON_NEGATIVE_INT,
        default=d.decoy_names,
        help=f"binding: bound names that are never used, only avoid (default: {d.decoy_names})",
    )
    p.add_argument(
        "--even-mentions",
        action="store_true",
        help="binding: each decoy name avoids twice, so it occurs as often as a key's name",
    )
    p.add_argument("--seed", type=NON_NEGATIVE_INT, default=1, help="random seed (default: 1)")
    return p


def config_from_args(args: argparse.Namespace) -> SyntheticConfig:
    """The generator's config from parsed flags (also how examples/long_range/report.py regenerates
    the documents it scores)."""
    return SyntheticConfig(
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        min_keys=args.min_keys,
        max_keys=args.max_keys,
        variant=args.variant,
        min_gap=args.min_gap,
        holdout=args.holdout,
        decoy_names=args.decoy_names,
        even_mentions=args.even_mentions,
    )


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    try:
        cfg.validate()
    except ValueError as e:
        flags = "--min-tokens/--max-tokens/--min-keys/--max-keys/--min-gap/--decoy-names"
        return report(f"bad size flags ({flags}): {e}", PROG)
    sizes = {"train": args.train, "valid": args.valid, "test": args.test}
    splits = [s for s, n in sizes.items() if n > 0]
    if not splits:  # else "wrote  to OUT", exit 0, nothing written
        return report("--train, --valid and --test are all 0: nothing to write (give one of them 1 or more)", PROG)
    paths = [os.path.join(args.output_dir, f"{s}.jsonl") for s in splits]
    try:
        check_output_path(args.output_dir, "--output-dir", folder=True)
        check_output_files(paths, "--output-dir")  # e.g. a folder named train.jsonl
        refuse_existing(paths, args.force, "--output-dir")
    except DataError as e:
        return report(e, PROG)
    for split in sizes:
        kept = os.path.join(args.output_dir, f"{split}.jsonl")
        if split not in splits and os.path.lexists(kept):
            print(f"note: {kept} is kept as it is (--{split} 0: not written by this run)", file=sys.stderr)
    start = time.time()
    with atomic_outputs(paths) as handles:
        for split, f in zip(splits, handles):
            for ex in progress(
                make_split(split, sizes[split], args.seed, cfg), desc=split, total=sizes[split], unit="doc"
            ):
                f.write(json.dumps(ex, ensure_ascii=False) + "\n")
    print(
        f"wrote {', '.join(f'{s}.jsonl ({sizes[s]})' for s in splits)} to {args.output_dir} "
        f"in {time.time() - start:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
