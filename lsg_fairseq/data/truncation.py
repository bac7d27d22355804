"""Truncation that keeps end-of-sentence and counts what it cut, instead of fairseq's silent skip.

fairseq's ``translation`` task drops over-long training examples with a warning and makes
valid/test raise (``Size of sample #i is invalid``). For long-document summarization every
document is useful even when cut, so we truncate and report how many examples were affected.
"""

import logging
from typing import List

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset

logger = logging.getLogger(__name__)


def truncate_keep_eos(item, max_len: int, eos: int):
    """``item`` (``tokens + [eos]``) cut to at most ``max_len`` tokens: the first ``max_len - 1``,
    then eos, closing the sequence as fairseq-preprocess did."""
    return torch.cat([item[: max_len - 1], item.new_tensor([eos])]) if item.numel() > max_len else item


class TruncateKeepEosDataset(BaseWrapperDataset):
    """Cut every item to at most ``max_len`` tokens, keeping its final ``eos``.

    Items are 1-D token tensors as fairseq-preprocess writes them (``tokens + [eos]``).
    ``num_truncated`` is computed once from the size array, so it costs no item reads.
    """

    def __init__(self, dataset, max_len: int, eos: int):
        super().__init__(dataset)
        if max_len < 2:
            raise ValueError(f"cannot truncate to {max_len} tokens: need room for a token and eos")
        self.max_len = max_len
        self.eos = eos
        sizes = np.asarray(dataset.sizes)
        self.num_truncated = int((sizes > max_len).sum())
        self._sizes = np.minimum(sizes, max_len)

    def __getitem__(self, index):
        return truncate_keep_eos(self.dataset[index], self.max_len, self.eos)

    @property
    def sizes(self):
        return self._sizes

    def num_tokens(self, index):
        return int(self._sizes[index])

    def size(self, index):
        return int(self._sizes[index])


def empty_indices(sizes, min_size: int = 1) -> List[int]:
    """Indices whose item has at most ``min_size`` tokens (``[eos]`` alone is an empty line)."""
    return [int(i) for i in np.flatnonzero(np.asarray(sizes) <= min_size)]
