"""``fairseq-train`` / ``fairseq-interactive`` / ``fairseq-generate``: this plugin's refusals as one
line, exit status 2.

Not an upstream bug: fairseq 0.12's CLI offers a plugin no point that runs after argument parsing
and around ``main``. Its train and interactive commands run ``main`` through
``fairseq.distributed.utils.call_main``, looked up when called (after ``--user-dir`` is imported);
``fairseq-generate``'s ``cli_main`` imports ``--user-dir`` while parsing and then calls its module's
``main``, also looked up when called. Wrapping those two lets a :class:`~lsg_text.errors.UserError`
(a bad flag or file of ours, a missing split) print ``prog: error: <message>`` instead of a
traceback. Any other exception, and every run that raises none of ours, is untouched.
(``lsg-fairseq-generate`` imports the plugin before ``fairseq_cli.generate`` and catches them itself.)
"""
import os
import sys

from fairseq.distributed import utils as distributed_utils

from lsg_text.errors import UserError, report
from lsg_fairseq.fairseq_fixes._wrap import wrap


def _one_line_user_errors(original):
    def run(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except UserError as e:
            sys.exit(report(e, os.path.basename(sys.argv[0]) or "fairseq"))

    return run


def install() -> None:
    wrap(distributed_utils, "call_main", _one_line_user_errors)
    generate = sys.modules.get("fairseq_cli.generate")
    if generate is not None:  # fairseq-generate is importing the plugin through --user-dir
        wrap(generate, "main", _one_line_user_errors)
