"""fairseq-hydra-train's config, checked where fairseq-train's argparse would have checked it.

Under fairseq-hydra-train a legacy (argparse) model, as this plugin's are, gets a config group with
no schema: its keys and values pass no flag parser, so a misspelt key is ignored and a wrong value
fails deep in the model. And the task's and the model's position limits, one flag for
fairseq-train, are two keys there. The tasks' ``vet_run`` calls :func:`check_hydra_keys` on the
config as hydra composed it (command ``fairseq_cli.hydra_train``,
:mod:`lsg_fairseq.fairseq_fixes.run_hooks`), and :func:`check_hydra_positions` with the run's
other settings (:func:`lsg_fairseq.tasks.run_settings.check_training_args`).
"""

import argparse
import dataclasses
import difflib
from argparse import Namespace
from typing import Optional

from fairseq.models import ARCH_CONFIG_REGISTRY
from omegaconf import OmegaConf

from lsg_text.errors import ConfigError


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
                f"them apart (fairseq-train's --{key.replace('_', '-')} sets both); set both to the length "
                "to train at"
            )
