"""Plumbing shared by every model family (``convert/bart.py``, ``lsg_bart.py``, ``led.py``, ``locost.py``), both ways.

HF -> fairseq: a family maps an HF folder (or an older fairseq checkpoint) to a fairseq state dict
and the model's hyper-parameter values; this module does the rest the way fairseq itself would:

1. ``read_hf_config`` / ``load_hf_state_dict``: an HF folder read defensively (a damaged file is
   named, with what it looks like);
2. ``write_identity_dict`` / ``write_gpt2_bpe_files``: ``dict.txt`` (fairseq index == HF id) and
   offline GPT-2 BPE files beside the checkpoint (fairseq_notes section 3);
3. ``build_model``: the values, completed by the registered architecture function
   (``arch_defaults``, the one source of every default) -> ``convert_namespace_to_omegaconf`` -> task
   (``long_document_summarization``, data = the output folder) -> ``task.build_model``, exactly
   as ``fairseq-train`` builds a model, so the saved ``cfg`` is one fairseq accepts everywhere;
4. ``save_checkpoint``: strict ``load_state_dict`` then ``torch_persistent_save`` of a complete
   checkpoint ``{cfg, model, optimizer_history, extra_state}`` usable by fairseq-generate, the
   hub, ``--restore-file`` (with ``--reset-*``) and ``--finetune-from-model``.

fairseq -> HF: ``checkpoint.read_checkpoint`` gives a family the ``Checkpoint`` to map (weights,
model cfg, the dictionary as the task loads it, where its tokenizer files are); ``write_json``
and ``dtype_name`` here write what HF writes.
"""

import argparse
import json
import logging
import os
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from lsg_fairseq.tasks.long_document_summarization import TASK_NAME
from lsg_text.argtypes import BOOL_FLAG, bool_flag
from lsg_text.errors import UserError
from lsg_text.jsonl import JSON_ERRORS, json_problem

logger = logging.getLogger(__name__)

SNIFF_BYTES = 512  # of a weights file that does not load: enough to tell an HTML page or an LFS pointer


class ConversionError(UserError, ValueError):
    """A source the converter refuses, with a message naming the file or field at fault."""


class ExportError(ConversionError):
    """A checkpoint or output folder the exporter refuses; the message names the file or flag."""


# ----------------------------------------------------------------------------- reading sources
def read_json(path: str, kind=None):
    """A JSON file; ``kind`` (e.g. ``dict``) is the type its top level must have."""
    if not os.path.exists(path):
        raise ConversionError(f"{path}: missing (expected an HF model folder)")
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except JSON_ERRORS as e:
        raise ConversionError(f"{path}: not valid JSON ({json_problem(e)}); re-download it") from None
    except UnicodeDecodeError as e:
        raise ConversionError(f"{path}: not UTF-8 text (byte offset {e.start}); re-download it") from None
    except OSError as e:
        raise ConversionError(f"{path}: cannot read ({e.strerror})") from None
    if kind is not None and not isinstance(value, kind):
        raise ConversionError(
            f"{path}: expected a JSON {'object' if kind is dict else kind.__name__}, got {type(value).__name__}"
        )
    return value


def read_hf_config(src: str) -> dict:
    return read_json(os.path.join(src, "config.json"), dict)


def check_architectures(config: dict, src: str) -> None:
    """Every family's detection reads ``architectures``: a list of class names, or absent/null."""
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ConversionError(f"{src}/config.json: architectures must be a list of class names, got {archs!r}")


_ABSENT = object()


def config_value(config: dict, key: str, src: str, kind, default=_ABSENT):
    """``config[key]`` checked against ``kind`` (a :class:`lsg_text.argtypes.Range`); absent or
    null: ``default``, or refused by name where there is none. For a typed field read outside the
    mapping rows (:mod:`lsg_fairseq.convert.fields`, which check their own ``kind``)."""
    value = config.get(key)
    if value is None:
        if default is _ABSENT:
            raise ConversionError(
                f"{src}/config.json: {key} is null" if key in config else f"{src}/config.json: missing field {key!r}"
            )
        return default
    problem = kind.problem(value)
    if problem:
        raise ConversionError(f"{src}/config.json: {key} {problem}, got {value!r}")
    return value


def config_flag(config: dict, key: str, src: str, default: bool) -> bool:
    """A true/false field of ``config`` (absent or null: ``default``). A JSON bool, or a string
    :func:`lsg_text.argtypes.bool_flag` reads ("false" is false, not a truthy string); anything else
    is refused by name."""
    return bool_flag(config_value(config, key, src, BOOL_FLAG, default))


def _weights_error(path: str, error: Exception) -> ConversionError:
    """A weights file that does not load: say what it looks like (truncated, an HTML page, ...)."""
    size = os.path.getsize(path) if os.path.exists(path) else 0
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES).lstrip().lower()
    if head.startswith((b"<!doctype", b"<html", b"<?xml", b"<")):
        what = "an HTML/XML page, not weights (a failed download saved as the file?)"
    elif head.startswith(b"version https://git-lfs"):
        what = "a Git LFS pointer, not the weights (run `git lfs pull`)"
    elif size == 0:
        what = "empty"
    else:
        first = (str(error).splitlines() or [""])[0][:200]
        what = f"truncated or not in the expected format ({type(error).__name__}: {first})"
    return ConversionError(f"{path}: cannot load weights: {what}, {size} bytes; re-download it")


def _load_safetensors(path: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as e:  # noqa: BLE001  (safetensors raises its own SafetensorError, OSError, ...)
        raise _weights_error(path, e) from None


def _load_torch_bin(path: str) -> Dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (UnpicklingError, RuntimeError, EOFError, ...)
        raise _weights_error(path, e) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConversionError(f"{path}: not a state dict of tensors (got {type(state).__name__})")
    return state


def load_hf_state_dict(src: str) -> Dict[str, torch.Tensor]:
    """Weights of an HF folder: model.safetensors, sharded safetensors or pytorch_model.bin."""
    single = os.path.join(src, "model.safetensors")
    index = os.path.join(src, "model.safetensors.index.json")
    binary = os.path.join(src, "pytorch_model.bin")
    if os.path.exists(single) or os.path.exists(index):
        if os.path.exists(single):
            return _load_safetensors(single)
        weight_map = read_json(index, dict).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ConversionError(f'{index}: no "weight_map" object of tensor name -> file name')
        state = {}
        for name in sorted(set(weight_map.values())):
            path = os.path.join(src, name)
            if not os.path.isfile(path):
                raise ConversionError(f"{path}: listed in model.safetensors.index.json but missing")
            state.update(_load_safetensors(path))
        return state
    if os.path.exists(binary):
        return _load_torch_bin(binary)
    raise ConversionError(
        f"{src}: no weights found (expected model.safetensors, model.safetensors.index.json or pytorch_model.bin)"
    )


def read_hf_vocab(src: str) -> Optional[Dict[str, int]]:
    path = os.path.join(src, "vocab.json")
    return read_json(path, dict) if os.path.exists(path) else None


# ----------------------------------------------------------------------------- writing outputs
def write_identity_dict(out_dir: str, vocab_size: int) -> str:
    """``dict.txt`` whose fairseq indices equal HF ids: lines ``i 1`` for i = 4 .. V-2.

    fairseq's Dictionary supplies <s> <pad> </s> <unk> (0..3) and the tasks append ``<mask>``,
    which lands on V-1 (fairseq_notes section 3).
    """
    path = os.path.join(out_dir, "dict.txt")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(4, vocab_size - 1):
            f.write(f"{i} 1\n")
    return path


def check_bart_vocab(vocab: Dict[str, int], vocab_size: int, src: str) -> None:
    """HF byte-level BPE ids must be 0..V-1 with BART's specials, so no token map is needed."""
    if not all(isinstance(i, int) for i in vocab.values()):
        raise ConversionError(f"{src}/vocab.json: expected an object of token -> integer id")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise ConversionError(f"{src}/vocab.json: ids are not 0..{len(ids) - 1} without gaps")
    expected = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for tok, i in expected.items():
        if vocab.get(tok) != i:
            raise ConversionError(f"{src}/vocab.json: {tok} has id {vocab.get(tok)}, fairseq needs {i}")
    if len(ids) != vocab_size:
        raise ConversionError(f"{src}/vocab.json has {len(ids)} tokens but the model has {vocab_size} embedding rows")
    if vocab.get("<mask>", vocab_size - 1) != vocab_size - 1:
        raise ConversionError(f"{src}/vocab.json: <mask> must be the last id ({vocab_size - 1})")


def write_gpt2_bpe_files(src: str, out_dir: str) -> List[str]:
    """``encoder.json`` (= vocab.json) and ``vocab.bpe`` (= merges.txt with a ``#version`` header
    and a trailing newline) for ``--bpe gpt2 --gpt2-encoder-json ... --gpt2-vocab-bpe ...``."""
    vocab, merges = os.path.join(src, "vocab.json"), os.path.join(src, "merges.txt")
    if not (os.path.exists(vocab) and os.path.exists(merges)):
        logger.warning("%s: no vocab.json/merges.txt; writing no BPE files", src)
        return []
    shutil.copyfile(vocab, os.path.join(out_dir, "encoder.json"))
    try:
        with open(merges, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ConversionError(f"{merges}: not UTF-8 text (byte offset {e.start}); re-download it") from None
    if not text.startswith("#version"):
        text = "#version: 0.2\n" + text
    if not text.endswith("\n"):
        text += "\n"
    with open(os.path.join(out_dir, "vocab.bpe"), "w", encoding="utf-8") as f:
        f.write(text)
    return [os.path.join(out_dir, "encoder.json"), os.path.join(out_dir, "vocab.bpe")]


def write_token_map(out_dir: str, fairseq_to_hf: Sequence[int]) -> str:
    """``token_map.json``: a list, fairseq index -> HF id (only when they differ)."""
    path = os.path.join(out_dir, "token_map.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(list(map(int, fairseq_to_hf)), f)
    return path


# ----------------------------------------------------------------------------- fairseq side
def arch_defaults(arch: str, **values) -> argparse.Namespace:
    """The hyper-parameters of ``--arch arch`` with ``values`` given: the registered architecture
    function fills every other default, derived ones included (e.g. decoder sizes from encoder
    sizes), exactly as ``fairseq-train --arch arch`` would. The one source of the defaults."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(**{k: v for k, v in values.items() if v is not None})
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def option_names(add_args: Callable) -> tuple:
    """The argparse destinations a model's ``add_*_args(parser)`` defines (its flags' one home)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_args(parser)
    return tuple(a.dest for a in parser._actions)


def option_ranges(add_args: Callable) -> dict:
    """{argparse destination: its declared range} of the flags ``add_*_args(parser)`` defines with a
    :class:`lsg_text.argtypes.Range` type (the others: choices, booleans, strings, left out)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_args(parser)
    return {a.dest: a.type for a in parser._actions if hasattr(a.type, "problem")}


def build_model(out_dir: str, arch: str, values: Dict[str, Any], task: str = TASK_NAME):
    """Build ``(cfg, task, model)`` through fairseq's own training path, from hyper-parameter values.

    ``out_dir`` must already hold ``dict.txt`` (the task reads its dictionary from the data
    folder). The model's hyper-parameters are ``values`` completed by the architecture function
    (:func:`arch_defaults`); everything else (task, optimization, ...) takes the training parser's
    defaults, as ``fairseq-train DATA --task TASK --arch ARCH`` would.
    """
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [os.path.abspath(out_dir), "--task", task, "--arch", arch])
    vars(args).update(vars(arch_defaults(arch, **values)))
    cfg = convert_namespace_to_omegaconf(args)
    fairseq_task = tasks.setup_task(cfg.task)
    try:
        model = fairseq_task.build_model(cfg.model)
    except ValueError as e:
        raise ConversionError(str(e)) from e
    return cfg, fairseq_task, model


def build_model_from_cfg(cfg, out_dir: str):
    """Rebuild ``(cfg, task, model)`` from an existing checkpoint cfg, data = ``out_dir``."""
    from fairseq import tasks
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.task.data = os.path.abspath(out_dir)
    fairseq_task = tasks.setup_task(cfg.task)
    try:
        model = fairseq_task.build_model(cfg.model)
    except ValueError as e:
        raise ConversionError(str(e)) from e
    return cfg, fairseq_task, model


def state_mismatches(
    expected: Dict[str, Tuple[int, ...]], state: Dict[str, torch.Tensor]
) -> Tuple[List[str], List[str], List[str]]:
    """What a strict ``load_state_dict`` refuses: the names (each list sorted) ``state`` lacks, the
    ones it has beyond ``expected`` ({name: shape}), and the ones of another shape."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shaped = [k for k in sorted(set(state) & set(expected)) if tuple(state[k].shape) != tuple(expected[k])]
    return missing, unexpected, shaped


def load_strict(model, state: Dict[str, torch.Tensor]) -> None:
    """Strict load with a readable report of missing / unexpected / mis-shaped tensors."""
    target = model.state_dict()
    missing, unexpected, shaped = state_mismatches({k: tuple(v.shape) for k, v in target.items()}, state)
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(target[k].shape)}" for k in shaped]
    if missing or unexpected or shapes:
        lines = []
        if missing:
            lines.append("missing: " + ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""))
        if unexpected:
            lines.append("unexpected: " + ", ".join(unexpected[:10]) + (" ..." if len(unexpected) > 10 else ""))
        if shapes:
            lines.append("shape mismatch: " + "; ".join(shapes[:10]))
        raise ConversionError("weights do not fit the fairseq model:\n  " + "\n  ".join(lines))
    state = {k: v.to(target[k].dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True)


def save_checkpoint(cfg, model, path: str) -> str:
    """Write a complete fairseq checkpoint (fairseq_notes section 3, "Checkpoint to write")."""
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    from lsg_text.atomic import final_location

    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    # the data folder is the output folder: record where it will be, not the temp folder
    task = container.get("task") or {}
    if isinstance(task.get("data"), str) and task["data"]:
        task["data"] = final_location(task["data"])
    state = {
        "cfg": container,
        "args": None,
        "model": model.state_dict(),
        "optimizer_history": [
            {
                "criterion_name": "CrossEntropyCriterion",
                "optimizer_name": "NoneType",
                "lr_scheduler_state": {"best": None},
                "num_updates": 0,
            }
        ],
        "extra_state": {"train_iterator": {"epoch": 1}},
        "last_optimizer_state": None,
    }
    checkpoint_utils.torch_persistent_save(state, path)
    return path


# ----------------------------------------------------------------------------- HF files
def write_json(folder: str, name: str, obj) -> str:
    """``folder/name`` as HF writes its JSON files (indented, sorted keys, final newline)."""
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def dtype_name(state: Dict[str, torch.Tensor]) -> str:
    """``torch_dtype`` of config.json: the weights' one floating dtype (else float32)."""
    floats = {t.dtype for t in state.values() if t.is_floating_point()}
    return str(floats.pop()).replace("torch.", "") if len(floats) == 1 else "float32"
