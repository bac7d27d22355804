"""The ``retrieval`` variant, the task of ``make demo`` and ``examples/long_context``: a few KEY
sentences inserted at uniformly random sentence positions among the filler::

    The {colour} {animal} visited {city} on {weekday}.

The summary is the key sentences in document order, verbatim: one hop, the key sentence is the
answer. Also its scorers (exact recall per slot, whole-summary exact match), the key facts' slots
and the holdout of (colour, animal) pairs, which ``binding`` (:mod:`lsg_text.synthetic.long_range`)
shares.
"""

import random
import re
from typing import Dict, List, Tuple

from lsg_text.synthetic.config import SyntheticConfig
from lsg_text.synthetic.filler import filler_sentences, paragraphs
from lsg_text.synthetic.vocabulary import ANIMALS, CITIES, COLOURS, KEY_TEMPLATE, KEY_TOKENS, WEEKDAYS

FIELDS = ("colour", "animal", "city", "weekday")
CHOICES = {"colour": COLOURS, "animal": ANIMALS, "city": CITIES, "weekday": WEEKDAYS}
KEY_SENTENCE_RE = re.compile(
    r"The (%s) (%s) visited (%s) on (%s)\." % tuple("|".join(words) for words in (COLOURS, ANIMALS, CITIES, WEEKDAYS))
)


def key_sentence(fact: Dict[str, str]) -> str:
    return KEY_TEMPLATE.format(**fact)


def summary_from_facts(facts: List[Dict[str, str]]) -> str:
    """The target: key sentences in document order."""
    return " ".join(key_sentence(f) for f in facts)


def find_key_sentences(document: str) -> List[Tuple[int, Dict[str, str]]]:
    """``(whitespace-token offset, fact)`` of every key sentence in ``document``, in order."""
    tokens = document.split()
    out = []
    for i in range(len(tokens) - KEY_TOKENS + 1):
        if tokens[i] == "The" and tokens[i + 3] == "visited":
            m = KEY_SENTENCE_RE.fullmatch(" ".join(tokens[i : i + KEY_TOKENS]))
            if m:
                out.append((i, dict(zip(("colour", "animal", "city", "weekday"), m.groups()))))
    return out


# a generated key sentence, whatever words fill its slots (a wrong word is a miss, not a non-match)
_LOOSE_KEY_RE = re.compile(r"The (\S+) (\S+) visited (\S+) on ([^\s.]+)")


def parse_key_sentences(text: str) -> List[Dict[str, str]]:
    """The key sentences of a generated summary, in order, as ``{field: word}``."""
    return [dict(zip(FIELDS, m.groups())) for m in _LOOSE_KEY_RE.finditer(text)]


def key_hits(reference_keys: List[Dict[str, str]], hypothesis: str) -> List[Dict[str, bool]]:
    """Exact recall of each reference key's facts: the i-th key sentence of ``hypothesis`` is
    compared slot by slot with the i-th reference key (the summary restates keys in document
    order); a key the hypothesis does not restate scores no hit."""
    generated = parse_key_sentences(hypothesis)
    out = []
    for i, ref in enumerate(reference_keys):
        gen = generated[i] if i < len(generated) else {}
        out.append({f: gen.get(f) == ref[f] for f in FIELDS})
    return out


def exact_match(reference: str, hypothesis: str) -> bool:
    """Whole-summary exact match (whitespace aside): every key, in order, and nothing else."""
    return hypothesis.split() == reference.split()


def chance_recall() -> float:
    """Mean over the four slots of 1 / (number of choices): a uniform guess's expected recall."""
    return sum(1.0 / len(CHOICES[f]) for f in FIELDS) / len(FIELDS)


def heldout_pair(colour: str, animal: str) -> bool:
    """True for the quarter of (colour, animal) pairs kept for valid/test under ``holdout``."""
    return (COLOURS.index(colour) + 2 * ANIMALS.index(animal)) % 4 == 0


def key_colour(rng: random.Random, animal: str, split: str, cfg: SyntheticConfig) -> str:
    """A colour for ``animal``; under ``holdout``, one whose pair belongs to ``split``'s side."""
    if not cfg.holdout:
        return rng.choice(COLOURS)
    want = split != "train"
    return rng.choice([c for c in COLOURS if heldout_pair(c, animal) == want])


def make_retrieval_example(rng: random.Random, cfg: SyntheticConfig, example_id: str, split: str) -> Dict:
    """The ``retrieval`` variant: 2-3 key sentences (``cfg.min_keys``-``cfg.max_keys``) at uniformly
    random sentence positions; the summary restates them in document order. ``keys``: each key's
    facts and ``token_offset``."""
    target_len = rng.randint(cfg.min_tokens + 1, cfg.max_tokens)
    n_keys = rng.randint(cfg.min_keys, cfg.max_keys)
    animals = rng.sample(ANIMALS, n_keys)  # distinct, so every key sentence is unique
    facts = [
        {
            "colour": key_colour(rng, a, split, cfg),
            "animal": a,
            "city": rng.choice(CITIES),
            "weekday": rng.choice(WEEKDAYS),
        }
        for a in animals
    ]
    # Filler up to the drawn length minus the keys, so the document has target_len or target_len - 1 tokens.
    filler = filler_sentences(rng, target_len - n_keys * KEY_TOKENS)
    # Keys go into uniformly random sentence slots (sorted: positions in document order).
    slots = sorted(rng.sample(range(len(filler) + n_keys), n_keys))
    sentences: List[str] = []
    fi = ki = 0
    for pos in range(len(filler) + n_keys):
        if ki < n_keys and pos == slots[ki]:
            sentences.append(key_sentence(facts[ki]))
            ki += 1
        else:
            sentences.append(filler[fi])
            fi += 1
    document = paragraphs(rng, cfg.min_paragraph, cfg.max_paragraph, sentences)
    keys = [dict(fact, token_offset=offset) for offset, fact in find_key_sentences(document)]
    return {"id": example_id, "document": document, "summary": summary_from_facts(facts), "keys": keys}
