"""Checkpoint files: the error type for a bad one, and which paths are this machine's.

A long-document run costs days, so a checkpoint must survive the process being killed (OOM killer,
preemption, ``scancel``, Ctrl-C) at any instant, and a bad checkpoint must be reported as such.
Every local checkpoint is written by :func:`lsg_text.atomic.atomic_write` (temp file, fsync,
rename, folder fsync): fairseq's own saves and copies (and so the converter's and the trainer's)
go through it once :mod:`lsg_fairseq.fairseq_fixes.atomic_checkpoints` is installed. Nothing here
patches fairseq.
"""

from fairseq.file_io import PathManager

from lsg_text.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint file that cannot be used; the message names the file and the fix."""


def is_local(path) -> bool:
    """A path of this machine's file system (not an ``s3://`` / ``manifold://`` URI)."""
    return isinstance(path, str) and not PathManager.path_requires_pathmanager(path)
