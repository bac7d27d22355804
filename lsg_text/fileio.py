"""File helpers shared by the offline data scripts, the converter and the checkpoint writer:
user-facing errors, the checks that refuse a bad input or output path up front (before any work),
defensive text reading, line counts. The writes themselves, all or nothing, are in
:mod:`lsg_text.atomic`.
"""

import codecs
import contextlib
import os
import sys
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

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
    if not os.access(path, os.R_OK):
        raise DataError(f"{what}: {path} is not readable for this user")
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
    if path == "":  # an unset shell variable, typically; os.makedirs("") fails, open("") too
        raise DataError(f"{flag}: an empty path (give a path)")
    if os.path.islink(path) and not os.path.exists(path):  # a write would follow it, or fail on it
        raise DataError(
            f"{flag} {path}: a symbolic link to {os.readlink(path)}, which does not exist (choose another path)"
        )
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


def same_or_inside(path: str, folder: str) -> bool:
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
            if same_or_inside(src, out):
                raise DataError(f"{out}: the {what} would {verb} {src}; choose another {what} path")


def check_output_folder(out: str, force: bool, inputs: Sequence[str] = (), flag: str = "--force") -> None:
    """Refuse ``out`` up front: a file, a folder holding one of ``inputs``, or (without ``force``)
    a non-empty folder; a path :func:`check_output_path` refuses (below a file, not writable, a
    broken link). The folder itself is written by :func:`lsg_text.atomic.atomic_folder`."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise DataError(f"{out}: exists and is not a folder; choose another output folder")
    check_output_path(out, "output folder", folder=True)  # else the error names the staging folder
    refuse_clobber([out], inputs, what="output folder", verb="replace the source")  # replaced as a whole
    if os.path.isdir(out) and os.listdir(out) and not force:
        held = sorted(os.listdir(out))
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise DataError(
            f"{out}: output folder exists and is not empty ({shown}); pass {flag} to replace it as a "
            "whole, or choose another folder"
        )


def check_utf8(path: str, what: str = "") -> None:
    """Raise a :class:`DataError` naming ``path``, the byte offset and the line of the first byte
    that is not UTF-8 (streamed: any file size)."""
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
