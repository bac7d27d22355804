"""Our one-line refusals (:mod:`lsg_text.errors`) inside fairseq's own commands.

fairseq's ``fairseq-train`` / ``fairseq-interactive`` run their ``main`` through
``fairseq.distributed.utils.call_main``, which is looked up when called, after fairseq has imported
``--user-dir``: :func:`install_fairseq_hook` wraps it so that our refusals print one line there too.
``fairseq-generate`` calls its ``main`` directly, so no plugin can reach it; ``lsg-fairseq-generate``
catches them instead (README "Bad inputs").
"""
import os
import sys

from lsg_text.errors import UserError, report

_HOOK_FLAG = "_lsg_fairseq_user_errors"


def install_fairseq_hook() -> None:
    """Make ``fairseq-train`` / ``fairseq-interactive`` print our refusals as one line (idempotent).

    Patched here and only here: fairseq 0.12's CLI has no other point where a plugin runs after
    argument parsing and around ``main`` (see the module docstring).
    """
    from fairseq.distributed import utils as distributed_utils

    original = distributed_utils.call_main
    if hasattr(original, _HOOK_FLAG):
        return

    def call_main(cfg, main, **kwargs):
        try:
            return original(cfg, main, **kwargs)
        except UserError as e:
            sys.exit(report(e, os.path.basename(sys.argv[0]) or "fairseq"))

    setattr(call_main, _HOOK_FLAG, original)
    distributed_utils.call_main = call_main
