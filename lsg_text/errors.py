"""Errors a user causes and can fix, and how every command reports them: one line, exit status 2.

Each refusal of the plugin is an instance of :class:`UserError` (``DataError``, ``ConversionError``,
``CheckpointError``, :class:`ConfigError`, :class:`MissingFileError`), whose message names the file
(and line) or the flag at fault and says how to fix it. Our own commands and scripts catch
``UserError`` and print ``prog: error: <message>`` (argparse's format) with exit status 2 through
:func:`report`, the one printer (the shell scripts' ``die`` prints the same form). Anything else is a bug
and keeps its traceback. (fairseq's own commands reach :func:`report` through
``lsg_fairseq.fairseq_fixes.one_line_errors``.)
"""

import argparse
import sys

EXIT_USER_ERROR = 2  # argparse's status for a bad command line


class UserError(Exception):
    """Marker base: bad input, a bad flag or a bad file the user can fix (never a bug)."""


class ConfigError(UserError, ValueError):
    """Flags that are out of range or inconsistent; the message names the flag(s)."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder a flag points at does not exist; the message names the flag and path."""


def one_line(message) -> str:
    """Collapse a (possibly multi-line) message into one line."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def report(error, prog: str) -> int:
    """Print ``prog: error: <message>`` on stderr and return the exit status (2): the one error
    printer of every Python command and script (``error``: an exception or a message)."""
    sys.stdout.flush()
    print(f"{prog}: error: {one_line(error)}", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, with its refusals as one line (``prog: error: ...``, exit 2) and no usage dump."""

    def error(self, message):
        self.exit(report(f"{message} (see {self.prog} --help)", self.prog))
