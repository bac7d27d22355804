"""Writes that land all or nothing: files (:func:`atomic_files` and its two forms) and whole
folders (:func:`atomic_folder`).

Every script writes its outputs through :func:`atomic_outputs`, so a run that fails half-way
(bad JSON on line 4,000, a missing BPE file, Ctrl-C) leaves no truncated file behind that a later
``fairseq-preprocess`` would silently accept. Checkpoints go through :func:`atomic_write`; both
share one core, :func:`atomic_files`. Commands that write a whole folder (the converter, the
exporter) use :func:`atomic_folder`. What is refused before anything is written (an output that is
an input, a non-empty folder without ``--force``) is checked by :mod:`lsg_text.fileio`.
"""

import contextlib
import ctypes
import glob
import os
import shutil
import sys
import tempfile
from typing import IO, Dict, Iterator, List, Optional, Sequence

from lsg_text.fileio import check_output_folder, refuse_clobber, same_or_inside


def _usual_mode(bits: int) -> int:
    """``bits`` under the process umask: mkstemp / mkdtemp make 0600 / 0700, a plain open would not."""
    umask = os.umask(0)
    os.umask(umask)
    return bits & ~umask


def _temp_prefix(path: str) -> str:
    # Hidden, and never matching fairseq's checkpoint patterns (checkpoint_\d+_(\d+)\.pt, ...), so
    # --keep-interval-updates and checkpoint averaging never pick a temp file up.
    return "." + os.path.basename(path) + "."


def _remove_stale_temps(path: str) -> None:
    """Delete the temp files or folders that writers of ``path`` killed earlier left beside it.

    The pattern is tempfile's own name (prefix, 8 random characters, ``.tmp``), so the temps of a
    longer name that shares the prefix (``.out.v2.XXXXXXXX.tmp`` beside ``out``) never match.
    """
    folder = os.path.dirname(os.path.abspath(path))
    pattern = glob.escape(_temp_prefix(path)) + "?" * 8 + ".tmp"
    for stale in glob.glob(os.path.join(glob.escape(folder), pattern)):
        if os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(stale)


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):  # not every OS / file system lets a folder be opened
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_files(paths: Sequence[str], mode: str = "wb", **open_kwargs) -> Iterator[List[IO]]:
    """Open every path for writing as a hidden temp file beside it; each path is replaced only by
    a complete file, and only once every file is written.

    On a clean exit each temp file is flushed and fsynced, given the usual mode and renamed onto
    its path (the renames come last, one after another), then each folder is fsynced: a node
    crash right after must not undo a rename or leave an empty file. Then the temps that killed
    writers of the same paths left (``.NAME.XXXXXXXX.tmp``) are deleted. On an exception every
    temp file is deleted and no path is touched. The core of :func:`atomic_write` (checkpoints)
    and :func:`atomic_outputs` (scripts).
    """
    handles: List[IO] = []
    temps: Dict[str, str] = {}
    try:
        for path in paths:
            folder = os.path.dirname(os.path.abspath(path))
            os.makedirs(folder, exist_ok=True)
            fd, temps[path] = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=folder)
            os.close(fd)
            # Opened by name so that ``handle.name`` is the temp path (callers re-count lines).
            handles.append(open(temps[path], mode, **open_kwargs))
        yield handles
        for handle in handles:
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        file_mode = _usual_mode(0o666)
        for path, tmp in temps.items():
            os.chmod(tmp, file_mode)
            os.replace(tmp, path)
        temps.clear()
        for folder in dict.fromkeys(os.path.dirname(os.path.abspath(path)) for path in paths):
            _fsync_dir(folder)
    finally:
        for handle in handles:
            handle.close()
        for tmp in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
    for path in paths:
        _remove_stale_temps(path)


@contextlib.contextmanager
def atomic_write(path: str) -> Iterator[IO[bytes]]:
    """One binary file that replaces ``path`` all or nothing, durably (:func:`atomic_files`)."""
    with atomic_files([path]) as (handle,):
        yield handle


@contextlib.contextmanager
def atomic_outputs(paths: Sequence[str], inputs: Sequence[str] = ()) -> Iterator[List[IO[str]]]:
    """Open ``paths`` for writing (UTF-8, ``\\n`` line ends), committed together by
    :func:`atomic_files`: either every output appears complete or none is touched.

    ``"-"`` means stdout (written directly: a pipe cannot be made atomic). An output that is one
    of ``inputs`` is refused before anything is opened (:func:`refuse_clobber`).
    """
    refuse_clobber(paths, inputs)
    files = [path for path in paths if path != "-"]
    with atomic_files(files, "w", encoding="utf-8", newline="\n") as handles:
        opened = iter(handles)
        yield [sys.stdout if path == "-" else next(opened) for path in paths]


# temp folder -> the folder it becomes on success; lets writers record final paths (a checkpoint's
# cfg.task.data) while they still write into the temp folder.
_PENDING_FOLDERS: Dict[str, str] = {}


def as_the_user_named_it(path, out: str) -> str:
    """``path`` of an error (an ``OSError``'s filename, may be None) as the user knows it: ``out``
    when it is, or lies in, ``out``'s staging copy (the hidden temp beside it, gone after a failure)."""
    if not path:
        return out
    prefix = _temp_prefix(out)
    parts = os.path.normpath(os.fsdecode(path)).split(os.sep)
    return out if any(p.startswith(prefix) and p.endswith(".tmp") for p in parts) else os.fsdecode(path)


def final_location(path: str) -> str:
    """Where ``path`` (inside an :func:`atomic_folder` temp folder) will be once the folder is in
    place; other paths are returned as they are (absolute)."""
    path = os.path.abspath(path)
    for tmp, final in _PENDING_FOLDERS.items():
        if same_or_inside(path, tmp):
            return os.path.join(final, os.path.relpath(path, tmp)) if path != tmp else final
    return path


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False when unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _fsync_tree(folder: str) -> None:
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)


@contextlib.contextmanager
def atomic_folder(out: str, force: bool = False, inputs: Sequence[str] = (), flag: str = "--force") -> Iterator[str]:
    """Write a whole output folder all-or-nothing: yields a temp folder beside ``out`` to fill.

    Usage (the converter; an exporter does the same)::

        with atomic_folder(out, force=args.force, inputs=[src]) as tmp:
            write_everything_into(tmp)

    * Before anything is written, :func:`check_output_folder` refuses an ``out`` that is a file,
      that is or holds one of ``inputs``, or that is a non-empty folder without ``force``.
    * The temp folder ``.NAME.XXXX.tmp`` lives in ``out``'s parent (same file system, so the final
      rename is atomic). On an exception it is deleted and ``out`` is untouched.
    * On success its files are fsynced and it replaces ``out`` in one step: a plain rename when
      ``out`` is absent or empty; with ``force``, an atomic exchange of the two folders (Linux
      ``renameat2``; elsewhere two renames, with a moment where ``out`` is missing) after which
      the old folder is deleted as a whole, so old and new files never mix.
    * A process killed at any instant leaves either the previous ``out`` or the complete new one,
      plus at most a hidden temp folder, which the next successful write of ``out`` removes.
    * :func:`final_location` maps paths inside the temp folder to their final place.
    """
    out = os.path.abspath(out)
    check_output_folder(out, force, inputs, flag)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=_temp_prefix(out), suffix=".tmp", dir=parent)
    os.chmod(tmp, _usual_mode(0o777))
    _PENDING_FOLDERS[tmp] = out
    leftover: Optional[str] = tmp  # deleted at the end: the temp folder, or the old OUT once replaced
    try:
        yield tmp
        _fsync_tree(tmp)
        if os.path.isdir(out) and os.listdir(out):
            if not _exchange(tmp, out):
                leftover = tempfile.mkdtemp(prefix=_temp_prefix(out), suffix=".tmp", dir=parent)
                os.replace(out, os.path.join(leftover, "old"))
                os.replace(tmp, out)
        else:
            os.replace(tmp, out)  # rename(2) replaces an empty folder atomically
            leftover = None
        _fsync_dir(parent)  # the rename itself survives a power cut
    finally:
        _PENDING_FOLDERS.pop(tmp, None)
        if leftover is not None:
            shutil.rmtree(leftover, ignore_errors=True)
    _remove_stale_temps(out)  # of runs killed earlier (hidden, so nothing else ever reads them)


@contextlib.contextmanager
def staging_folder(folder: str, name: str) -> Iterator[str]:
    """A hidden temp folder ``folder/.NAME.XXXXXXXX.tmp`` (same file system as ``folder``, so its
    files can be renamed into place) for a command that replaces some files of ``folder`` but not
    the folder as a whole (:func:`atomic_folder` does that). It is deleted on exit either way,
    together with those that killed runs of the same command left."""
    os.makedirs(folder, exist_ok=True)
    marker = os.path.join(folder, name)
    tmp = tempfile.mkdtemp(prefix=_temp_prefix(marker), suffix=".tmp", dir=folder)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _remove_stale_temps(marker)
