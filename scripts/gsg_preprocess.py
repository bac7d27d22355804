#!/usr/bin/env python
"""Raw unlabeled text -> the corpus that `--task gap_sentence_generation` reads.

Splits documents into sentences (offline regex splitter shared with ROUGE-Lsum), optionally cuts
long documents (books) into pseudo-documents of about --chunk-words words, tokenizes every
sentence with the model's tokenizer and writes, per split, <output-dir>/<split>.gsg.*.npy
(model token ids + ROUGE word ids + sentence/document boundaries, see
lsg_fairseq/data/gsg_dataset.py) and <output-dir>/dict.txt. Gap-sentence selection and masking
happen on the fly in the task, so one preprocessing run serves every epoch, seed and GSG flag.

An --output-dir that already holds a GSG corpus (*.gsg.*.npy) or a dict.txt is refused: the splits
of two runs would be encoded with two dictionaries. --force replaces every GSG file there (the
splits not given this time are deleted, not kept) and dict.txt; other files are left alone. The
new files are written to a hidden temp folder first, so a failed run changes nothing.

Input formats (--format): lines (one document per line), blank (documents separated by blank
lines), file (each file one document, e.g. a book), jsonl (field --document-field, default
"document", as in shared/data).

Tokenizers: sentencepiece (--spm-model from scripts/spm_train.py, dict.txt beside it by default),
gpt2 (--gpt2-encoder-json/--gpt2-vocab-bpe + --dict, e.g. a converted BART folder), or
whitespace (--dict, or a dictionary built from the first split).

Example (Gutenberg books -> ~4K-word documents):
    python scripts/gsg_preprocess.py --format file --chunk-words 4000 \\
        --input train=../shared/data/gutenberg/austen-emma.txt,../shared/data/gutenberg/melville-moby_dick.txt \\
        --input valid=../shared/data/gutenberg/chesterton-thursday.txt \\
        --spm-model spm/spm.model --output-dir data-bin/gsg
"""

import argparse
import os
import shutil
import sys
import time

from lsg_text.argtypes import NON_NEGATIVE_INT, POSITIVE_INT
from lsg_text.atomic import staging_folder
from lsg_text.documents import (
    DOCUMENT_FORMATS,
    SENTENCE_SPLITTERS,
    chunk_sentences,
    document_sentences,
    get_sentence_splitter,
    read_documents,
)
from lsg_text.errors import report
from lsg_text.fileio import DataError, check_fairseq_dict, check_output_path, made_folder, require_file

PROG = "gsg_preprocess.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="SPLIT=FILE[,FILE...]",
        help="input files of one split (repeatable), e.g. train=a.txt,b.txt valid=c.txt",
    )
    p.add_argument("--format", choices=DOCUMENT_FORMATS, required=True, help="how documents are delimited (see above)")
    p.add_argument(
        "--document-field",
        default="document",
        help="JSON field holding the text for --format jsonl (default: document)",
    )
    p.add_argument("--output-dir", required=True, help="where <split>.gsg.*.npy and dict.txt are written")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the GSG corpus already in --output-dir: every *.gsg.*.npy there (also of splits not "
        "given now) and dict.txt; without it such a folder is refused",
    )
    p.add_argument(
        "--chunk-words",
        type=NON_NEGATIVE_INT,
        default=0,
        help="cut documents into runs of consecutive sentences of at most this many words (0: keep whole; "
        "~4000 for books)",
    )
    p.add_argument(
        "--min-sentences",
        type=POSITIVE_INT,
        default=2,
        help="drop (pseudo-)documents with fewer sentences: one sentence leaves nothing to condition on (default: 2)",
    )
    p.add_argument(
        "--max-sentence-words",
        type=POSITIVE_INT,
        default=200,
        help="cut longer 'sentences' (verse, lists without punctuation) into pieces of this many words (default: 200)",
    )
    p.add_argument(
        "--sentence-splitter",
        choices=SENTENCE_SPLITTERS,
        default="regex",
        help="regex: fast, the one ROUGE-Lsum uses; pysbd: slower, also splits lower-cased text (SumPubMed) "
        "(default: regex)",
    )
    p.add_argument("--spm-model", default=None, help="sentencepiece model (tokenizer: sentencepiece)")
    p.add_argument(
        "--gpt2-encoder-json",
        default=None,
        help="GPT-2 encoder.json (tokenizer: gpt2; needs --gpt2-vocab-bpe and --dict)",
    )
    p.add_argument("--gpt2-vocab-bpe", default=None, help="GPT-2 vocab.bpe (tokenizer: gpt2)")
    p.add_argument(
        "--dict",
        default=None,
        help="fairseq dict.txt mapping tokens to ids (default: dict.txt beside --spm-model; built from the first "
        "split for whitespace)",
    )
    p.add_argument(
        "--nwords",
        type=POSITIVE_INT,
        default=8000,
        help="whitespace tokenizer without --dict: keep this many most frequent words (default: 8000)",
    )
    p.add_argument(
        "--max-documents",
        type=POSITIVE_INT,
        default=None,
        metavar="N",
        help="keep only the first N (pseudo-)documents of each split",
    )
    return p


def parse_inputs(items):
    inputs = {}
    for item in items:
        split, sep, files = item.partition("=")
        if not sep or not split or not files:
            raise DataError(f"--input: expected SPLIT=FILE[,FILE...], got {item!r}")
        if "/" in split or os.sep in split or split.startswith("."):  # else written outside --output-dir
            raise DataError(
                f"--input: split {split!r} is not a split name (a name such as train, valid, test: its "
                "files are OUTPUT_DIR/<split>.gsg.*.npy)"
            )
        if split in inputs:
            raise DataError(f"--input: split {split!r} given twice; list its files comma-separated")
        inputs[split] = [require_file(f, f"--input {split}") for f in files.split(",") if f]
    return inputs


def input_dictionary(args):
    """The dict.txt this run reads (None: the whitespace tokenizer builds one from the text)."""
    if args.spm_model and not args.dict:
        return os.path.join(os.path.dirname(os.path.abspath(args.spm_model)), "dict.txt")
    return args.dict


def dictionary_flag(args) -> str:
    """How the messages name that dict.txt: --dict, unless it is the default beside --spm-model."""
    return "--dict" if args.dict else "--spm-model's dict.txt (no --dict given)"


def corpus_files(out_dir, dict_in):
    """The files of ``out_dir`` a run replaces or deletes: every split's GSG arrays, and a dict.txt
    unless it is the very dictionary read (``--dict OUT/dict.txt``, or --spm-model in OUT)."""
    from lsg_fairseq.data.gsg_dataset import CORPUS_PARTS, CORPUS_SUFFIX

    if not os.path.isdir(out_dir):
        return []
    suffixes = tuple(f"{CORPUS_SUFFIX}.{part}.npy" for part in CORPUS_PARTS)
    names = sorted(
        n for n in os.listdir(out_dir) if n.endswith(suffixes) and not os.path.isdir(os.path.join(out_dir, n))
    )
    out_dict = os.path.join(out_dir, "dict.txt")
    if os.path.lexists(out_dict) and not (dict_in and os.path.realpath(dict_in) == os.path.realpath(out_dict)):
        names.insert(0, "dict.txt")
    return names


def check_output_corpus(args, dict_in):
    """Refuse, before any work, an --output-dir holding a corpus that this run would only partly
    replace (the splits not given again would keep the old dictionary's ids) unless --force.
    Returns the files to delete before the new ones are moved in."""
    old = corpus_files(args.output_dir, dict_in)
    if old and not args.force:
        shown = ", ".join(old[:4]) + (", ..." if len(old) > 4 else "")
        raise DataError(
            f"--output-dir {args.output_dir}: already holds a GSG corpus ({shown}); pass --force to replace "
            "it (every split's *.gsg.*.npy and dict.txt), or choose another folder"
        )
    return old


def move_into(staged, out_dir, old):
    """Put the files written to ``staged`` into ``out_dir``: first every old corpus file is deleted,
    then the new files are renamed in, dict.txt last. Cut short, this leaves an incomplete corpus,
    which the task refuses naming the missing file, never splits encoded with two dictionaries."""
    for name in old:
        try:
            os.remove(os.path.join(out_dir, name))
        except FileNotFoundError:
            pass
    for name in sorted(os.listdir(staged), key=lambda n: n == "dict.txt"):
        os.replace(os.path.join(staged, name), os.path.join(out_dir, name))


def load_dict(path, flag: str = "--dict"):
    """``--dict``: fairseq's Dictionary of ``path``, a damaged line named; one that lists no token is
    refused, since every piece would be written as <unk>. ``flag``: how the path came (the default
    beside --spm-model is not a --dict the user gave)."""
    from fairseq.data import Dictionary

    check_fairseq_dict(require_file(path, flag), flag)
    dictionary = Dictionary.load(path)
    if len(dictionary) == dictionary.nspecial:
        raise DataError(f"--dict {path}: lists no token (every piece would be <unk>); give the model's dict.txt")
    return dictionary


def build_encoder(args, first_split_docs):
    """(dictionary, dict_path or None, encode: list of sentences -> list of token id lists)."""
    from fairseq.data import Dictionary

    if args.spm_model and args.gpt2_encoder_json:
        raise DataError("give either --spm-model or --gpt2-encoder-json, not both")
    if args.spm_model:
        from lsg_text.offline_bpe import load_sentencepiece

        sp = load_sentencepiece(args.spm_model, "--spm-model")
        dict_path = input_dictionary(args)
        dictionary = load_dict(dict_path, dictionary_flag(args))

        def encode(sentences):
            return [[dictionary.index(p) for p in pieces] for pieces in sp.encode(sentences, out_type=str)]

        return dictionary, dict_path, encode
    if args.gpt2_encoder_json or args.gpt2_vocab_bpe:
        from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

        from lsg_text.offline_bpe import check_gpt2_files, gpt2_encode_line

        check_gpt2_files(args.gpt2_encoder_json, args.gpt2_vocab_bpe, "--gpt2-encoder-json", "--gpt2-vocab-bpe")
        bpe = get_encoder(args.gpt2_encoder_json, args.gpt2_vocab_bpe)
        if not args.dict:
            raise DataError("--dict is required with the gpt2 tokenizer (the dict.txt of the model)")
        dictionary = load_dict(args.dict)

        def encode(sentences):
            # A leading space, as every sentence but the first has in running text, so sentences
            # concatenated in a GSG target decode with spaces between them.
            return [[dictionary.index(str(i)) for i in gpt2_encode_line(bpe, " " + s)] for s in sentences]

        return dictionary, args.dict, encode
    if args.dict:
        dictionary = load_dict(args.dict)
        dict_path = args.dict
    else:
        dictionary = Dictionary()
        for doc in first_split_docs:
            for sentence in doc:
                for word in sentence.split():
                    dictionary.add_symbol(word)
        dictionary.finalize(nwords=args.nwords + dictionary.nspecial)
        dict_path = None

    def encode(sentences):
        return [[dictionary.index(w) for w in s.split()] for s in sentences]

    return dictionary, dict_path, encode


def read_split(files, args):
    split = get_sentence_splitter(args.sentence_splitter)
    docs, dropped = [], 0
    for path in files:
        for paragraphs in read_documents(path, args.format, args.document_field):
            for chunk in chunk_sentences(
                document_sentences(paragraphs, args.max_sentence_words, split), args.chunk_words
            ):
                if len(chunk) < args.min_sentences:
                    dropped += 1
                    continue
                docs.append(chunk)
                if args.max_documents is not None and len(docs) >= args.max_documents:
                    return docs, dropped
    return docs, dropped


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from lsg_fairseq.data.gsg_dataset import GSGCorpusWriter, corpus_prefix

    try:
        check_output_path(args.output_dir, "--output-dir", folder=True)
        old = check_output_corpus(args, input_dictionary(args))
        if input_dictionary(args) is not None:
            load_dict(
                input_dictionary(args), dictionary_flag(args)
            )  # a damaged or empty one refused before the inputs are read
        inputs = parse_inputs(args.input)
        t0 = time.time()
        split_docs = {}
        for split, files in inputs.items():
            split_docs[split], dropped = read_split(files, args)
            if not split_docs[split]:
                raise DataError(f"split {split!r}: no document with >= {args.min_sentences} sentences in {files}")
            print(
                f"{split}: {len(split_docs[split])} documents ({dropped} with < {args.min_sentences} sentences "
                "dropped)",
                file=sys.stderr,
            )
        dictionary, dict_path, encode = build_encoder(args, next(iter(split_docs.values())))
        out_dict = os.path.join(args.output_dir, "dict.txt")
        # Everything is written to a hidden folder inside --output-dir, then moved in (move_into).
        with made_folder(args.output_dir), staging_folder(args.output_dir, "gsg_preprocess") as staged:
            if dict_path is None:
                dictionary.save(os.path.join(staged, "dict.txt"))
            elif os.path.realpath(dict_path) != os.path.realpath(out_dict):
                shutil.copyfile(dict_path, os.path.join(staged, "dict.txt"))
            writer = GSGCorpusWriter()
            for split, docs in split_docs.items():
                n_unk = 0
                for doc in docs:
                    tokens = encode(doc)
                    n_unk += sum(t == dictionary.unk() for sent in tokens for t in sent)
                    writer.add_document(tokens, doc)
                stats = writer.save(corpus_prefix(staged, split))
                print(
                    f"{split}: {stats['documents']} documents, {stats['sentences']} sentences, {stats['tokens']} "
                    f"tokens ({100.0 * n_unk / max(stats['tokens'], 1):.2f}% <unk>), {stats['words']} ROUGE words "
                    f"-> {corpus_prefix(args.output_dir, split)}.*.npy",
                    file=sys.stderr,
                )
            move_into(staged, args.output_dir, old)
        gone = sorted({n.split(".gsg.")[0] for n in old if ".gsg." in n} - set(split_docs))
        if gone:
            print(f"--force: deleted the old corpus of split(s) {', '.join(gone)}", file=sys.stderr)
        print(f"done in {time.time() - t0:.1f}s; dictionary: {out_dict} ({len(dictionary)} symbols)", file=sys.stderr)
    except DataError as e:
        return report(str(e), PROG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
