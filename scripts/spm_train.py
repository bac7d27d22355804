#!/usr/bin/env python
"""Train a sentencepiece model offline and write a fairseq dict.txt consistent with it.

Writes PREFIX.model, PREFIX.vocab and (default) dict.txt beside them; existing ones are replaced
only with --force (text encoded with the old model, and data binarized with its dictionary, would
no longer match the new ones). The model reserves
fairseq's specials at the same ids (<s>=0 <pad>=1 </s>=2 <unk>=3), and dict.txt lists every other
piece in id order, so fairseq dictionary index == sentencepiece id (see
lsg_text/offline_bpe.py). Input lines (whole documents) are split into sentences for
training, because sentencepiece skips lines longer than --max-sentence-length bytes.

Then: scripts/spm_encode.py --model PREFIX.model ..., fairseq-preprocess --srcdict dict.txt, and
decode with fairseq's `--bpe sentencepiece --sentencepiece-model PREFIX.model`.

Example:
    python scripts/spm_train.py --inputs raw/train.source raw/train.target \\
        --model-prefix spm/spm --vocab-size 8000
"""

import argparse
import os
import shutil
import sys
import tempfile

from lsg_text.argtypes import C_INT_MAX, POSITIVE_INT, SPM_SEED, float_range, int_range
from lsg_text.atomic import atomic_files
from lsg_text.errors import report
from lsg_text.fileio import (
    DataError,
    check_output_files,
    check_utf8,
    made_folder,
    progress,
    refuse_existing,
    require_text,
)
from lsg_text.offline_bpe import (
    fairseq_dict_lines,
    load_sentencepiece,
    require_local_file,
    sentencepiece_special_kwargs,
    sentences_for_training,
)
from lsg_text.sentences import split_sentences

PROG = "spm_train.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, help="text files, one document (or sentence) per line")
    p.add_argument("--model-prefix", required=True, help="output prefix: writes PREFIX.model and PREFIX.vocab")
    p.add_argument(
        "--vocab-size",
        type=int_range(5, C_INT_MAX),
        default=8000,
        help="number of pieces, the 4 specials included (default: 8000)",
    )
    p.add_argument(
        "--model-type",
        choices=["unigram", "bpe"],
        # BPE: on small corpora unigram stops far below the requested size (263 of 400 pieces on
        # the synthetic set, 2.2 pieces per word), while BPE grows up to whole words.
        default="bpe",
        help="sentencepiece algorithm (default: bpe)",
    )
    p.add_argument("--dict", default=None, help="fairseq dictionary to write (default: dict.txt beside PREFIX.model)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing PREFIX.model, PREFIX.vocab or --dict (else refused before training)",
    )
    p.add_argument(
        "--character-coverage",
        type=float_range(0, 1, lo_open=True),
        # sentencepiece's own advice: 1.0 for languages with small character sets (English);
        # 0.9995 for CJK. Below 1.0, rare letters (the 'q' of a city name) become <unk>.
        default=1.0,
        help="share of characters covered; rarer ones become <unk> (default: 1.0; 0.9995 suits CJK text)",
    )
    p.add_argument(
        "--soft-vocab-limit",
        action="store_true",
        help="allow fewer pieces than --vocab-size when the data is too small (sentencepiece's hard_vocab_limit=false)",
    )
    p.add_argument(
        "--user-defined-symbols",
        default="",
        help="comma-separated pieces never split, e.g. '<n>' for jsonl_to_parallel.py --newline-token",
    )
    p.add_argument(
        "--input-sentence-size",
        type=POSITIVE_INT,
        default=2_000_000,
        help="sample at most this many sentences for training (default: 2000000)",
    )
    p.add_argument(
        "--max-sentence-length",
        type=int_range(1, C_INT_MAX),
        default=16384,
        help="longest training sentence in bytes; longer ones are cut at word boundaries (default: 16384)",
    )
    p.add_argument(
        "--no-sentence-split",
        action="store_true",
        help="train on input lines as they are (already one sentence per line)",
    )
    p.add_argument(
        "--normalization-rule",
        default="nmt_nfkc",
        help="sentencepiece normalization_rule_name (default: nmt_nfkc; 'identity' keeps text byte-exact)",
    )
    p.add_argument("--seed", type=SPM_SEED, default=1, help="seed of sentencepiece's sampling (default: 1)")
    p.add_argument(
        "--threads", type=int_range(1, C_INT_MAX), default=min(4, os.cpu_count() or 1), help="training threads"
    )
    p.add_argument("--verbose", action="store_true", help="show sentencepiece's own training log")
    return p


def train(spm, args, sentences, tmp_prefix: str) -> None:
    """sentencepiece's training into ``tmp_prefix``.model/.vocab; its failures as a DataError."""
    print(f"training sentencepiece ({args.model_type}, vocab {args.vocab_size}) ...", file=sys.stderr)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences,
            model_prefix=tmp_prefix,
            vocab_size=args.vocab_size,
            model_type=args.model_type,
            character_coverage=args.character_coverage,
            hard_vocab_limit=not args.soft_vocab_limit,
            user_defined_symbols=[s for s in args.user_defined_symbols.split(",") if s],
            input_sentence_size=args.input_sentence_size,
            shuffle_input_sentence=True,
            max_sentence_length=args.max_sentence_length,
            normalization_rule_name=args.normalization_rule,
            num_threads=args.threads,
            minloglevel=0 if args.verbose else 1,
            **sentencepiece_special_kwargs(),
        )
    except (RuntimeError, OSError) as e:
        hint = ""
        if "Vocabulary size" in str(e):
            hint = " (lower --vocab-size or pass --soft-vocab-limit"
            hint += ", or use --model-type bpe, which grows up to whole words)" if args.model_type == "unigram" else ")"
        raise DataError(f"sentencepiece training failed: {e}{hint}") from None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    prefix = os.path.abspath(args.model_prefix)
    out_dir = os.path.dirname(prefix)
    dict_path = args.dict or os.path.join(out_dir, "dict.txt")
    try:
        if args.model_prefix.endswith(("/", os.sep)) or os.path.isdir(args.model_prefix):
            # "spm/" would write spm.model/.vocab beside the folder and a dict.txt in its parent
            example = os.path.join(args.model_prefix.rstrip("/" + os.sep) or ".", "spm")
            raise DataError(
                f"--model-prefix {args.model_prefix}: names a folder (--model-prefix is a prefix, e.g. {example}, "
                f"which writes {example}.model and {example}.vocab)"
            )
        for path in args.inputs:
            require_local_file(path, "--inputs")
            check_utf8(path, "--inputs")  # names the byte offset; sentencepiece's reader cannot
            require_text(path, "--inputs")  # else sentencepiece's "[!sentences_.empty()]"
        model_files = [prefix + ".model", prefix + ".vocab"]
        check_output_files(model_files, "--model-prefix", inputs=args.inputs)
        # --dict that is one of the model files would replace the model just trained (its "given
        # twice" names --dict, the flag to change)
        check_output_files([*model_files, dict_path], "--dict", inputs=args.inputs)
        why = "text encoded with the old model, and data binarized with its dictionary, would no longer match"
        # the flag whose file is in the way: another --model-prefix does not move a --dict
        flag = "--model-prefix" if any(os.path.lexists(p) for p in model_files) else "--dict"
        refuse_existing([*model_files, dict_path], args.force, flag, why)
    except DataError as e:
        return report(str(e), PROG)
    import sentencepiece as spm

    def sentences():
        for path in args.inputs:
            with open(path, encoding="utf-8") as f:
                lines = progress(f, desc=f"reading {os.path.basename(path)}")
                if args.no_sentence_split:
                    yield from sentences_for_training(
                        lines, lambda x: [x.strip()] if x.strip() else [], args.max_sentence_length
                    )
                else:
                    yield from sentences_for_training(lines, split_sentences, args.max_sentence_length)

    spm.set_random_generator_seed(args.seed)
    # sentencepiece writes its files by prefix, so it trains into a temp folder beside the outputs;
    # atomic_files then commits model, vocab and dict.txt together: a failed run leaves no model
    # without its dictionary, no half of an earlier one, and no output folder it made (made_folder).
    try:
        with made_folder(out_dir), tempfile.TemporaryDirectory(prefix=".spm_train.", dir=out_dir) as tmp_dir:
            tmp_prefix = os.path.join(tmp_dir, "m")
            train(spm, args, sentences(), tmp_prefix)
            sp = load_sentencepiece(tmp_prefix + ".model", flag="--model-prefix")
            with atomic_files([prefix + ".model", prefix + ".vocab", dict_path]) as (model, vocab, dictionary):
                for trained, out in ((".model", model), (".vocab", vocab)):
                    with open(tmp_prefix + trained, "rb") as f:
                        shutil.copyfileobj(f, out)
                for line in fairseq_dict_lines(sp):
                    dictionary.write((line + "\n").encode("utf-8"))
    except DataError as e:
        return report(str(e), PROG)
    n = sp.get_piece_size()
    print(
        f"wrote {prefix}.model/.vocab ({n} pieces) and {dict_path} ({n - 4} entries; index == piece id)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
