#!/usr/bin/env python
"""Examples/s of the on-the-fly GSG dataset (selection + masking + collation, one process).

    python examples/gsg_pretraining/throughput.py --data gsg_out/gsg-bin --split train

Prints one line per selection strategy: examples/s, source tokens/s and the mean source/target
lengths. One process, no DataLoader workers: fairseq's --num-workers N multiplies it.
"""

import argparse
import os
import sys
import time

from fairseq.data import Dictionary

from lsg_fairseq.data.binarized import splits_in
from lsg_fairseq.data.gsg_dataset import CORPUS_PARTS, CORPUS_SUFFIX, GapSentenceDataset, GSGCorpus, corpus_prefix
from lsg_text import gsg
from lsg_text.argtypes import POSITIVE_INT
from lsg_text.errors import OneLineArgumentParser, UserError, report
from lsg_text.fileio import DataError, check_fairseq_dict, require_dir, require_file

PROG = "throughput.py"


def open_split(data: str, split: str):
    """(dictionary, corpus) of ``--data``'s ``split``, or a :class:`DataError` naming the folder, the
    split and the splits there (before fairseq's traceback on a missing or damaged dict.txt)."""
    require_dir(data, "--data")
    dict_path = require_file(os.path.join(data, "dict.txt"), "--data (not a scripts/gsg_preprocess.py folder)")
    check_fairseq_dict(dict_path, "--data")
    prefix = corpus_prefix(data, split)
    if not any(os.path.exists(f"{prefix}.{part}.npy") for part in CORPUS_PARTS):
        found = splits_in(data, CORPUS_SUFFIX + ".")
        raise DataError(f"--split {split}: no such split in --data {data} (splits there: {', '.join(found) or 'none'})")
    return Dictionary.load(dict_path), GSGCorpus(prefix)


def main(argv=None):
    p = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="output dir of scripts/gsg_preprocess.py")
    p.add_argument("--split", default="train")
    p.add_argument("--max-source-positions", type=POSITIVE_INT, default=4096)
    p.add_argument("--max-target-positions", type=POSITIVE_INT, default=1024)
    p.add_argument("--batch-size", type=POSITIVE_INT, default=8, help="examples per collated batch")
    p.add_argument("--repeats", type=POSITIVE_INT, default=2, help="passes over the split (epochs 1..N)")
    args = p.parse_args(argv)

    try:
        d, corpus = open_split(args.data, args.split)
    except UserError as e:
        return report(e, PROG)
    mask = d.add_symbol("<mask>")
    print(
        f"{args.split}: {len(corpus)} documents, mean {corpus.doc_tokens.mean():.0f} tokens "
        f"(min {corpus.doc_tokens.min()}, max {corpus.doc_tokens.max()})"
    )
    for strategy in gsg.SELECTION_STRATEGIES:
        ds = GapSentenceDataset(
            corpus,
            d,
            mask_token=mask,
            ratio=0.2,
            ratio_max=None,
            strategy=strategy,
            score_noise=0.0,
            mask_probs=(1, 0, 0, 0),
            seed=1,
            max_source_positions=args.max_source_positions,
            max_target_positions=args.max_target_positions,
        )
        n, src_tokens, tgt_tokens = 0, 0, 0
        t0 = time.perf_counter()
        for epoch in range(1, args.repeats + 1):
            ds.set_epoch(epoch)
            for start in range(0, len(ds), args.batch_size):
                batch = ds.collater([ds[i] for i in range(start, min(start + args.batch_size, len(ds)))])
                n += batch["nsentences"]
                src_tokens += int(batch["net_input"]["src_lengths"].sum())
                tgt_tokens += batch["ntokens"]
        dt = time.perf_counter() - t0
        print(
            f"{strategy:9s} {n / dt:8.1f} examples/s  {src_tokens / dt / 1e3:8.1f}K source tokens/s  "
            f"mean source {src_tokens / n:.0f}, target {tgt_tokens / n:.0f} tokens"
        )

    return 0


if __name__ == "__main__":
    sys.exit(main())
