"""Checks on fairseq-binarized (mmap) split files before fairseq opens them.

fairseq's own failures here name no file: an empty split dies with ``ValueError: cannot mmap an
empty file``, a source/target pair with different example counts with ``AssertionError: Source
and target must contain the same number of examples``, and a split that is not there (``--valid-subset
valid`` by default) with a ``FileNotFoundError`` traceback "Dataset not found: valid (bin)". Reading
the folder and the 26-byte ``.idx`` header is enough to say which file is at fault, before anything
is memory-mapped.
"""

import os
import struct
from typing import Iterator, List, Optional

import numpy as np

from lsg_text.errors import MissingFileError
from lsg_text.fileio import DataError

# fairseq.data.indexed_dataset.MMapIndexedDataset.Index: magic, <Q version, <B dtype, <Q length
_MAGIC = b"MMIDIDX\x00\x00"


def mmap_example_count(idx_path: str) -> Optional[int]:
    """Number of examples in a fairseq mmap ``.idx`` file; None if it is not one."""
    with open(idx_path, "rb") as f:
        header = f.read(len(_MAGIC) + 8 + 1 + 8)
    if len(header) < len(_MAGIC) + 17 or not header.startswith(_MAGIC):
        return None
    (length,) = struct.unpack("<Q", header[len(_MAGIC) + 9 :])
    return length


def splits_in(data_path: str, marker: str) -> List[str]:
    """The splits of ``data_path``'s files named ``<split><marker>...`` (e.g. marker ``.source-target.``)."""
    names = os.listdir(data_path) if os.path.isdir(data_path) else []
    return sorted({name[: name.index(marker)] for name in names if marker in name and not name.startswith(marker)})


PAIR_MAKER = "scripts/preprocess.sh --trainpref"  # what binarizes a summarization split


def missing_split(
    data_path: str, split: str, expected: str, found: List[str], train: bool, maker: str = PAIR_MAKER
) -> MissingFileError:
    """The refusal of a split that is not in ``data_path``: the folder, the split, what is there,
    and the flags that choose another split or none (``maker``: the command that writes one)."""
    where = f"{data_path}: no {split!r} split ({expected} not found; splits there: {', '.join(found) or 'none'})"
    if train:
        return MissingFileError(
            f"{where}; binarize the training data into this folder ({maker}) or name another split with --train-subset"
        )
    return MissingFileError(
        f"{where}; binarize it, name an existing split (fairseq-train --valid-subset, "
        "fairseq-generate --gen-subset), or train without validation (--disable-validation)"
    )


def require_split(
    data_path: str, split: str, src: str, tgt: Optional[str], dataset_impl=None, train: bool = False
) -> None:
    """Refuse a split without binarized source files in ``data_path`` (either pair direction), as
    fairseq's ``load_langpair_dataset`` looks for them."""
    from fairseq.data import indexed_dataset

    pairs = (f"{src}-{tgt}", f"{tgt}-{src}")
    other_format = MissingFileError(
        f"{data_path}: the {split!r} split is not in the format --dataset-impl {dataset_impl} reads; drop "
        "--dataset-impl (fairseq then reads the format it finds)"
    )
    for pair in pairs:
        prefix = os.path.join(data_path, f"{split}.{pair}.{src}")
        if indexed_dataset.dataset_exists(prefix, impl=dataset_impl):
            # lazy/cached and mmap share the file names (.bin/.idx): fairseq's own error for the
            # other format is an assert on the index header
            written = indexed_dataset.infer_dataset_impl(prefix)
            reads = "cached" if dataset_impl in ("lazy", "cached") else dataset_impl
            if reads in ("cached", "mmap") and written in ("cached", "mmap") and written != reads:
                raise other_format
            return
    found = sorted(set(splits_in(data_path, f".{pairs[0]}.")) | set(splits_in(data_path, f".{pairs[1]}.")))
    if dataset_impl is not None and split in found:  # there, in a format --dataset-impl does not read
        raise other_format
    raise missing_split(data_path, split, f"{split}.{pairs[0]}.{src}.*", found, train)


def check_binarized_pair(data_path: str, split: str, src: str, tgt: Optional[str]) -> None:
    """Refuse an empty split or a source/target pair of different lengths, naming the files.

    Silently returns when the files are not fairseq mmap files of the usual names (fairseq then
    reports what it finds itself, e.g. "Dataset not found").
    """
    for pair in (f"{src}-{tgt}", f"{tgt}-{src}") if tgt else (f"{src}-None",):
        prefix = os.path.join(data_path, f"{split}.{pair}")
        sides = [src] + ([tgt] if tgt else [])
        counts = {}
        for lang in sides:
            idx = f"{prefix}.{lang}.idx"
            if not os.path.exists(idx):
                break
            n = mmap_example_count(idx)
            if n is None:
                return
            counts[lang] = n
        if len(counts) != len(sides):
            continue
        for lang, n in counts.items():
            if n == 0:
                raise DataError(
                    f"{prefix}.{lang}.idx: split {split!r} is empty (0 examples); binarize a non-empty "
                    f"file for it, or leave it out (e.g. --valid-subset / --disable-validation)"
                )
        if tgt and counts[src] != counts[tgt]:
            raise DataError(
                f"{prefix}.{src} has {counts[src]} examples but {prefix}.{tgt} has {counts[tgt]}: the "
                "two sides were binarized from files with different line counts (re-run "
                "scripts/preprocess.sh, which checks the raw files first)"
            )
        return


# tokens read from the start of each file: a dictionary of another binarization shows within a few
# documents (their ids cover its range), and a training set's gigabytes are not read at every start
ID_SCAN_TOKENS = 1 << 24


def check_token_ids(tokens, vocabulary_size: int, where: str, dictionary: str) -> None:
    """Refuse a token id at or past ``vocabulary_size`` among the first :data:`ID_SCAN_TOKENS` of
    ``tokens`` (an array, memory-mapped or not): data binarized with another, larger dictionary than
    ``dictionary``. The model's embedding would fail on it at the first batch that holds one
    (``IndexError: index out of range in self``), after the data and the model are loaded."""
    head = np.asarray(tokens[:ID_SCAN_TOKENS])
    largest = int(head.max()) if head.size else -1
    if largest >= vocabulary_size:
        raise DataError(
            f"{where} holds token id {largest}, but {dictionary} has {vocabulary_size} symbols (the task's "
            "included): the data was binarized with another dictionary; give the folder the dict it was made with"
        )


def mmap_token_files(dataset) -> Iterator:
    """(the tokens of one .bin file, its path) of each fairseq mmap dataset in ``dataset`` (itself,
    or the shards a ConcatDataset holds); other kinds of dataset hold none."""
    if hasattr(dataset, "_bin_buffer") and hasattr(dataset, "_index"):
        yield np.frombuffer(dataset._bin_buffer, dtype=dataset._index.dtype), f"{dataset._path}.bin"
    for part in getattr(dataset, "datasets", ()):
        yield from mmap_token_files(part)
