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
  refused with its index;
* ``--eval-rouge``: ROUGE-1/2/L/Lsum F1 (rouge-score, stemmed) of generated summaries, logged as
  ``rouge1 rouge2 rougeL rougeLsum`` so that ``--best-checkpoint-metric rougeL
  --maximize-best-checkpoint-metric`` works;
* generation through :class:`~lsg_fairseq.generation.LongInputSequenceGenerator`: the model is
  left exactly as before generation (fairseq#3893) and ``--no-repeat-ngram-size`` works on CPU
  (fairseq#5206);
* a ``--restore-file`` that does not exist is refused, and a checkpoint that does not fit the
  model is explained (:mod:`lsg_fairseq.checkpoint_policy`);
* precision flags the device cannot run are refused before any work, ``--fp16`` keeps
  ``grouped_adam``'s parameter groups, and running out of device memory in a step is one line
  naming the batch and the flags that shrink it (:mod:`lsg_fairseq.device_policy`).
"""

import json
import logging
import os
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Optional

from fairseq import metrics, utils
from fairseq.data import Dictionary, LanguagePairDataset, PrependTokenDataset, encoders
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask, load_langpair_dataset

from lsg_fairseq import checkpoint_policy, device_policy
from lsg_fairseq.data.binarized import check_binarized_pair, require_split
from lsg_fairseq.data.truncation import TruncateKeepEosDataset, empty_indices
from lsg_fairseq.generation import LongInputSequenceGenerator
from lsg_text.argtypes import GENERATION_SETTINGS
from lsg_text.errors import ConfigError, MissingFileError
from lsg_text.fileio import DataError
from lsg_text.offline_bpe import GPT2_FILES, SENTENCEPIECE_MODEL, check_sentencepiece_dictionary
from lsg_text.rouge import ROUGE_KEYS, rouge_example

logger = logging.getLogger(__name__)

# The plugin's default task: what the converter builds models with and lsg-fairseq-generate adds.
TASK_NAME = "long_document_summarization"
EVAL_ROUGE_BPE_CHOICES = ChoiceEnum(["gpt2", "sentencepiece", "none"])
DEFAULT_EVAL_ROUGE_ARGS = '{"beam": 4, "lenpen": 1.0, "max_len_b": 256, "min_len": 0, "no_repeat_ngram_size": 3}'


def parse_eval_rouge_args(text: str) -> dict:
    """``--eval-rouge-args`` JSON -> dict; unknown keys and bad values are refused, flag named."""
    flag = "--eval-rouge-args"
    try:
        args = json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{flag}: not valid JSON ({getattr(e, 'msg', e)}); e.g. {DEFAULT_EVAL_ROUGE_ARGS}") from None
    if not isinstance(args, dict):
        raise ConfigError(f"{flag}: expected a JSON object, got {type(args).__name__}; e.g. {DEFAULT_EVAL_ROUGE_ARGS}")
    unknown = sorted(set(args) - set(GENERATION_SETTINGS))
    if unknown:
        raise ConfigError(
            f"{flag}: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(GENERATION_SETTINGS)}"
        )
    for key, value in args.items():
        problem = GENERATION_SETTINGS[key].problem(value)
        if problem:
            raise ConfigError(f"{flag}: {key} {problem}, got {json.dumps(value)}")
    if args.get("max_len_a", 0) == 0 and args.get("min_len", 0) > args.get("max_len_b", 200):
        raise ConfigError(f"{flag}: min_len {args['min_len']} is above max_len_b {args.get('max_len_b', 200)}")
    return args


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
        metadata={"help": "truncate over-long targets to --max-target-positions (counted) instead of skipping them"},
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


@register_task(TASK_NAME, dataclass=LongDocumentSummarizationConfig)
class LongDocumentSummarizationTask(TranslationTask):
    cfg: LongDocumentSummarizationConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.bpe = None
        self.sequence_generator = None
        self.eval_rouge_gen_args = None
        self.truncation_counts = {}
        self._model_prepend_bos = True  # until a model is built: BART's convention

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
                raise MissingFileError(
                    f"no dictionary: neither {filename} nor {joint} exists (run scripts/preprocess.sh "
                    "or point --data at a converted model folder)"
                )
        dictionary = Dictionary.load(filename)
        dictionary.add_symbol("<mask>")
        return dictionary

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        paths = utils.split_paths(cfg.data) if cfg.data else []
        if not paths or not os.path.isdir(paths[0]):
            raise MissingFileError(f"--data: data directory {cfg.data!r} does not exist")
        parse_eval_rouge_args(cfg.eval_rouge_args)  # refuse a bad option dictionary before any work
        for flag, value in (
            ("--max-source-positions", cfg.max_source_positions),
            ("--max-target-positions", cfg.max_target_positions),
        ):
            if value is not None and value < 2:
                raise ConfigError(f"{flag} must be >= 2 (room for <s>/</s> and one token), got {value}")
        return super().setup_task(cfg, **kwargs)

    # ---------------------------------------------------------------- datasets
    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        if split != self.cfg.train_subset:
            paths = paths[:1]
        data_path = paths[(epoch - 1) % len(paths)]
        src, tgt = self.cfg.source_lang, self.cfg.target_lang
        # fairseq's own errors for these are tracebacks that name no file ("Dataset not found: valid",
        # "cannot mmap an empty file", an assert)
        require_split(data_path, split, src, tgt, self.cfg.dataset_impl, train=split == self.cfg.train_subset)
        check_binarized_pair(data_path, split, src, tgt)
        pair = load_langpair_dataset(
            data_path,
            split,
            src,
            self.src_dict,
            tgt,
            self.tgt_dict,
            combine=combine,
            dataset_impl=self.cfg.dataset_impl,
            upsample_primary=self.cfg.upsample_primary,
            left_pad_source=self.cfg.left_pad_source,
            left_pad_target=self.cfg.left_pad_target,
            max_source_positions=self.cfg.max_source_positions,
            max_target_positions=self.cfg.max_target_positions,
        )
        where = os.path.join(data_path, f"{split}.{src}-{tgt}")
        self._refuse_empty(pair.src.sizes, f"{where}.{src}", "source")
        if pair.tgt is not None:
            self._refuse_empty(pair.tgt.sizes, f"{where}.{tgt}", "target")

        bos = 1 if self.prepend_bos else 0
        src_ds = TruncateKeepEosDataset(pair.src, self.cfg.max_source_positions - bos, self.src_dict.eos())
        counts = {"source": src_ds.num_truncated}
        tgt_ds = pair.tgt
        if tgt_ds is not None and self.cfg.truncate_target:
            tgt_ds = TruncateKeepEosDataset(tgt_ds, self.cfg.max_target_positions - bos, self.tgt_dict.eos())
            counts["target"] = tgt_ds.num_truncated
        if self.prepend_bos:
            src_ds = PrependTokenDataset(src_ds, self.src_dict.bos())
            if tgt_ds is not None:
                tgt_ds = PrependTokenDataset(tgt_ds, self.tgt_dict.bos())
        pair = LanguagePairDataset(
            src_ds,
            src_ds.sizes,
            self.src_dict,
            tgt_ds,
            tgt_ds.sizes if tgt_ds is not None else None,
            self.tgt_dict,
            left_pad_source=self.cfg.left_pad_source,
            left_pad_target=self.cfg.left_pad_target,
            num_buckets=self.cfg.num_batch_buckets,
            shuffle=(split != "test"),
            pad_to_multiple=self.cfg.required_seq_len_multiple,
        )
        self.truncation_counts[split] = counts
        msg = ", ".join(f"{n} of {len(pair)} {side}s" for side, n in counts.items())
        logger.info(
            f"[{split}] truncated {msg} (max source positions {self.cfg.max_source_positions}, "
            f"max target positions {self.cfg.max_target_positions})"
        )
        self.datasets[split] = pair

    @staticmethod
    def _refuse_empty(sizes, path, side):
        bad = empty_indices(sizes)
        if bad:
            shown = ", ".join(str(i) for i in bad[:10]) + (" ..." if len(bad) > 10 else "")
            raise DataError(
                f"{path}: {len(bad)} empty {side} line(s) at example index {shown} (0-based line numbers "
                "of the text given to fairseq-preprocess); remove or fill them"
            )

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
        return super().get_batch_iterator(dataset, *args, **kwargs)

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        # fairseq skips examples above max_positions silently in training (and in valid/test with
        # --skip-invalid-size-inputs-valid-test), then dies with a bare "The dataset is empty" when
        # that was all of them. Nothing is skipped here: sources are always truncated, targets with
        # --truncate-target; anything still too long is refused with the flag to change.
        if max_positions is not None:
            self._refuse_over_long(indices, dataset, max_positions)
        return super().filter_indices_by_size(indices, dataset, max_positions, ignore_invalid_inputs)

    def _refuse_over_long(self, indices, dataset, max_positions):
        limits = max_positions if isinstance(max_positions, tuple) else (max_positions, max_positions)
        split = next((k for k, v in self.datasets.items() if v is dataset), None)
        where = f"{utils.split_paths(self.cfg.data)[0]}/{split}" if split else "the dataset"
        max_tokens = getattr(self, "_batch_max_tokens", None)
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
            head = (
                f"{where}: {len(too_long)} of {len(indices)} examples have a {side} longer than {limit} "
                f"tokens (first: example #{too_long[0]}, {int(sizes[too_long[0]])} tokens; longest {longest})"
            )
            if max_tokens is not None and limit == max_tokens and limit < task_max:
                raise ConfigError(
                    f"{head}: --max-tokens {max_tokens} is smaller than one example; raise "
                    f"--max-tokens to at least {longest}, or lower --max-{side}-positions"
                )
            if side == "target" and limit >= task_max:
                raise ConfigError(
                    f"{head}: pass --truncate-target (truncates and counts them) or raise "
                    f"--max-target-positions {task_max} (for generation, score against the raw references, "
                    "e.g. generate_to_rouge.py --ref-file)"
                )
            raise ConfigError(
                f"{head}: the model accepts at most {limit} {side} tokens; lower --max-{side}-positions to {limit}"
            )

    # ---------------------------------------------------------------- generation
    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
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
        if prefix_tokens is None and self.prepend_bos:
            # like BART's hub: decoder input starts "</s> <s>", the HF decoder_start + forced bos
            src = sample["net_input"]["src_tokens"]
            prefix_tokens = src.new_full((src.size(0), 1), self.tgt_dict.bos())
        with device_policy.explain_out_of_memory(sample, "generation"):
            return super().inference_step(
                generator, models, sample, prefix_tokens=prefix_tokens, constraints=constraints
            )

    # ---------------------------------------------------------------- devices and precision
    # vet_run: called by fairseq-train before any work (lsg_fairseq.fairseq_fixes.run_hooks)
    @classmethod
    def vet_run(cls, cfg, command):
        device_policy.vet_run(cfg, command)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        with device_policy.explain_out_of_memory(sample, "training"):
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    # ---------------------------------------------------------------- restoring checkpoints
    # Called by fairseq-train's load_checkpoint (lsg_fairseq.fairseq_fixes.restore_hooks): these
    # policies hold for this task only, stock tasks keep fairseq's behaviour.
    def check_restore(self, cfg, trainer):
        checkpoint_policy.check_restore(cfg, trainer)

    def explain_restore_failure(self, cfg, trainer, error):
        checkpoint_policy.explain_restore_failure(cfg, trainer, error)

    # ---------------------------------------------------------------- ROUGE in validation
    def build_model(self, cfg, from_checkpoint=False):
        model = super(TranslationTask, self).build_model(cfg, from_checkpoint)
        self._model_prepend_bos = bool(getattr(model, "prepend_bos", True))  # before any dataset
        if self.cfg.eval_rouge:
            self.bpe = self._build_eval_bpe()
            self.eval_rouge_gen_args = parse_eval_rouge_args(self.cfg.eval_rouge_args)
            self.sequence_generator = self.build_generator([model], Namespace(**self.eval_rouge_gen_args))
        return model

    def _build_eval_bpe(self):
        kind = str(self.cfg.eval_rouge_bpe)
        data_dir = utils.split_paths(self.cfg.data)[0]

        def path(flag, value, default_name):
            p = value or os.path.join(data_dir, default_name)
            if not os.path.exists(p):
                raise MissingFileError(f"--{flag}: {p} does not exist (needed to detokenize for --eval-rouge)")
            return p

        if kind == "gpt2":
            return encoders.build_bpe(
                Namespace(
                    bpe="gpt2",
                    gpt2_encoder_json=path(
                        "eval-rouge-gpt2-encoder-json", self.cfg.eval_rouge_gpt2_encoder_json, GPT2_FILES[0]
                    ),
                    gpt2_vocab_bpe=path("eval-rouge-gpt2-vocab-bpe", self.cfg.eval_rouge_gpt2_vocab_bpe, GPT2_FILES[1]),
                )
            )
        if kind == "sentencepiece":
            spm_path = path(
                "eval-rouge-sentencepiece-model", self.cfg.eval_rouge_sentencepiece_model, SENTENCEPIECE_MODEL
            )
            bpe = encoders.build_bpe(
                Namespace(
                    bpe="sentencepiece",
                    sentencepiece_model=spm_path,
                    sentencepiece_enable_sampling=False,
                    sentencepiece_alpha=None,
                )
            )
            # a model from another spm training would score <unk>-ridden text, not fail
            check_sentencepiece_dictionary(
                bpe.sp,
                self.tgt_dict.symbols,
                f"--eval-rouge-sentencepiece-model {spm_path}",
                f"the target dictionary of {data_dir}",
            )
            return bpe
        return None

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
            gen_out = self.inference_step(self.sequence_generator, [model], sample)
            totals = {k: 0.0 for k in ROUGE_KEYS}
            for i, hypos in enumerate(gen_out):
                hyp = self.decode_tokens(hypos[0]["tokens"])
                ref = self.decode_tokens(utils.strip_pad(sample["target"][i], self.tgt_dict.pad()), escape_unk=True)
                for k, v in rouge_example(hyp, ref).items():
                    totals[k] += v
                if i == 0 and self.cfg.eval_rouge_print_samples:
                    logger.info(f"example hypothesis: {hyp}")
                    logger.info(f"example reference: {ref}")
            for k in ROUGE_KEYS:
                logging_output[f"_rouge_{k}_sum"] = totals[k]
            logging_output["_rouge_n"] = len(gen_out)
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        # Training logs carry no ROUGE statistics; validation logs always do (even n = 0).
        if not self.cfg.eval_rouge or not any("_rouge_n" in log for log in logging_outputs):
            return
        # Plain Python floats only: numpy scalars in meters end up in checkpoints and break
        # torch>=2.6 weights_only loading (fairseq#5603).
        n = float(sum(float(log.get("_rouge_n", 0)) for log in logging_outputs))
        for k in ROUGE_KEYS:
            total = float(sum(float(log.get(f"_rouge_{k}_sum", 0.0)) for log in logging_outputs))
            # always log the key, or --best-checkpoint-metric raises KeyError (fairseq#3881)
            metrics.log_scalar(k, 100.0 * total / n if n else 0.0, weight=n, round=2)
