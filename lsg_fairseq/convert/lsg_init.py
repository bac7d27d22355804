"""BART -> LSG-BART: the global tokens' initialisation, as the LSG reference's converter does it
(spec/lsg.md section 6 step 3).

Global token g starts as an ordered encoder position row plus the ``<mask>`` embedding (``<s>``'s
for g = 0): the P position rows are brought to 512 (cut, or completed with rows drawn around the
column means), subsampled, then reordered by a stride so that neighbouring globals look at distant
positions. Used for an HF BART folder and for a fairseq BART checkpoint alike, so both give
bit-identical LSG-BART models (``tests/test_convert_lsg.py``).
"""

import os
from typing import Optional

import torch

from lsg_fairseq.convert import common as C
from lsg_layers.modules.lsg_config import MAX_GLOBAL_TOKENS

# The reference's defaults (lsg-fairseq-convert --global-positional-stride / --seed)
GLOBAL_POSITIONAL_STRIDE = 64
INIT_SEED = 123


def order_positions(positions: torch.Tensor, stride: int, generator: torch.Generator) -> torch.Tensor:
    """512 position rows for the global tokens (spec section 6 step 3).

    P rows are brought to a multiple of 512 (cut, or completed with rows drawn from
    N(column mean, column std) with ``generator``), subsampled to 512 rows (every factor-th),
    then reordered so that global g gets subsampled row
    ``(g mod (512/m)) * m + g // (512/m)`` with ``m = stride / factor``.
    """
    n, d = positions.shape
    if n % MAX_GLOBAL_TOKENS != 0:
        if n > MAX_GLOBAL_TOKENS:
            positions = positions[: MAX_GLOBAL_TOKENS * (n // MAX_GLOBAL_TOKENS)]
        else:
            mean = positions.mean(dim=0, keepdim=True).expand(MAX_GLOBAL_TOKENS - n, -1)
            std = positions.std(dim=0, keepdim=True).expand(MAX_GLOBAL_TOKENS - n, -1)
            extra = torch.normal(mean, std, generator=generator)
            positions = torch.cat([positions, extra.to(positions.dtype)], dim=0)
        n = positions.size(0)
    factor = n // MAX_GLOBAL_TOKENS
    if stride % factor != 0 or MAX_GLOBAL_TOKENS % (stride // factor) != 0:
        raise C.ConversionError(
            f"--global-positional-stride {stride} must be a multiple of {factor} (positions/{MAX_GLOBAL_TOKENS}) "
            f"and stride/{factor} must divide {MAX_GLOBAL_TOKENS}"
        )
    positions = positions.reshape(-1, factor, d)[:, 0]  # (512, d): rows 0, factor, 2*factor...
    m = stride // factor
    return positions.reshape(-1, m, d).transpose(0, 1).reshape(-1, d)  # (512, d)


def init_global_embeddings(
    enc_positions: torch.Tensor, embed_tokens: torch.Tensor, bos_id: int, mask_id: int, stride: int, seed: int
) -> torch.Tensor:
    """The reference's global-token initialisation (spec section 6 step 3), [512, d]."""
    generator = torch.Generator().manual_seed(seed)
    ordered = order_positions(enc_positions[2:].float(), stride, generator)
    glob = ordered + embed_tokens[mask_id].float()
    glob[0] = ordered[0] + embed_tokens[bos_id].float()
    return glob.to(embed_tokens.dtype)


def mask_id(src: str, vocab: Optional[dict], vocab_size: int) -> int:
    special = os.path.join(src, "special_tokens_map.json")
    token = "<mask>"
    if os.path.exists(special):
        entry = C.read_json(special, dict).get("mask_token")
        if isinstance(entry, dict):
            token = entry.get("content", token)
        elif isinstance(entry, str):
            token = entry
    if vocab is not None and token in vocab:
        return vocab[token]
    return vocab_size - 1
