"""``long_document_summarization``: fine-tuning seq2seq models on long documents, ROUGE in validation.

A :class:`~fairseq.tasks.translation.TranslationTask` with the conventions long inputs need:

* source padded on the **right** (block-sparse encoders align blocks from position 0; left padding
  shifts them, fairseq_notes §3.5) and ``<s>`` prepended to source and target, as BART/HF do, so that
  converted HF checkpoints see the ids they were trained on; generation starts like BART's hub
  (``</s> <s>`` then tokens) and ``<s>`` is stripped from the output;
* over-long sources are **truncated** (eos kept) to ``--max-source-positions``, never skipped, and
  the number of truncated examples per split is logged; targets likewise with ``--truncate-target``,
  else an over-long target is refused up front in every split (fairseq would skip training examples
  silently); so is an example larger than ``--max-tokens``; an empty source (or target) line is
  refused with its index (the split's loading: :mod:`lsg_fairseq.data.summarization_pairs`);
  sources typed at generation time (``fairseq-interactive``, the hub, ``lsg-fairseq-summarize``)
  are made the same way, ``<s>``, truncation and right padding included;
* ``--eval-rouge``: ROUGE-1/2/L/Lsum F1 (rouge-score, stemmed) of generated summaries, logged as
  ``rouge1 rouge2 rougeL rougeLsum`` so that ``--best-checkpoint-metric rougeL
  --maximize-best-checkpoint-metric`` works (:mod:`lsg_fairseq.tasks.eval_rouge`);
* generation through :class:`~lsg_fairseq.generation.LongInputSequenceGenerator`: the model is
  left exactly as before generation (fairseq#3893) and ``--no-repeat-ngram-size`` works on CPU
  (fairseq#5206);
* a ``--restore-file`` that does not exist is refused, and a checkpoint that does not fit the
  model is explained (:mod:`lsg_fairseq.checkpoint_policy`);
* fairseq's own numeric flags out of range (``--update-freq 0``, ``--lr -1``, ``--nbest 0``, ...)
  are refused before any work (:mod:`lsg_fairseq.tasks.run_settings`);
* precision flags the device cannot run are refused before any work, ``--fp16`` keeps
  ``grouped_adam``'s parameter groups, running out of device memory in a step is one line
  naming the batch and the flags that shrink it, and so is a training that diverged
  (:mod:`lsg_fairseq.device_policy`).
"""

import contextlib
import logging
import os
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from fairseq import utils
from fairseq.data import Dictionary
from fairseq.logging import metrics
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import OmegaConf, open_dict

from lsg_fairseq import checkpoint_policy, device_policy
from lsg_fairseq.data.summarization_pairs import inference_sources, load_summarization_pair
from lsg_fairseq.generation import LongInputSequenceGenerator
from lsg_fairseq.tasks.hydra_config import check_hydra_keys, in_hydra_terms, refusals_in_config_keys, under_hydra
from lsg_fairseq.tasks.run_settings import (
    check_generate_args,
    check_generation_args,
    check_launch,
    check_metric_logged,
    check_stop_min_lr,
    check_training_args,
    check_updates_per_epoch,
    check_validate_args,
    explain_missing_metric,
    explain_output_folder_error,
    watched_metric,
)
from lsg_fairseq.tasks.eval_rouge import (
    DEFAULT_EVAL_ROUGE_ARGS,
    EVAL_ROUGE_BPE_CHOICES,
    build_eval_bpe,
    log_rouge,
    parse_eval_rouge_args,
    rouge_sums,
)
from lsg_text.argtypes import POSITIVE_INT
from lsg_text.errors import ConfigError, MissingFileError
from lsg_text.fileio import check_fairseq_dict
from lsg_text.offline_bpe import GPT2_FILES, SENTENCEPIECE_MODEL
from lsg_text.rouge import ROUGE_KEYS

logger = logging.getLogger(__name__)

# The plugin's default task: what the converter builds models with and lsg-fairseq-generate adds.
TASK_NAME = "long_document_summarization"


@dataclass
class LongDocumentSummarizationConfig(TranslationConfig):
    source_lang: Optional[str] = field(
        default="source", metadata={"help": "source suffix of the binarized files", "argparse_alias": "-s"}
    )
    target_lang: Optional[str] = field(
        default="target", metadata={"help": "target suffix of the binarized files", "argparse_alias": "-t"}
    )
    left_pad_source: bool = field(
        default=False,
        metadata={"help": "pad the source on the left; keep False: block-sparse attention needs right padding"},
    )
    # Named negatively on purpose: fairseq turns a bool field that defaults to True into a
    # store_false flag, so a positive `--prepend-bos` would switch <s> *off*.
    no_prepend_bos: bool = field(
        default=False,
        metadata={
            "help": "T5-style inputs: no <s> before source and target and no <s> generation prefix "
            "(default: the model's own convention, <s> for BART/LSG/LED, none for LOCOST)"
        },
    )
    truncate_target: bool = field(
        default=False,
        metadata={"help": "truncate over-long targets to --max-target-positions (counted) instead of refusing the run"},
    )
    # fairseq's TranslationConfig defaults to -1, which np.tile cannot repeat: a data folder with a
    # second shard (train1 beside train, or valid1 with --combine-valid-subsets) failed to load with
    # "negative dimensions are not allowed" (fairseq#3644, which says 1 was meant)
    upsample_primary: int = field(
        default=1, metadata={"help": "how many times the first shard (train) is repeated beside train1, train2, ..."}
    )
    eval_rouge: bool = field(
        default=False, metadata={"help": "generate summaries during validation and log ROUGE-1/2/L/Lsum F1"}
    )
    eval_rouge_args: Optional[str] = field(
        default=DEFAULT_EVAL_ROUGE_ARGS,
        metadata={
            "help": "generation args for --eval-rouge as JSON (beam, lenpen, max_len_b, min_len, "
            "no_repeat_ngram_size, ...)"
        },
    )
    eval_rouge_bpe: EVAL_ROUGE_BPE_CHOICES = field(
        default="gpt2",
        metadata={"help": "how to detokenize before ROUGE: gpt2 (encoder.json/vocab.bpe), sentencepiece, or none"},
    )
    eval_rouge_gpt2_encoder_json: Optional[str] = field(
        default=None, metadata={"help": f"GPT-2 {GPT2_FILES[0]} for --eval-rouge (default: <data>/{GPT2_FILES[0]})"}
    )
    eval_rouge_gpt2_vocab_bpe: Optional[str] = field(
        default=None, metadata={"help": f"GPT-2 {GPT2_FILES[1]} for --eval-rouge (default: <data>/{GPT2_FILES[1]})"}
    )
    eval_rouge_sentencepiece_model: Optional[str] = field(
        default=None, metadata={"help": f"sentencepiece model for --eval-rouge (default: <data>/{SENTENCEPIECE_MODEL})"}
    )
    eval_rouge_print_samples: bool = field(
        default=False, metadata={"help": "log one generated summary and its reference per validation batch"}
    )


def check_position_room(cfg, least: int, room: str) -> None:
    """``--max-source-positions`` and ``--max-target-positions`` (the task's ``cfg``) at least
    ``least``, the message saying what ``room`` they need."""
    for flag, value in (
        ("--max-source-positions", cfg.max_source_positions),
        ("--max-target-positions", cfg.max_target_positions),
    ):
        if value is not None and value < least:
            raise ConfigError(f"{flag} must be >= {least} {room}, got {value}")


def data_argument() -> str:
    """What the data folder is called where it is given: fairseq's commands take it as their first
    argument (no flag), fairseq-hydra-train as a config key."""
    return "task.data" if under_hydra() else "DATA, the command's first argument"


@register_task(TASK_NAME, dataclass=LongDocumentSummarizationConfig)
class LongDocumentSummarizationTask(TranslationTask):
    cfg: LongDocumentSummarizationConfig
    truncates_targets = False  # whatever --truncate-target says (a subclass that always cuts them: True)

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.bpe = None
        self.sequence_generator = None
        self.eval_rouge_gen_args = None
        self.truncation_counts = {}
        self._model_prepend_bos = True  # until a model is built: BART's convention
        self._source_table = True  # the same: a source position table (LOCOST's encoder has none)

    @property
    def prepend_bos(self) -> bool:
        """Whether ``<s>`` starts source and target and prefixes generation: the convention the model
        declares (``model.prepend_bos``: BART/HF yes, LOCOST/T5 no), unless ``--no-prepend-bos``.
        fairseq builds the model before it loads datasets (train, generate, validate, hub)."""
        return self._model_prepend_bos and not self.cfg.no_prepend_bos

    # ---------------------------------------------------------------- dictionaries
    @classmethod
    def load_dictionary(cls, filename):
        """Load ``filename``, falling back to ``dict.txt`` beside it; always has ``<mask>``.

        Every plugin task adds ``<mask>`` so the embedding rows equal the HF vocabulary size and
        BART's ``upgrade_state_dict_named`` never drops a row (fairseq_notes §3.4).
        """
        if not os.path.exists(filename):
            joint = os.path.join(os.path.dirname(filename), "dict.txt")
            if os.path.exists(joint):
                filename = joint
            else:
                folder = os.path.dirname(filename)
                langs = sorted(n[5:-4] for n in os.listdir(folder) if n.startswith("dict.") and n.endswith(".txt"))
                if len(langs) == 2:  # data binarized with other suffixes (fairseq-preprocess -s src -t tgt)
                    raise MissingFileError(
                        f"no dictionary: neither {filename} nor {joint} exists, but {folder} holds "
                        f"dict.{langs[0]}.txt and dict.{langs[1]}.txt: pass --source-lang and --target-lang "
                        "(e.g. --source-lang src --target-lang tgt, the suffixes given to fairseq-preprocess)"
                    )
                raise MissingFileError(
                    f"no dictionary: neither {filename} nor {joint} exists (run scripts/preprocess.sh "
                    f"or give as {data_argument()} a converted model folder)"
                )
        check_fairseq_dict(filename, "dictionary")  # a damaged line named, not fairseq's traceback
        dictionary = Dictionary.load(filename)
        dictionary.add_symbol("<mask>")
        return dictionary

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        paths = utils.split_paths(cfg.data) if cfg.data else []
        if not paths or not os.path.isdir(paths[0]):
            what = "is a file, not a data folder" if paths and os.path.exists(paths[0]) else "does not exist"
            raise MissingFileError(f"data directory {cfg.data!r} {what} ({data_argument()})")
        parse_eval_rouge_args(cfg.eval_rouge_args)  # refuse a bad option dictionary before any work
        check_position_room(cfg, 2, "(room for </s> and one token)")
        if cfg.upsample_primary == -1:  # fairseq's default, saved in the checkpoints of earlier runs: 1 meant
            with open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.nullcontext():
                cfg.upsample_primary = 1
        problem = POSITIVE_INT.problem(cfg.upsample_primary)  # below 1: np.tile's error, or no first shard
        if problem:
            raise ConfigError(f"--upsample-primary {cfg.upsample_primary}: {problem}")
        return super().setup_task(cfg, **kwargs)

    # ---------------------------------------------------------------- datasets
    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        if split != self.cfg.train_subset:
            paths = paths[:1]
        data_path = paths[(epoch - 1) % len(paths)]
        pair, counts = load_summarization_pair(
            self.cfg, split, data_path, self.src_dict, self.tgt_dict, combine=combine, prepend_bos=self.prepend_bos
        )
        self.truncation_counts[split] = counts
        msg = ", ".join(f"{n} of {len(pair)} {side}s" for side, n in counts.items())
        logger.info(
            f"[{split}] truncated {msg} (max source positions {self.cfg.max_source_positions}, "
            f"max target positions {self.cfg.max_target_positions})"
        )
        self.datasets[split] = pair

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        pair, truncated = inference_sources(
            self.cfg, src_tokens, self.src_dict, self.tgt_dict, self.prepend_bos, constraints=constraints
        )
        if truncated:
            logger.warning(
                f"{truncated} of {len(src_tokens)} inputs truncated to --max-source-positions "
                f"{self.cfg.max_source_positions}"
            )
        return pair

    def get_batch_iterator(self, dataset, *args, **kwargs):
        # remembered for filter_indices_by_size's messages (fairseq folds it into max_positions)
        self._batch_max_tokens = args[0] if args else kwargs.get("max_tokens")
        # fairseq's batch_by_size drops the last (n mod multiple) examples when
        # --required-batch-size-multiple > 1 (the default is 8): test documents vanish from
        # generation and the same training documents are skipped every epoch. Long-document
        # batches hold a handful of examples anyway, so the rounding buys nothing here.
        multiple = kwargs.get("required_batch_size_multiple", 1)
        if multiple != 1:
            if not getattr(self, "_warned_batch_multiple", False):
                logger.warning(
                    f"--required-batch-size-multiple {multiple} ignored (using 1): fairseq's batching would "
                    "silently drop the remainder examples"
                )
                self._warned_batch_multiple = True
            kwargs["required_batch_size_multiple"] = 1
        batches = super().get_batch_iterator(dataset, *args, **kwargs)
        if kwargs.get("skip_remainder_batch"):  # fairseq-train's training split only
            epoch, freqs = kwargs.get("epoch", 1), self.update_freq or (1,)
            update_freq = freqs[epoch - 1] if epoch <= len(freqs) else freqs[-1]  # as fairseq-train's train()
            check_updates_per_epoch(len(batches), update_freq, True, self._split_path(dataset)[1])
        return batches

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        # fairseq skips examples above max_positions silently in training (and in valid/test with
        # --skip-invalid-size-inputs-valid-test), then dies with a bare "The dataset is empty" when
        # that was all of them. Nothing is skipped here: sources are always truncated, targets with
        # --truncate-target; anything still too long is refused with the flag to change.
        if max_positions is not None:
            self._refuse_over_long(indices, dataset, max_positions)
        return super().filter_indices_by_size(indices, dataset, max_positions, ignore_invalid_inputs)

    def _split_path(self, dataset):
        """(name, ``<data>/<name>``) of a loaded split, for messages; (None, "the dataset") for another."""
        split = next((k for k, v in self.datasets.items() if v is dataset), None)
        return split, f"{utils.split_paths(self.cfg.data)[0]}/{split}" if split else "the dataset"

    def _refuse_over_long(self, indices, dataset, max_positions):
        limits = max_positions if isinstance(max_positions, tuple) else (max_positions, max_positions)
        split, where = self._split_path(dataset)
        max_tokens = getattr(self, "_batch_max_tokens", None)
        tokens_flag = "--max-tokens-valid" if split in self.valid_subsets else "--max-tokens"
        for side, sizes, limit, task_max in (
            ("source", getattr(dataset, "src_sizes", None), limits[0], self.cfg.max_source_positions),
            ("target", getattr(dataset, "tgt_sizes", None), limits[1], self.cfg.max_target_positions),
        ):
            if sizes is None or limit is None:
                continue
            too_long = [int(i) for i in indices if sizes[i] > limit]
            if not too_long:
                continue
            longest = int(max(sizes[i] for i in too_long))
            # a lower --max-target-positions cuts targets only with --truncate-target (else refused below)
            truncated = side == "source" or self.cfg.truncate_target or self.truncates_targets
            with_truncation = "" if truncated else " with --truncate-target"
            head = (
                f"{where}: {len(too_long)} of {len(indices)} examples have a {side} longer than {limit} "
                f"tokens (first: example #{too_long[0]}, {int(sizes[too_long[0]])} tokens; longest {longest})"
            )
            if max_tokens is not None and limit == max_tokens and limit < task_max:
                raise ConfigError(
                    f"{head}: {tokens_flag} {max_tokens} is smaller than one example; raise "
                    f"{tokens_flag} to at least {longest}, or lower --max-{side}-positions{with_truncation}"
                )
            if side == "target" and limit >= task_max and not self.truncates_targets:
                raise ConfigError(
                    f"{head}: pass --truncate-target (truncates and counts them) or raise "
                    f"--max-target-positions {task_max}, up to the model's own (for generation, score against the "
                    "raw references, e.g. generate_to_rouge.py --ref-file)"
                )
            raise_limit = ""
            if side == "source" and not self._source_table:
                raise_limit = (
                    f", or raise the model's, which no position table holds: --model-overrides "
                    f"\"{{'max_source_positions': {task_max}}}\""
                )
            raise ConfigError(
                f"{head}: the model accepts at most {limit} {side} tokens; lower --max-{side}-positions to "
                f"{limit}{with_truncation}{raise_limit}"
            )
        if max_tokens is not None and len(indices):
            # fairseq-generate does not fold --max-tokens into the limits above (fairseq-train does);
            # its own error is batch_by_size's assert
            try:
                tokens = np.asarray(dataset.num_tokens_vec(indices))
            except NotImplementedError:  # a dataset without it: fairseq's own check stands
                return
            if tokens.max() > max_tokens:
                at = int((tokens > max_tokens).argmax())
                raise ConfigError(
                    f"{where}: example #{int(indices[at])} has {int(tokens[at])} tokens, more than {tokens_flag} "
                    f"{max_tokens} (largest {int(tokens.max())}): raise {tokens_flag} to at least {int(tokens.max())}"
                )

    # ---------------------------------------------------------------- generation
    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        check_generation_args(args)
        extra = dict(extra_gen_cls_kwargs or {})
        if self.prepend_bos:
            extra.setdefault("symbols_to_strip_from_output", {self.tgt_dict.bos()})
        if seq_gen_cls is None and getattr(args, "print_alignment", None):
            # fairseq would pick its alignment generator, which leaves the beam size set (fairseq#3893)
            raise ConfigError(
                "--print-alignment: not supported by this task (its generator keeps the "
                "model's beam state, fairseq's alignment generator does not)"
            )
        return super().build_generator(
            models, args, seq_gen_cls=seq_gen_cls or LongInputSequenceGenerator, extra_gen_cls_kwargs=extra, **kwargs
        )

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        target = sample.get("target")
        if (
            prefix_tokens is not None
            and self.prepend_bos
            and target is not None
            and prefix_tokens.equal(target[:, : prefix_tokens.size(1)])
        ):
            # fairseq-generate's --prefix-size N slices the reference, whose first token is <s> here:
            # N would count it (1 forced only <s>), where LOCOST's N forces N words
            prefix_tokens = target[:, : prefix_tokens.size(1) + 1]
        if prefix_tokens is None and self.prepend_bos:
            # like BART's hub: decoder input starts "</s> <s>", the HF decoder_start + forced bos
            src = sample["net_input"]["src_tokens"]
            prefix_tokens = src.new_full((src.size(0), 1), self.tgt_dict.bos())
        with device_policy.explain_out_of_memory(sample, "generation"):
            return super().inference_step(
                generator, models, sample, prefix_tokens=prefix_tokens, constraints=constraints
            )

    # ---------------------------------------------------------------- devices and precision
    # fairseq-train's --best-checkpoint-metric, set by vet_run and checked at the first training log
    # (reduce_metrics): fairseq looks for it only after the first validation
    metric_to_watch: Optional[str] = None
    # fairseq-train's validation splits, set by vet_run: they are batched by --max-tokens-valid
    valid_subsets: tuple = ()
    # fairseq-train's --update-freq (one per epoch, the last for the rest), set by vet_run
    update_freq: tuple = ()

    # vet_run: called by fairseq-train, -generate, -interactive and -validate before any work
    # (lsg_fairseq.fairseq_fixes.run_hooks)
    @classmethod
    def vet_run(cls, cfg, command):
        if command == "fairseq_cli.hydra_train":  # the config (hydra's, then again in fairseq-train's main)
            check_hydra_keys(cfg)
            with refusals_in_config_keys(cfg):
                check_launch(cfg)  # fairseq-hydra-train enters the profiler before fairseq-train's main
            return
        cls.metric_to_watch = None
        train = command == "fairseq_cli.train"
        cls.valid_subsets = tuple(cfg.dataset.valid_subset.split(",")) if train else ()
        cls.update_freq = tuple(cfg.optimization.update_freq) if train else ()
        with refusals_in_config_keys(cfg):
            if train:
                check_training_args(cfg)
            elif command in ("fairseq_cli.generate", "fairseq_cli.interactive"):
                check_generate_args(cfg, command)
            elif command == "fairseq_cli.validate":
                check_validate_args(cfg)
            device_policy.vet_run(cfg, command)
        cls.metric_to_watch = watched_metric(cfg, command)

    # explain_failure: called when fairseq-train, -validate or -interactive fails (run_hooks); a
    # refusal of ours raised during the run (None here) goes on as it is, in the config's keys under
    # fairseq-hydra-train
    @classmethod
    def explain_failure(cls, cfg, command, error):
        better = (
            device_policy.explain_divergence(cfg, command, error)
            or explain_missing_metric(cfg, command, error)
            or explain_output_folder_error(cfg, command, error)
        )
        in_hydra_terms(better or error, cfg)
        return better

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        with device_policy.explain_out_of_memory(sample, "training"):
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    # ---------------------------------------------------------------- restoring checkpoints
    # Called by fairseq-train's load_checkpoint (lsg_fairseq.fairseq_fixes.restore_hooks): these
    # policies hold for this task only, stock tasks keep fairseq's behaviour.
    def check_restore(self, cfg, trainer):
        checkpoint_policy.check_restore(cfg, trainer)
        checkpoint_policy.check_built_as_saved(cfg, trainer)
        if checkpoint_policy.starts_anew(cfg, trainer):
            with refusals_in_config_keys(trainer.cfg):
                check_stop_min_lr(trainer.cfg)

    def explain_restore_failure(self, cfg, trainer, error):
        checkpoint_policy.explain_restore_failure(cfg, trainer, error)

    # ---------------------------------------------------------------- ROUGE in validation
    def build_model(self, cfg, from_checkpoint=False):
        model = super(TranslationTask, self).build_model(cfg, from_checkpoint)
        self._model_prepend_bos = bool(getattr(model, "prepend_bos", True))  # before any dataset
        # LOCOST's encoder has no position table: its source limit is a setting, which a model override raises
        self._source_table = getattr(getattr(model, "encoder", None), "embed_positions", None) is not None
        if self.prepend_bos:  # else every example truncated to <s></s>
            name = type(model).__name__
            check_position_room(
                self.cfg, 3, f"with <s> before each sequence ({name}'s convention: room for <s>, </s> and one token)"
            )
        if self.cfg.eval_rouge:
            self.bpe = build_eval_bpe(self.cfg, self.tgt_dict)
            self.eval_rouge_gen_args = parse_eval_rouge_args(self.cfg.eval_rouge_args)
            self.sequence_generator = self.build_generator([model], Namespace(**self.eval_rouge_gen_args))
        return model

    def decode_tokens(self, tokens, escape_unk=False) -> str:
        """Token ids -> detokenized text (specials stripped), as ROUGE sees it."""
        text = self.tgt_dict.string(
            tokens.int().cpu(),
            unk_string=("UNKNOWNTOKENINREF" if escape_unk else "UNKNOWNTOKENINHYP"),
            extra_symbols_to_ignore={self.tgt_dict.bos()},
        )
        if self.bpe is not None:
            text = self.bpe.decode(text)
        return text.strip()

    def valid_step(self, sample, model, criterion):
        with device_policy.explain_out_of_memory(sample, "validation"):
            loss, sample_size, logging_output = super(TranslationTask, self).valid_step(sample, model, criterion)
        if self.cfg.eval_rouge:
            advice = device_policy.MEMORY_ADVICE["validation"] + ', or the "beam" of --eval-rouge-args'
            with device_policy.explain_out_of_memory(sample, "validation (ROUGE's generation)", advice):
                gen_out = self.inference_step(self.sequence_generator, [model], sample)
            pairs = [
                (
                    self.decode_tokens(hypos[0]["tokens"]),
                    self.decode_tokens(utils.strip_pad(sample["target"][i], self.tgt_dict.pad()), escape_unk=True),
                )
                for i, hypos in enumerate(gen_out)
            ]
            if pairs and self.cfg.eval_rouge_print_samples:
                logger.info(f"example hypothesis: {pairs[0][0]}")
                logger.info(f"example reference: {pairs[0][1]}")
            logging_output.update(rouge_sums(pairs))
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion):
        self.log_metrics(logging_outputs, criterion)
        metric, type(self).metric_to_watch = self.metric_to_watch, None  # the first log only
        if metric is not None:
            valid_only = list(ROUGE_KEYS) if self.cfg.eval_rouge else []  # --eval-bleu is refused (run_settings)
            check_metric_logged(metric, metrics.get_active_aggregators()[-1].keys(), valid_only)

    def log_metrics(self, logging_outputs, criterion):
        """What reduce_metrics logs (fairseq's, the criterion's, ROUGE in validation); a subclass
        adds its own here."""
        super().reduce_metrics(logging_outputs, criterion)
        if self.cfg.eval_rouge:
            log_rouge(logging_outputs)
