"""The synthetic set's settings (:class:`SyntheticConfig`) and the sizes each variant needs."""

from dataclasses import dataclass

from lsg_text.synthetic.filler import FILLER_SHORTFALL
from lsg_text.synthetic.vocabulary import (
    ANIMALS,
    ARRIVE_TEMPLATE,
    BIND_TEMPLATE,
    DECOY_TEMPLATE,
    KEY_TOKENS,
    NAMES,
    USE_TEMPLATE,
)

VARIANTS = ("retrieval", "binding", "count", "order")


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
        # the 40 words make_binding_example keeps around it; filler_sentences may fall FILLER_SHORTFALL words short
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
