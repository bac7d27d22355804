"""Filler: the ordinary sentences a synthetic document is made of, and how planted sentences are
placed among them and the whole cut into paragraphs. Shared by every variant; the filler words never
occur in :mod:`lsg_text.synthetic.vocabulary`."""

import random
from typing import Dict, List, Tuple

# Filler: people doing ordinary things. None of these words is a key word (checked in tests).
_SUBJECTS = (
    "the farmer",
    "a teacher",
    "the old sailor",
    "my neighbour",
    "the young doctor",
    "a quiet student",
    "the baker",
    "the mayor",
    "a tired worker",
    "the painter",
    "her brother",
    "the driver",
    "a stranger",
    "the nurse",
    "our cook",
    "the clerk",
    "his aunt",
    "the gardener",
    "a child",
    "the captain",
)
_VERBS = (
    "carried",
    "found",
    "cleaned",
    "repaired",
    "sold",
    "bought",
    "painted",
    "watched",
    "opened",
    "closed",
    "moved",
    "counted",
    "dropped",
    "lifted",
    "washed",
    "hid",
    "borrowed",
    "returned",
    "wrapped",
    "checked",
    "measured",
    "forgot",
    "kept",
    "shared",
)
_OBJECTS = (
    "a wooden box",
    "the heavy door",
    "some fresh bread",
    "an empty basket",
    "the long letter",
    "a small key",
    "the broken chair",
    "two old books",
    "a glass jar",
    "the new map",
    "a warm coat",
    "the tall ladder",
    "some dry wood",
    "a paper bag",
    "the tin spoon",
    "three clay pots",
    "a thin rope",
    "the metal bucket",
    "a loaf of rye",
    "the cotton sheets",
)
_PLACES = (
    "near the river",
    "in the small garden",
    "behind the market",
    "under the bridge",
    "at the station",
    "inside the barn",
    "by the fence",
    "on the hill",
    "next to the school",
    "in the kitchen",
    "outside the church",
    "along the road",
    "at the harbour",
    "in the cellar",
    "across the square",
)
_TIMES = (
    "in the morning",
    "after lunch",
    "before dinner",
    "late at night",
    "during the storm",
    "at dawn",
    "after the meeting",
    "before the rain",
    "at noon",
    "in the evening",
    "once again",
)
_TEMPLATES = (
    "{S} {V} {O} {P}.",
    "{S} {V} {O} {T}.",
    "{T}, {s} {V} {O}.",
    "{S} said that {s} {V} {O} {P}.",
    "Nobody knew why {s} {V} {O}.",
    "{S} {V} {O} and {v2} {o2}.",
    "{S} {V} {O}.",
    "{P}, {s} quietly {V} {O} {T}.",
)
# Fillers that close the gap to the drawn document length (see filler_sentences for why it can fall short).
_GAP_FILLERS = {2: "It rained.", 3: "Nothing happened."}
# The most words filler_sentences falls short of its budget, with a margin over the worst shortfall seen
# (benchmarks/README, "Figures behind the constants").
FILLER_SHORTFALL = 8


def _filler_sentence(rng: random.Random) -> str:
    template = rng.choice(_TEMPLATES)
    text = template.format(
        S=rng.choice(_SUBJECTS),
        s=rng.choice(_SUBJECTS),
        V=rng.choice(_VERBS),
        O=rng.choice(_OBJECTS),
        P=rng.choice(_PLACES),
        T=rng.choice(_TIMES),
        v2=rng.choice(_VERBS),
        o2=rng.choice(_OBJECTS),
    )
    return text[0].upper() + text[1:]


def filler_sentences(rng: random.Random, budget: int) -> List[str]:
    """Filler sentences of ``budget`` words or up to FILLER_SHORTFALL fewer: drawn sentences, then short
    ones closing the gap (``_GAP_FILLERS[3]`` has 2 words, not 3: each use loses one; kept, since the
    committed outputs' documents are regenerated from this code)."""
    filler: List[str] = []
    used = 0
    while True:
        s = _filler_sentence(rng)
        n = len(s.split())
        if used + n > budget - 2:
            break
        filler.append(s)
        used += n
    gap = budget - used
    while gap >= 2:
        k = 3 if gap >= 5 or gap == 3 else 2
        filler.insert(rng.randint(0, len(filler)), _GAP_FILLERS[k])
        gap -= k
    return filler


def paragraphs(rng: random.Random, min_paragraph: int, max_paragraph: int, sentences: List[str]) -> str:
    """The document: paragraphs of ``min_paragraph``-``max_paragraph`` sentences, one per line."""
    out, i = [], 0
    while i < len(sentences):
        size = rng.randint(min_paragraph, max_paragraph)
        out.append(" ".join(sentences[i : i + size]))
        i += size
    return "\n".join(out)


# A sentence placed among the filler: (text, role, index); its position is ``at[(role, index)]``.
Special = Tuple[str, str, int]


def assemble(filler: List[str], specials: List[Special], at: Dict[Tuple[str, int], int]):
    """Sentences of the document and the word offset of each special ``(text, role, index)``: each
    goes before the first filler sentence that starts at or after its position ``at[(role, index)]``
    (in filler words), so at most one filler sentence (< 20 words) after it."""
    pending = sorted(specials, key=lambda s: at[(s[1], s[2])])
    sentences: List[str] = []
    offsets: Dict[Tuple[str, int], int] = {}
    words = filler_words = 0
    for f in filler + [None]:
        while pending and (f is None or at[(pending[0][1], pending[0][2])] <= filler_words):
            text, role, i = pending.pop(0)
            offsets[(role, i)] = words
            sentences.append(text)
            words += len(text.split())
        if f is not None:
            sentences.append(f)
            words += len(f.split())
            filler_words += len(f.split())
    return sentences, offsets
