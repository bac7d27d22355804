"""File helpers shared by the offline data scripts: user-facing errors, atomic writes, line counts.

Every script writes its outputs through :func:`atomic_outputs`, so a run that fails half-way
(bad JSON on line 4,000, a missing BPE file, Ctrl-C) leaves no truncated file behind that a later
``fairseq-preprocess`` would silently accept.
"""

import contextlib
import os
import sys
import tempfile
from typing import Dict, Iterator, List, Sequence, TextIO


class DataError(ValueError):
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
def atomic_outputs(paths: Sequence[str]) -> Iterator[List[TextIO]]:
    """Open ``paths`` for writing (UTF-8, ``\\n`` line ends) as temp files in the same folders.

    On a clean exit every temp file is renamed onto its final path; on an exception all of them
    are deleted, so either every output appears complete or none is touched. ``"-"`` means
    stdout (written directly: a pipe cannot be made atomic).
    """
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
