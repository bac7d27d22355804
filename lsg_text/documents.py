"""Unlabeled documents from raw text, as sentence lists (input side of gap-sentence generation).

Formats (``DOCUMENT_FORMATS``):

- ``lines``: one document per line;
- ``blank``: documents separated by blank lines; inside a document, single newlines are hard wraps;
- ``file``: each file is one document (a book); blank lines separate paragraphs, single newlines
  are hard wraps (the NLTK Gutenberg books);
- ``jsonl``: one JSON object per line, the text in a field (``document`` in ``shared/data``);
  inside it each line is a paragraph.

A document is a list of paragraphs; paragraphs are split into sentences with the shared
:func:`~lsg_text.sentences.split_sentences`, so ROUGE-Lsum and GSG agree on boundaries.
Book-length documents are cut into pseudo-documents of consecutive sentences
(:func:`chunk_sentences`), as LOCOST/PEGASUS-X train on windows of long texts.
"""

import json
from typing import Callable, Iterable, Iterator, List

from lsg_text.fileio import DataError
from lsg_text.jsonl import JSON_ERRORS, json_problem
from lsg_text.sentences import split_sentences

DOCUMENT_FORMATS = ("lines", "blank", "file", "jsonl")
SENTENCE_SPLITTERS = ("regex", "pysbd")


def get_sentence_splitter(name: str) -> Callable[[str], List[str]]:
    """``regex``: the shared fast splitter (needs an upper-case letter or digit after the stop);
    ``pysbd``: rule-based, far slower, but also splits lower-cased text such as SumPubMed's."""
    if name == "regex":
        return split_sentences
    if name == "pysbd":
        import pysbd

        segmenter = pysbd.Segmenter(language="en", clean=False)
        return lambda text: [s.strip() for s in segmenter.segment(text) if s.strip()]
    raise DataError(f"unknown sentence splitter {name!r}; choose from {SENTENCE_SPLITTERS}")


def _join_wrapped(lines: Iterable[str]) -> str:
    return " ".join(" ".join(line.split()) for line in lines if line.strip())


def _blocks(lines: Iterable[str]) -> Iterator[List[str]]:
    """Groups of consecutive non-blank lines."""
    block: List[str] = []
    for line in lines:
        if line.strip():
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


def read_documents(path: str, fmt: str, field: str = "document") -> Iterator[List[str]]:
    """Yield each document of ``path`` as a list of paragraphs (whitespace-normalised strings)."""
    if fmt not in DOCUMENT_FORMATS:
        raise DataError(f"unknown document format {fmt!r}; choose from {DOCUMENT_FORMATS}")
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not text
            if fmt == "lines":
                for line in f:
                    if line.strip():
                        yield [" ".join(line.split())]
            elif fmt == "blank":
                for block in _blocks(f):
                    yield [_join_wrapped(block)]
            elif fmt == "file":
                yield [_join_wrapped(block) for block in _blocks(f)]
            else:
                for lineno, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except JSON_ERRORS as e:
                        raise DataError(f"{path}:{lineno}: not valid JSON ({json_problem(e)})") from None
                    text = obj.get(field) if isinstance(obj, dict) else None
                    if not isinstance(text, str):
                        raise DataError(f"{path}:{lineno}: no string field {field!r}")
                    paragraphs = [" ".join(p.split()) for p in text.splitlines() if p.strip()]
                    if paragraphs:
                        yield paragraphs
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason})") from None


def document_sentences(
    paragraphs: Iterable[str], max_sentence_words: int, split: Callable[[str], List[str]] = split_sentences
) -> List[str]:
    """Sentences of a document; a sentence longer than ``max_sentence_words`` words is cut into
    pieces of that many words (verse without punctuation would otherwise make one gap "sentence"
    of thousands of words, all masked or none)."""
    out: List[str] = []
    for paragraph in paragraphs:
        for sentence in split(paragraph):
            words = sentence.split()
            for start in range(0, len(words), max_sentence_words):
                out.append(" ".join(words[start : start + max_sentence_words]))
    return out


def chunk_sentences(sentences: List[str], chunk_words: int) -> Iterator[List[str]]:
    """Consecutive runs of sentences with at most ``chunk_words`` whitespace words each (a run
    always holds at least one sentence). ``chunk_words <= 0`` keeps the document whole."""
    if chunk_words <= 0:
        if sentences:
            yield sentences
        return
    chunk: List[str] = []
    size = 0
    for sentence in sentences:
        n = len(sentence.split())
        if chunk and size + n > chunk_words:
            yield chunk
            chunk, size = [], 0
        chunk.append(sentence)
        size += n
    if chunk:
        yield chunk
