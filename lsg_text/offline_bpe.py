"""Offline tokenizers for fairseq data: GPT-2 byte-level BPE from local files, sentencepiece.

No function here ever downloads. fairseq's ``--bpe gpt2`` fetches ``encoder.json``/``vocab.bpe``
from dl.fbaipublicfiles.com unless it is given local paths; the helpers below take paths only,
and refuse URLs.

GPT-2 BPE (fairseq_notes §3). ``encoder.json`` maps BPE token -> GPT-2 id and ``vocab.bpe`` lists
the merges after a ``#version`` header. HF ``vocab.json``/``merges.txt`` (BART, RoBERTa) are the
same formats and work unchanged. The encoder produces GPT-2 *ids*; fairseq's ``dict.txt`` then
maps those ids (written as strings) to dictionary indices.

Sentencepiece. We train with ``<s>=0, <pad>=1, </s>=2, <unk>=3``, exactly fairseq's
``Dictionary`` specials, and write ``dict.txt`` with every other piece in id order. Hence
dictionary index == sentencepiece id for every piece, and the model's own control pieces are
never emitted by ``encode`` (sentencepiece emits control symbols only when asked), so they
cannot appear twice in the dictionary. The fairseq task appends ``<mask>`` after the last piece.
"""

import json
import os
import re
from typing import Dict, Iterable, Iterator, List

from lsg_text.fileio import DataError, require_file
from lsg_text.jsonl import JSON_ERRORS, json_problem

# fairseq.data.Dictionary: bos, pad, eos, unk at indices 0..3 (in this order).
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def require_local_file(path: str, flag: str) -> str:
    """A local, existing file given by ``flag``; URLs are refused (we never download)."""
    if path is None:
        raise DataError(f"{flag} is required")
    if _URL.match(path):
        raise DataError(f"{flag}: {path} is a URL; give a local file (this tool never downloads)")
    return require_file(path, flag)


# ----------------------------------------------------------------------------- GPT-2 BPE


def check_gpt2_files(
    encoder_json: str, vocab_bpe: str, encoder_flag: str = "--encoder-json", vocab_flag: str = "--vocab-bpe"
) -> None:
    """Validate the two GPT-2 BPE files the way fairseq's ``get_encoder`` will read them.

    ``get_encoder`` drops the first and the last item of ``vocab.bpe.split("\\n")``: a file without
    the ``#version`` header, or without a trailing newline, silently loses a merge and gives
    different ids. Both are errors here. The encoder itself is fairseq's (``get_encoder``), built
    by the callers that already depend on fairseq: this module never imports it.
    """
    require_local_file(encoder_json, encoder_flag)
    require_local_file(vocab_bpe, vocab_flag)
    try:
        with open(encoder_json, encoding="utf-8") as f:
            encoder = json.load(f)
    except (*JSON_ERRORS, UnicodeDecodeError) as e:
        raise DataError(f"{encoder_flag}: {encoder_json} is not a JSON file ({json_problem(e)})") from None
    if not isinstance(encoder, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in encoder.items()):
        raise DataError(f"{encoder_flag}: {encoder_json} must be a JSON object mapping token -> integer id")
    if len(set(encoder.values())) != len(encoder):
        raise DataError(f"{encoder_flag}: {encoder_json} maps two tokens to the same id")
    try:
        with open(vocab_bpe, encoding="utf-8") as f:
            data = f.read()
    except UnicodeDecodeError as e:
        raise DataError(f"{vocab_flag}: {vocab_bpe} is not UTF-8 text ({e.reason})") from None
    lines = data.split("\n")
    if not lines[0].startswith("#"):
        raise DataError(
            f"{vocab_flag}: {vocab_bpe}: first line must be the '#version: ...' header "
            f"(fairseq skips line 1, so the merge {lines[0]!r} would be lost)"
        )
    if lines[-1] != "":
        raise DataError(
            f"{vocab_flag}: {vocab_bpe}: missing trailing newline "
            f"(fairseq drops the last line, so the merge {lines[-1]!r} would be lost)"
        )
    for lineno, line in enumerate(lines[1:-1], start=2):
        if len(line.split()) != 2:
            raise DataError(f"{vocab_flag}: {vocab_bpe}:{lineno}: expected a merge 'A B', got {line!r}")


def gpt2_encode_line(encoder, line: str) -> List[int]:
    """GPT-2 ids of one line; a BPE token missing from encoder.json becomes a :class:`DataError`."""
    try:
        return encoder.encode(line)
    except KeyError as e:
        raise DataError(
            f"BPE token {e.args[0]!r} is not in encoder.json: encoder.json and vocab.bpe do not belong together"
        ) from None


# ----------------------------------------------------------------------------- sentencepiece


def sentencepiece_special_kwargs() -> Dict[str, object]:
    """Trainer options that put fairseq's four specials at ids 0..3 (see the module docstring)."""
    return dict(
        bos_id=0, pad_id=1, eos_id=2, unk_id=3, bos_piece="<s>", pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>"
    )


def check_sentencepiece_specials(sp, model_path: str) -> None:
    """Refuse a model whose ids 0..3 are not fairseq's specials: dict indices would be shifted."""
    found = tuple(sp.id_to_piece(i) for i in range(min(4, sp.get_piece_size())))
    if found != FAIRSEQ_SPECIALS:
        raise DataError(
            f"{model_path}: ids 0..3 are {found}, expected {FAIRSEQ_SPECIALS}; "
            "train it with scripts/spm_train.py so that dictionary index == sentencepiece id"
        )


def fairseq_dict_lines(sp) -> Iterator[str]:
    """``dict.txt`` lines for every non-special piece, in id order, so index == sentencepiece id.

    fairseq ignores the counts when a dictionary is loaded with ``--srcdict``, but
    ``Dictionary.finalize`` would re-sort by count; strictly decreasing pseudo-counts keep the
    order stable under any such sort.
    """
    n = sp.get_piece_size()
    for i in range(len(FAIRSEQ_SPECIALS), n):
        piece = sp.id_to_piece(i)
        if not piece or any(ch.isspace() for ch in piece):
            raise DataError(
                f"sentencepiece piece {i} ({piece!r}) contains whitespace; fairseq's dict.txt cannot hold it"
            )
        yield f"{piece} {n - i}"


def sentences_for_training(lines: Iterable[str], split, max_bytes: int) -> Iterator[str]:
    """Training sentences from document lines.

    Long documents are one line each, far above sentencepiece's ``max_sentence_length``
    (those lines would be skipped), so each line is split into sentences with ``split`` and any
    sentence still longer than ``max_bytes`` is cut into word chunks.
    """
    for line in lines:
        for sentence in split(line):
            if len(sentence.encode("utf-8")) <= max_bytes:
                yield sentence
                continue
            chunk: List[str] = []
            size = 0
            for word in sentence.split():
                wb = len(word.encode("utf-8")) + 1
                if chunk and size + wb > max_bytes:
                    yield " ".join(chunk)
                    chunk, size = [], 0
                if wb > max_bytes:  # one absurd "word" (a URL, base64): keep a prefix
                    word = word.encode("utf-8")[: max_bytes - 1].decode("utf-8", "ignore")
                    wb = len(word.encode("utf-8")) + 1
                chunk.append(word)
                size += wb
            if chunk:
                yield " ".join(chunk)


def load_sentencepiece(model_path: str, flag: str = "--model", check_specials: bool = True):
    require_local_file(model_path, flag)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(model_path)
    except (OSError, RuntimeError) as e:
        raise DataError(f"{flag}: {model_path} is not a sentencepiece model ({e})") from None
    if check_specials:
        check_sentencepiece_specials(sp, model_path)
    return sp


def check_sentencepiece_dictionary(sp, symbols, model_path: str, dict_path: str, min_coverage: float = 0.95) -> None:
    """Refuse a sentencepiece model whose pieces are mostly missing from the dictionary.

    fairseq's ``--bpe sentencepiece`` emits piece *strings* and the dictionary maps them to
    indices, so a model from another training silently turns most text into ``<unk>`` (and ROUGE
    or summaries into garbage) instead of failing. ``symbols`` is the dictionary's symbol list.
    Control pieces (``<s>``, ...) are never emitted and are ignored; extra dictionary symbols
    (``<mask>``, madeupwords) are fine.
    """
    known = set(symbols)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]
    missing = [p for p in pieces if p not in known]
    if pieces and len(missing) > (1.0 - min_coverage) * len(pieces):
        shown = ", ".join(repr(p) for p in missing[:5])
        raise DataError(
            f"{model_path} does not match {dict_path}: {len(missing)} of its {len(pieces)} pieces are not "
            f"in the dictionary (e.g. {shown}); they come from different sentencepiece trainings, and every "
            "missing piece would become <unk>. Use the dict.txt that scripts/spm_train.py wrote beside "
            "this model (or the model folder's own files)"
        )


__all__ = [
    "check_sentencepiece_dictionary",
    "FAIRSEQ_SPECIALS",
    "require_local_file",
    "check_gpt2_files",
    "gpt2_encode_line",
    "sentencepiece_special_kwargs",
    "check_sentencepiece_specials",
    "fairseq_dict_lines",
    "sentences_for_training",
    "load_sentencepiece",
]


# ----------------------------------------------------------------------------- model folders
# A model folder (converter output) names its tokenizer in one file, so that stale tokenizer files
# of another model left beside it can never be picked up instead.
TOKENIZER_RECORD = "tokenizer.txt"
GPT2_FILES = ("encoder.json", "vocab.bpe")
# A model folder's sentencepiece model: the name our tools write first, then the ones fairseq users give it.
SENTENCEPIECE_NAMES = ("spm.model", "sentencepiece.bpe.model", "sentencepiece.model")
SENTENCEPIECE_MODEL = SENTENCEPIECE_NAMES[0]
HF_SENTENCEPIECE_NAME = "spiece.model"  # T5's name, in HF LOCOST folders
TOKENIZER_KINDS = ("gpt2", "sentencepiece", "none")


def tokenizer_files(model_dir: str) -> Dict[str, List[str]]:
    """The tokenizer files present in ``model_dir``, by kind."""
    found = {
        "gpt2": [n for n in GPT2_FILES if os.path.isfile(os.path.join(model_dir, n))],
        "sentencepiece": [n for n in SENTENCEPIECE_NAMES if os.path.isfile(os.path.join(model_dir, n))],
    }
    return found


def write_tokenizer_record(model_dir: str) -> str:
    """Write ``tokenizer.txt`` naming the kind of the tokenizer files in ``model_dir``.

    Raises a :class:`DataError` if files of both kinds are present (nothing can tell which one the
    model was trained with). Returns the kind (``none`` when there are no tokenizer files).
    """
    found = tokenizer_files(model_dir)
    complete_gpt2 = len(found["gpt2"]) == len(GPT2_FILES)
    if found["gpt2"] and found["sentencepiece"]:
        raise DataError(f"{model_dir}: holds both GPT-2 BPE files and a sentencepiece model")
    kind = "gpt2" if complete_gpt2 else "sentencepiece" if found["sentencepiece"] else "none"
    with open(os.path.join(model_dir, TOKENIZER_RECORD), "w", encoding="utf-8") as f:
        f.write(kind + "\n")
    return kind


def read_tokenizer_record(model_dir: str):
    """The kind named by ``model_dir/tokenizer.txt`` (``None`` if the folder has no record).

    Raises a :class:`DataError` naming the file when the record is unreadable or names an unknown
    kind, or when the folder's tokenizer files contradict it (missing files of the named kind, or
    files of the other kind: a stale tokenizer of another model).
    """
    path = os.path.join(model_dir, TOKENIZER_RECORD)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            kind = f.read(64).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable tokenizer record ({e})") from None
    if kind not in TOKENIZER_KINDS:
        raise DataError(f"{path}: names tokenizer {kind[:20]!r}; expected one of {', '.join(TOKENIZER_KINDS)}")
    found = tokenizer_files(model_dir)
    fix = "(delete the stale files, or re-run lsg-fairseq-convert with --force into a clean folder)"
    if kind == "gpt2":
        missing = [n for n in GPT2_FILES if n not in found["gpt2"]]
        if missing:
            raise DataError(f"{path} says gpt2 but {', '.join(missing)} is missing in {model_dir}")
        if found["sentencepiece"]:
            raise DataError(f"{path} says gpt2 but {model_dir} also holds {found['sentencepiece'][0]} {fix}")
    elif kind == "sentencepiece":
        if not found["sentencepiece"]:
            raise DataError(f"{path} says sentencepiece but {model_dir} holds none of {', '.join(SENTENCEPIECE_NAMES)}")
        if found["gpt2"]:
            raise DataError(f"{path} says sentencepiece but {model_dir} also holds {found['gpt2'][0]} {fix}")
    elif found["gpt2"] or found["sentencepiece"]:
        stale = (found["gpt2"] + found["sentencepiece"])[0]
        raise DataError(f"{path} says none but {model_dir} holds {stale} {fix}")
    return kind
