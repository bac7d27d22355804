"""``fairseq-train`` / ``fairseq-interactive``: this plugin's refusals as one line, exit status 2.

Not an upstream bug: fairseq 0.12's CLI offers a plugin no point that runs after argument parsing
and around ``main``. Its train and interactive commands run ``main`` through
``fairseq.distributed.utils.call_main``, looked up when called (after ``--user-dir`` is imported),
so wrapping it lets a :class:`~lsg_text.errors.UserError` (a bad flag or file of ours) print
``prog: error: <message>`` instead of a traceback. Any other exception, and every run that raises
none of ours, is untouched. ``fairseq-generate`` calls its ``main`` directly: ``lsg-fairseq-generate``
catches them there (README "Bad inputs").
"""
import os
import sys

from fairseq.distributed import utils as distributed_utils

from lsg_text.errors import UserError, report
from lsg_fairseq.fairseq_fixes._wrap import wrap


def _one_line_user_errors(original):
    def call_main(cfg, main, **kwargs):
        try:
            return original(cfg, main, **kwargs)
        except UserError as e:
            sys.exit(report(e, os.path.basename(sys.argv[0]) or "fairseq"))

    return call_main


def install() -> None:
    wrap(distributed_utils, "call_main", _one_line_user_errors)
