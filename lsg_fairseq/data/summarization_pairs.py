"""A split's binarized source/target pair as ``long_document_summarization`` feeds it to a model.

Its files are checked first (:mod:`~lsg_fairseq.data.binarized`: fairseq's own errors name no file),
empty lines are refused with their index, sources are truncated with eos kept (targets too with
``--truncate-target``; :mod:`~lsg_fairseq.data.truncation`) and counted, ``<s>`` is prepended when
the model's convention has it, and the source is padded as ``--left-pad-source`` says (right by
default: block-sparse attention aligns blocks from position 0).
"""

import os
from typing import Dict, Tuple

import torch

from fairseq.data import Dictionary, LanguagePairDataset, PrependTokenDataset
from fairseq.tasks.translation import load_langpair_dataset

from lsg_fairseq.data.binarized import check_binarized_pair, check_token_ids, mmap_token_files, require_split
from lsg_fairseq.data.truncation import TruncateKeepEosDataset, empty_indices, truncate_keep_eos
from lsg_text.fileio import DataError


def load_summarization_pair(
    cfg, split: str, data_path: str, src_dict: Dictionary, tgt_dict: Dictionary, combine: bool, prepend_bos: bool
) -> Tuple[LanguagePairDataset, Dict[str, int]]:
    """``split`` of ``data_path`` under the task's ``cfg`` -> (the dataset, {side: examples truncated});
    the target side is counted only with ``--truncate-target``."""
    src, tgt = cfg.source_lang, cfg.target_lang
    # fairseq's own errors for these are tracebacks that name no file ("Dataset not found: valid",
    # "cannot mmap an empty file", an assert)
    require_split(data_path, split, src, tgt, cfg.dataset_impl, train=split == cfg.train_subset)
    check_binarized_pair(data_path, split, src, tgt)
    pair = load_langpair_dataset(
        data_path,
        split,
        src,
        src_dict,
        tgt,
        tgt_dict,
        combine=combine,
        dataset_impl=cfg.dataset_impl,
        upsample_primary=cfg.upsample_primary,
        left_pad_source=cfg.left_pad_source,
        left_pad_target=cfg.left_pad_target,
        max_source_positions=cfg.max_source_positions,
        max_target_positions=cfg.max_target_positions,
    )
    where = os.path.join(data_path, f"{split}.{src}-{tgt}")
    refuse_empty(pair.src.sizes, f"{where}.{src}", "source")
    if pair.tgt is not None:
        refuse_empty(pair.tgt.sizes, f"{where}.{tgt}", "target")
    for side, lang, dictionary in ((pair.src, src, src_dict), (pair.tgt, tgt, tgt_dict)):
        for tokens, path in mmap_token_files(side):
            check_token_ids(tokens, len(dictionary), path, os.path.join(data_path, f"dict.{lang}.txt"))

    bos = 1 if prepend_bos else 0
    src_ds = TruncateKeepEosDataset(pair.src, cfg.max_source_positions - bos, src_dict.eos())
    counts = {"source": src_ds.num_truncated}
    tgt_ds = pair.tgt
    if tgt_ds is not None and cfg.truncate_target:
        tgt_ds = TruncateKeepEosDataset(tgt_ds, cfg.max_target_positions - bos, tgt_dict.eos())
        counts["target"] = tgt_ds.num_truncated
    if prepend_bos:
        src_ds = PrependTokenDataset(src_ds, src_dict.bos())
        if tgt_ds is not None:
            tgt_ds = PrependTokenDataset(tgt_ds, tgt_dict.bos())
    pair = LanguagePairDataset(
        src_ds,
        src_ds.sizes,
        src_dict,
        tgt_ds,
        tgt_ds.sizes if tgt_ds is not None else None,
        tgt_dict,
        left_pad_source=cfg.left_pad_source,
        left_pad_target=cfg.left_pad_target,
        num_buckets=cfg.num_batch_buckets,
        shuffle=(split != "test"),
        pad_to_multiple=cfg.required_seq_len_multiple,
    )
    return pair, counts


def inference_sources(cfg, src_tokens, src_dict: Dictionary, tgt_dict: Dictionary, prepend_bos: bool, constraints=None):
    """Sources encoded at generation time (``fairseq-interactive``, the hub, ``lsg-fairseq-summarize``)
    -> the dataset a split's sources would give: cut to ``--max-source-positions`` with eos kept,
    ``<s>`` first when the model's convention has it (kept, not doubled, where the encoder already
    put it: BART's hub does), padded as ``--left-pad-source`` says. TranslationTask's own passes them
    as they are: no ``<s>`` for a model trained with it, a long line refused instead of truncated,
    and left padding, which shifts every block of a block-sparse encoder for the shorter documents
    of a batch. Returns (the dataset, how many sources were truncated)."""
    bos, room = src_dict.bos(), cfg.max_source_positions - int(prepend_bos)
    sources, truncated = [], 0
    for tokens in src_tokens:
        if prepend_bos and tokens.numel() and tokens[0] == bos:
            tokens = tokens[1:]
        truncated += tokens.numel() > room
        tokens = truncate_keep_eos(tokens, room, src_dict.eos())
        sources.append(torch.cat([tokens.new_tensor([bos]), tokens]) if prepend_bos else tokens)
    pair = LanguagePairDataset(
        sources,
        torch.tensor([t.numel() for t in sources]),
        src_dict,
        tgt_dict=tgt_dict,
        left_pad_source=cfg.left_pad_source,
        constraints=constraints,
    )
    return pair, truncated


def refuse_empty(sizes, path: str, side: str) -> None:
    """Refuse a split holding an empty line (``sizes``: its examples' token counts), naming its indices."""
    bad = empty_indices(sizes)
    if bad:
        shown = ", ".join(str(i) for i in bad[:10]) + (" ..." if len(bad) > 10 else "")
        raise DataError(
            f"{path}: {len(bad)} empty {side} line(s) at example index {shown} (0-based line numbers "
            "of the text given to fairseq-preprocess); remove or fill them"
        )
