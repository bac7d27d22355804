#!/usr/bin/env python
"""Encode text lines to GPT-2 BPE ids with LOCAL encoder.json / vocab.bpe (never downloads).

A drop-in for fairseq's examples/roberta/multiprocessing_bpe_encoder.py, with the same flags and
semantics: --inputs are read in parallel (line i of every input forms one example), each line is
stripped, and without --keep-empty an example with any empty line is dropped from every output.
Unlike fairseq's script, inputs of different lengths are an error (fairseq silently truncates to
the shortest), the BPE files are checked first, and outputs appear only when complete.

HF vocab.json/merges.txt (BART, RoBERTa) work as --encoder-json/--vocab-bpe unchanged. The ids are
GPT-2 ids; fairseq-preprocess maps them to indices with a dict.txt (lsg-fairseq-convert writes
one for converted HF models).

Example:
    python scripts/gpt2_encode.py --encoder-json m/encoder.json --vocab-bpe m/vocab.bpe \\
        --inputs raw/train.source raw/train.target --outputs bpe/train.source bpe/train.target \\
        --keep-empty --workers 2
"""

import argparse
import contextlib
import logging
import sys
from multiprocessing import Pool

from lsg_text.argtypes import POSITIVE_INT
from lsg_text.atomic import atomic_outputs
from lsg_text.errors import report
from lsg_text.fileio import DataError, check_output_files, check_utf8, count_lines, progress, unpaired_outputs
from lsg_text.offline_bpe import check_gpt2_files, gpt2_encode_line, require_local_file

PROG = "gpt2_encode.py"

# Per-process state, set by _init_worker in the main process and in every pool worker.
_encoder = None
_keep_empty = False


def _init_worker(encoder_json: str, vocab_bpe: str, keep_empty: bool) -> None:
    global _encoder, _keep_empty
    check_gpt2_files(encoder_json, vocab_bpe)
    # fairseq's own encoder, so the ids are exactly those that `--bpe gpt2` decodes (imported
    # here, not at the top: --help and flag errors do not pay for importing fairseq). Its package
    # logs INFO notices at import (tensorboardX missing) that say nothing to this script's user;
    # quiet for the import only, so that a caller in the same process (the tests) keeps its logs.
    fairseq_log = logging.getLogger("fairseq")
    level = fairseq_log.level
    fairseq_log.setLevel(logging.WARNING)
    try:
        from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
    finally:
        fairseq_log.setLevel(level)

    _encoder = get_encoder(encoder_json, vocab_bpe)
    _keep_empty = keep_empty


def _encode_example(item):
    """(line_number, lines) -> ("PASS", encoded lines) | ("EMPTY", None) | ("ERROR", message)."""
    lineno, lines = item
    out = []
    for line in lines:
        line = line.strip()
        if not line and not _keep_empty:
            return "EMPTY", None
        try:
            out.append(" ".join(map(str, gpt2_encode_line(_encoder, line))))
        except DataError as e:
            return "ERROR", f"line {lineno}: {e}"
    return "PASS", out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--encoder-json", required=True, help="local encoder.json (or HF vocab.json)")
    p.add_argument(
        "--vocab-bpe", required=True, help="local vocab.bpe (or HF merges.txt), with its '#version' header line"
    )
    p.add_argument("--inputs", nargs="+", default=["-"], help="text files read in parallel ('-' = stdin)")
    p.add_argument("--outputs", nargs="+", default=["-"], help="one output per input ('-' = stdout)")
    p.add_argument(
        "--keep-empty",
        action="store_true",
        help="keep empty lines (as empty output lines) instead of dropping the example",
    )
    p.add_argument(
        "--workers", type=POSITIVE_INT, default=1, help="encoder processes (default: 1); output order is kept"
    )
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    unpaired = unpaired_outputs(args.inputs, args.outputs)
    if unpaired:
        return report(unpaired, PROG)
    if args.inputs.count("-") > 1:
        return report("--inputs: stdin ('-') can be given only once", PROG)
    try:
        check_output_files(args.outputs, "--outputs", inputs=list(args.inputs) + [args.encoder_json, args.vocab_bpe])
        # Validates both files (existence, URL, format) before any output exists.
        _init_worker(args.encoder_json, args.vocab_bpe, args.keep_empty)
        for path in args.inputs:
            if path != "-":
                require_local_file(path, "--inputs")
                check_utf8(path, "--inputs")  # names the byte offset; decoding later cannot
        files = [p for p in args.inputs if p != "-"]
        counts = {p: count_lines(p) for p in files}
        if len(set(counts.values())) > 1:
            detail = ", ".join(f"{p} has {n}" for p, n in counts.items())
            raise DataError(f"--inputs have different line counts ({detail}); they must be aligned")
        total = next(iter(counts.values()), None)

        stats = {"PASS": 0, "EMPTY": 0}
        with contextlib.ExitStack() as stack:
            ins = [sys.stdin if p == "-" else stack.enter_context(open(p, encoding="utf-8")) for p in args.inputs]
            outs = stack.enter_context(atomic_outputs(args.outputs, inputs=list(args.inputs)))
            items = enumerate(zip(*ins), start=1)
            if args.workers > 1:
                pool = stack.enter_context(
                    Pool(
                        args.workers,
                        initializer=_init_worker,
                        initargs=(args.encoder_json, args.vocab_bpe, args.keep_empty),
                    )
                )
                results = pool.imap(_encode_example, items, chunksize=100)  # imap keeps input order
            else:
                results = map(_encode_example, items)
            for status, enc in progress(results, desc="gpt2 bpe", total=total):
                if status == "ERROR":
                    raise DataError(f"{enc} (inputs: {', '.join(args.inputs)})")
                stats[status] += 1
                if status == "PASS":
                    for line, fout in zip(enc, outs):
                        fout.write(line + "\n")
    except DataError as e:
        return report(str(e), PROG)
    except UnicodeDecodeError as e:
        return report(f"--inputs: not UTF-8 text ({e.reason})", PROG)
    msg = f"encoded {stats['PASS']} examples"
    if stats["EMPTY"]:
        msg += f"; dropped {stats['EMPTY']} with an empty line (pass --keep-empty to keep them)"
    print(msg, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
