"""fairseq's own settings of a run, checked by this plugin's tasks before any work.

fairseq range-checks hardly any of its flags. Out of range they fail after the data and the model
are loaded, with a traceback (``--update-freq 0``, ``--nbest 0``, ``--seed -1``, ``--sampling``
with ``--nbest`` below ``--beam``), or not at all: a run that trains nothing or wrongly (``--lr
-1``, ``--weight-decay -1``), or a generation of another shard than asked, with exit status 0.
The tasks' ``vet_run``, which fairseq-train, -generate, -interactive and -validate call before any
work (:mod:`lsg_fairseq.fairseq_fixes.run_hooks`), refuses them in one line naming the flag:
:func:`check_training_args` for training, :func:`check_generate_args` for generation,
:func:`check_validate_args` for validation. The ranges live in :mod:`lsg_text.argtypes`
(``TRAINING_SETTINGS``, ``GENERATE_SETTINGS``, and ``GENERATION_SETTINGS`` for the search itself,
which :func:`check_generation_args` checks wherever a generator is built: generate,
``--eval-rouge``, the hub, ``lsg-fairseq-summarize``).
"""

import importlib.util
import os
from typing import Optional

from omegaconf import OmegaConf

from lsg_fairseq.checkpoint_policy import saved_has_ema, saved_task_name
from lsg_fairseq.device_policy import check_profiler
from lsg_fairseq.tasks.hydra_config import check_hydra_positions
from lsg_text.argtypes import (
    GENERATE_SETTINGS,
    GENERATION_SETTINGS,
    RUN_SETTINGS,
    TRAINING_SETTINGS,
    adam_betas_problem,
    min_len_out_of_reach,
    python_literal,
)
from lsg_text.errors import ConfigError, MissingFileError
from lsg_text.fileio import check_output_path, check_utf8, require_file
from lsg_text.offline_bpe import GPT2_FILES, SENTENCEPIECE_MODEL, check_gpt2_files, read_tokenizer_record
from lsg_text.rouge import ROUGE_KEYS


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def check_settings(cfg, table) -> None:
    """Every ``(group, key)`` of ``table`` that ``cfg`` sets, in its range (each value of a list)."""
    for (group, key), kind in table.items():
        value = getattr(getattr(cfg, group, None), key, None)
        if value is None:
            continue
        values = list(value) if isinstance(value, (list, tuple)) or OmegaConf.is_list(value) else [value]
        problems = [p for p in map(kind.problem, values) if p]
        if problems:
            shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
            raise ConfigError(f"{_flag(key)} {shown}: {problems[0]}")


def check_generation_args(args) -> None:
    """The search flags (``args``: fairseq-generate's Namespace or its ``generation`` config) in the
    ranges ``lsg-fairseq-summarize`` and ``--eval-rouge-args`` take (GENERATION_SETTINGS): fairseq's
    own errors for ``--beam 0`` or ``--max-len-b -1`` are a reshape RuntimeError or an assert, deep
    in the search."""
    for key, kind in GENERATION_SETTINGS.items():
        value = getattr(args, key, None)
        problem = None if value is None else kind.problem(value)
        if problem:
            raise ConfigError(f"{_flag(key)} {value}: {problem}")
    min_len, max_len_a, max_len_b = (getattr(args, k, None) for k in ("min_len", "max_len_a", "max_len_b"))
    if min_len_out_of_reach(min_len, max_len_a, max_len_b):
        raise ConfigError(f"--min-len {min_len} is above --max-len-b {max_len_b}")


def check_launch(cfg) -> None:
    """What fairseq-train's ``cli_main`` (and fairseq-hydra-train's ``main``) act on before the run
    itself: the task's ``vet_run`` is called before that for both commands
    (:mod:`lsg_fairseq.fairseq_fixes.run_hooks`). ``--use-plasma-view`` starts a plasma store to share
    ``language_modeling``'s token blocks between processes; this plugin's tasks read no token blocks,
    so the store would share nothing, and it needs ``pyarrow.plasma``, which pyarrow no longer ships
    (deprecated since 10.0): fairseq's ImportError traceback says "pip install pyarrow" whether
    pyarrow is installed or not. ``--profile``: :func:`~lsg_fairseq.device_policy.check_profiler`."""
    if cfg.common.use_plasma_view:
        raise ConfigError(
            "--use-plasma-view: fairseq's plasma store shares language_modeling's token blocks, and this task "
            "has none to share; drop it"
        )
    check_profiler(cfg.common)


def starting_lr(cfg) -> float:
    """The learning rate fairseq-train's first epoch starts with when the schedule starts anew:
    ``--lr-scheduler`` set up on a one-parameter optimizer at ``--lr``, then stepped as the trainer
    and ``load_checkpoint`` step it before the first epoch (``step_update(0)``, ``step_begin_epoch(1)``,
    ``step(1)``). Warmup schedules start at ``--warmup-init-lr``, 0 by default."""
    import torch
    from fairseq.optim import FairseqOptimizer
    from fairseq.optim.lr_scheduler import build_lr_scheduler

    class OneParameter(FairseqOptimizer):
        def __init__(self, lr: float):
            super().__init__(cfg.optimizer)
            self._optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)

    optimizer = OneParameter(float(cfg.optimization.lr[0]))
    # a resolved copy: the schedules write their defaults into it (inverse_sqrt's warmup_init_lr)
    schedule = build_lr_scheduler(OmegaConf.create(OmegaConf.to_container(cfg.lr_scheduler, resolve=True)), optimizer)
    schedule.step_update(0)
    schedule.step_begin_epoch(1)
    schedule.step(1)
    return optimizer.get_lr()


def check_stop_min_lr(cfg) -> None:
    """``--stop-min-lr`` at or above the learning rate a new schedule starts with: fairseq-train
    compares them before every epoch, the first included, and stops without an update (exit 0, no
    checkpoint). Warmup schedules start at 0 unless ``--warmup-init-lr`` says otherwise, which is why
    fairseq's default is -1 (fairseq#2523). Called by the task when fairseq-train's
    ``load_checkpoint`` starts the schedule anew (``checkpoint_policy.starts_anew``)."""
    stop = cfg.optimization.stop_min_lr
    if stop < 0 or cfg.lr_scheduler is None or cfg.lr_scheduler.get("_name") is None:
        return
    try:
        lr = starting_lr(cfg)
    except (AssertionError, ValueError):  # the schedule's own refusal (pass_through's optimizer): fairseq's to say
        return
    if lr <= stop:
        raise ConfigError(
            f"--stop-min-lr {stop:g}: this run's learning rate starts at {lr:g} (--lr-scheduler "
            f"{cfg.lr_scheduler._name}), so fairseq-train would stop before its first update, exit 0; give a "
            "lower --stop-min-lr (fairseq's default -1 never stops), or a --warmup-init-lr above it"
        )


def updates_per_epoch(batches: int, update_freq: int, skip_remainder_batch: bool) -> int:
    """The updates fairseq-train makes in an epoch of ``batches`` batches (per process): it groups
    them ``update_freq`` to an update (``GroupedIterator``); ``--skip-remainder-batch`` first drops
    the last batch (``EpochBatchIterator``, whether full or not), then the group left short."""
    if skip_remainder_batch:
        return max(batches - 1, 0) // update_freq
    return -(-batches // update_freq)


def check_updates_per_epoch(batches: int, update_freq: int, skip_remainder_batch: bool, where: str) -> None:
    """An epoch in which fairseq-train would make no update: it ends in fairseq's UnboundLocalError
    ("valid_losses") once the epoch is over, a traceback. Called by the task when fairseq-train
    batches its training split (``batches``: that epoch's, for one process)."""
    if updates_per_epoch(batches, update_freq, skip_remainder_batch) > 0 or not skip_remainder_batch:
        return
    grouped = ""
    if update_freq > 1:
        grouped = f" and, with --update-freq {update_freq}, the batches that fill no whole update"
    fewer = " or a lower --update-freq" if update_freq > 1 else ""
    raise ConfigError(
        f"--skip-remainder-batch: {where} makes {batches} batch{'es' if batches != 1 else ''} an epoch (per "
        f"process), and fairseq-train drops the last{grouped}, so no update would run; drop "
        f"--skip-remainder-batch, or make smaller batches (--max-tokens, --batch-size){fewer}"
    )


def check_training_args(cfg) -> None:
    """fairseq-train's settings (TRAINING_SETTINGS, ``--adam-betas``) and the combinations fairseq
    fails on late or keeps without a word (:func:`check_best_checkpoint_metric`,
    :func:`check_finetune_from_model`), and what fairseq-train acts on before the run (:func:`check_launch`)."""
    check_launch(cfg)
    if getattr(getattr(cfg, "optimizer", None), "_name", None) is None:  # fairseq's ValueError after loading
        raise ConfigError("--optimizer is required (e.g. --optimizer adam; LOCOST's --ssm-lr needs grouped_adam)")
    check_settings(cfg, TRAINING_SETTINGS)
    betas = getattr(getattr(cfg, "optimizer", None), "adam_betas", None)
    problem = None if betas is None else adam_betas_problem(betas)
    if problem:
        raise ConfigError(f"--adam-betas {betas}: {problem}")
    check_best_checkpoint_metric(cfg)
    check_finetune_from_model(cfg.checkpoint)
    check_lr_scheduler(cfg)
    if getattr(cfg.task, "eval_bleu", False):  # translation's flag: this task's validation never computes it
        raise ConfigError("--eval-bleu: this task scores validation with ROUGE (--eval-rouge), not BLEU")
    check_valid_subsets(cfg.dataset)
    check_packages(cfg)
    check_ema_seed(getattr(cfg, "ema", None))
    if cfg.common.quantization_config_path is not None:  # fairseq reads it once the model is built
        require_file(cfg.common.quantization_config_path, "--quantization-config-path")
    check_output_folders(cfg)
    check_hydra_positions(cfg)  # a no-op for fairseq-train's flat model namespace


def check_valid_subsets(dataset) -> None:
    """``--combine-valid-subsets`` loads valid, valid1, valid2, ... as one split named valid; fairseq
    then validates each name of ``--valid-subset``, and any other than valid fails with a KeyError
    (Dataset not loaded) at the end of the first epoch. The training split among them: fairseq loads
    it once for both, and its epoch iterator then starts at epoch 2, unshuffled (exit 0)."""
    if dataset.disable_validation:
        return
    subsets = dataset.valid_subset.split(",")
    if dataset.train_subset in subsets:
        raise ConfigError(
            f"--valid-subset {dataset.valid_subset} holds the training split {dataset.train_subset}: fairseq "
            "then skips epoch 1 and trains without shuffling; validate on another split (a copy of it binarized "
            "under another name checks the fit on training data)"
        )
    if not dataset.combine_valid_subsets:
        return
    others = [name for name in subsets if name != "valid"]
    if others:
        raise ConfigError(
            f"--valid-subset {dataset.valid_subset} with --combine-valid-subsets: the combined splits (valid, "
            f"valid1, valid2, ...) are validated as one, named valid; drop {', '.join(others)} or "
            "--combine-valid-subsets"
        )


def check_ema_seed(ema) -> None:
    """``--ema-seed-model``: a checkpoint holding an EMA (fairseq reads its ``extra_state["ema"]``
    at the first update: a KeyError, or a FileNotFoundError, after the data and the model are loaded)."""
    path = getattr(ema, "ema_seed_model", None) if ema is not None and ema.store_ema else None
    if not path:
        return
    require_file(path, "--ema-seed-model")
    if not saved_has_ema(path):
        raise ConfigError(
            f"--ema-seed-model {path}: holds no EMA (a checkpoint saved with --store-ema does); without this flag "
            "the EMA starts from the run's starting weights"
        )


def check_lr_scheduler(cfg) -> None:
    """What fairseq's schedules fail on once the model is built (a ZeroDivisionError, an assert, a
    ValueError): polynomial_decay needs its length; inverse_sqrt divides by --warmup-updates (0
    means no warmup for the others); cosine, tri_stage and reduce_lr_on_plateau take one --lr, not a
    list; cosine needs a period, tri_stage its stages, reduce_lr_on_plateau a factor below 1."""
    sched = getattr(cfg, "lr_scheduler", None)
    name = getattr(sched, "_name", None)
    if name == "polynomial_decay" and sched.total_num_update <= 0:  # given so, or --max-update's 0 (no limit)
        raise ConfigError(
            f"--total-num-update {sched.total_num_update:g}: --lr-scheduler polynomial_decay decays over that many "
            "updates (more than 0), --max-update's by default: give --total-num-update N or --max-update N"
        )
    if name == "inverse_sqrt" and getattr(sched, "warmup_updates", 1) == 0:
        raise ConfigError(
            "--warmup-updates 0 with --lr-scheduler inverse_sqrt: fairseq divides by it; give 1 or more "
            "(1: --lr from the first update, then its inverse square root decay)"
        )
    lrs = list(cfg.optimization.lr)
    if name in ("cosine", "tri_stage", "reduce_lr_on_plateau") and len(lrs) > 1:
        shown = ",".join(f"{lr:g}" for lr in lrs)
        raise ConfigError(f"--lr {shown}: --lr-scheduler {name} takes one learning rate (a list is fixed's, per epoch)")
    max_update = cfg.optimization.max_update
    if name == "cosine" and sched.lr_period_updates <= 0 and max_update <= 0:
        raise ConfigError("--lr-scheduler cosine needs its period: --max-update N or --lr-period-updates N")
    if name == "tri_stage":
        ratio = sched.phase_ratio
        if ratio is not None and (max_update <= 0 or abs(sum(ratio) - 1) > 1e-6):
            raise ConfigError(f"--phase-ratio {ratio}: needs --max-update N, and ratios that add up to 1")
        if ratio is None and sched.warmup_steps + sched.hold_steps + sched.decay_steps <= 0:
            raise ConfigError(
                "--lr-scheduler tri_stage needs --phase-ratio or --warmup-steps/--hold-steps/--decay-steps"
            )
    if name == "reduce_lr_on_plateau" and not 0 <= sched.lr_shrink < 1:
        raise ConfigError(
            f"--lr-shrink {sched.lr_shrink:g}: the factor a plateau multiplies the learning rate by, in [0, 1)"
        )


def check_output_folders(cfg) -> None:
    """``--save-dir`` and ``--tensorboard-logdir`` folders, or paths where one can be made, and
    ``--log-file`` a file in a folder that exists. fairseq's own: a NotADirectoryError or
    FileExistsError traceback from ``os.makedirs`` (for the logs only after the data and the model
    are loaded); for ``--log-file``, which fairseq opens first and in a folder it does not make, an
    IsADirectoryError or FileNotFoundError traceback."""
    if not cfg.checkpoint.no_save:
        check_output_path(cfg.checkpoint.save_dir, "--save-dir", folder=True)
    logdir = getattr(cfg.common, "tensorboard_logdir", None)
    if logdir:
        check_output_path(logdir, "--tensorboard-logdir", folder=True)
    log_file = getattr(cfg.common, "log_file", None)
    if log_file is not None:
        check_output_path(log_file, "--log-file")
        folder = os.path.dirname(os.path.abspath(log_file))
        if not os.path.isdir(folder):
            raise ConfigError(
                f"--log-file {log_file}: the folder {folder} does not exist, and fairseq-train does not make it "
                "(make it first)"
            )


LOWER_IS_BETTER = ("loss", "nll_loss", "ppl")  # what validation logs whatever the flags


def check_best_checkpoint_metric(cfg) -> None:
    """The metric that picks checkpoint_best.pt (also --keep-best-checkpoints, --patience) is logged
    by validation and compared the right way round. Else fairseq's KeyError after the first
    epoch (ROUGE without --eval-rouge), or, without a word, a checkpoint_best.pt with the lowest
    ROUGE (--maximize-best-checkpoint-metric forgotten) or the highest loss (given for a loss)."""
    if cfg.dataset.disable_validation:
        return  # no validation, no metric read
    ckpt = cfg.checkpoint
    metric, maximize = ckpt.best_checkpoint_metric, ckpt.maximize_best_checkpoint_metric
    spelled = [key for key in ROUGE_KEYS if key.lower() == metric.lower().replace("-", "").replace("_", "")]
    if spelled and metric not in ROUGE_KEYS:  # fairseq's KeyError after the first epoch
        raise ConfigError(f"--best-checkpoint-metric {metric}: validation logs it as {spelled[0]}")
    if metric in ROUGE_KEYS and not getattr(cfg.task, "eval_rouge", False):
        raise ConfigError(
            f"--best-checkpoint-metric {metric}: validation logs ROUGE only with --eval-rouge (add it, or keep "
            "the default metric, loss)"
        )
    if metric in ROUGE_KEYS and not maximize:
        raise ConfigError(
            f"--best-checkpoint-metric {metric}: higher is better, add --maximize-best-checkpoint-metric (else "
            "checkpoint_best.pt is the one of lowest ROUGE)"
        )
    if metric in LOWER_IS_BETTER and maximize:
        raise ConfigError(
            f"--maximize-best-checkpoint-metric: the metric is {metric}, lower is better (drop the flag, or choose "
            "a higher-is-better metric such as rougeL with --eval-rouge)"
        )


def watched_metric(cfg, command: str) -> Optional[str]:
    """The ``--best-checkpoint-metric`` a fairseq-train run's validation must log, to be checked
    at the first training log (:func:`check_metric_logged`); None where no validation reads one."""
    if command != "fairseq_cli.train" or cfg.dataset.disable_validation:
        return None
    return cfg.checkpoint.best_checkpoint_metric


def check_metric_logged(metric: str, logged, valid_only=()) -> None:
    """At the first training log: ``metric`` is among the names the criterion and the task
    ``logged`` there (validation logs the same names, plus ``valid_only``: ROUGE with --eval-rouge,
    bleu with --eval-bleu; fairseq adds num_updates). fairseq reads the metric only after the first
    validation, an epoch of training later, and then fails with a KeyError (which
    :func:`explain_missing_metric` still explains, for a metric only a validation could log)."""
    known = set(logged) | set(valid_only) | {"num_updates"}
    if metric not in known:
        shown = ", ".join(
            k for k in ("loss", "nll_loss", "ppl", *sorted(set(logged) - {"loss", "nll_loss", "ppl"})) if k in known
        )
        raise ConfigError(
            f"--best-checkpoint-metric {metric}: not a metric of this run (its criterion and task log {shown}"
            f"{'; validation adds ' + ', '.join(valid_only) if valid_only else ''}); refused at the first "
            "training log, before any checkpoint"
        )


def explain_missing_metric(cfg, command: str, error: BaseException):
    """fairseq-train's KeyError when validation logged no ``--best-checkpoint-metric`` (it reads the
    metric only then, after the first epoch or ``--validate-interval-updates``), as one line; None
    for any other error. :func:`check_metric_logged` refuses at the first training log a metric the
    run does not log at all; this explains one that only a validation could have logged."""
    metric = cfg.checkpoint.best_checkpoint_metric
    if command != "fairseq_cli.train" or not isinstance(error, KeyError) or error.args != (metric,):
        return None
    return ConfigError(
        f"--best-checkpoint-metric {metric}: validation logged no such metric (the criterion's, such as loss, "
        "nll_loss and ppl, and with --eval-rouge rouge1, rouge2, rougeL and rougeLsum); the checkpoints saved "
        "before this validation are intact"
    )


def explain_output_folder_error(cfg, command: str, error: BaseException):
    """fairseq-train's OSError making ``--save-dir`` (the first thing its ``main`` does, with a test
    file ``dummy`` in it) or ``--tensorboard-logdir`` (after the data and the model are loaded), as
    one line; None for any other error. :func:`check_output_folders` refuses what can be seen
    before (a file in the way, a folder this user may not write in); this explains the rest, such
    as a folder in ``/proc`` or on a mount that refuses it."""
    if command != "fairseq_cli.train" or not isinstance(error, OSError) or not error.filename:
        return None
    failed = os.path.abspath(os.fsdecode(error.filename))
    folders = (("--save-dir", cfg.checkpoint.save_dir), ("--tensorboard-logdir", cfg.common.tensorboard_logdir))
    for flag, folder in folders:
        if not folder:
            continue
        made = os.path.abspath(folder)
        if failed in (made, os.path.join(made, "dummy")) or made.startswith(failed + os.sep):
            return ConfigError(
                f"{flag} {folder}: cannot be made or written in ({error.strerror}: {error.filename}); choose "
                "another folder"
            )
    return None


def check_finetune_from_model(ckpt) -> None:
    """``--finetune-from-model`` alone: fairseq's own ValueError tracebacks, once the model is built,
    for it beside a reset flag or a ``--restore-file``."""
    if not ckpt.finetune_from_model:
        return
    resets = [
        flag
        for flag, on in (
            ("--reset-optimizer", ckpt.reset_optimizer),
            ("--reset-lr-scheduler", ckpt.reset_lr_scheduler),
            ("--reset-meters", ckpt.reset_meters),
            ("--reset-dataloader", ckpt.reset_dataloader),
        )
        if on
    ]
    if resets:
        raise ConfigError(
            f"--finetune-from-model with {', '.join(resets)}: it resets the optimizer, the lr scheduler, the meters "
            f"and the dataloader itself (drop {'it' if len(resets) == 1 else 'them'})"
        )
    if ckpt.restore_file != "checkpoint_last.pt":  # fairseq's default
        raise ConfigError(
            f"--finetune-from-model with --restore-file {ckpt.restore_file}: give one (--restore-file resumes a "
            "training from its checkpoint, --finetune-from-model starts a new one from a model's weights)"
        )


def check_checkpoint_paths(paths: Optional[str], verb: str, ensemble: bool = True) -> None:
    """``--path`` given (fairseq's own: an AssertionError, or an AttributeError of None), and each of
    its checkpoints a file (fairseq's own: an OSError traceback). ``ensemble``: ``paths`` may list
    several, separated by ``os.pathsep`` (generate, interactive; validate reads one)."""
    if not paths:
        raise ConfigError(f"--path is required: the checkpoint to {verb} (e.g. --path ckpt/checkpoint_best.pt)")
    for path in paths.split(os.pathsep) if ensemble else [paths]:
        if not os.path.isfile(path):
            raise MissingFileError(f"--path {path}: no such checkpoint file")


def check_model_overrides(overrides: str) -> None:
    """``--model-overrides``: a Python dict (fairseq's own: literal_eval's or eval's traceback)."""
    if not isinstance(python_literal(overrides), dict):
        raise ConfigError(f"--model-overrides {overrides}: must be a Python dict, e.g. \"{{'dropout': 0.0}}\"")


# --bpe NAME -> the settings naming the files it reads, and the file each names in a model folder
# (lsg-fairseq-convert's, the hub's); the other tokenizers are fairseq's affair
BPE_FILES = {
    "gpt2": tuple(zip(("gpt2_encoder_json", "gpt2_vocab_bpe"), GPT2_FILES)),
    "sentencepiece": (("sentencepiece_model", SENTENCEPIECE_MODEL),),
}


def check_bpe_files(bpe) -> None:
    """The files ``--bpe gpt2`` or ``--bpe sentencepiece`` reads (fairseq-generate and -interactive
    build the tokenizer once the models are loaded): given, local and there. fairseq's own: omegaconf's
    MissingMandatoryValue traceback (no ``--sentencepiece-model``), an OSError traceback (a missing
    file), and for ``--bpe gpt2`` without its two files a download of fairseq's GPT-2 files (where
    there is no internet, as on many cluster nodes, a ConnectionError traceback). This plugin
    downloads nothing: a model's tokenizer files sit beside its model.pt. The GPT-2 files are also
    read as fairseq's ``get_encoder`` will read them (:func:`lsg_text.offline_bpe.check_gpt2_files`):
    a vocab.bpe without its ``#version`` header or its last newline silently loses a merge there, so
    that interactive input is split into other ids than the model was trained on."""
    name = None if bpe is None else bpe.get("_name")
    for key, usual in BPE_FILES.get(name, ()):
        flag = _flag(key)
        if OmegaConf.is_missing(bpe, key) or not bpe[key]:
            raise ConfigError(
                f"{flag} is required with --bpe {name}: the model's {usual} (e.g. {flag} MODEL_DIR/{usual})"
            )
        if "://" in bpe[key]:
            raise ConfigError(
                f"{flag} {bpe[key]}: a URL, which fairseq would download at run time; give the model's own file "
                f"(e.g. {flag} MODEL_DIR/{usual}: lsg-fairseq-convert writes it beside model.pt)"
            )
        require_file(bpe[key], flag)
    if name == "gpt2":
        flags = [_flag(key) for key, _ in BPE_FILES[name]]
        check_gpt2_files(bpe.gpt2_encoder_json, bpe.gpt2_vocab_bpe, *flags)


# --tokenizer / --bpe NAME -> the package fairseq's tokenizer imports once the models are loaded (its
# own: an ImportError traceback then, the models' loading time spent), and the name pip installs it by
TOKENIZER_PACKAGES = {
    ("tokenizer", "moses"): ("sacremoses", "sacremoses"),
    ("tokenizer", "nltk"): ("nltk", "nltk"),
    ("bpe", "sentencepiece"): ("sentencepiece", "sentencepiece"),
    ("bpe", "byte_bpe"): ("sentencepiece", "sentencepiece"),
    ("bpe", "subword_nmt"): ("subword_nmt", "subword-nmt"),
    ("bpe", "fastbpe"): ("fastBPE", "fastBPE"),
    ("bpe", "hf_byte_bpe"): ("tokenizers", "tokenizers"),
    ("bpe", "bert"): ("transformers", "transformers"),
}
# the same for other settings, as (group, field, value) -> (package, pip name, what needs it): a
# scorer's ImportError once generation is done, fairscale's once the model is built; ANY: any value
# given (a logger's project or repository, or its switch on), where fairseq logs one warning without
# the package and trains on, its metrics going nowhere
ANY = "any value"
SETTING_PACKAGES = {
    ("scoring", "_name", "wer"): ("editdistance", "editdistance", "fairseq's wer scorer"),
    ("scoring", "_name", "meteor"): ("nltk", "nltk", "fairseq's meteor scorer"),
    ("scoring", "_name", "bert_score"): ("bert_score", "bert-score", "fairseq's bert_score scorer"),
    ("distributed_training", "ddp_backend", "fully_sharded"): (
        "fairscale",
        "fairscale",
        "fairseq's fully sharded data parallel",
    ),
    ("distributed_training", "zero_sharding", "os"): ("fairscale", "fairscale", "fairseq's optimizer state sharding"),
    # fairseq-train logs this one's ImportError and returns: exit 0, nothing trained
    ("checkpoint", "write_checkpoints_asynchronously", True): (
        "iopath",
        "iopath",
        "fairseq's asynchronous checkpoint writing",
    ),
    ("common", "wandb_project", ANY): ("wandb", "wandb", "fairseq's Weights & Biases logging"),
    ("common", "aim_repo", ANY): ("aim", "aim", "fairseq's Aim logging"),
    ("common", "azureml_logging", ANY): ("azureml.core", "azureml-core", "fairseq's AzureML logging"),
}


def _installed(module: str) -> bool:
    """``module`` can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


def check_packages(cfg) -> None:
    """The package ``--tokenizer``, ``--bpe``, ``--scoring``, ``--ddp-backend``, ``--zero-sharding``
    and fairseq's loggers (``--wandb-project``, ...) import, installed (looked up, not imported)."""
    needs = {
        (group, "_name", name): (module, pip, f"fairseq's {name} {group}")
        for (group, name), (module, pip) in TOKENIZER_PACKAGES.items()
    }
    for (group, key, value), (module, pip_name, what) in {**needs, **SETTING_PACKAGES}.items():
        section = getattr(cfg, group, None)
        setting = None if section is None else section.get(key)
        if not (setting if value is ANY else setting == value) or _installed(module):
            continue
        flag = f"--{group.replace('_', '-')}" if key == "_name" else _flag(key)
        given = flag if setting is True else f"{flag} {setting}"  # a switch is given by its name alone
        raise ConfigError(
            f"{given}: {what} needs the package {module}, which is not installed here (pip install {pip_name})"
        )


def check_interactive_bpe(cfg) -> None:
    """fairseq-interactive reads raw text: without ``--bpe`` a model of GPT-2 or sentencepiece pieces
    (its folder's tokenizer.txt, written by lsg-fairseq-convert) sees every input word as <unk>, and
    generates anyway, exit 0."""
    if cfg.bpe is not None and cfg.bpe.get("_name"):
        return
    folder = os.path.dirname(os.path.abspath(cfg.common_eval.path.split(os.pathsep)[0]))
    try:
        kind = read_tokenizer_record(folder)
    except ValueError:  # a record that contradicts its folder: the hub and summarize say so; not this check's
        return
    pieces = {
        "gpt2": f"--bpe gpt2 --gpt2-encoder-json {os.path.join(folder, GPT2_FILES[0])} --gpt2-vocab-bpe "
        f"{os.path.join(folder, GPT2_FILES[1])}",
        "sentencepiece": f"--bpe sentencepiece --sentencepiece-model {os.path.join(folder, SENTENCEPIECE_MODEL)}",
    }
    if kind in pieces:
        raise ConfigError(
            f"--bpe is not given, but {os.path.join(folder, 'tokenizer.txt')} says the model reads {kind} pieces: "
            f"every input word would be <unk>; pass {pieces[kind]}"
        )


# what fairseq's data_utils.post_process knows (--post-process / --remove-bpe); another value is its
# NotImplementedError at the first hypothesis printed
POST_PROCESS = ("sentencepiece", "wordpiece", "letter", "silence", "_EOW", "subword_nmt", "@@ ", "@@", "none")


def check_interactive_processes(dist) -> None:
    """fairseq-interactive reads its input in one process. With ``--distributed-world-size`` above 1
    (or a ``--distributed-init-method``) its ``call_main`` spawns processes, each reading /dev/null
    (multiprocessing's stdin for a child): nothing is generated, exit 0."""
    flag = None
    if dist.distributed_world_size > 1:
        flag = f"--distributed-world-size {dist.distributed_world_size}"
    elif dist.distributed_init_method is not None:
        flag = f"--distributed-init-method {dist.distributed_init_method}"
    if flag:
        raise ConfigError(
            f"{flag}: fairseq-interactive reads its input in one process, and the processes fairseq would spawn "
            "for it read none (nothing would be printed); drop it"
        )


def check_post_process(symbol: Optional[str]) -> None:
    """``--post-process`` (alias ``--remove-bpe``) one of fairseq's :data:`POST_PROCESS`."""
    if symbol is None or symbol in POST_PROCESS:
        return
    hint = " (GPT-2 pieces are undone by --bpe gpt2 with its files)" if symbol == "gpt2" else ""
    raise ConfigError(
        f"--post-process {symbol}: not one of fairseq's: {', '.join(repr(s) for s in POST_PROCESS)}{hint}"
    )


def check_validate_args(cfg) -> None:
    """fairseq-validate's settings: one checkpoint, a batch size, RUN_SETTINGS."""
    check_settings(cfg, RUN_SETTINGS)
    check_checkpoint_paths(cfg.common_eval.path, "validate", ensemble=False)
    # fairseq-validate builds the checkpoint's own task, whatever --task says (and runs this check
    # for the --task given): another one was either ignored or read the data as the checkpoint's
    saved, given = saved_task_name(cfg.common_eval.path), getattr(cfg.task, "_name", None)
    if saved and given and saved != given:
        raise ConfigError(
            f"--task {given}: {cfg.common_eval.path} was trained with --task {saved}, and fairseq-validate "
            f"evaluates with the checkpoint's own task (its data format and its loss); pass --task {saved}"
        )
    if cfg.dataset.max_tokens is None and cfg.dataset.batch_size is None:  # fairseq's AssertionError
        raise ConfigError("--max-tokens or --batch-size is required: how many tokens (or examples) per batch")
    check_model_overrides(cfg.common_eval.model_overrides)


def check_generate_args(cfg, command: str) -> None:
    """fairseq-generate's and -interactive's settings (``command``: ``fairseq_cli.generate`` or
    ``fairseq_cli.interactive``), and the combinations fairseq asserts or fails on."""
    check_checkpoint_paths(cfg.common_eval.path, "generate with")
    check_settings(cfg, GENERATE_SETTINGS)
    gen = cfg.generation
    check_generation_args(gen)
    if gen.sampling and gen.nbest != gen.beam:  # fairseq's AssertionError
        raise ConfigError(f"--nbest {gen.nbest}: with --sampling it must equal --beam ({gen.beam})")
    if gen.diverse_beam_groups > 0 and gen.beam % gen.diverse_beam_groups:  # fairseq's ValueError
        raise ConfigError(
            f"--diverse-beam-groups {gen.diverse_beam_groups}: must divide --beam ({gen.beam}) into equal groups"
        )
    if command == "fairseq_cli.generate":
        # below a file, or where this user may not write: fairseq's makedirs traceback (a file
        # itself is refused for every task by one_line_errors, before this)
        check_output_path(cfg.common_eval.results_path, "--results-path", folder=True)
        for flag, on in (("--print-step", gen.print_step), ("--retain-iter-history", gen.retain_iter_history)):
            if on:  # fairseq-generate's KeyError once the first batch is generated
                raise ConfigError(
                    f"{flag}: only for fairseq's iterative refinement models, not this task's beam search"
                )
        if gen.constraints is not None:  # a TypeError at the first batch: binarized data holds no constraints
            raise ConfigError(
                "--constraints: fairseq-generate's binarized data carries none; fairseq-interactive reads them from "
                "each input line (the source, then each constraint after a tab)"
            )
        if gen.replace_unk is not None:  # fairseq-generate's AssertionError
            raise ConfigError(
                "--replace-unk: fairseq-generate replaces <unk> from raw text datasets only, and this task reads "
                "binarized data"
            )
    check_post_process(cfg.common_eval.post_process)
    data = cfg.dataset
    if command == "fairseq_cli.interactive":
        source = cfg.interactive.input
        if source != "-":  # fairseq's FileNotFoundError or UnicodeDecodeError once the model is loaded
            check_utf8(require_file(source, "--input"), "--input")
        check_interactive_bpe(cfg)
        check_interactive_processes(cfg.distributed_training)
        buffer = max(1, cfg.interactive.buffer_size)  # what fairseq-interactive's main makes of 0 (not given)
        if data.batch_size and data.batch_size > buffer:  # its AssertionError
            raise ConfigError(
                f"--batch-size {data.batch_size}: must not exceed --buffer-size ({buffer}; lines read at a time): "
                f"pass --buffer-size {data.batch_size} or more"
            )
    # fairseq 0.12's generate shards by --distributed-world-size, in its one process: shard
    # --distributed-rank of it only (exit 0), or a ZeroDivisionError once it has generated nothing
    dist = cfg.distributed_training
    if command == "fairseq_cli.generate" and dist.distributed_world_size > 1:
        raise ConfigError(
            f"--distributed-world-size {dist.distributed_world_size}: fairseq-generate runs in one process and "
            f"would generate only its batches of shard {dist.distributed_rank} (--distributed-rank) of "
            f"{dist.distributed_world_size}, none if the split makes fewer batches; drop it (for several GPUs, "
            "split the data into folders and run one generation per folder and GPU)"
        )
    for flag, value, unread in (("--num-shards", data.num_shards, 1), ("--shard-id", data.shard_id, 0)):
        if value != unread:
            raise ConfigError(
                f"{flag} {value}: fairseq-generate does not read it (each --shard-id would generate every "
                "example); split the data into folders and run one generation per folder"
            )
    if gen.lm_path is not None:  # fairseq's OSError traceback once the models are loaded
        require_file(gen.lm_path, "--lm-path")
        task = saved_task_name(gen.lm_path)  # an encoder-decoder's: a TypeError in the first search step
        if task is not None and "language_modeling" not in task:
            raise ConfigError(
                f"--lm-path {gen.lm_path}: a checkpoint of --task {task}, not a language model (fairseq's "
                "language_modeling task) that the search can add to the model's scores"
            )
    check_model_overrides(cfg.common_eval.model_overrides)
    check_packages(cfg)
    check_bpe_files(getattr(cfg, "bpe", None))
