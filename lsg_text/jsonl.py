"""Reading and validating summarization JSONL, and flattening it to fairseq parallel text.

Input: one JSON object per line with at least ``{"document": str, "summary": str}`` (the format of
``shared/data/{sumpubmed,squality,qmsum}`` and of :mod:`lsg_text.synthetic`). Inside a
``document``, each line is a paragraph or a speaker turn.

Output: fairseq wants one example per line, so :func:`flatten` joins all whitespace runs (newlines
included) into single spaces. Sentence information survives through punctuation, which
:func:`lsg_text.sentences.split_sentences` uses; what is lost is the boundary after a
paragraph without final punctuation (a heading such as ``BACKGROUND``). Pass ``newline_token``
(e.g. ``"<n>"``, PEGASUS' convention) to keep paragraph breaks as an explicit token instead.
"""

import json
from typing import Dict, Iterator, Optional, Sequence, Tuple

from lsg_text.fileio import DataError

DEFAULT_FIELDS = ("document", "summary")
# what json.load(s) raises for text that is not JSON: its decoder's error, and a RecursionError for
# arrays or objects nested deeper than Python's recursion limit (its decoder recurses)
JSON_ERRORS = (json.JSONDecodeError, RecursionError)


def json_problem(error: Exception) -> str:
    """A reader's error in words: for :data:`JSON_ERRORS`, the decoder's message and where (the
    column, and the line past the first), or the nesting; any other error as it says itself."""
    if isinstance(error, json.JSONDecodeError):
        where = f"column {error.colno}" if error.lineno == 1 else f"line {error.lineno} column {error.colno}"
        return f"{error.msg} at {where}"
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return str(error)


def flatten(text: str, newline_token: Optional[str] = None) -> str:
    """One line of text: whitespace runs become one space; paragraph breaks optionally a token."""
    if newline_token is None:
        return " ".join(text.split())
    paragraphs = (" ".join(p.split()) for p in text.splitlines())
    return f" {newline_token} ".join(p for p in paragraphs if p)


def read_jsonl(
    path: str, fields: Sequence[str] = DEFAULT_FIELDS, max_examples: Optional[int] = None
) -> Iterator[Tuple[int, Dict]]:
    """Yield ``(line_number, object)`` for each example, validating ``fields``.

    Raises :class:`DataError` naming ``path:line`` for a line that is not JSON, not an object, or
    whose field is missing, not a string, empty/whitespace-only (an empty document or summary
    would become an empty line that fairseq trains on as if it were data) or holds a NUL. A UTF-8
    byte-order mark before the first line is skipped. Blank lines are errors
    too: they usually mean a truncated or hand-edited file.
    """
    yield from _read_checked(path, fields, max_examples)


def _read_checked(path, fields, max_examples):
    count = 0
    # bytes, decoded line by line, so that a non-UTF-8 byte is reported with its line number
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if max_examples is not None and count >= max_examples:
                return
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not UTF-8 text (byte {e.start} of the line: {e.reason})") from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]  # a UTF-8 byte-order mark (Windows editors) is not content
            if not line.strip():
                raise DataError(f"{where}: blank line (expected one JSON object per line)")
            try:
                obj = json.loads(line)
            except JSON_ERRORS as e:
                raise DataError(f"{where}: not valid JSON ({json_problem(e)})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            for field in fields:
                if field not in obj:
                    raise DataError(f"{where}: missing field {field!r} (has: {', '.join(sorted(obj))})")
                value = obj[field]
                if not isinstance(value, str):
                    got = "null" if value is None else type(value).__name__
                    raise DataError(f"{where}: field {field!r} must be a string, got {got}")
                if not value.strip():
                    raise DataError(f"{where}: field {field!r} is empty")
                if "\x00" in value:
                    # fairseq-preprocess and sentencepiece treat NUL as a string end or a token
                    raise DataError(f"{where}: field {field!r} contains a NUL character (\\u0000); remove it")
            count += 1
            yield lineno, obj
