"""File helpers shared by the offline data scripts, the converter and the checkpoint writer:
user-facing errors, atomic writes (files and whole folders), defensive text reading, line counts.

Every script writes its outputs through :func:`atomic_outputs`, so a run that fails half-way
(bad JSON on line 4,000, a missing BPE file, Ctrl-C) leaves no truncated file behind that a later
``fairseq-preprocess`` would silently accept. Checkpoints go through :func:`atomic_write`; both
share one core, :func:`atomic_files`. Commands that write a whole folder (the converter, the
exporter) use :func:`atomic_folder`.
"""

import contextlib
import ctypes
import glob
import os
import shutil
import sys
import tempfile
from typing import IO, Dict, Iterator, List, Optional, Sequence, Tuple

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


def require_text(path: str, what: str) -> str:
    """Return ``path`` if it holds something besides whitespace, else raise a :class:`DataError`
    (reads only up to the first non-blank chunk)."""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            if chunk.strip():
                return path
    raise DataError(f"{what} {path}: no text (the file is empty or blank; give a file with text)")


def existing_above(path: str) -> Tuple[str, List[str]]:
    """The nearest path at or above ``path`` that exists, and the missing ones on the way there
    (deepest first: what ``os.makedirs(path)`` would create)."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return path, missing


def check_output_path(path: str, flag: str, folder: bool = False) -> None:
    """Refuse up front an output path of the wrong kind, naming ``flag`` and the path as given:
    a folder where a file is to be written, a file where a folder is (``folder``), a path below
    a file, or one whose folder (or the nearest existing one above it, where the missing ones would
    be made) this process may not write in: a read-only mount, another user's folder. Otherwise the
    error comes from deep in a write, after the work, naming a temp file."""
    if path in (None, "-"):
        return
    if folder and os.path.exists(path) and not os.path.isdir(path):
        raise DataError(f"{flag} {path}: exists and is not a folder (choose another output folder)")
    if not folder and os.path.isdir(path):
        raise DataError(f"{flag} {path}: is a folder (give the path of a file, e.g. one inside it)")
    above, _ = existing_above(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(above):  # the folders that will be created must not sit below a file
        raise DataError(f"{flag} {path}: {above} is a file, not a folder (choose another path)")
    # an existing output folder is written in itself; anything else in the nearest folder above
    writes_in = os.path.abspath(path) if folder and os.path.isdir(path) else above
    if not os.access(writes_in, os.W_OK | os.X_OK):  # files are written beside their final name, then renamed
        raise DataError(f"{flag} {path}: {writes_in} is not writable for this user (choose another path)")


def check_output_files(paths: Sequence[str], flag: str, inputs: Sequence[str] = ()) -> None:
    """The up-front checks of a list of output files: each of the right kind
    (:func:`check_output_path`), none given twice (the second write would silently replace the
    first), none one of ``inputs`` (:func:`refuse_clobber`)."""
    seen: Dict[str, str] = {}  # realpath -> the path as given
    for path in paths:
        check_output_path(path, flag)
        if path in (None, "-"):
            continue
        real = os.path.realpath(path)
        if real in seen:
            same = "" if seen[real] == path else f" (as {seen[real]})"
            raise DataError(f"{flag} {path}: given twice{same} (give one output path per input)")
        seen[real] = path
    refuse_clobber(paths, inputs, what=flag)


@contextlib.contextmanager
def made_folder(folder: str) -> Iterator[str]:
    """``os.makedirs(folder)``; if the block then fails, the folders it created are removed again
    (those still empty), so a refused run leaves no empty output folder behind."""
    _, missing = existing_above(folder)
    os.makedirs(folder, exist_ok=True)
    try:
        yield folder
    except BaseException:
        for made in missing:  # deepest first; rmdir never removes a folder that has files
            with contextlib.suppress(OSError):
                os.rmdir(made)
        raise


def count_lines(path: str) -> int:
    """Number of lines as fairseq reads them (a last line without ``\\n`` still counts)."""
    n = 0
    last = b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (0 if last == b"\n" else 1)


# ----------------------------------------------------------------------------- atomic writes
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


def _same_or_inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or os.path.commonpath([path, folder]) == folder


def refuse_existing(paths: Sequence[str], force: bool, flag: str, why: str = "") -> None:
    """Refuse to replace any of ``paths`` that exists, unless ``force`` (``--force``): the message
    names the first, lists the names of all of them, and ``flag``, the choice of another place;
    ``why``: what a replacement would break, if that needs saying."""
    existing = [path for path in paths if os.path.lexists(path)]
    if existing and not force:
        names = ", ".join(os.path.basename(path) for path in existing)
        reason = f": {why}; or" if why else ", or"
        raise DataError(
            f"{existing[0]}: exists (pass --force to replace the {names} there{reason} choose another {flag})"
        )


def refuse_clobber(
    outputs: Sequence[str], inputs: Sequence[str], what: str = "output", verb: str = "overwrite the input"
) -> None:
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
                raise DataError(f"{out}: the {what} would {verb} {src}; choose another {what} path")


def check_output_folder(out: str, force: bool, inputs: Sequence[str] = (), flag: str = "--force") -> None:
    """Refuse ``out`` up front: a file, a folder holding one of ``inputs``, or (without ``force``)
    a non-empty folder. See :func:`atomic_folder`."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise DataError(f"{out}: exists and is not a folder; choose another output folder")
    refuse_clobber([out], inputs, what="output folder", verb="replace the source")  # replaced as a whole
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
                raise DataError(
                    f"{prefix}{path}: not UTF-8 text (byte offset {at}, line {line}: {e.reason}); "
                    "convert it to UTF-8 text"
                ) from None
            offset += len(chunk)
            lines += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise DataError(f"{prefix}{path}: not UTF-8 text (truncated character at the end: {e.reason})") from None


# A model folder's checkpoint: the first of these that is there (lsg-fairseq-convert's model.pt, else a
# training's best, else its last), as the converter, the exporter and lsg-fairseq-summarize pick it.
CHECKPOINT_NAMES = ("model.pt", "checkpoint_best.pt", "checkpoint_last.pt")


def folder_checkpoint(model_dir: str) -> Optional[str]:
    """The name of ``model_dir``'s checkpoint: the first of :data:`CHECKPOINT_NAMES` there, else None."""
    return next((n for n in CHECKPOINT_NAMES if os.path.isfile(os.path.join(model_dir, n))), None)


# In every fairseq Dictionary before its dict.txt is read: listing them again is a duplicate.
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


def check_fairseq_dict(path: str, what: str) -> None:
    """Raise a :class:`DataError` naming the first line of ``path`` that fairseq's
    ``Dictionary.load`` would fail on with a traceback (the same parse as its ``add_from_file``,
    without importing fairseq): ``<token> <count>`` with an optional ``#fairseq:overwrite``."""
    check_utf8(path, what)
    fix = "give the dict.txt that scripts/spm_train.py, lsg-fairseq-convert or fairseq-preprocess wrote"
    seen = set(FAIRSEQ_SPECIALS)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                word, field = line.rstrip().rsplit(" ", 1)
                overwrite = field == "#fairseq:overwrite"
                if overwrite:
                    word, field = word.rsplit(" ", 1)
                int(field)
            except ValueError:
                got = line.rstrip("\n")[:40]
                raise DataError(
                    f"{what} {path}: not a fairseq dict.txt (line {lineno} is {got!r}, expected "
                    f"'<token> <count>'; {fix})"
                ) from None
            if word in seen and not overwrite:
                raise DataError(
                    f"{what} {path}: line {lineno} lists {word!r} a second time (fairseq's own "
                    f"{' '.join(FAIRSEQ_SPECIALS)} count as listed; {fix})"
                )
            seen.add(word)


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


def unpaired_outputs(inputs: Sequence[str], outputs: Sequence[str]) -> Optional[str]:
    """The refusal of ``--inputs``/``--outputs`` lists of different lengths (None when paired)."""
    if len(inputs) == len(outputs):
        return None
    return f"--inputs has {len(inputs)} paths but --outputs has {len(outputs)}; give one output per input"


def progress(iterable, desc: str, total=None, unit: str = "line"):
    """tqdm on stderr, refreshed at most every 2 s so that logs of long jobs stay short."""
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety, never a reason to fail
        return iterable
    return tqdm(iterable, desc=desc, total=total, unit=unit, mininterval=2.0, file=sys.stderr)
