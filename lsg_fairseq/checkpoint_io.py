"""Crash-safe checkpoint files and checkpoint errors that name the file, for fairseq's own trainer.

A long-document run costs days, so a checkpoint must survive the process being killed (OOM killer,
preemption, ``scancel``, Ctrl-C) at any instant, and a bad checkpoint must be reported as such.
Stock fairseq (0.12) falls short in four ways, each patched here at plugin import without forking
the trainer (every patch only changes behaviour for local files and is idempotent):

1. ``checkpoint_utils.torch_persistent_save`` writes ``path.tmp`` and renames it, but never
   fsyncs: after a node crash the rename can reach the disk before the data, leaving an empty
   ``checkpoint_last.pt``. We write a unique temp file in the same folder, fsync it, ``os.replace``
   it and fsync the folder.
2. ``checkpoint_last.pt`` and ``checkpoint_best.pt`` are *copies* of the first checkpoint written
   (``checkpoint_utils.save_checkpoint`` -> ``PathManager.copy`` -> ``shutil.copyfile``), which
   writes in place: a kill during that copy leaves a truncated ``checkpoint_last.pt`` and the
   restart dies on it. The copy now goes through the same temp + fsync + rename.
3. ``torch.load`` of a truncated or corrupt file fails with ``PytorchStreamReader failed reading zip
   archive`` and no file name; :func:`load_checkpoint_to_cpu` now raises
   :class:`CheckpointError` naming the file, and adds the file name to any other load error.
4. ``--restore-file some/typo.pt`` that does not exist makes fairseq log "No existing checkpoint
   found" and **train from scratch**; we refuse it. A checkpoint of another architecture (or with a
   shorter position table than ``--max-source-positions`` needs) fails in fairseq with "please
   ensure that the architectures match"; we say which architecture / how many positions the
   checkpoint has and what to do.
"""
import logging
import os
import shutil
import zipfile

import torch
from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from lsg_text.errors import MissingFileError, UserError
from lsg_text.fileio import atomic_write

logger = logging.getLogger(__name__)

_PATCHED_FLAG = "_lsg_fairseq_atomic"
# path -> small facts about the checkpoint last loaded from it (never the tensors)
_LOADED_INFO = {}


class CheckpointError(UserError, RuntimeError):
    """A checkpoint file that cannot be used; the message names the file and the fix."""


# ----------------------------------------------------------------------------- atomic writes
def _is_local(path) -> bool:
    return isinstance(path, str) and not PathManager.path_requires_pathmanager(path)


def _make_atomic_save(original):
    def torch_persistent_save(obj, filename, async_write: bool = False):
        if async_write or not _is_local(filename):
            return original(obj, filename, async_write=async_write)
        with atomic_write(filename) as f:
            torch.save(obj, f)

    torch_persistent_save.__doc__ = "fairseq's torch_persistent_save, made atomic and durable (lsg_fairseq.checkpoint_io)."
    setattr(torch_persistent_save, _PATCHED_FLAG, original)
    return torch_persistent_save


def _make_atomic_copy(original):
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if not (_is_local(src_path) and _is_local(dst_path)) or (os.path.exists(dst_path) and not overwrite):
            return original(src_path, dst_path, overwrite=overwrite)
        with open(src_path, "rb") as src, atomic_write(dst_path) as dst:
            shutil.copyfileobj(src, dst, 16 << 20)
        return True

    setattr(copy, _PATCHED_FLAG, original)
    return staticmethod(copy)


# ----------------------------------------------------------------------------- loading
def _arch_of(state) -> str:
    """``model/arch`` as stored in a fairseq checkpoint (legacy Namespace or dict cfg)."""
    model_cfg = None
    cfg = state.get("cfg") if isinstance(state, dict) else None
    if cfg is not None:
        model_cfg = cfg.get("model") if isinstance(cfg, dict) else getattr(cfg, "model", None)
    if model_cfg is None and isinstance(state, dict):
        model_cfg = state.get("args")
    if model_cfg is None:
        return "unknown"
    get = model_cfg.get if isinstance(model_cfg, dict) else (lambda k, d=None: getattr(model_cfg, k, d))
    name, arch = get("_name"), get("arch")
    return f"{arch}" if not name or name == arch else f"{arch} (model {name})"


def _position_rows(state):
    weights = state.get("model", {}) if isinstance(state, dict) else {}
    t = weights.get("encoder.embed_positions.weight") if isinstance(weights, dict) else None
    return None if t is None else int(t.shape[0])


def _make_checked_load(original):
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        try:
            state = original(path, arg_overrides=arg_overrides, load_on_all_ranks=load_on_all_ranks)
        except FileNotFoundError:
            raise
        except Exception as e:
            # torch.save has written zip archives since torch 1.6; a truncated one has lost its
            # central directory, so a file that is not a readable zip and did not load is damaged
            # (old non-zip checkpoints that load fine never get here).
            local = _is_local(path) and os.path.isfile(path)
            if local and not zipfile.is_zipfile(path):
                size = os.path.getsize(path)
                detail = type(e).__name__ + (f": {str(e).splitlines()[0]}" if str(e) else "")
                raise CheckpointError(
                    f"{path}: truncated or corrupt checkpoint ({size} bytes, not a complete torch.save "
                    f"archive; torch.load: {detail}). If a run was killed while "
                    "writing it with a fairseq that lacks lsg_fairseq's atomic saves, restart from the "
                    "previous checkpoint_*.pt with --restore-file"
                ) from e
            if local and isinstance(e, (KeyError, TypeError, AttributeError)):
                # a torch.save archive of something else (an HF pytorch_model.bin, a tensor, ...)
                detail = type(e).__name__ + (f": {str(e).splitlines()[0][:200]}" if str(e) else "")
                raise CheckpointError(
                    f"{path}: a torch file but not a fairseq checkpoint ({detail}); convert HF weights "
                    "with lsg-fairseq-convert, or point at a checkpoint_*.pt written by fairseq-train"
                ) from e
            e.add_note(f"(while loading the checkpoint {path})")
            raise
        if isinstance(path, str):
            _LOADED_INFO[path] = {"arch": _arch_of(state), "position_rows": _position_rows(state)}
        return state

    setattr(load_checkpoint_to_cpu, _PATCHED_FLAG, original)
    return load_checkpoint_to_cpu


def _restore_path(cfg, trainer):
    """The file fairseq's load_checkpoint will read for a non-default --restore-file."""
    suffix = trainer.checkpoint_suffix
    return cfg.restore_file.replace(".pt", suffix + ".pt") if suffix is not None else cfg.restore_file


def _explain_mismatch(path, trainer, error) -> str:
    info = _LOADED_INFO.get(path, {})
    model = trainer.model
    model_cfg = trainer.cfg.model
    ours = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None) or type(model).__name__
    lines = [f"{path}: the checkpoint does not fit the model this run builds (--arch {ours})."]
    theirs = info.get("arch")
    if theirs and theirs != "unknown" and theirs.split()[0] != ours:
        lines.append(
            f"It was saved by --arch {theirs}: pass that --arch, or start a new run with "
            "--finetune-from-model only between compatible models (convert across families with "
            "lsg-fairseq-convert)."
        )
    rows = info.get("position_rows")
    encoder = getattr(model, "encoder", None)
    positions = getattr(encoder, "embed_positions", None)
    if rows is not None and positions is not None and getattr(positions, "weight", None) is not None:
        want = int(positions.weight.shape[0])
        if want != rows:
            lines.append(
                f"Its encoder position table holds {rows - 2} positions but --max-source-positions "
                f"{want - 2} needs {want} rows: extend it with `lsg-fairseq-convert {path} OUT_DIR "
                f"--max-source-positions {want - 2}` (tiles the table), or use --max-source-positions "
                f"{rows - 2}."
            )
    cause = error.__cause__ or error.__context__
    if cause is not None:
        detail = [line.strip()[:300] for line in str(cause).strip().splitlines()[:2]]
        lines.append("fairseq: " + " ".join(detail))
    return "\n".join(lines)


def _make_checked_restore(original):
    def load_checkpoint(cfg, trainer, **passthrough_args):
        path = None
        if cfg.restore_file != "checkpoint_last.pt":
            path = _restore_path(cfg, trainer)
            # fairseq would log "No existing checkpoint found" and silently train from scratch.
            # Only rank 0 reads the file (the others get it by broadcast), so only it checks.
            if trainer.data_parallel_rank == 0 and not PathManager.isfile(path):
                raise MissingFileError(
                    f"--restore-file {cfg.restore_file}: no such file ({path}); fairseq would silently "
                    "train from scratch. Give an existing checkpoint, or leave --restore-file out to "
                    "resume from --save-dir/checkpoint_last.pt"
                )
        else:
            path = os.path.join(cfg.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
            if not PathManager.exists(path) and cfg.finetune_from_model:
                path = cfg.finetune_from_model
        try:
            return original(cfg, trainer, **passthrough_args)
        except Exception as e:
            if "Cannot load model parameters from checkpoint" not in str(e):
                raise
            raise CheckpointError(_explain_mismatch(path, trainer, e)) from e

    setattr(load_checkpoint, _PATCHED_FLAG, original)
    return load_checkpoint


def install() -> None:
    """Patch fairseq (idempotent): atomic saves/copies, clear load and restore errors."""
    if not hasattr(checkpoint_utils.torch_persistent_save, _PATCHED_FLAG):
        checkpoint_utils.torch_persistent_save = _make_atomic_save(checkpoint_utils.torch_persistent_save)
    if not hasattr(PathManager.copy, _PATCHED_FLAG):
        PathManager.copy = _make_atomic_copy(PathManager.copy)
    if not hasattr(checkpoint_utils.load_checkpoint_to_cpu, _PATCHED_FLAG):
        checkpoint_utils.load_checkpoint_to_cpu = _make_checked_load(checkpoint_utils.load_checkpoint_to_cpu)
    if not hasattr(checkpoint_utils.load_checkpoint, _PATCHED_FLAG):
        checkpoint_utils.load_checkpoint = _make_checked_restore(checkpoint_utils.load_checkpoint)


install()
