"""File helpers shared by the offline data scripts and the converter: user-facing errors, atomic
writes (files and whole folders), defensive text reading, line counts.

Every script writes its outputs through :func:`atomic_outputs`, so a run that fails half-way
(bad JSON on line 4,000, a missing BPE file, Ctrl-C) leaves no truncated file behind that a later
``fairseq-preprocess`` would silently accept. Commands that write a whole folder (the converter,
the exporter) use :func:`atomic_folder`.
"""

import contextlib
import ctypes
import glob
import os
import shutil
import sys
import tempfile
from typing import Dict, Iterator, List, Sequence, TextIO

from lsg_text.errors import UserError


class DataError(UserError, ValueError):
    """Bad input a user can fix; the message names the file (and line) or the flag at fault."""


def require_file(path: str, what: str) -> str:
    """Return ``path`` if it is an existing regular file, else raise a :class:`DataError`.

    ``what`` names where the path came from (a flag such as ``--encoder-json``), so the message
    points at the thing to fix.
    """
    if not os.path.exists(path):
        raise DataError(f"{what}: file not found: {path}")
    if not os.path.isfile(path):
        raise DataError(f"{what}: not a regular file: {path}")
    return path


def require_dir(path: str, what: str) -> str:
    if not os.path.exists(path):
        raise DataError(f"{what}: directory not found: {path}")
    if not os.path.isdir(path):
        raise DataError(f"{what}: not a directory: {path}")
    return path


def count_lines(path: str) -> int:
    """Number of lines as fairseq reads them (a last line without ``\\n`` still counts)."""
    n = 0
    last = b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (0 if last == b"\n" else 1)


@contextlib.contextmanager
def atomic_outputs(paths: Sequence[str], inputs: Sequence[str] = ()) -> Iterator[List[TextIO]]:
    """Open ``paths`` for writing (UTF-8, ``\\n`` line ends) as temp files in the same folders.

    On a clean exit every temp file is renamed onto its final path; on an exception all of them
    are deleted, so either every output appears complete or none is touched. ``"-"`` means
    stdout (written directly: a pipe cannot be made atomic). An output that is one of ``inputs``
    is refused before anything is opened (:func:`refuse_clobber`).
    """
    refuse_clobber(paths, inputs)
    handles: List[TextIO] = []
    temps: Dict[str, str] = {}
    try:
        for path in paths:
            if path == "-":
                handles.append(sys.stdout)
                continue
            folder = os.path.dirname(os.path.abspath(path))
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
            os.close(fd)
            temps[path] = tmp
            # Opened by name so that ``handle.name`` is the temp path (callers re-count lines).
            handles.append(open(tmp, "w", encoding="utf-8", newline="\n"))
        yield handles
        for h in handles:
            if h is not sys.stdout:
                h.close()
        umask = os.umask(0)
        os.umask(umask)
        for path, tmp in temps.items():
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual mode
            os.replace(tmp, path)
        temps.clear()
    finally:
        for h in handles:
            if h is not sys.stdout and not h.closed:
                h.close()
        for tmp in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


def _same_or_inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or os.path.commonpath([path, folder]) == folder


def refuse_clobber(outputs: Sequence[str], inputs: Sequence[str], what: str = "output") -> None:
    """Raise a :class:`DataError` when an output path is one of the inputs (or holds one).

    ``outputs`` and ``inputs`` are ``(flag, path)``-free plain paths; ``"-"`` (stdout/stdin) is
    ignored. A command must never write over what it reads: ``--output docs.txt`` with
    ``--input-lines docs.txt`` would replace the documents by their summaries.
    """
    for out in outputs:
        if out in (None, "-"):
            continue
        for src in inputs:
            if src in (None, "-") or not os.path.exists(src):
                continue
            if _same_or_inside(src, out):
                raise DataError(
                    f"{out}: the {what} would overwrite the input {src}; choose another {what} path"
                )


def check_output_folder(out: str, force: bool, inputs: Sequence[str] = (), flag: str = "--force") -> None:
    """Refuse ``out`` up front: a file, a folder holding one of ``inputs``, or (without ``force``)
    a non-empty folder. See :func:`atomic_folder`."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise DataError(f"{out}: exists and is not a folder; choose another output folder")
    refuse_clobber([out], inputs, what="output folder")
    if os.path.isdir(out) and os.listdir(out) and not force:
        held = sorted(os.listdir(out))
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise DataError(
            f"{out}: output folder exists and is not empty ({shown}); pass {flag} to replace it as a "
            "whole, or choose another folder"
        )


# temp folder -> the folder it becomes on success; lets writers record final paths (a checkpoint's
# cfg.task.data) while they still write into the temp folder.
_PENDING_FOLDERS: Dict[str, str] = {}


def final_location(path: str) -> str:
    """Where ``path`` (inside an :func:`atomic_folder` temp folder) will be once the folder is in
    place; other paths are returned as they are (absolute)."""
    path = os.path.abspath(path)
    for tmp, final in _PENDING_FOLDERS.items():
        if _same_or_inside(path, tmp):
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


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):  # not every OS / file system lets a folder be opened
        fd = os.open(folder, os.O_RDONLY)
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
    parent, name = os.path.dirname(out), os.path.basename(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700 folders; give the usual mode
    _PENDING_FOLDERS[tmp] = out
    leftover = tmp  # deleted at the end: the temp folder, or the old OUT once replaced
    try:
        yield tmp
        _fsync_tree(tmp)
        if os.path.isdir(out) and os.listdir(out):
            if not _exchange(tmp, out):
                leftover = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
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
    # leftovers of runs killed earlier (hidden, so nothing else ever reads them)
    for stale in glob.glob(os.path.join(glob.escape(parent), f".{glob.escape(name)}.*.tmp")):
        shutil.rmtree(stale, ignore_errors=True)


def check_utf8(path: str, what: str = "") -> None:
    """Raise a :class:`DataError` naming ``path``, the byte offset and the line of the first byte
    that is not UTF-8 (streamed: any file size)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = lines = 0
    prefix = f"{what}: " if what else ""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                # e.start counts from the decoder's pending bytes (at most 3) plus this chunk
                at = offset + e.start - len(e.object) + len(chunk)
                line = lines + chunk.count(b"\n", 0, max(at - offset, 0)) + 1
                raise DataError(f"{prefix}{path}: not UTF-8 text (byte offset {at}, line {line}: {e.reason}); "
                                "convert it to UTF-8 text") from None
            offset += len(chunk)
            lines += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise DataError(f"{prefix}{path}: not UTF-8 text (truncated character at the end: {e.reason})") from None


def read_text(path: str, what: str = "", errors: str = "strict", fix: str = "convert it to UTF-8 text") -> str:
    """The whole of a text file, decoded as UTF-8; a non-UTF-8 byte is reported with its offset.

    ``errors="replace"`` turns undecodable bytes into U+FFFD instead (``--errors replace``).
    """
    prefix = f"{what}: " if what else ""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"{prefix}{path}: cannot read ({e.strerror})") from None
    try:
        text = data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(
            f"{prefix}{path}: not UTF-8 text (byte offset {e.start}, line {line}: {e.reason}); {fix}"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text  # a UTF-8 BOM is not content


def die(message: str, prog: str) -> int:
    """Print ``prog: error: message`` to stderr (argparse's format) and return exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def progress(iterable, desc: str, total=None, unit: str = "line"):
    """tqdm on stderr, refreshed at most every 2 s so that logs of long jobs stay short."""
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety, never a reason to fail
        return iterable
    return tqdm(iterable, desc=desc, total=total, unit=unit, mininterval=2.0, file=sys.stderr)
