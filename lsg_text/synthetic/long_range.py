"""The long-range study's variants (``examples/long_range``), beyond ``retrieval``: each one's
generator and the scorer of a generated summary.

- ``count``: 2-3 key animals are each mentioned 1-4 times at random places ("A fox was seen.");
  the summary counts them in order of first mention, "The fox was seen 3 times. The owl was seen
  1 times.": an answer that aggregates mentions spread over the whole document.
- ``order``: 2-3 key animals each arrive once ("The fox arrived."), consecutive arrivals at least
  ``min_gap`` words apart; the summary gives the order of arrival, "The fox arrived before the owl.
  The owl arrived before the bear.". Each arrival alone says nothing about the order: that is a
  relation between sentences 1,024+ words apart, and the decoder, copying animals it finds anywhere,
  gets the order right only by chance (1 in 2 with two keys) unless something compares positions.
- ``binding``: the answer joins two sentences at least ``min_gap`` words apart. A name is bound
  early, "The silver moose is called Nora.", and used late, "Nora visited Tokyo on Monday."; the
  summary is "The silver moose visited Tokyo on Monday." for each of the document's keys, in the
  order of their use sentences. Decoys must not be reported: every key name also "avoided" another
  city on another day, and ``decoy_names`` more bound names (default 1) only ever "avoided"
  somewhere (twice with ``even_mentions``, so that every bound name occurs equally often).

Under ``holdout``, ``binding`` keeps retrieval's split of (colour, animal) pairs
(:func:`~lsg_text.synthetic.retrieval.heldout_pair`); for ``order`` the key combination is the set
of arriving animals (:func:`heldout_set`).

They live in the package rather than beside the experiment because ``scripts/make_synthetic_data.py
--variant`` writes them and the tests check them, and both import the installed packages (no
``sys.path`` edits).
"""

import random
import re
from typing import Dict, List

from lsg_text.synthetic.config import SyntheticConfig
from lsg_text.synthetic.filler import Special, assemble, filler_sentences, paragraphs
from lsg_text.synthetic.retrieval import FIELDS, key_colour, summary_from_facts
from lsg_text.synthetic.vocabulary import (
    ANIMALS,
    ARRIVE_TEMPLATE,
    BIND_TEMPLATE,
    CITIES,
    COUNT_TEMPLATE,
    DECOY_TEMPLATE,
    MAX_COUNT,
    MENTION_TEMPLATE,
    NAMES,
    ORDER_TEMPLATE,
    USE_TEMPLATE,
    WEEKDAYS,
)


def heldout_set(animals) -> bool:
    """``order`` under ``holdout``: True for the sets of animals kept for valid/test (a quarter of the
    index sums), whatever their order, so that training sees every kept set in both orders."""
    return sum(ANIMALS.index(a) for a in animals) % 4 == 0


def make_binding_example(rng: random.Random, cfg: SyntheticConfig, example_id: str, split: str) -> Dict:
    """The ``binding`` variant (module docstring): per key a binding sentence, a use sentence at least
    ``min_gap`` words later and a decoy; plus ``decoy_names`` bound names that only have a decoy (two
    with ``even_mentions``, so that no name stands out by how often it occurs). ``keys`` holds each
    key's facts, ``token_offset`` (its use sentence) and ``bind_offset``, in summary order."""
    target_len = rng.randint(cfg.min_tokens + 1, cfg.max_tokens)
    n_keys = rng.randint(cfg.min_keys, cfg.max_keys)
    animals = rng.sample(ANIMALS, n_keys + cfg.decoy_names)  # the last ones are the decoy-only names'
    names = rng.sample(NAMES, n_keys + cfg.decoy_names)
    bound = [{"colour": key_colour(rng, a, split, cfg), "animal": a, "name": n} for a, n in zip(animals, names)]
    specials: List[Special] = []  # positions are drawn once the filler is known
    for i, b in enumerate(bound):
        specials.append((BIND_TEMPLATE.format(**b), "bind", i))
        decoy = {"name": b["name"], "city": rng.choice(CITIES), "weekday": rng.choice(WEEKDAYS)}
        specials.append((DECOY_TEMPLATE.format(**decoy), "decoy", i))
        if i < n_keys:
            b["city"] = rng.choice([c for c in CITIES if c != decoy["city"]])
            b["weekday"] = rng.choice([w for w in WEEKDAYS if w != decoy["weekday"]])
            specials.append((USE_TEMPLATE.format(**b), "use", i))
        elif cfg.even_mentions:  # bind + two sentences, as often as a key's name
            again = {
                "name": b["name"],
                "city": rng.choice([c for c in CITIES if c != decoy["city"]]),
                "weekday": rng.choice(WEEKDAYS),
            }
            specials.append((DECOY_TEMPLATE.format(**again), "decoy2", i))
    filler = filler_sentences(rng, target_len - sum(len(s[0].split()) for s in specials))
    total = sum(len(f.split()) for f in filler)
    # Positions in filler words; assemble places a sentence up to 20 words late: hence the + 20.
    at = {}
    for sentence, role, i in specials:
        if role == "bind":
            at[("bind", i)] = rng.randint(0, total - cfg.min_gap - 40)
        elif role in ("decoy", "decoy2"):
            at[(role, i)] = rng.randint(0, total)
        else:
            at[("use", i)] = rng.randint(at[("bind", i)] + cfg.min_gap + 20, total)
    sentences, offsets = assemble(filler, specials, at)
    keys = sorted(
        (
            {
                **{f: bound[i][f] for f in FIELDS},
                "name": bound[i]["name"],
                "token_offset": offsets[("use", i)],
                "bind_offset": offsets[("bind", i)],
            }
            for i in range(n_keys)
        ),
        key=lambda k: k["token_offset"],
    )
    assert all(k["token_offset"] - k["bind_offset"] >= cfg.min_gap for k in keys), example_id
    document = paragraphs(rng, cfg.min_paragraph, cfg.max_paragraph, sentences)
    return {"id": example_id, "document": document, "summary": summary_from_facts(keys), "keys": keys}


def make_count_example(rng: random.Random, cfg: SyntheticConfig, example_id: str) -> Dict:
    """The ``count`` variant (module docstring): each key animal is mentioned 1..MAX_COUNT times at
    uniformly random places; the summary gives each one's count, in order of first mention. ``keys``:
    ``animal``, ``count``, ``token_offset`` (first mention) and ``mentions`` (every offset)."""
    target_len = rng.randint(cfg.min_tokens + 1, cfg.max_tokens)
    n_keys = rng.randint(cfg.min_keys, cfg.max_keys)
    counts = {a: rng.randint(1, MAX_COUNT) for a in rng.sample(ANIMALS, n_keys)}
    specials = [(MENTION_TEMPLATE.format(animal=a), a, j) for a, c in counts.items() for j in range(c)]
    filler = filler_sentences(rng, target_len - sum(len(s[0].split()) for s in specials))
    total = sum(len(f.split()) for f in filler)
    at = {(a, j): rng.randint(0, total) for _, a, j in specials}
    sentences, offsets = assemble(filler, specials, at)
    keys = sorted(
        (
            {
                "animal": a,
                "count": c,
                "token_offset": min(offsets[(a, j)] for j in range(c)),
                "mentions": sorted(offsets[(a, j)] for j in range(c)),
            }
            for a, c in counts.items()
        ),
        key=lambda k: k["token_offset"],
    )
    summary = " ".join(COUNT_TEMPLATE.format(**k) for k in keys)
    document = paragraphs(rng, cfg.min_paragraph, cfg.max_paragraph, sentences)
    return {"id": example_id, "document": document, "summary": summary, "keys": keys}


_COUNT_RE = re.compile(r"The (\S+) was seen (\S+) times")


def count_hits(reference_keys: List[Dict], hypothesis: str) -> List[Dict[str, bool]]:
    """``count`` variant: the i-th sentence of ``hypothesis`` against the i-th key, animal and count."""
    generated = _COUNT_RE.findall(hypothesis)
    out = []
    for i, ref in enumerate(reference_keys):
        animal, count = generated[i] if i < len(generated) else (None, None)
        out.append({"animal": animal == ref["animal"], "count": count == str(ref["count"])})
    return out


def order_summary(animals: List[str]) -> str:
    """``order``: "The a1 arrived before the a2. The a2 arrived before the a3." for arrivals a1, a2, a3."""
    return " ".join(ORDER_TEMPLATE.format(first=a, second=b) for a, b in zip(animals, animals[1:]))


_ORDER_RE = re.compile(r"The (\S+) arrived before the ([^\s.]+)")


def parse_order(text: str) -> List[str]:
    """The animals of a generated ``order`` summary in the order it gives: the first sentence's two, then
    the second word of each further sentence ("A before B. B before C." -> [A, B, C])."""
    pairs = _ORDER_RE.findall(text)
    return [pairs[0][0]] + [b for _, b in pairs] if pairs else []


def order_hits(reference_keys: List[Dict], hypothesis: str) -> List[Dict[str, bool]]:
    """``order``: is the i-th animal of the hypothesis' order the i-th to arrive?"""
    generated = parse_order(hypothesis)
    return [{"animal": i < len(generated) and generated[i] == ref["animal"]} for i, ref in enumerate(reference_keys)]


def make_order_example(rng: random.Random, cfg: SyntheticConfig, example_id: str, split: str) -> Dict:
    """The ``order`` variant (module docstring): n_keys animals arrive once each, consecutive arrivals at
    least ``min_gap`` words apart, in a random order. ``keys``: ``animal`` and ``token_offset``, in order of
    arrival."""
    target_len = rng.randint(cfg.min_tokens + 1, cfg.max_tokens)
    n_keys = rng.randint(cfg.min_keys, cfg.max_keys)
    animals = rng.sample(ANIMALS, n_keys)
    while cfg.holdout and heldout_set(animals) != (split != "train"):
        animals = rng.sample(ANIMALS, n_keys)
    specials = [(ARRIVE_TEMPLATE.format(animal=a), "arrive", i) for i, a in enumerate(animals)]
    filler = filler_sentences(rng, target_len - sum(len(s[0].split()) for s in specials))
    total = sum(len(f.split()) for f in filler)
    # Positions in filler words, each drawn after the previous one's plus the gap (+ 20: assemble may place
    # a sentence up to 20 words late), leaving room for the arrivals still to come.
    at, lo = {}, 0
    for i in range(n_keys):
        hi = total - (n_keys - 1 - i) * (cfg.min_gap + 20)
        at[("arrive", i)] = lo = rng.randint(lo, hi)
        lo += cfg.min_gap + 20
    sentences, offsets = assemble(filler, specials, at)
    keys = [{"animal": a, "token_offset": offsets[("arrive", i)]} for i, a in enumerate(animals)]
    assert all(b["token_offset"] - a["token_offset"] >= cfg.min_gap for a, b in zip(keys, keys[1:])), example_id
    document = paragraphs(rng, cfg.min_paragraph, cfg.max_paragraph, sentences)
    return {"id": example_id, "document": document, "summary": order_summary(animals), "keys": keys}
