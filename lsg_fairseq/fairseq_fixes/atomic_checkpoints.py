"""Checkpoint writes that a kill or a node crash cannot leave half done (fairseq#2684).

fairseq#2684: a restarted run died on a corrupt checkpoint file. Stock fairseq 0.12 leaves two ways
to get one:

1. ``checkpoint_utils.torch_persistent_save`` writes ``path.tmp`` and renames it, but never
   fsyncs: after a node crash the rename can reach the disk before the data, leaving an empty
   ``checkpoint_last.pt``.
2. ``checkpoint_last.pt`` and ``checkpoint_best.pt`` are *copies* of the first file saved
   (``save_checkpoint`` -> ``PathManager.copy`` -> ``shutil.copyfile``), written in place: a kill
   during the copy leaves a truncated ``checkpoint_last.pt`` and the restart dies on it.

Both now write a hidden temp file in the same folder, fsync it, rename it and fsync the folder
(:func:`lsg_text.atomic.atomic_write`). Remote paths and ``async_write`` keep fairseq's
own code.
"""

import os
import shutil

import torch
from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from lsg_fairseq.checkpoint_io import is_local
from lsg_text.atomic import atomic_write
from lsg_fairseq.fairseq_fixes._wrap import wrap


def _atomic_save(original):
    def torch_persistent_save(obj, filename, async_write: bool = False):
        if async_write or not is_local(filename):
            return original(obj, filename, async_write=async_write)
        with atomic_write(filename) as f:
            torch.save(obj, f)

    return torch_persistent_save


def _atomic_copy(original):
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if not (is_local(src_path) and is_local(dst_path)) or (os.path.exists(dst_path) and not overwrite):
            return original(src_path, dst_path, overwrite=overwrite)
        with open(src_path, "rb") as src, atomic_write(dst_path) as dst:
            shutil.copyfileobj(src, dst, 16 << 20)
        return True

    return copy


def install() -> None:
    wrap(checkpoint_utils, "torch_persistent_save", _atomic_save)
    wrap(PathManager, "copy", _atomic_copy)
