"""fairseq checkpoint -> HF folder: the inverse of :func:`lsg_fairseq.convert.convert`.

Contract::

    lsg-fairseq-export CKPT_OR_MODEL_DIR HF_DIR [--force]
    python -m lsg_fairseq.cli.export ...         (same)
    lsg_fairseq.convert.export(src, out, force=False)

``src`` is a fairseq checkpoint (``model.pt`` written by ``lsg-fairseq-convert``, or a training
run's ``checkpoint_best.pt`` / ``checkpoint_last.pt``) or a folder holding ``model.pt``
(else ``checkpoint_best.pt``). Only the weights and the model cfg are read: optimizer state,
training iterator and meters are dropped. The dictionary (``dict.txt``, or the training data's
``dict.<source_lang>.txt``) and tokenizer files are looked up beside the checkpoint, then in the
checkpoint's ``cfg.task.data`` folder.

Families (by ``cfg.model.arch``; ``hf_export_bart`` and ``hf_export_locost`` hold the mappings):

- ``bart_*``     -> ``BartForConditionalGeneration`` folder;
- ``lsg_bart_*`` -> the LSG-BART folder the LSG authors publish (spec/lsg.md sections 1 and 6);
- ``led_*``      -> ``LEDForConditionalGeneration`` folder;
- ``locost_*``   -> the reference LOCOST folder (spec/locost.md section 5), ``token_map.json``
  (fairseq index -> HF id) undone.

The HF folder is written into a temp folder beside ``HF_DIR`` and renamed into place at the end,
so a refusal or a crash leaves no half-written output.
"""
import contextlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from lsg_fairseq.convert import ConversionError

logger = logging.getLogger(__name__)

CHECKPOINT_NAMES = ("model.pt", "checkpoint_best.pt", "checkpoint_last.pt")
SPM_NAMES = ("spm.model", "sentencepiece.bpe.model", "sentencepiece.model", "spiece.model")


class ExportError(ConversionError):
    """A checkpoint or output folder the exporter refuses; the message names the file or flag."""


@dataclass
class Source:
    """What a family exporter gets: the model's weights and cfg, its dictionary and files."""

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


# ----------------------------------------------------------------------------- reading the source
def resolve_checkpoint(src: str) -> str:
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


def read_source(src: str) -> Source:
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
    arch = str(getattr(model_cfg, "arch", None) or model_cfg.get("arch", None) or model_cfg.get("_name", ""))
    search_dirs = [os.path.dirname(os.path.abspath(path))]
    data = cfg.get("task", {}).get("data") if cfg.get("task") is not None else None
    if data:
        data_dir = str(data).split(os.pathsep)[0]
        if os.path.isdir(data_dir) and os.path.abspath(data_dir) not in search_dirs:
            search_dirs.append(os.path.abspath(data_dir))
    task = cfg.get("task") or {}
    dictionary = _load_dictionary(task.get("_name", "long_document_summarization"), search_dirs,
                                  task.get("source_lang"))
    return Source(path, arch, model_cfg, dict(state["model"]), dictionary, search_dirs)


# ----------------------------------------------------------------------------- writing the output
@contextlib.contextmanager
def staged_folder(out: str, force: bool, protected: List[str]):
    """Yield a temp folder that replaces ``out`` when the block succeeds (removed otherwise).

    Mirrors the converter's output rule (issue 14): an existing non-empty ``out`` is refused
    unless ``force``; the result appears all at once by a rename in the same parent folder.
    """
    out = os.path.abspath(out)
    for path in protected:
        if out == path or path.startswith(out + os.sep):
            raise ExportError(f"{out}: the output folder would replace the source ({path})")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"{out}: exists and is not a folder")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise ExportError(f"{out}: exists and is not empty; pass --force to replace it")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=parent)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700 folders
        if os.path.exists(out):
            old = tmp + ".old"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(folder: str, name: str, obj) -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def dtype_name(state: Dict[str, torch.Tensor]) -> str:
    floats = {t.dtype for t in state.values() if t.is_floating_point()}
    return str(floats.pop()).replace("torch.", "") if len(floats) == 1 else "float32"


# ----------------------------------------------------------------------------- dispatch
def family_of(arch: str) -> Optional[str]:
    for prefix in ("lsg_bart", "bart", "led", "locost"):
        if arch == prefix or arch.startswith(prefix + "_"):
            return prefix
    return None


def export(src: str, out: str, force: bool = False) -> str:
    """Write the HF folder ``out`` for the fairseq model ``src``; returns ``out``."""
    source = read_source(src)
    family = family_of(source.arch)
    if family is None:
        raise ExportError(
            f"{source.path}: arch {source.arch!r} has no HuggingFace format here "
            "(known: bart_*, lsg_bart_*, led_*, locost_*)"
        )
    if family == "locost":
        from lsg_fairseq.convert.hf_export_locost import export_locost as write
    else:
        from lsg_fairseq.convert.hf_export_bart import export_bart_family as write
    # map every tensor before creating anything, so a refusal leaves no output behind
    files = write(source, family)
    with staged_folder(out, force, protected=source.search_dirs) as tmp:
        files(tmp)
    return os.path.abspath(out)
