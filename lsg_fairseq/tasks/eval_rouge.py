"""``--eval-rouge``: ROUGE of generated summaries during validation, for ``long_document_summarization``
and the tasks built on it. The generation options (``--eval-rouge-args``, checked before any work),
the detokenizer (``--eval-rouge-bpe``), the sums each validation batch logs, and the metrics they
reduce to: ROUGE-1/2/L/Lsum F1 x100 (:mod:`lsg_text.rouge`), logged as ``rouge1 rouge2 rougeL
rougeLsum`` so that ``--best-checkpoint-metric rougeL --maximize-best-checkpoint-metric`` works.

A helper of the task: it registers nothing (``lsg_fairseq``'s ``__init__`` imports it with every
module of ``tasks/``).
"""

import json
import os
from argparse import Namespace
from typing import Dict, Iterable, Tuple

from fairseq import metrics, utils
from fairseq.data import encoders
from fairseq.dataclass import ChoiceEnum

from lsg_text.argtypes import GENERATION_DEFAULTS, GENERATION_SETTINGS, min_len_out_of_reach
from lsg_text.errors import ConfigError, MissingFileError
from lsg_text.jsonl import JSON_ERRORS, json_problem
from lsg_text.offline_bpe import GPT2_FILES, SENTENCEPIECE_MODEL, check_sentencepiece_dictionary
from lsg_text.rouge import ROUGE_KEYS, rouge_example

EVAL_ROUGE_BPE_CHOICES = ChoiceEnum(["gpt2", "sentencepiece", "none"])
DEFAULT_EVAL_ROUGE_ARGS = json.dumps(GENERATION_DEFAULTS)


def parse_eval_rouge_args(text: str) -> dict:
    """``--eval-rouge-args`` JSON -> dict; unknown keys and bad values are refused, flag named."""
    flag = "--eval-rouge-args"
    try:
        args = json.loads(text)
    except (TypeError, *JSON_ERRORS) as e:
        raise ConfigError(f"{flag}: not valid JSON ({json_problem(e)}); e.g. {DEFAULT_EVAL_ROUGE_ARGS}") from None
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
    max_len_b = args.get("max_len_b", 200)  # fairseq's SequenceGenerator default
    if min_len_out_of_reach(args.get("min_len"), args.get("max_len_a", 0), max_len_b):
        raise ConfigError(f"{flag}: min_len {args['min_len']} is above max_len_b {max_len_b}")
    return args


def build_eval_bpe(cfg, tgt_dict):
    """The detokenizer of ``--eval-rouge-bpe`` (None for ``none``), its files checked first."""
    kind = str(cfg.eval_rouge_bpe)
    data_dir = utils.split_paths(cfg.data)[0]

    def path(flag, value, default_name):
        p = value or os.path.join(data_dir, default_name)
        if not os.path.exists(p):
            raise MissingFileError(f"--{flag}: {p} does not exist (needed to detokenize for --eval-rouge)")
        return p

    if kind == "gpt2":
        return encoders.build_bpe(
            Namespace(
                bpe="gpt2",
                gpt2_encoder_json=path("eval-rouge-gpt2-encoder-json", cfg.eval_rouge_gpt2_encoder_json, GPT2_FILES[0]),
                gpt2_vocab_bpe=path("eval-rouge-gpt2-vocab-bpe", cfg.eval_rouge_gpt2_vocab_bpe, GPT2_FILES[1]),
            )
        )
    if kind == "sentencepiece":
        spm_path = path("eval-rouge-sentencepiece-model", cfg.eval_rouge_sentencepiece_model, SENTENCEPIECE_MODEL)
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
            tgt_dict.symbols,
            f"--eval-rouge-sentencepiece-model {spm_path}",
            f"the target dictionary of {data_dir}",
        )
        return bpe
    return None


def rouge_sums(pairs: Iterable[Tuple[str, str]]) -> Dict[str, float]:
    """A validation batch's logging entries from its (hypothesis, reference) texts: the sum of each
    ROUGE score and the count, summed again across batches and workers by fairseq."""
    totals = {k: 0.0 for k in ROUGE_KEYS}
    n = 0
    for hyp, ref in pairs:
        for k, v in rouge_example(hyp, ref).items():
            totals[k] += v
        n += 1
    out = {f"_rouge_{k}_sum": totals[k] for k in ROUGE_KEYS}
    out["_rouge_n"] = n
    return out


def log_rouge(logging_outputs) -> None:
    """The ROUGE metrics of validation's logging outputs (nothing for training's)."""
    # Training logs carry no ROUGE statistics; validation logs always do (even n = 0).
    if not any("_rouge_n" in log for log in logging_outputs):
        return
    # Plain Python floats only: numpy scalars in meters end up in checkpoints and break
    # torch>=2.6 weights_only loading (fairseq#5603).
    n = float(sum(float(log.get("_rouge_n", 0)) for log in logging_outputs))
    for k in ROUGE_KEYS:
        total = float(sum(float(log.get(f"_rouge_{k}_sum", 0.0)) for log in logging_outputs))
        # always log the key, or --best-checkpoint-metric raises KeyError (fairseq#3881)
        metrics.log_scalar(k, 100.0 * total / n if n else 0.0, weight=n, round=2)
