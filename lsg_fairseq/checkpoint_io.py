"""Checkpoint files: the error type for a bad one, and all-or-nothing writes.

A long-document run costs days, so a checkpoint must survive the process being killed (OOM killer,
preemption, ``scancel``, Ctrl-C) at any instant, and a bad checkpoint must be reported as such.
:func:`atomic_write` is how every checkpoint is written: fairseq's own saves and copies (and so the
converter's and the trainer's) go through it once :mod:`lsg_fairseq.fairseq_fixes.atomic_checkpoints`
is installed. Nothing here patches fairseq.
"""
import contextlib
import glob
import os
import tempfile

from fairseq.file_io import PathManager

from lsg_fairseq.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint file that cannot be used; the message names the file and the fix."""


def is_local(path) -> bool:
    """A path of this machine's file system (not an ``s3://`` / ``manifold://`` URI)."""
    return isinstance(path, str) and not PathManager.path_requires_pathmanager(path)


# ----------------------------------------------------------------------------- atomic writes
def _fsync_dir(folder: str) -> None:
    # Makes the rename itself durable; not every OS/file system lets a folder be opened.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temp_prefix(path: str) -> str:
    # Hidden and never matching fairseq's checkpoint patterns (checkpoint_\d+_(\d+)\.pt, ...), so
    # --keep-interval-updates and checkpoint averaging never pick a temp file up.
    return "." + os.path.basename(path) + "."


@contextlib.contextmanager
def atomic_write(path: str):
    """Yield a binary file; on success it is fsynced and renamed onto ``path`` (all or nothing).

    On an exception the temp file is removed and ``path`` is untouched. A temp file left by a
    SIGKILL (``.NAME.XXXX.tmp``) is removed by the next successful write of the same ``path``.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual mode
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(folder)
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
    for stale in glob.glob(os.path.join(glob.escape(folder), glob.escape(_temp_prefix(path)) + "*.tmp")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(stale)
