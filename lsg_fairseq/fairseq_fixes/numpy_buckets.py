"""``--num-batch-buckets`` on numpy 2 (no upstream issue found).

fairseq 0.12's bucketing calls two numpy names that numpy has since removed:

- ``data_utils.get_buckets`` passes ``np.percentile(..., interpolation="lower")``. numpy 1.22 renamed
  the argument ``method``; numpy 2.4 removed the old name (a TypeError).
- ``LanguagePairDataset.__init__`` types its bucketed token counts ``np.compat.long``; numpy 2.0
  removed ``np.compat`` (an AttributeError).

Every run given ``--num-batch-buckets N`` (N > 0) failed while building its datasets, with a
traceback: training, validation and generation alike, since this plugin's tasks pass N to fairseq's
``LanguagePairDataset`` as translation does. The replacements compute the same things under the new
names: ``method="lower"`` is the old option renamed, and ``np.compat.long`` was Python's ``int``,
which numpy stores as int64. ``LanguagePairDataset`` is built without buckets, then given them by
fairseq's own steps (:func:`_bucket`, the block of its ``__init__`` under ``if num_buckets > 0``).
``bucket_pad_length_dataset`` and ``raw_audio_dataset`` import ``get_buckets`` by name, so it is
replaced there too. On a numpy older than 1.22 nothing is replaced: the old names work there.
"""

import inspect
import logging

import numpy as np
from fairseq.data import BucketPadLengthDataset, LanguagePairDataset, bucket_pad_length_dataset, data_utils
from fairseq.data.audio import raw_audio_dataset

from lsg_fairseq.fairseq_fixes._wrap import wrap

logger = logging.getLogger("fairseq.data.language_pair_dataset")  # where fairseq logs the buckets

# every module that holds fairseq's get_buckets under that name
HOLDERS = (data_utils, bucket_pad_length_dataset, raw_audio_dataset)


def numpy_has_method() -> bool:
    """Whether this numpy's ``percentile`` takes ``method`` (1.22 and later)."""
    return np.lib.NumpyVersion(np.__version__) >= "1.22.0"


def _percentile_method(original):
    def get_buckets(sizes, num_buckets):
        # fairseq's body, with the argument under its numpy >= 1.22 name
        return np.unique(np.percentile(sizes, np.linspace(0, 100, num_buckets + 1), method="lower")[1:])

    return get_buckets


def _bucket(pair, num_buckets: int) -> None:
    """fairseq's bucketing of a built ``LanguagePairDataset``, step for step, with int64 counts."""
    for side, name in (("src", "source"), ("tgt", "target")):
        data = getattr(pair, side)
        if data is None:
            continue
        bucketed = BucketPadLengthDataset(
            data,
            sizes=getattr(pair, f"{side}_sizes"),
            num_buckets=num_buckets,
            pad_idx=getattr(pair, f"{side}_dict").pad(),
            left_pad=getattr(pair, f"left_pad_{name}"),
        )
        setattr(pair, side, bucketed)
        setattr(pair, f"{side}_sizes", bucketed.sizes)
        logger.info("bucketing {} lengths: {}".format(name, list(bucketed.buckets)))
    num_tokens = np.vectorize(pair.num_tokens, otypes=[np.int64])
    pair.bucketed_num_tokens = num_tokens(np.arange(len(pair.src)))
    pair.buckets = [(None, n) for n in np.unique(pair.bucketed_num_tokens)]


def _buckets_without_compat(original):
    signature = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        num_buckets = bound.arguments.pop("num_buckets", 0)
        original(*bound.args, **bound.kwargs)
        if num_buckets > 0:
            _bucket(self, num_buckets)

    return __init__


def install() -> None:
    if not numpy_has_method():
        return
    for module in HOLDERS:
        wrap(module, "get_buckets", _percentile_method)
    wrap(LanguagePairDataset, "__init__", _buckets_without_compat)
