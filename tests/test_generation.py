"""The CPU n-gram blocker (fairseq#5206) against a brute-force reference."""
import math

import pytest
import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock

from lsg_fairseq.generation import NGramRepeatBlockFixed


def brute_force_banned(tokens, step, n):
    """For each row: tokens t such that (last n-1 generated tokens) + t already occurred."""
    banned = []
    for row in tokens.tolist():
        hist = row[: step + 1]
        out = set()
        if len(hist) >= n:
            prefix = hist[len(hist) - (n - 1):] if n > 1 else []
            for i in range(len(hist) - n + 1):
                if hist[i : i + n - 1] == prefix:
                    out.add(hist[i + n - 1])
        banned.append(out)
    return banned


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("step", [0, 1, 2, 5, 11])
def test_fixed_blocker_equals_brute_force(n, step):
    g = torch.Generator().manual_seed(step * 10 + n)
    bsz, beam, vocab, max_len = 2, 3, 6, 16
    tokens = torch.full((bsz * beam, max_len + 2), 1)  # pad-filled buffer, as in SequenceGenerator
    tokens[:, : step + 1] = torch.randint(2, vocab, (bsz * beam, step + 1), generator=g)
    lprobs = torch.zeros(bsz * beam, vocab)
    out = NGramRepeatBlockFixed(n, use_extension=False)(tokens, lprobs, bsz, beam, step)
    for row, expected in zip(out, brute_force_banned(tokens, step, n)):
        got = {i for i, v in enumerate(row.tolist()) if v == -math.inf}
        assert got == expected


def test_stock_cpu_blocker_misses_repeats():
    """Documents the upstream bug the fixed blocker exists for: five identical tokens pass n=3."""
    tokens = torch.full((1, 10), 1)
    tokens[0, :5] = 7
    step = 4
    stock = NGramRepeatBlock(3, use_extension=False)(tokens, torch.zeros(1, 9), 1, 1, step)
    fixed = NGramRepeatBlockFixed(3, use_extension=False)(tokens, torch.zeros(1, 9), 1, 1, step)
    assert stock[0, 7] == 0.0
    assert fixed[0, 7] == -math.inf
