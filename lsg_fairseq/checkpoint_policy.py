"""What this plugin's tasks demand of the checkpoint ``fairseq-train`` restores (policies, not fixes).

Called through the task hooks of :mod:`lsg_fairseq.fairseq_fixes.restore_hooks`, so they apply to
``--task long_document_summarization`` / ``gap_sentence_generation`` runs only; a stock fairseq
task in the same process keeps fairseq's behaviour.

* ``--restore-file some/typo.pt`` that does not exist: fairseq logs "No existing checkpoint found"
  and trains from scratch, which for a fine-tuning run means days spent on the wrong thing; refused,
  as is a ``--finetune-from-model`` that does not exist (fairseq's error is a traceback).
* A first launch (no ``checkpoint_last.pt`` to resume from) in a ``--save-dir`` holding another
  run's checkpoints: fairseq writes over them; refused, naming the newest to resume from.
* A checkpoint that does not fit the model: fairseq says "please ensure that the architectures
  match"; we say which ``--arch`` it was saved with, or how many positions its table holds and
  how to extend it.
* A checkpoint that fits, but whose model was built with other settings that no weight records
  (LSG's blocks and sparsity, LED's window: the model class's ``weightless_settings``): fairseq
  builds the model from the command line, so a forgotten flag trains another attention without a
  word. Resuming with other settings is refused; ``--finetune-from-model`` (where a change may be
  meant) logs a warning naming each setting, the checkpoint's value and the run's.
"""

import logging
import os
import shlex

import torch
from fairseq.file_io import PathManager

from lsg_fairseq.checkpoint_io import CheckpointError, is_local
from lsg_text.errors import ConfigError, MissingFileError

logger = logging.getLogger(__name__)


def model_arch(model_args) -> str:
    """The arch of a checkpoint's ``cfg.model`` (an argparse namespace, a DictConfig or a plain
    dict): fairseq-train's ``arch``, else ``_name`` (fairseq-hydra-train's checkpoints hold only
    that); "" when neither."""
    get = model_args.get if hasattr(model_args, "get") else lambda key: getattr(model_args, key, None)
    return str(get("arch") or get("_name") or "")


def longer_positions_hint(arch: str, path: str, n: int) -> str:
    """What to run so that ``path``, a fairseq checkpoint of ``--arch arch``, reads ``n`` source
    tokens: lsg-fairseq-convert tiles the encoder position table of a BART or LSG-BART checkpoint (a
    BART one stays BART only with ``--to bart``: a new length alone makes it an LSG-BART, the
    reference's conversion); it takes no fairseq LED checkpoint (an LED's table is made from an HF
    BART's). Held to what the converter does by ``tests/test_convert_lsg.py``."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY
    from fairseq.models.bart import BARTModel

    model = ARCH_MODEL_NAME_REGISTRY.get(arch)
    command = f"lsg-fairseq-convert {path} OUT_DIR"
    if model == "lsg_bart":
        return f"extend it with `{command} --max-source-positions {n}` (tiles the table)"
    only = f"lsg-fairseq-convert extends the tables of BART and LSG-BART checkpoints, not of {arch}'s"
    if model == "led":
        led = f"lsg-fairseq-convert HF_BART OUT_DIR --to led --max-source-positions {n}"
        return f"{only} (an LED's is made from an HF BART folder: `{led}`)"
    if isinstance(MODEL_REGISTRY.get(model), type) and issubclass(MODEL_REGISTRY[model], BARTModel):
        return f"extend it with `{command} --to bart --max-source-positions {n}` (tiles the table)"
    return only


def restore_path(cfg, trainer) -> str:
    """The file fairseq's ``load_checkpoint`` reads (same rules as fairseq's, checkpoint_utils.py)."""
    suffix = trainer.checkpoint_suffix
    if cfg.restore_file != "checkpoint_last.pt":
        return cfg.restore_file.replace(".pt", suffix + ".pt") if suffix is not None else cfg.restore_file
    path = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
    if not PathManager.exists(path) and getattr(cfg, "continue_once", None) is not None:
        path = cfg.continue_once  # a first launch resumes from it (fairseq's order: before a fine-tuning's)
    elif not PathManager.exists(path) and cfg.finetune_from_model:
        path = cfg.finetune_from_model
    return path


def check_restore(cfg, trainer) -> None:
    """Refuse a non-default ``--restore-file``, or the ``--continue-once`` or ``--finetune-from-model``
    a first launch starts from, that does not exist; and a first launch in a ``--save-dir`` holding
    another run's checkpoints (:func:`check_nothing_overwritten`)."""
    path = restore_path(cfg, trainer)
    # Only rank 0 reads the file (the others get it by broadcast), so only it checks.
    if trainer.data_parallel_rank != 0:
        return
    if not PathManager.isfile(path):
        _check_start_given(cfg, path)
    check_nothing_overwritten(cfg, trainer, path)


def _check_start_given(cfg, path: str) -> None:
    """``path``, the file :func:`restore_path` names, is not there: refused where the user named it
    (a first launch's default, ``checkpoint_last.pt``, means "start fresh")."""
    if cfg.restore_file == "checkpoint_last.pt" and path == getattr(cfg, "continue_once", None):
        raise MissingFileError(
            f"--continue-once {path}: no such file; fairseq would silently train from scratch (give the "
            "checkpoint to resume from once)"
        )
    if cfg.restore_file == "checkpoint_last.pt" and path == cfg.finetune_from_model:
        # fairseq's own error is a ValueError traceback
        raise MissingFileError(
            f"--finetune-from-model {path}: no such file; give the checkpoint to start from (a "
            "checkpoint_*.pt of fairseq-train, or model.pt of lsg-fairseq-convert)"
        )
    if cfg.restore_file != "checkpoint_last.pt":  # the default: a first launch starts fresh
        raise MissingFileError(
            f"--restore-file {cfg.restore_file}: no such file ({path}); fairseq would silently "
            "train from scratch. Give an existing checkpoint, or leave --restore-file out to "
            "resume from --save-dir/checkpoint_last.pt"
        )


def starts_anew(cfg, trainer) -> bool:
    """Whether fairseq-train's ``load_checkpoint`` starts the learning-rate schedule anew: nothing to
    restore (a first launch), a fine-tuning's first launch, or ``--reset-lr-scheduler``."""
    path = restore_path(cfg, trainer)
    return cfg.reset_lr_scheduler or not PathManager.isfile(path) or path == cfg.finetune_from_model


def saved_checkpoints(save_dir: str) -> list:
    """The checkpoints fairseq-train writes (``checkpoint*.pt``: last, best, per epoch or update,
    ``checkpoint.best_<metric>_<value>.pt``) that ``save_dir`` holds, newest first."""
    if not is_local(save_dir) or not os.path.isdir(save_dir):
        return []
    names = [n for n in os.listdir(save_dir) if n.startswith("checkpoint") and n.endswith(".pt")]
    names = [n for n in names if os.path.isfile(os.path.join(save_dir, n))]
    return sorted(names, key=lambda n: os.path.getmtime(os.path.join(save_dir, n)), reverse=True)


def check_nothing_overwritten(cfg, trainer, path: str) -> None:
    """A first launch (no ``checkpoint_last.pt`` to resume from: from scratch, from
    ``--finetune-from-model`` or from ``--continue-once``) in a ``--save-dir`` that holds another
    run's checkpoints: fairseq writes over them (``checkpoint_best.pt`` at its first validation,
    ``checkpoint1.pt`` at its first epoch's end) without a word. A rerun of a training saved with
    ``--no-last-checkpoints`` ends so, or one whose ``checkpoint_last.pt`` was removed. Refused,
    naming the newest to resume from; a ``--restore-file`` the user names, and ``--no-save``, pass."""
    if cfg.no_save or cfg.restore_file != "checkpoint_last.pt":
        return
    last = os.path.join(cfg.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
    earlier = [] if PathManager.exists(last) else saved_checkpoints(cfg.save_dir)
    if not earlier:
        return
    start = "from scratch" if path == last else f"from {path}"
    shown = ", ".join(earlier[:3]) + (f" and {len(earlier) - 3} more" if len(earlier) > 3 else "")
    raise ConfigError(
        f"--save-dir {cfg.save_dir} holds another run's checkpoints ({shown}) and no checkpoint_last.pt to "
        f"resume from (--no-last-checkpoints writes none): this run would start {start} and write over them. "
        f"Resume with --restore-file {os.path.join(cfg.save_dir, earlier[0])}, or give an empty --save-dir"
    )


def check_built_as_saved(cfg, trainer) -> None:
    """Refuse to resume from (warn on fine-tuning from) a checkpoint whose model was built with other
    weightless settings than this run's (module docstring)."""
    path = restore_path(cfg, trainer)
    if trainer.data_parallel_rank != 0 or not PathManager.isfile(path):
        return
    model_cls = type(trainer.get_model())
    settings = getattr(model_cls, "weightless_settings", None)
    saved_cfg = saved_model_cfg(path)
    if settings is None or saved_cfg is None or _model_class(saved_cfg) is not model_cls:
        return  # nothing to compare, or another model (whose weights will not fit: explained then)
    try:
        theirs, ours = settings(saved_cfg), settings(trainer.cfg.model)
    except (ValueError, TypeError):  # settings this code cannot read: the load decides
        return
    differ = [n for n in theirs if n in ours and theirs[n] != ours[n]]
    if not differ:
        return

    def flags(values):
        return settings_flags({n: values[n] for n in differ})

    finetune = cfg.restore_file == "checkpoint_last.pt" and path == cfg.finetune_from_model
    what = f"--finetune-from-model {path}" if finetune else f"{path} (the checkpoint this run resumes)"
    said = (
        f"{what}: its model was built with {flags(theirs)}, this run builds {flags(ours)}; no weight records "
        "these settings, so the checkpoint loads into either"
    )
    if finetune:
        logger.warning(f"{said}: pass the checkpoint's flags unless the change is meant")
        return
    raise ConfigError(
        f"{said}, and the training would go on with another attention. Resume with the checkpoint's flags, or "
        f"start a new run from it on purpose (--finetune-from-model {path} in another --save-dir)"
    )


def saved_state(path):
    """The checkpoint at ``path`` as torch loads it, memory-mapped (no copy of the weights), or None
    where it cannot be read: every check here reads a checkpoint through it, and leaves a damaged
    file to fairseq's loader, which says what is wrong with it."""
    try:
        return torch.load(path, map_location="cpu", mmap=True)
    except Exception:  # noqa: BLE001
        return None


def saved_model_cfg(path):
    """``cfg.model`` of the checkpoint at ``path`` (a Namespace or DictConfig), None if unreadable."""
    from omegaconf import OmegaConf

    model_cfg = _model_cfg_of(saved_state(path))
    if isinstance(model_cfg, dict):
        model_cfg = OmegaConf.create(model_cfg)
    return model_cfg


def saved_has_ema(path) -> bool:
    """Whether the checkpoint at ``path`` holds an EMA (``extra_state["ema"]``, what --store-ema
    saves); True when it cannot be read (fairseq's loader then says why)."""
    state = saved_state(path)
    if state is None:
        return True
    extra = state.get("extra_state") if isinstance(state, dict) else None
    return isinstance(extra, dict) and "ema" in extra


def saved_task_name(path):
    """The ``--task`` the checkpoint at ``path`` was trained with, None if unreadable or unsaid."""
    state = saved_state(path)
    task = _cfg_section(state, "task")
    name = task.get("_name") if hasattr(task, "get") else getattr(task, "_name", None)
    if name is None and isinstance(state, dict):  # a legacy checkpoint: its argparse namespace
        name = getattr(state.get("args"), "task", None)
    return name


def _model_class(model_cfg):
    from fairseq.models import ARCH_MODEL_REGISTRY

    arch = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None)
    return ARCH_MODEL_REGISTRY.get(arch)


def settings_flags(values: dict) -> str:
    """``{"block_size": 64, "mask_first_token": False}`` -> ``--block-size 64 --mask-first-token false``."""
    return " ".join(f"--{n.replace('_', '-')} {_flag_value(v)}" for n, v in values.items())


def _flag_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "''"
    return shlex.quote(str(value))


def explain_restore_failure(cfg, trainer, error) -> None:
    """Raise a :class:`CheckpointError` saying why the checkpoint does not fit, when it does not: its
    weights (another model), or the optimizer state it resumes (:func:`optimizer_state_problem`)."""
    path = restore_path(cfg, trainer)
    if "Cannot load model parameters from checkpoint" in str(error):
        raise CheckpointError(_explain_mismatch(path, trainer, error)) from error
    problem = optimizer_state_problem(path, trainer, cfg)
    if problem:
        raise CheckpointError(problem) from error


def optimizer_state_problem(path, trainer, cfg):
    """Why the optimizer state saved in ``path`` does not carry over to this run, or None. fairseq
    resumes it only for the same criterion and optimizer (its AssertionErrors), the lr scheduler's
    state only into a scheduler of the same kind (a KeyError). None as well where the run resets
    what does not fit."""
    if cfg.reset_optimizer:
        return None
    state = saved_state(path)  # a best effort on an error path: fairseq's error follows otherwise
    history = state.get("optimizer_history") if isinstance(state, dict) else None
    if not history:
        return None
    last = history[-1]
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.optim import OPTIMIZER_REGISTRY

    fresh = "pass --reset-optimizer (the weights are kept, the optimizer and its schedule start afresh)"
    for what, registry, theirs, ours in (
        ("criterion", CRITERION_REGISTRY, last.get("criterion_name"), type(trainer.get_criterion()).__name__),
        ("optimizer", OPTIMIZER_REGISTRY, last.get("optimizer_name"), type(trainer.optimizer).__name__),
    ):
        if theirs is not None and theirs != ours:
            flags = [f"--{what} {name}" for name, cls in registry.items() if cls.__name__ == theirs]
            named = f"{theirs} ({' or '.join(flags)})" if flags else theirs
            return (
                f"{path} was trained with the {what} {named}, this run's is {ours}: resume with that {what}, or {fresh}"
            )
    saved_schedule = last.get("lr_scheduler_state")
    if not cfg.reset_lr_scheduler and isinstance(saved_schedule, dict):
        missing = sorted(set(trainer.lr_scheduler.state_dict()) - set(saved_schedule))
        if missing:
            name = getattr(trainer.cfg.lr_scheduler, "_name", "this one")
            return (
                f"{path} was trained with another learning-rate schedule than --lr-scheduler {name} (its saved "
                f"state lacks {', '.join(missing)}): resume with its --lr-scheduler, or pass --reset-lr-scheduler"
            )
    return None


def _cfg_section(state, section: str):
    """A loaded checkpoint's ``cfg.<section>`` (a dict, DictConfig or Namespace), None when it has none."""
    cfg = state.get("cfg") if isinstance(state, dict) else None
    if cfg is None:
        return None
    return cfg.get(section) if isinstance(cfg, dict) else getattr(cfg, section, None)


def _model_cfg_of(state):
    """A loaded checkpoint's ``cfg.model`` (a dict, DictConfig or Namespace), else its legacy
    ``args``; None when it holds neither."""
    model_cfg = _cfg_section(state, "model")
    if model_cfg is None and isinstance(state, dict):
        return state.get("args")
    return model_cfg


def _arch_of(state) -> str:
    """``model/arch`` as stored in a fairseq checkpoint (legacy Namespace or dict cfg)."""
    model_cfg = _model_cfg_of(state)
    if model_cfg is None:
        return "unknown"
    get = model_cfg.get if isinstance(model_cfg, dict) else (lambda k, d=None: getattr(model_cfg, k, d))
    name, arch = get("_name"), model_arch(model_cfg)  # fairseq-hydra-train's hold the arch as _name alone
    if not arch:
        return "unknown"
    return f"{arch}" if not name or name == arch else f"{arch} (model {name})"


def _position_rows(state):
    weights = state.get("model", {}) if isinstance(state, dict) else {}
    t = weights.get("encoder.embed_positions.weight") if isinstance(weights, dict) else None
    return None if t is None else int(t.shape[0])


def _checkpoint_facts(path):
    """(arch, encoder position rows) of the checkpoint at ``path``, ("unknown", None) if unreadable.

    Read again on this error path only; memory-mapped, so a large checkpoint costs no copy.
    """
    state = saved_state(path)
    if state is None:  # the explanation is a best effort; fairseq's error follows
        return "unknown", None
    return _arch_of(state), _position_rows(state)


def _explain_mismatch(path, trainer, error) -> str:
    theirs, rows = _checkpoint_facts(path)
    model = trainer.model
    model_cfg = trainer.cfg.model
    ours = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None) or type(model).__name__
    lines = [f"{path}: the checkpoint does not fit the model this run builds (--arch {ours})."]
    if theirs != "unknown" and theirs.split()[0] != ours:
        lines.append(
            f"It was saved by --arch {theirs}: pass that --arch, or start a new run with "
            "--finetune-from-model only between compatible models (convert across families with "
            "lsg-fairseq-convert)."
        )
    encoder = getattr(model, "encoder", None)
    positions = getattr(encoder, "embed_positions", None)
    if rows is not None and positions is not None and getattr(positions, "weight", None) is not None:
        want = int(positions.weight.shape[0])
        if want != rows:
            arch = ours if theirs == "unknown" else theirs.split()[0]
            lines.append(
                f"Its encoder position table holds {rows - 2} positions but --max-source-positions "
                f"{want - 2} needs {want} rows: {longer_positions_hint(arch, path, want - 2)}, "
                f"or use --max-source-positions {rows - 2}."
            )
    cause = error.__cause__ or error.__context__
    if cause is not None:
        detail = [line.strip()[:300] for line in str(cause).strip().splitlines()[:2]]
        lines.append("fairseq: " + " ".join(detail))
    return "\n".join(lines)
