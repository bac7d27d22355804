"""A seeded, *long-range* synthetic summarization set (JSONL like ``shared/data``), no external data.

Each document is 2K-8K whitespace tokens (configurable) of filler sentences drawn from fixed
templates, with a few key sentences inserted at random places; the summary is a function of them.
Key words never occur in filler, so the task is pure retrieve-and-copy (or retrieve-and-combine);
but since keys land anywhere, usually beyond the first 1K tokens, a model that reads only a 1K
prefix (plain BART) cannot solve it, while a long-input encoder can. The whole vocabulary is a few
hundred word types so that a tiny model with a small sentencepiece vocabulary learns it quickly.

Every example also stores its facts under ``"keys"`` (with the whitespace-token offset of each key
sentence) for analysis; the pipeline only reads ``document`` and ``summary``.

Where things are:

- :mod:`~lsg_text.synthetic.retrieval`: the ``retrieval`` variant (``make demo``,
  ``examples/long_context``, ``scripts/key_recall.py``): "The red fox visited Paris on Monday."
  hidden in the document, restated in the summary; its scorers (``key_hits``, ``exact_match``);
- :mod:`~lsg_text.synthetic.long_range`: ``binding``, ``count`` and ``order``, the variants of
  ``examples/long_range``, with their scorers; :mod:`~lsg_text.synthetic.position_rule`: the
  ``order`` tables' no-model reference (each arrival ranked by its word offset alone);
- :mod:`~lsg_text.synthetic.config`: :class:`SyntheticConfig` (``variant``, sizes, ``holdout``);
- :mod:`~lsg_text.synthetic.vocabulary`: the key words and sentence templates;
  :mod:`~lsg_text.synthetic.filler`: the filler and how sentences are placed among it.

``holdout=True`` draws the (colour, animal) pairs of train from one set and those of valid/test
from the disjoint rest (``heldout_pair``), so no test key combination was seen in training; for
``order`` the key combination is the set of arriving animals (``heldout_set``).

Determinism: split ``s`` with seed ``n`` uses ``random.Random(f"lsg-synthetic/{n}/{s}")``
(string seeds are hashed with SHA-512, independent of PYTHONHASHSEED), so the same arguments
give byte-identical files on any machine.
"""

import random
from typing import Dict, Iterator

from lsg_text.synthetic.config import VARIANTS, SyntheticConfig
from lsg_text.synthetic.filler import FILLER_SHORTFALL
from lsg_text.synthetic.long_range import (
    count_hits,
    heldout_set,
    make_binding_example,
    make_count_example,
    make_order_example,
    order_hits,
    order_summary,
    parse_order,
)
from lsg_text.synthetic.retrieval import (
    CHOICES,
    FIELDS,
    KEY_SENTENCE_RE,
    chance_recall,
    exact_match,
    find_key_sentences,
    heldout_pair,
    key_hits,
    key_sentence,
    make_retrieval_example,
    parse_key_sentences,
    summary_from_facts,
)
from lsg_text.synthetic.vocabulary import (
    ANIMALS,
    ARRIVE_TEMPLATE,
    BIND_TEMPLATE,
    CITIES,
    COLOURS,
    COUNT_TEMPLATE,
    DECOY_TEMPLATE,
    KEY_TEMPLATE,
    KEY_TOKENS,
    MAX_COUNT,
    MENTION_TEMPLATE,
    NAMES,
    ORDER_TEMPLATE,
    USE_TEMPLATE,
    WEEKDAYS,
)

# the names callers import from lsg_text.synthetic (scripts, examples, tests); the modules hold more
__all__ = [
    "ANIMALS",
    "ARRIVE_TEMPLATE",
    "BIND_TEMPLATE",
    "CHOICES",
    "CITIES",
    "COLOURS",
    "COUNT_TEMPLATE",
    "DECOY_TEMPLATE",
    "FIELDS",
    "FILLER_SHORTFALL",
    "KEY_SENTENCE_RE",
    "KEY_TEMPLATE",
    "KEY_TOKENS",
    "MAX_COUNT",
    "MENTION_TEMPLATE",
    "NAMES",
    "ORDER_TEMPLATE",
    "USE_TEMPLATE",
    "VARIANTS",
    "WEEKDAYS",
    "SyntheticConfig",
    "chance_recall",
    "count_hits",
    "exact_match",
    "find_key_sentences",
    "heldout_pair",
    "heldout_set",
    "key_hits",
    "key_sentence",
    "make_binding_example",
    "make_count_example",
    "make_example",
    "make_order_example",
    "make_retrieval_example",
    "make_split",
    "order_hits",
    "order_summary",
    "parse_key_sentences",
    "parse_order",
    "summary_from_facts",
]


def make_example(rng: random.Random, cfg: SyntheticConfig, example_id: str, split: str = "train") -> Dict:
    """One example of ``cfg.variant``."""
    if cfg.variant == "binding":
        return make_binding_example(rng, cfg, example_id, split)
    if cfg.variant == "count":
        return make_count_example(rng, cfg, example_id)
    if cfg.variant == "order":
        return make_order_example(rng, cfg, example_id, split)
    return make_retrieval_example(rng, cfg, example_id, split)


def make_split(split: str, n: int, seed: int, cfg: SyntheticConfig) -> Iterator[Dict]:
    cfg.validate()
    rng = random.Random(f"lsg-synthetic/{seed}/{split}")
    for i in range(n):
        yield make_example(rng, cfg, f"synthetic-{split}-{i}", split)
