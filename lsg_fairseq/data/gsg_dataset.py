"""On-the-fly gap-sentence generation over a sentence-segmented, pre-tokenized corpus.

Why on the fly: selection needs sentences and words, masking needs model tokens, and the PEGASUS
variants (score noise, stochastic ratio, random mask actions) draw new examples every epoch. So
the text work (sentence splitting, BPE, ROUGE word ids) is done **once** by
``scripts/gsg_preprocess.py``, and the cheap part (ROUGE-1 counting, selection, masking) is done
per example here, deterministically from ``(seed, epoch, index)``.

Corpus layout, ``<prefix>`` = ``<data>/<split>.gsg`` (all numpy ``.npy``, memory-mapped):

- ``<prefix>.tokens.npy``: model-dictionary ids of every sentence, concatenated (no bos/eos);
- ``<prefix>.words.npy``: ROUGE word ids (:func:`~lsg_text.gsg.rouge_tokenize` words
  numbered in order of first appearance; only equality matters), concatenated;
- ``<prefix>.sentences.npy``: ``(n_sentences, 2)`` int64, tokens and words per sentence;
- ``<prefix>.documents.npy``: ``(n_documents + 1,)`` int64 sentence offsets of the documents.
"""

import logging
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from fairseq.data import FairseqDataset
from fairseq.data.language_pair_dataset import collate

from lsg_fairseq.data.binarized import missing_split, splits_in
from lsg_text import gsg
from lsg_text.atomic import atomic_files
from lsg_text.errors import MissingFileError
from lsg_text.fileio import DataError

logger = logging.getLogger(__name__)

CORPUS_PARTS = ("tokens", "words", "sentences", "documents")
CORPUS_SUFFIX = ".gsg"  # a split's files: <split>.gsg.<part>.npy


def corpus_prefix(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, split + CORPUS_SUFFIX)


def require_corpus_split(data_dir: str, split: str, train: bool) -> None:
    """Refuse a split with no corpus file at all in ``data_dir`` (one line: folder, split, flags);
    a corpus missing some parts is :class:`GSGCorpus`'s to report."""
    prefix = corpus_prefix(data_dir, split)
    if not any(os.path.exists(f"{prefix}.{part}.npy") for part in CORPUS_PARTS):
        found = splits_in(data_dir, CORPUS_SUFFIX + ".")
        maker = "scripts/gsg_preprocess.py --input train=FILE"
        raise missing_split(data_dir, split, f"{split}{CORPUS_SUFFIX}.*.npy", found, train, maker=maker)


def corpus_exists(prefix: str) -> bool:
    return all(os.path.exists(f"{prefix}.{part}.npy") for part in CORPUS_PARTS)


class GSGCorpusWriter:
    """Accumulates documents (lists of per-sentence token ids and words), then saves the corpus.

    The word numbering is shared by every split written with the same writer object, but nothing
    depends on it being shared: ROUGE only compares words within one document.
    """

    def __init__(self):
        self.word_ids: Dict[str, int] = {}
        self._reset()

    def _reset(self):
        self.tokens: List[np.ndarray] = []
        self.words: List[np.ndarray] = []
        self.sentence_sizes: List[tuple] = []
        self.doc_offsets: List[int] = [0]

    def add_document(self, sentence_tokens: Sequence[Sequence[int]], sentences: Sequence[str]) -> None:
        if len(sentence_tokens) != len(sentences):
            raise ValueError(f"{len(sentence_tokens)} tokenized sentences for {len(sentences)} sentences")
        for toks, text in zip(sentence_tokens, sentences):
            words = [self.word_ids.setdefault(w, len(self.word_ids)) for w in gsg.rouge_tokenize(text)]
            self.tokens.append(np.asarray(toks, dtype=np.int32))
            self.words.append(np.asarray(words, dtype=np.int32))
            self.sentence_sizes.append((len(toks), len(words)))
        self.doc_offsets.append(len(self.sentence_sizes))

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    def save(self, prefix: str) -> Dict[str, int]:
        """Write the four arrays (atomically: a failed run leaves no partial array) and start a
        new, empty split."""
        empty = np.zeros(0, dtype=np.int32)
        arrays = {
            "tokens": np.concatenate(self.tokens) if self.tokens else empty,
            "words": np.concatenate(self.words) if self.words else empty,
            "sentences": np.asarray(self.sentence_sizes, dtype=np.int64).reshape(-1, 2),
            "documents": np.asarray(self.doc_offsets, dtype=np.int64),
        }
        with atomic_files([f"{prefix}.{part}.npy" for part in arrays]) as files:
            for f, array in zip(files, arrays.values()):
                np.save(f, array)
        stats = {
            "documents": self.num_documents,
            "sentences": len(self.sentence_sizes),
            "tokens": int(arrays["tokens"].size),
            "words": int(arrays["words"].size),
        }
        self._reset()
        return stats


class GSGCorpus:
    """Read side of the layout above: document ``i`` as per-sentence token and word arrays."""

    def __init__(self, prefix: str):
        if not corpus_exists(prefix):
            missing = [f"{prefix}.{p}.npy" for p in CORPUS_PARTS if not os.path.exists(f"{prefix}.{p}.npy")]
            raise MissingFileError(
                f"GSG corpus {prefix!r} is incomplete, missing {missing}; build it with scripts/gsg_preprocess.py"
            )

        def load(part):
            path = f"{prefix}.{part}.npy"
            try:
                return np.load(path, mmap_mode="r")
            except (ValueError, OSError, EOFError) as e:  # truncated or not an .npy file
                raise DataError(f"{path}: not a readable .npy array ({e}); re-run scripts/gsg_preprocess.py") from None

        self.tokens, self.words = load("tokens"), load("words")
        sentences = np.asarray(load("sentences"))  # (n_sentences, 2): tokens, words
        self.doc_offsets = np.asarray(load("documents"))
        self.tok_offsets = np.concatenate([[0], np.cumsum(sentences[:, 0])])
        self.word_offsets = np.concatenate([[0], np.cumsum(sentences[:, 1])])
        if self.tok_offsets[-1] != len(self.tokens) or self.word_offsets[-1] != len(self.words):
            raise DataError(
                f"GSG corpus {prefix!r}: sentence sizes do not add up to the token/word arrays "
                "(files from different runs?); re-run scripts/gsg_preprocess.py"
            )
        # Tokens per document, for batching before any example is built.
        self.doc_tokens = self.tok_offsets[self.doc_offsets[1:]] - self.tok_offsets[self.doc_offsets[:-1]]

    def __len__(self) -> int:
        return len(self.doc_offsets) - 1

    def document(self, i: int):
        s0, s1 = int(self.doc_offsets[i]), int(self.doc_offsets[i + 1])
        t, w = self.tok_offsets[s0 : s1 + 1], self.word_offsets[s0 : s1 + 1]
        tokens = np.asarray(self.tokens[t[0] : t[-1]], dtype=np.int64)
        words = np.asarray(self.words[w[0] : w[-1]], dtype=np.int64)
        # per-sentence views, bounds relative to the document start (np.split is much slower)
        t, w = (t - t[0]).tolist(), (w - w[0]).tolist()
        return ([tokens[a:b] for a, b in zip(t[:-1], t[1:])], [words[a:b] for a, b in zip(w[:-1], w[1:])])


class GapSentenceDataset(FairseqDataset):
    """fairseq dataset of GSG (source, target) pairs built per item from a :class:`GSGCorpus`.

    Items follow ``long_document_summarization``: ``<s>`` (if ``prepend_bos``) + tokens + ``</s>``
    on both sides, source right-padded, so a GSG-pretrained model fine-tunes on summaries with the
    same conventions. Sources and targets longer than the position limits are truncated (eos kept),
    never dropped; each collated batch carries how many of its examples were truncated.

    ``fixed_epoch``: when set (validation/test), examples ignore :meth:`set_epoch`, so the valid
    loss is comparable across epochs.
    """

    def __init__(
        self,
        corpus: GSGCorpus,
        dictionary,
        *,
        mask_token: int,
        ratio: float,
        ratio_max: Optional[float],
        strategy: str,
        score_noise: float,
        mask_probs: Sequence[float],
        seed: int,
        max_source_positions: int,
        max_target_positions: int,
        prepend_bos: bool = True,
        shuffle: bool = True,
        fixed_epoch: Optional[int] = None,
        pad_to_multiple: int = 1,
    ):
        self.corpus = corpus
        self.dictionary = dictionary
        self.mask_token = mask_token
        self.options = dict(
            ratio=ratio, ratio_max=ratio_max, strategy=strategy, score_noise=score_noise, mask_probs=tuple(mask_probs)
        )
        self.seed = seed
        self.max_source_positions = max_source_positions
        self.max_target_positions = max_target_positions
        self.bos = [dictionary.bos()] if prepend_bos else []
        self.shuffle = shuffle
        self.fixed_epoch = fixed_epoch
        self.epoch = fixed_epoch if fixed_epoch is not None else 1
        self.pad_to_multiple = pad_to_multiple
        # Upper bounds used for batching and size filtering: the source is at most the whole
        # document (masking only shortens it; a RANDOM replacement may lengthen it by a sentence,
        # which truncation then caps), the target at most the whole document. Capped at the
        # position limits because items are truncated, never skipped.
        full = corpus.doc_tokens + len(self.bos) + 1
        self.src_sizes = np.minimum(full, max_source_positions).astype(np.int64)
        self.tgt_sizes = np.minimum(full, max_target_positions).astype(np.int64)

    def __len__(self):
        return len(self.corpus)

    def set_epoch(self, epoch):
        if self.fixed_epoch is None:
            self.epoch = epoch

    def rng(self, index: int) -> np.random.Generator:
        """The only source of randomness of example ``index``: a function of (seed, epoch, index)."""
        return np.random.default_rng([self.seed, self.epoch, index])

    def _close(self, tokens: List[int], limit: int):
        item = self.bos + tokens + [self.dictionary.eos()]
        if len(item) <= limit:
            return torch.tensor(item, dtype=torch.long), False
        return torch.tensor(item[: limit - 1] + [self.dictionary.eos()], dtype=torch.long), True

    def __getitem__(self, index):
        sent_tokens, sent_words = self.corpus.document(index)
        ex = gsg.gsg_example(sent_words, sent_tokens, mask_token=self.mask_token, rng=self.rng(index), **self.options)
        source, src_cut = self._close(ex["source"], self.max_source_positions)
        target, tgt_cut = self._close(ex["target"], self.max_target_positions)
        return {
            "id": index,
            "source": source,
            "target": target,
            "source_truncated": src_cut,
            "target_truncated": tgt_cut,
        }

    def collater(self, samples, pad_to_length=None):
        batch = collate(
            samples,
            self.dictionary.pad(),
            self.dictionary.eos(),
            left_pad_source=False,
            left_pad_target=False,
            input_feeding=True,
            pad_to_length=pad_to_length,
            pad_to_multiple=self.pad_to_multiple,
        )
        if batch:
            batch["gsg_source_truncated"] = sum(int(s["source_truncated"]) for s in samples)
            batch["gsg_target_truncated"] = sum(int(s["target_truncated"]) for s in samples)
        return batch

    def num_tokens(self, index):
        return int(max(self.src_sizes[index], self.tgt_sizes[index]))

    def num_tokens_vec(self, indices):
        return np.maximum(self.src_sizes[indices], self.tgt_sizes[indices])

    def size(self, index):
        return (int(self.src_sizes[index]), int(self.tgt_sizes[index]))

    @property
    def sizes(self):
        return np.stack([self.src_sizes, self.tgt_sizes], axis=1)

    def ordered_indices(self):
        # As LanguagePairDataset: shuffle (fairseq seeds numpy per epoch), then sort by length so
        # batches hold documents of similar length.
        if self.shuffle:
            indices = np.random.permutation(len(self)).astype(np.int64)
        else:
            indices = np.arange(len(self), dtype=np.int64)
        indices = indices[np.argsort(self.tgt_sizes[indices], kind="mergesort")]
        return indices[np.argsort(self.src_sizes[indices], kind="mergesort")]

    @property
    def supports_prefetch(self):
        return False

    def filter_indices_by_size(self, indices, max_sizes):
        # Sizes are capped at the position limits and items truncated: nothing to filter.
        return indices, []
