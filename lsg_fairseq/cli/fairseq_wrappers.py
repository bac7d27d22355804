"""``lsg-fairseq-generate`` / ``lsg-fairseq-interactive``: fairseq's commands with the plugin loaded.

A checkpoint never imports the plugin that wrote it (fairseq_notes §1): ``fairseq-generate
--path checkpoint_best.pt`` without ``--user-dir`` dies with ``UnpicklingError ... GLOBAL
argparse.Namespace`` (torch >= 2.6) or, with weights_only loading turned off, with the confusing
``IndexError: Replacement index 1 out of range`` from fairseq's model registry. And without
``--task`` fairseq builds a ``translation`` task whatever the checkpoint was trained with.

These wrappers run fairseq's own ``generate`` / ``interactive`` mains unchanged, after adding
``--user-dir <this plugin>`` and ``--task long_document_summarization`` when they are not given,
and they refuse a missing ``--path`` flag or file up front with a message naming it. The plugin's
refusals (a corrupt checkpoint, an over-long target, ...) are printed as one line with exit status 2:
``fairseq-generate`` itself calls its ``main`` where no plugin can catch them
(lsg_fairseq.fairseq_fixes.one_line_errors).
Every other flag is fairseq's (``lsg-fairseq-generate --help``).
"""

import logging
import os
import sys

from lsg_fairseq._fairseq_logs import DropMessage
from lsg_text.errors import UserError, report


def _has_flag(argv, flag) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _flag_value(argv, flag):
    """The value argparse takes for ``flag``: its last occurrence's."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def plugin_argv(argv, prog: str):
    """``argv`` with ``--user-dir`` and ``--task`` added when missing; checks ``--path`` files."""
    from lsg_fairseq import user_dir
    from lsg_fairseq.tasks.long_document_summarization import TASK_NAME
    from lsg_fairseq.tasks.run_settings import check_checkpoint_paths

    argv = list(argv)
    if _has_flag(argv, "--user-dir"):
        given = os.path.abspath(_flag_value(argv, "--user-dir") or "")
        if given != user_dir():
            # The same code under two module names registers everything twice (fairseq_notes §1).
            print(f"{prog}: note: --user-dir {given} is not this installation's plugin ({user_dir()})", file=sys.stderr)
    else:
        argv += ["--user-dir", user_dir()]
    if not _has_flag(argv, "--task") and "-h" not in argv and "--help" not in argv:
        argv += ["--task", TASK_NAME]
    if "-h" not in argv and "--help" not in argv:
        # before fairseq parses anything: its own errors are an AssertionError (generate), a TypeError
        # (interactive), and an OSError once the data is loaded
        check_checkpoint_paths(_flag_value(argv, "--path"), "generate with")
    return argv


def _run(fairseq_main_module: str, prog: str, argv=None) -> None:
    try:
        argv = plugin_argv(sys.argv[1:] if argv is None else argv, prog)
        import importlib

        import lsg_fairseq  # noqa: F401  (registrations, safe globals, checkpoint checks)

        module = importlib.import_module(fairseq_main_module)
        # fairseq's --user-dir import finds the plugin imported (by this wrapper, just above) and
        # says so at INFO, before anything else: not news to the user
        user_dir_line = f"--user-dir={lsg_fairseq.user_dir()} has already been imported."
        logging.getLogger("fairseq.utils").addFilter(DropMessage(user_dir_line))
        lsg_fairseq.fairseq_fixes.install()  # again: the fixes of fairseq_cli.generate need it loaded
        # fairseq's get_parser pre-parses sys.argv for --user-dir, so the real argv must be there.
        sys.argv = [prog] + argv
        module.cli_main()
    except UserError as e:
        sys.exit(report(e, prog))


def generate(argv=None) -> None:
    _run("fairseq_cli.generate", "lsg-fairseq-generate", argv)


def interactive(argv=None) -> None:
    _run("fairseq_cli.interactive", "lsg-fairseq-interactive", argv)


if __name__ == "__main__":
    # python -m lsg_fairseq.cli.fairseq_wrappers {generate|interactive} ...
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command not in ("generate", "interactive"):
        sys.exit(
            report(
                "usage: python -m lsg_fairseq.cli.fairseq_wrappers {generate|interactive} [fairseq flags]",
                "lsg_fairseq.cli.fairseq_wrappers",
            )
        )
    {"generate": generate, "interactive": interactive}[command](sys.argv[2:])
