"""fairseq-hydra-train's config, checked where fairseq-train's argparse would have checked it.

Under fairseq-hydra-train a legacy (argparse) model, as this plugin's are, gets a config group with
no schema: its keys and values pass no flag parser, so a misspelt key is ignored and a wrong value
fails deep in the model. And the task's and the model's position limits, one flag for
fairseq-train, are two keys there. The tasks' ``vet_run`` calls :func:`check_hydra_keys` on the
config as hydra composed it (command ``fairseq_cli.hydra_train``,
:mod:`lsg_fairseq.fairseq_fixes.run_hooks`), and :func:`check_hydra_positions` with the run's
other settings (:func:`lsg_fairseq.tasks.run_settings.check_training_args`). The checks shared
with fairseq-train name its flags; under hydra :func:`in_hydra_terms` puts the config's keys in
their place (``--update-freq 0`` -> ``optimization.update_freq 0``).
"""

import argparse
import contextlib
import dataclasses
import difflib
import re
from argparse import Namespace
from typing import Optional

from fairseq.models import ARCH_CONFIG_REGISTRY
from omegaconf import OmegaConf

from lsg_text.errors import ConfigError, UserError


def hydra_model_arch(cfg):
    """The arch function of a legacy model configured by fairseq-hydra-train (its ``cfg.model`` a
    config, not fairseq-train's flat namespace), else None."""
    model = cfg.model
    return ARCH_CONFIG_REGISTRY.get(model.get("_name")) if OmegaConf.is_config(model) else None


# keys a legacy model reads that fairseq-train's flat namespace holds beside its own flags (LOCOST's
# ssm_lr is set against the base lr, named by interpolation in a hydra config: models/locost.py)
FLAT_KEYS_READ = ("lr", "optimizer", "weight_decay")


def model_flags(arch_name: str) -> dict:
    """A legacy arch's model flags (``add_args``), as argparse actions by destination."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[arch_name].add_args(parser)
    return {a.dest: a for a in parser._actions}


def model_settings(arch_name: str, flags: dict) -> set:
    """What a legacy arch's config may hold: its model's ``flags`` (:func:`model_flags`), what its
    arch function sets, and the keys of :data:`FLAT_KEYS_READ`."""
    defaults = Namespace()
    ARCH_CONFIG_REGISTRY[arch_name](defaults)
    return set(flags) | set(vars(defaults)) | {"_name", "arch", *FLAT_KEYS_READ}


def flag_value_problem(action: argparse.Action, value) -> Optional[str]:
    """What argparse would say of ``value`` for ``action`` (its type and choices), or None: a
    hydra model config's values arrive already typed by YAML, past the flag's parser."""
    if value is None or action.type is None and not action.choices:
        return None
    typed = value
    if action.type is not None:
        try:
            typed = action.type(value if isinstance(value, str) else str(value))
        except argparse.ArgumentTypeError as e:
            return str(e)
        except (TypeError, ValueError):
            kind = {int: "an integer", float: "a number"}.get(action.type, getattr(action.type, "__name__", "valid"))
            return f"must be {kind}"
    if action.choices and typed not in action.choices:
        return f"must be one of {', '.join(map(str, action.choices))}"
    return None


def check_hydra_keys(cfg) -> None:
    """Every key of a fairseq-hydra-train config's groups is a setting of what it configures, and a
    legacy model's values are what its flags take. A legacy model has no schema under hydra: a
    misspelt key (``sparsity_typ``) is ignored without a word, the run trains the default, and a
    value of the wrong type or choice (``block_size: abc``, ``sparsity_type: foo``) ends in a
    traceback deep in the model. A misspelt key of a task, optimizer, scheduler or criterion ends in
    omegaconf's ConfigKeyError traceback once fairseq builds it."""
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    groups = {"model": None, "task": TASK_DATACLASS_REGISTRY}
    groups.update({g: REGISTRIES[g]["dataclass_registry"] for g in ("criterion", "optimizer", "lr_scheduler")})
    for group, registry in groups.items():
        section = cfg.get(group)
        name = section.get("_name") if OmegaConf.is_config(section) else None  # a bare name: no keys
        if group == "model":
            if name not in ARCH_CONFIG_REGISTRY:
                continue
            flags = model_flags(name)
            known = model_settings(name, flags)
        else:
            dc = registry.get(name)
            if dc is None:
                continue
            flags, known = {}, {f.name for f in dataclasses.fields(dc)} | {"_name"}
        for key in section:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise ConfigError(f"{group}.{key}: not a setting of {group} {name}{hint}")
            problem = flag_value_problem(flags[key], section[key]) if key in flags else None
            if problem:
                raise ConfigError(f"{group}.{key} {section[key]}: {problem}")


def check_hydra_positions(cfg) -> None:
    """Under fairseq-hydra-train, the task's and the model's position limits agree. fairseq-train's
    ``--max-source-positions`` sets both; a hydra config keeps two settings, the task's defaulting
    to 1,024 and the model's to its arch's (4,096 for lsg_bart_base): the effective limit is the
    smaller one, and with ``truncate_source`` a long-input model would train on 1,024 tokens
    without a word."""
    model, arch = cfg.model, hydra_model_arch(cfg)
    if arch is None:
        return  # fairseq-train (its model config is the flat namespace), or no legacy arch
    defaults = Namespace(**OmegaConf.to_container(model, resolve=True))
    arch(defaults)
    for key in ("max_source_positions", "max_target_positions"):
        ours, task = getattr(defaults, key, None), getattr(cfg.task, key, None)
        if ours is not None and task is not None and ours != task:
            raise ConfigError(
                f"task.{key} {task} and model.{key} {ours} (arch {model._name}) differ: fairseq-hydra-train keeps "
                "them apart (fairseq-train sets both with one flag); set both to the length to train at"
            )


# The groups of a fairseq config in the order a setting is looked up: fairseq's own groups first (lr
# lives in optimization, though the optimizer and the scheduler hold a copy), then what the run names
CONFIG_GROUPS = (
    "common", "common_eval", "distributed_training", "dataset", "optimization", "checkpoint", "bmuf",
    "generation", "eval_lm", "interactive", "ema", "model", "task", "criterion", "optimizer",
    "lr_scheduler", "scoring", "bpe", "tokenizer",
)  # fmt: skip
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def under_hydra() -> bool:
    """Whether this process runs a hydra app's job (fairseq-hydra-train's main)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.initialized()


def config_key(flag: str, cfg) -> Optional[str]:
    """The ``group.key`` of fairseq-train's ``--flag`` in a hydra config, or None where none holds it
    (a legacy model's group holds only what the YAML gives: its flags are looked up too)."""
    key = flag.replace("-", "_")
    if key in CONFIG_GROUPS or key == "arch":  # --lr-scheduler, --arch: the name of a group's choice
        return f"{'model' if key == 'arch' else key}._name"
    arch = cfg.model.get("_name") if OmegaConf.is_config(cfg.get("model")) else None
    for group in CONFIG_GROUPS:
        section = cfg.get(group)
        if OmegaConf.is_config(section) and key in section:
            return f"{group}.{key}"
        if group == "model" and arch in ARCH_CONFIG_REGISTRY and key in model_settings(arch, model_flags(arch)):
            return f"model.{key}"
    return None


def in_config_keys(message: str, cfg) -> str:
    """``message`` with each fairseq-train flag it names as the hydra config's key
    (``--update-freq 0`` -> ``optimization.update_freq 0``); a flag no group holds stays."""
    return FLAG.sub(lambda m: config_key(m.group(1), cfg) or m.group(0), message)


def in_hydra_terms(error, cfg):
    """``error`` (returned), its message naming the config's keys where this process runs
    fairseq-hydra-train: the checks it shares with fairseq-train name that command's flags."""
    if isinstance(error, UserError) and error.args and isinstance(error.args[0], str) and under_hydra():
        error.args = (in_config_keys(error.args[0], cfg), *error.args[1:])
    return error


@contextlib.contextmanager
def refusals_in_config_keys(cfg):
    """A refusal raised inside, in the config's keys under fairseq-hydra-train (:func:`in_hydra_terms`)."""
    try:
        yield
    except UserError as e:
        raise in_hydra_terms(e, cfg)
