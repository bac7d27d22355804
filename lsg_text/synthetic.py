"""A seeded, *long-range* synthetic summarization set (JSONL like ``shared/data``), no external data.

Each document is 2K-8K whitespace tokens (configurable) of filler sentences drawn from fixed
templates, with a few KEY sentences inserted at uniformly random sentence positions::

    The {colour} {animal} visited {city} on {weekday}.

The summary is the key sentences in document order, verbatim. Key words (colours, animals,
cities, weekdays, "visited") never occur in filler, so the task is pure retrieve-and-copy; but
since keys land anywhere, usually beyond the first 1K tokens, a model that reads only a 1K prefix
(plain BART) cannot solve it, while a long-input encoder can. The whole vocabulary is a few
hundred word types so that a tiny model with a small sentencepiece vocabulary learns it quickly.

Every example also stores its facts under ``"keys"`` (with the whitespace-token offset of each key
sentence) for analysis; the pipeline only reads ``document`` and ``summary``.

Variants (``SyntheticConfig.variant``):

- ``retrieval`` (above): one hop, the key sentence is the answer.
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

``holdout=True`` draws the (colour, animal) pairs of train from one set and those of valid/test
from the disjoint rest (``heldout_pair``), so no test key combination was seen in training; for
``order`` the key combination is the set of arriving animals (``heldout_set``).

Determinism: split ``s`` with seed ``n`` uses ``random.Random(f"lsg-synthetic/{n}/{s}")``
(string seeds are hashed with SHA-512, independent of PYTHONHASHSEED), so the same arguments
give byte-identical files on any machine.
"""

import random
import re
from dataclasses import dataclass
from typing import Dict, Iterator, List, Tuple

COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "grey", "brown", "pink", "silver")
ANIMALS = (
    "fox",
    "owl",
    "bear",
    "wolf",
    "deer",
    "hare",
    "otter",
    "eagle",
    "badger",
    "heron",
    "lynx",
    "moose",
    "raven",
    "seal",
    "tiger",
    "camel",
)
CITIES = (
    "Paris",
    "Lisbon",
    "Oslo",
    "Cairo",
    "Lima",
    "Dublin",
    "Vienna",
    "Prague",
    "Madrid",
    "Athens",
    "Quito",
    "Tokyo",
    "Nairobi",
    "Boston",
    "Sydney",
    "Berlin",
)
NAMES = (
    "Nora",
    "Pim",
    "Otto",
    "Lena",
    "Ivo",
    "Mira",
    "Tess",
    "Bram",
    "Cato",
    "Edda",
    "Finn",
    "Hana",
    "Juno",
    "Kai",
    "Lars",
    "Rosa",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

KEY_TEMPLATE = "The {colour} {animal} visited {city} on {weekday}."
KEY_TOKENS = len(KEY_TEMPLATE.split())  # 7
KEY_SENTENCE_RE = re.compile(
    r"The (%s) (%s) visited (%s) on (%s)\." % tuple("|".join(words) for words in (COLOURS, ANIMALS, CITIES, WEEKDAYS))
)

BIND_TEMPLATE = "The {colour} {animal} is called {name}."
USE_TEMPLATE = "{name} visited {city} on {weekday}."
DECOY_TEMPLATE = "{name} avoided {city} on {weekday}."
MENTION_TEMPLATE = "A {animal} was seen."
COUNT_TEMPLATE = "The {animal} was seen {count} times."
MAX_COUNT = 4
ARRIVE_TEMPLATE = "The {animal} arrived."
ORDER_TEMPLATE = "The {first} arrived before the {second}."
VARIANTS = ("retrieval", "binding", "count", "order")

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
# Fillers that close the gap to the drawn document length (see _filler for why it can fall short).
_GAP_FILLERS = {2: "It rained.", 3: "Nothing happened."}
# The most words _filler falls short of its budget, with a margin over the worst shortfall seen
# (benchmarks/README, "Figures behind the constants").
FILLER_SHORTFALL = 8


@dataclass
class SyntheticConfig:
    min_tokens: int = 2000  # document length in whitespace tokens, inclusive bounds
    max_tokens: int = 8000
    min_keys: int = 2  # key sentences per document (and so per summary)
    max_keys: int = 3
    min_paragraph: int = 3  # sentences per paragraph (one paragraph per line, as in shared/data)
    max_paragraph: int = 8
    variant: str = "retrieval"  # one of VARIANTS
    min_gap: int = 1024  # binding: words from a name's binding to its use; order: between arrivals; at least
    holdout: bool = False  # train and valid/test draw (colour, animal) from disjoint sets
    decoy_names: int = 1  # binding: bound names that are never used, only avoid
    even_mentions: bool = False  # binding: a decoy name is mentioned as often as a key's (it avoids twice)

    def validate(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        # binding: the filler left beside the binding sentences (every slot one word) must hold the gap and
        # the 40 words make_binding_example keeps around it; _filler may fall FILLER_SHORTFALL words short
        bind, decoy, use = (len(t.split()) for t in (BIND_TEMPLATE, DECOY_TEMPLATE, USE_TEMPLATE))
        decoy_name_words = bind + decoy * (2 if self.even_mentions else 1)
        special_words = (bind + decoy + use) * self.max_keys + decoy_name_words * self.decoy_names
        if self.variant == "binding" and self.min_tokens + 1 - special_words - FILLER_SHORTFALL < self.min_gap + 40:
            raise ValueError(
                f"min_tokens={self.min_tokens} is too small for min_gap={self.min_gap}, {self.max_keys} keys and "
                f"{self.decoy_names} decoy names (at least {self.min_gap + 39 + FILLER_SHORTFALL + special_words})"
            )
        arrive = len(ARRIVE_TEMPLATE.split())
        if self.variant == "order" and self.min_tokens + 1 - arrive * self.max_keys - FILLER_SHORTFALL < (
            (self.max_keys - 1) * (self.min_gap + 20) + 1
        ):
            raise ValueError(
                f"min_tokens={self.min_tokens} is too small for {self.max_keys} arrivals {self.min_gap} words apart "
                f"(at least {(self.max_keys - 1) * (self.min_gap + 20) + arrive * self.max_keys + FILLER_SHORTFALL})"
            )
        if self.variant == "order" and self.min_keys < 2:
            raise ValueError(f"order needs min_keys >= 2 (an order of one animal is no task), got {self.min_keys}")
        if self.variant == "binding" and self.max_keys + self.decoy_names > len(NAMES):
            raise ValueError(
                f"binding needs max_keys + decoy_names <= {len(NAMES)}, got {self.max_keys} + {self.decoy_names}"
            )
        if self.min_tokens < 2 * KEY_TOKENS * self.max_keys:
            raise ValueError(f"min_tokens={self.min_tokens} is too small for {self.max_keys} key sentences")
        if self.max_tokens <= self.min_tokens:
            raise ValueError(f"max_tokens={self.max_tokens} must be > min_tokens={self.min_tokens}")
        if not 1 <= self.min_keys <= self.max_keys <= len(ANIMALS):
            raise ValueError(f"need 1 <= min_keys <= max_keys <= {len(ANIMALS)}, got {self.min_keys}, {self.max_keys}")
        if not 1 <= self.min_paragraph <= self.max_paragraph:
            raise ValueError(
                f"need 1 <= min_paragraph <= max_paragraph, got {self.min_paragraph}, {self.max_paragraph}"
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


FIELDS = ("colour", "animal", "city", "weekday")
CHOICES = {"colour": COLOURS, "animal": ANIMALS, "city": CITIES, "weekday": WEEKDAYS}
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


_COUNT_RE = re.compile(r"The (\S+) was seen (\S+) times")


def count_hits(reference_keys: List[Dict], hypothesis: str) -> List[Dict[str, bool]]:
    """``count`` variant: the i-th sentence of ``hypothesis`` against the i-th key, animal and count."""
    generated = _COUNT_RE.findall(hypothesis)
    out = []
    for i, ref in enumerate(reference_keys):
        animal, count = generated[i] if i < len(generated) else (None, None)
        out.append({"animal": animal == ref["animal"], "count": count == str(ref["count"])})
    return out


def chance_recall() -> float:
    """Mean over the four slots of 1 / (number of choices): a uniform guess's expected recall."""
    return sum(1.0 / len(CHOICES[f]) for f in FIELDS) / len(FIELDS)


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


def heldout_pair(colour: str, animal: str) -> bool:
    """True for the quarter of (colour, animal) pairs kept for valid/test under ``holdout``."""
    return (COLOURS.index(colour) + 2 * ANIMALS.index(animal)) % 4 == 0


def heldout_set(animals) -> bool:
    """``order`` under ``holdout``: True for the sets of animals kept for valid/test (a quarter of the
    index sums), whatever their order, so that training sees every kept set in both orders."""
    return sum(ANIMALS.index(a) for a in animals) % 4 == 0


def _colour(rng: random.Random, animal: str, split: str, cfg: SyntheticConfig) -> str:
    """A colour for ``animal``; under ``holdout``, one whose pair belongs to ``split``'s side."""
    if not cfg.holdout:
        return rng.choice(COLOURS)
    want = split != "train"
    return rng.choice([c for c in COLOURS if heldout_pair(c, animal) == want])


def _filler(rng: random.Random, budget: int) -> List[str]:
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


def _paragraphs(rng: random.Random, cfg: SyntheticConfig, sentences: List[str]) -> str:
    paragraphs, i = [], 0
    while i < len(sentences):
        size = rng.randint(cfg.min_paragraph, cfg.max_paragraph)
        paragraphs.append(" ".join(sentences[i : i + size]))
        i += size
    return "\n".join(paragraphs)


def make_example(rng: random.Random, cfg: SyntheticConfig, example_id: str, split: str = "train") -> Dict:
    if cfg.variant == "binding":
        return make_binding_example(rng, cfg, example_id, split)
    if cfg.variant == "count":
        return make_count_example(rng, cfg, example_id)
    if cfg.variant == "order":
        return make_order_example(rng, cfg, example_id, split)
    target_len = rng.randint(cfg.min_tokens + 1, cfg.max_tokens)
    n_keys = rng.randint(cfg.min_keys, cfg.max_keys)
    animals = rng.sample(ANIMALS, n_keys)  # distinct, so every key sentence is unique
    facts = [
        {
            "colour": _colour(rng, a, split, cfg),
            "animal": a,
            "city": rng.choice(CITIES),
            "weekday": rng.choice(WEEKDAYS),
        }
        for a in animals
    ]
    # Filler up to the drawn length minus the keys, so the document has target_len or target_len - 1 tokens.
    filler = _filler(rng, target_len - n_keys * KEY_TOKENS)
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
    document = _paragraphs(rng, cfg, sentences)
    keys = [dict(fact, token_offset=offset) for offset, fact in find_key_sentences(document)]
    return {"id": example_id, "document": document, "summary": summary_from_facts(facts), "keys": keys}


# A sentence placed among the filler: (text, role, index); its position is ``at[(role, index)]``.
Special = Tuple[str, str, int]


def _assemble(filler: List[str], specials: List[Special], at: Dict[Tuple[str, int], int]):
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


def make_binding_example(rng: random.Random, cfg: SyntheticConfig, example_id: str, split: str) -> Dict:
    """The ``binding`` variant (module docstring): per key a binding sentence, a use sentence at least
    ``min_gap`` words later and a decoy; plus ``decoy_names`` bound names that only have a decoy (two
    with ``even_mentions``, so that no name stands out by how often it occurs). ``keys`` holds each
    key's facts, ``token_offset`` (its use sentence) and ``bind_offset``, in summary order."""
    target_len = rng.randint(cfg.min_tokens + 1, cfg.max_tokens)
    n_keys = rng.randint(cfg.min_keys, cfg.max_keys)
    animals = rng.sample(ANIMALS, n_keys + cfg.decoy_names)  # the last ones are the decoy-only names'
    names = rng.sample(NAMES, n_keys + cfg.decoy_names)
    bound = [{"colour": _colour(rng, a, split, cfg), "animal": a, "name": n} for a, n in zip(animals, names)]
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
    filler = _filler(rng, target_len - sum(len(s[0].split()) for s in specials))
    total = sum(len(f.split()) for f in filler)
    # Positions in filler words; _assemble places a sentence up to 20 words late: hence the + 20.
    at = {}
    for sentence, role, i in specials:
        if role == "bind":
            at[("bind", i)] = rng.randint(0, total - cfg.min_gap - 40)
        elif role in ("decoy", "decoy2"):
            at[(role, i)] = rng.randint(0, total)
        else:
            at[("use", i)] = rng.randint(at[("bind", i)] + cfg.min_gap + 20, total)
    sentences, offsets = _assemble(filler, specials, at)
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
    document = _paragraphs(rng, cfg, sentences)
    return {"id": example_id, "document": document, "summary": summary_from_facts(keys), "keys": keys}


def make_count_example(rng: random.Random, cfg: SyntheticConfig, example_id: str) -> Dict:
    """The ``count`` variant (module docstring): each key animal is mentioned 1..MAX_COUNT times at
    uniformly random places; the summary gives each one's count, in order of first mention. ``keys``:
    ``animal``, ``count``, ``token_offset`` (first mention) and ``mentions`` (every offset)."""
    target_len = rng.randint(cfg.min_tokens + 1, cfg.max_tokens)
    n_keys = rng.randint(cfg.min_keys, cfg.max_keys)
    counts = {a: rng.randint(1, MAX_COUNT) for a in rng.sample(ANIMALS, n_keys)}
    specials = [(MENTION_TEMPLATE.format(animal=a), a, j) for a, c in counts.items() for j in range(c)]
    filler = _filler(rng, target_len - sum(len(s[0].split()) for s in specials))
    total = sum(len(f.split()) for f in filler)
    at = {(a, j): rng.randint(0, total) for _, a, j in specials}
    sentences, offsets = _assemble(filler, specials, at)
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
    return {"id": example_id, "document": _paragraphs(rng, cfg, sentences), "summary": summary, "keys": keys}


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
    filler = _filler(rng, target_len - sum(len(s[0].split()) for s in specials))
    total = sum(len(f.split()) for f in filler)
    # Positions in filler words, each drawn after the previous one's plus the gap (+ 20: _assemble may place
    # a sentence up to 20 words late), leaving room for the arrivals still to come.
    at, lo = {}, 0
    for i in range(n_keys):
        hi = total - (n_keys - 1 - i) * (cfg.min_gap + 20)
        at[("arrive", i)] = lo = rng.randint(lo, hi)
        lo += cfg.min_gap + 20
    sentences, offsets = _assemble(filler, specials, at)
    keys = [{"animal": a, "token_offset": offsets[("arrive", i)]} for i, a in enumerate(animals)]
    assert all(b["token_offset"] - a["token_offset"] >= cfg.min_gap for a, b in zip(keys, keys[1:])), example_id
    return {
        "id": example_id,
        "document": _paragraphs(rng, cfg, sentences),
        "summary": order_summary(animals),
        "keys": keys,
    }


def make_split(split: str, n: int, seed: int, cfg: SyntheticConfig) -> Iterator[Dict]:
    cfg.validate()
    rng = random.Random(f"lsg-synthetic/{seed}/{split}")
    for i in range(n):
        yield make_example(rng, cfg, f"synthetic-{split}-{i}", split)
