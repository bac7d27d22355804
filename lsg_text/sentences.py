"""Offline sentence splitting (no downloads), shared by ROUGE-Lsum and GSG selection."""

import re
from typing import List

# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) before whitespace and
# an upper-case letter, digit or opening quote. Deliberately simple and deterministic: ROUGE-Lsum
# only needs consistent boundaries on both sides, and GSG needs speed on book-length input.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATIONS = {
    "mr.",
    "mrs.",
    "ms.",
    "dr.",
    "prof.",
    "sr.",
    "jr.",
    "st.",
    "vs.",
    "etc.",
    "e.g.",
    "i.e.",
    "fig.",
    "figs.",
    "al.",
    "no.",
    "approx.",
    "ca.",
    "cf.",
    "eq.",
    "vol.",
    "pp.",
}


def split_sentences(text: str) -> List[str]:
    """Split ``text`` into sentences; newlines always end a sentence."""
    sentences: List[str] = []
    for para in text.split("\n"):
        para = para.strip()
        if not para:
            continue
        start = 0
        for m in _BOUNDARY.finditer(para):
            candidate = para[start : m.start()].strip()
            last_word = candidate.rsplit(" ", 1)[-1]
            if last_word.lower() in _ABBREVIATIONS or re.fullmatch(r"[A-Z]\.", last_word):
                continue  # "Dr. Smith", "J. Doe": not a boundary
            if candidate:
                sentences.append(candidate)
            start = m.end()
        tail = para[start:].strip()
        if tail:
            sentences.append(tail)
    return sentences
