#!/usr/bin/env python
"""Encode text with a sentencepiece model: one output line per input line, pieces space-separated.

The output is what `fairseq-preprocess --srcdict dict.txt` expects (dict.txt from spm_train.py).
Empty input lines stay empty, so source and target files stay aligned. Decoding happens inside
fairseq: `fairseq-generate --bpe sentencepiece --sentencepiece-model PREFIX.model`.

Example:
    python scripts/spm_encode.py --model spm/spm.model \\
        --inputs raw/train.source raw/train.target --outputs bpe/train.source bpe/train.target
"""

import argparse
import os
import sys

from lsg_text.argtypes import C_INT_MAX, int_range
from lsg_text.atomic import atomic_outputs
from lsg_text.errors import report
from lsg_text.fileio import DataError, check_output_files, check_utf8, count_lines, progress, unpaired_outputs
from lsg_text.offline_bpe import load_sentencepiece, require_local_file

PROG = "spm_encode.py"
BATCH = 256  # lines handed to sentencepiece's C++ encoder at once (it threads over a batch)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="sentencepiece model (PREFIX.model from spm_train.py)")
    p.add_argument("--inputs", nargs="+", default=["-"], help="text files ('-' = stdin); default: stdin")
    p.add_argument("--outputs", nargs="+", default=["-"], help="one output per input ('-' = stdout); default: stdout")
    p.add_argument(
        "--output-format",
        choices=["piece", "id"],
        default="piece",
        help="pieces (for fairseq-preprocess) or ids (== fairseq dictionary indices)",
    )
    p.add_argument(
        "--threads", type=int_range(1, C_INT_MAX), default=min(4, os.cpu_count() or 1), help="encoder threads"
    )
    p.add_argument(
        "--allow-foreign-model",
        action="store_true",
        help="accept a model whose ids 0..3 are not <s> <pad> </s> <unk> (dict.txt indices will not equal piece ids)",
    )
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    unpaired = unpaired_outputs(args.inputs, args.outputs)
    if unpaired:
        return report(unpaired, PROG)
    try:
        # All outputs up front: the encoding loop commits them one by one.
        check_output_files(args.outputs, "--outputs", inputs=list(args.inputs) + [args.model])
        sp = load_sentencepiece(args.model, "--model", check_specials=not args.allow_foreign_model)
        for path in args.inputs:
            if path != "-":
                require_local_file(path, "--inputs")
                check_utf8(path, "--inputs")  # names the byte offset; decoding later cannot
        unk = sp.unk_id()
        known = {sp.id_to_piece(i) for i in range(sp.get_piece_size()) if i != unk}
        for src, dst in zip(args.inputs, args.outputs):
            n_lines = n_pieces = n_unk = 0
            total = count_lines(src) if src != "-" else None
            fin = sys.stdin if src == "-" else open(src, encoding="utf-8")
            with fin, atomic_outputs([dst], inputs=list(args.inputs) + [args.model]) as (fout,):
                batch = []

                def flush():
                    nonlocal n_pieces, n_unk
                    if args.output_format == "id":
                        seqs = sp.encode(batch, num_threads=args.threads)
                        n_unk += sum(i == unk for seq in seqs for i in seq)
                    else:
                        # Same strings as fairseq's SentencepieceBPE.encode: an unknown character
                        # stays as itself and fairseq-preprocess maps it to <unk>.
                        seqs = sp.encode(batch, out_type=str, num_threads=args.threads)
                        n_unk += sum(p not in known for seq in seqs for p in seq)
                    for seq in seqs:
                        n_pieces += len(seq)
                        fout.write(" ".join(map(str, seq)) + "\n")
                    batch.clear()

                for line in progress(fin, desc=f"encoding {os.path.basename(src)}", total=total):
                    batch.append(line.rstrip("\n"))
                    n_lines += 1
                    if len(batch) == BATCH:
                        flush()
                if batch:
                    flush()
            print(f"{src}: {n_lines} lines, {n_pieces} pieces, {n_unk} <unk> -> {dst}", file=sys.stderr)
    except DataError as e:
        return report(str(e), PROG)
    except UnicodeDecodeError as e:
        return report(f"{src}: not UTF-8 text ({e.reason})", PROG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
