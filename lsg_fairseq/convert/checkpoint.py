"""fairseq -> HF: the checkpoint a family exports, read once (:func:`read_checkpoint`): its weights,
model cfg, the dictionary as the task loads it, and the folders where its tokenizer files are."""

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from lsg_fairseq.checkpoint_policy import model_arch
from lsg_fairseq.convert.common import ExportError, state_mismatches
from lsg_fairseq.tasks.long_document_summarization import TASK_NAME
from lsg_text.fileio import CHECKPOINT_NAMES


@dataclass
class Checkpoint:
    """What a family exports: the model's weights and cfg, its dictionary and where its files are."""

    path: str  # the checkpoint file
    arch: str
    model_cfg: object  # argparse.Namespace or DictConfig (cfg.model)
    state: Dict[str, torch.Tensor]  # fairseq state dict (weights only)
    dictionary: object  # fairseq Dictionary, as the task loads it (with <mask>)
    search_dirs: List[str] = field(default_factory=list)

    def get(self, key: str, default=None):
        """``cfg.model.<key>`` (a Namespace in legacy-arch checkpoints, else a DictConfig)."""
        try:
            value = getattr(self.model_cfg, key)
        except Exception:  # noqa: BLE001  (omegaconf raises on a missing key in struct mode)
            return default
        return default if value is None else value

    def find(self, *names: str) -> Optional[str]:
        """First of ``names`` found in the search folders (checkpoint folder, then data folder)."""
        for folder in self.search_dirs:
            for name in names:
                path = os.path.join(folder, name)
                if os.path.isfile(path):
                    return path
        return None


def resolve_checkpoint(src: str) -> str:
    """``src`` itself, or the first of :data:`CHECKPOINT_NAMES` in the folder ``src``."""
    if os.path.isfile(src):
        return src
    if os.path.isdir(src):
        for name in CHECKPOINT_NAMES:
            if os.path.isfile(os.path.join(src, name)):
                return os.path.join(src, name)
        raise ExportError(f"{src}: no checkpoint in this folder (expected one of {', '.join(CHECKPOINT_NAMES)})")
    raise ExportError(f"{src}: no such file or folder")


def _load_dictionary(task_name: str, search_dirs: List[str], source_lang: Optional[str]):
    from fairseq import tasks

    names = ["dict.txt"] + [f"dict.{source_lang}.txt"] * bool(source_lang)
    for folder in search_dirs:
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                task_cls = tasks.TASK_REGISTRY.get(task_name)
                if task_cls is None:
                    raise ExportError(f"{path}: the checkpoint's task {task_name!r} is not registered")
                # the task's own loader, so symbols it appends (<mask>) are counted as in training
                return task_cls.load_dictionary(path)
    raise ExportError(
        f"no dictionary: none of {', '.join(names)} in {' or '.join(search_dirs)} (put the model's dict.txt "
        "beside the checkpoint)"
    )


def read_checkpoint(src: str) -> Checkpoint:
    """A fairseq checkpoint (or model folder) with its dictionary, looked up beside it, then in the
    checkpoint's ``cfg.task.data`` folder. Optimizer state, iterator and meters are dropped."""
    from fairseq import checkpoint_utils

    path = resolve_checkpoint(src)
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # noqa: BLE001  (any unreadable file gets the same clear refusal)
        raise ExportError(f"{path}: not a readable fairseq checkpoint ({str(e).splitlines()[0][:300]})") from e
    cfg = state.get("cfg")
    if cfg is None or cfg.get("model") is None or not isinstance(state.get("model"), dict):
        raise ExportError(f"{path}: no cfg.model or weights in this checkpoint; cannot tell what model it holds")
    model_cfg = cfg.model
    arch = model_arch(model_cfg)
    search_dirs = [os.path.dirname(os.path.abspath(path))]
    data = cfg.get("task", {}).get("data") if cfg.get("task") is not None else None
    if data:
        data_dir = str(data).split(os.pathsep)[0]
        if os.path.isdir(data_dir) and os.path.abspath(data_dir) not in search_dirs:
            search_dirs.append(os.path.abspath(data_dir))
    task = cfg.get("task") or {}
    dictionary = _load_dictionary(task.get("_name", TASK_NAME), search_dirs, task.get("source_lang"))
    return Checkpoint(path, arch, model_cfg, dict(state["model"]), dictionary, search_dirs)


def model_shapes(checkpoint: Checkpoint) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
    """{name: (shape, dtype)} of the state of the model the checkpoint's cfg and dictionary build,
    as fairseq builds it to load the checkpoint; a cfg it cannot build from (a hand-edited value of
    any type) is refused by name.

    Built under ``FakeTensorMode``: shapes and dtypes only, no memory and no initialisation time (a
    real build of a large model takes seconds)."""
    import copy
    from types import SimpleNamespace

    from fairseq import models
    from torch._subclasses.fake_tensor import FakeTensorMode

    d = checkpoint.dictionary
    task = SimpleNamespace(source_dictionary=d, target_dictionary=d, cfg=SimpleNamespace(data=None))
    try:
        with FakeTensorMode():
            model = models.build_model(copy.deepcopy(checkpoint.model_cfg), task)
            return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    except Exception as e:  # noqa: BLE001  (a cfg fairseq cannot build from: named, whatever the reason)
        odd = _odd_cfg_values(checkpoint)
        why = "; ".join(odd[:3]) if odd else str(e).splitlines()[0][:300]
        raise ExportError(f"{checkpoint.path}: its cfg does not build a {checkpoint.arch} model ({why})") from None


def _odd_cfg_values(checkpoint: Checkpoint) -> List[str]:
    """The cfg values their own flag would refuse (``--encoder-layers abc``, ``--activation-fn [1]``):
    the likely culprits when the cfg does not build, named for the user."""
    import argparse

    from fairseq.models import ARCH_MODEL_REGISTRY

    parser = argparse.ArgumentParser(add_help=False)
    try:
        ARCH_MODEL_REGISTRY[checkpoint.arch].add_args(parser)
    except Exception:  # noqa: BLE001  (no flags to compare with: the build's own message is given)
        return []
    odd = []
    for action in parser._actions:
        value = checkpoint.get(action.dest)
        if value is None or not action.option_strings:
            continue
        try:
            ok = action.type is None or action.type(value if isinstance(value, str) else str(value)) is not None
            ok = ok and (action.choices is None or value in action.choices)
        except Exception:  # noqa: BLE001  (whatever the flag's type raises: the value is not one it takes)
            ok = False
        if not ok:
            odd.append(f"{action.dest} = {value!r}, not a value {action.option_strings[0]} takes")
    return odd


def check_weights_fit(checkpoint: Checkpoint, expected: Dict[str, Tuple[Tuple[int, ...], torch.dtype]]) -> None:
    """Refuse weights that fairseq's strict load into the checkpoint's own model (``expected``, from
    :func:`model_shapes`) would refuse: a tensor missing, unexpected or of another shape, or an
    integer tensor where the model has a float one. The families map the tensors they know by name;
    without this an HF folder could be written that HF fills with random weights, or cannot load."""
    state = checkpoint.state
    missing, unexpected, mis_shaped = state_mismatches({k: shape for k, (shape, _) in expected.items()}, state)
    shaped = set(mis_shaped)
    problems = []
    for label, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            problems.append(f"{label} {', '.join(keys[:5])}" + (f" and {len(keys) - 5} more" if len(keys) > 5 else ""))
    for k in sorted(set(expected) & set(state)):
        shape, dtype = expected[k]
        if k in shaped:
            problems.append(f"{k} is {tuple(state[k].shape)}, the model's {shape}")
        elif dtype.is_floating_point and not state[k].dtype.is_floating_point:
            problems.append(f"{k} holds {state[k].dtype}, the model {dtype}")
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise ExportError(
            f"{checkpoint.path}: the weights do not fit its cfg's {checkpoint.arch} model ({shown}); fairseq "
            "could not load it either"
        )
