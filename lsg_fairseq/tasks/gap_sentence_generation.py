"""``gap_sentence_generation``: PEGASUS/LOCOST gap-sentence pretraining on unlabeled documents.

Examples are built on the fly (:mod:`lsg_fairseq.data.gsg_dataset`) from a corpus that
``scripts/gsg_preprocess.py`` writes once (``<data>/<split>.gsg.*.npy`` + ``dict.txt``). The task
subclasses ``long_document_summarization``, so dictionaries (``<mask>`` added), ``<s>``
prepending, right padding, generation and ``--eval-rouge`` are the same, and a GSG-pretrained
checkpoint fine-tunes with ``--task long_document_summarization`` on the same ``dict.txt``.

Example ``i`` of epoch ``e`` depends only on ``(--seed, e, i)``; validation and test always use
epoch 1, so their loss is comparable across epochs. Truncated sources/targets are counted per
epoch and logged as ``gsg_src_trunc`` / ``gsg_tgt_trunc``.
"""

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Optional

from fairseq import metrics, utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from omegaconf import II

from lsg_fairseq.data.binarized import check_token_ids
from lsg_fairseq.data.gsg_dataset import GapSentenceDataset, GSGCorpus, corpus_prefix, require_corpus_split
from lsg_fairseq.tasks.long_document_summarization import LongDocumentSummarizationConfig, LongDocumentSummarizationTask
from lsg_text import gsg
from lsg_text.errors import ConfigError

logger = logging.getLogger(__name__)

GSG_SELECTION_CHOICES = ChoiceEnum(list(gsg.SELECTION_STRATEGIES))


@dataclass
class GapSentenceGenerationConfig(LongDocumentSummarizationConfig):
    gsg_ratio: float = field(
        default=0.2,
        metadata={
            "help": "gap-sentence ratio: m = min(max(floor(n * ratio), 1), n) of a document's n "
            "sentences are selected (LOCOST 0.2, PEGASUS base 0.3)"
        },
    )
    gsg_ratio_max: Optional[float] = field(
        default=None,
        metadata={
            "help": "if set, the ratio is drawn per document from U(--gsg-ratio, --gsg-ratio-max) "
            "(PEGASUS Large: 0.15..0.45)"
        },
    )
    gsg_selection: GSG_SELECTION_CHOICES = field(
        default="ind_orig",
        metadata={
            "help": "ind_orig: top ROUGE-1 F1 of each sentence vs the rest (PEGASUS/LOCOST default); "
            "seq: greedy ROUGE-1 of the selected set vs the rest; random; lead"
        },
    )
    gsg_score_noise: float = field(
        default=0.0,
        metadata={
            "help": "ind_orig scores become score * (1 + sigma * N(0,1)) (PEGASUS dynamic_rouge; Large used 0.2)"
        },
    )
    gsg_mask_prob: float = field(
        default=1.0, metadata={"help": "probability that a gap sentence is replaced by one mask token"}
    )
    gsg_remove_prob: float = field(
        default=0.0,
        metadata={"help": "probability that a gap sentence is removed from the source (LOCOST's pseudo-source: 1.0)"},
    )
    gsg_keep_prob: float = field(
        default=0.0, metadata={"help": "probability that a gap sentence is left in the source intact"}
    )
    gsg_random_prob: float = field(
        default=0.0,
        metadata={
            "help": "probability that a gap sentence is replaced by another sentence of the "
            "document; the four --gsg-*-prob must sum to 1"
        },
    )
    gsg_mask_symbol: str = field(
        default="<mask>",
        metadata={"help": "dictionary symbol of the mask-sentence token (e.g. <extra_id_0> for a T5 vocabulary)"},
    )
    seed: int = II("common.seed")


def validate_gsg_config(cfg) -> None:
    """Every GSG flag checked once, with a message naming the flag."""
    if not 0.0 < cfg.gsg_ratio <= 1.0:
        raise ConfigError(f"--gsg-ratio must be in (0, 1], got {cfg.gsg_ratio}")
    if cfg.gsg_ratio_max is not None and not cfg.gsg_ratio <= cfg.gsg_ratio_max <= 1.0:
        raise ConfigError(
            f"--gsg-ratio-max must be in [--gsg-ratio, 1] = [{cfg.gsg_ratio}, 1], got {cfg.gsg_ratio_max}"
        )
    if not 0 <= cfg.gsg_score_noise < math.inf:  # NaN fails every comparison; inf makes every score inf or NaN
        raise ConfigError(f"--gsg-score-noise must be a finite number >= 0, got {cfg.gsg_score_noise}")
    if cfg.gsg_score_noise > 0 and str(cfg.gsg_selection) != "ind_orig":
        raise ConfigError(f"--gsg-score-noise applies to --gsg-selection ind_orig only, not {cfg.gsg_selection}")
    probs = (cfg.gsg_mask_prob, cfg.gsg_remove_prob, cfg.gsg_keep_prob, cfg.gsg_random_prob)
    try:
        gsg.validate_mask_probs(probs)
    except ValueError as e:
        raise ConfigError(f"--gsg-mask-prob/--gsg-remove-prob/--gsg-keep-prob/--gsg-random-prob: {e}") from None


@register_task("gap_sentence_generation", dataclass=GapSentenceGenerationConfig)
class GapSentenceGenerationTask(LongDocumentSummarizationTask):
    cfg: GapSentenceGenerationConfig
    truncates_targets = True  # its gap-sentence targets are cut to --max-target-positions, counted

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        validate_gsg_config(cfg)
        # Targets are copied from source tokens, so both sides must share one vocabulary.
        if src_dict.symbols != tgt_dict.symbols:
            raise ConfigError(
                "gap_sentence_generation needs one dictionary for source and target "
                f"({len(src_dict)} vs {len(tgt_dict)} symbols): give the data dir a single dict.txt"
            )
        if cfg.gsg_mask_symbol not in src_dict.indices:
            raise ConfigError(
                f"--gsg-mask-symbol {cfg.gsg_mask_symbol!r} is not in the dictionary; use a symbol of "
                "dict.txt or the default <mask> (added by the task)"
            )
        self.mask_index = src_dict.index(cfg.gsg_mask_symbol)
        specials = (src_dict.bos(), src_dict.pad(), src_dict.eos(), src_dict.unk())
        if self.mask_index in specials:  # <pad> is skipped by the encoder, </s> ends the source: not a mask
            raise ConfigError(
                f"--gsg-mask-symbol {cfg.gsg_mask_symbol}: one of the dictionary's special symbols (<s>, <pad>, "
                "</s>, <unk>), which the model reads as such; use <mask> (added by the task) or another symbol"
            )

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        data_path = paths[(epoch - 1) % len(paths)] if split == self.cfg.train_subset else paths[0]
        train = split == self.cfg.train_subset
        require_corpus_split(data_path, split, train)
        prefix = corpus_prefix(data_path, split)
        corpus = GSGCorpus(prefix)
        check_token_ids(corpus.tokens, len(self.src_dict), f"{prefix}.tokens.npy", os.path.join(data_path, "dict.txt"))
        dataset = GapSentenceDataset(
            corpus,
            self.src_dict,
            mask_token=self.mask_index,
            ratio=self.cfg.gsg_ratio,
            ratio_max=self.cfg.gsg_ratio_max,
            strategy=str(self.cfg.gsg_selection),
            score_noise=self.cfg.gsg_score_noise,
            mask_probs=(
                self.cfg.gsg_mask_prob,
                self.cfg.gsg_remove_prob,
                self.cfg.gsg_keep_prob,
                self.cfg.gsg_random_prob,
            ),
            seed=self.cfg.seed,
            max_source_positions=self.cfg.max_source_positions,
            max_target_positions=self.cfg.max_target_positions,
            prepend_bos=self.prepend_bos,
            shuffle=split != "test",
            fixed_epoch=None if train else 1,
            pad_to_multiple=self.cfg.required_seq_len_multiple,
        )
        bos = 1 if self.prepend_bos else 0
        long_docs = int((corpus.doc_tokens + bos + 1 > self.cfg.max_source_positions).sum())
        logger.info(
            f"[{split}] {len(dataset)} GSG documents, {int(corpus.doc_tokens.sum())} tokens; {long_docs} "
            f"longer than --max-source-positions {self.cfg.max_source_positions} before masking "
            "(truncated sources/targets are counted per epoch as gsg_src_trunc / gsg_tgt_trunc)"
        )
        self.datasets[split] = dataset

    # The collated batch carries its truncation counts; pass them to the logging outputs so they
    # are summed across batches and workers like the loss.
    @staticmethod
    def _add_truncation(sample, logging_output):
        logging_output["gsg_src_trunc"] = int(sample.get("gsg_source_truncated", 0))
        logging_output["gsg_tgt_trunc"] = int(sample.get("gsg_target_truncated", 0))
        return logging_output

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        loss, sample_size, logging_output = super().train_step(
            sample, model, criterion, optimizer, update_num, ignore_grad
        )
        return loss, sample_size, self._add_truncation(sample, logging_output)

    def valid_step(self, sample, model, criterion):
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        return loss, sample_size, self._add_truncation(sample, logging_output)

    def log_metrics(self, logging_outputs, criterion):
        super().log_metrics(logging_outputs, criterion)
        for key in ("gsg_src_trunc", "gsg_tgt_trunc"):
            total = sum(int(log.get(key, 0)) for log in logging_outputs)
            metrics.log_scalar_sum(key, total, round=0)
