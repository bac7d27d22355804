"""``fairseq-train`` / ``fairseq-interactive`` / ``fairseq-generate``: this plugin's refusals as one
line, exit status 2.

Not an upstream bug: fairseq 0.12's CLI offers a plugin no point that runs after argument parsing
and around ``main``. Its train and interactive commands run ``main`` through
``fairseq.distributed.utils.call_main``, looked up when called (after ``--user-dir`` is imported);
``fairseq-generate``'s ``cli_main`` imports ``--user-dir`` while parsing and then calls its module's
``main``, also looked up when called. Wrapping those two lets a :class:`~lsg_text.errors.UserError`
(a bad flag or file of ours, a missing split, a step out of device memory) print ``prog: error:
<message>`` instead of a traceback. Any other exception, and every run that raises none of ours, is
untouched. fairseq-train's ``cli_main`` vets its config before ``call_main`` (:mod:`.run_hooks`):
its module's ``convert_namespace_to_omegaconf`` is wrapped so too. A ``--results-path`` that is a
file is refused so before any work. A generation that stops so leaves no half-written
``--results-path`` file: fairseq opens (and so truncates) ``generate-<subset>.txt`` before it loads
anything, so the file holds only this run's partial output, and it is removed; a refusal before
fairseq opened it leaves an earlier run's file as it was. Likewise a training refused after
fairseq-train's ``main`` made ``--save-dir`` (or ``--tensorboard-logdir``) leaves no empty folder.
(``lsg-fairseq-generate`` imports the plugin before ``fairseq_cli.generate`` and installs the fixes
again once it is loaded.)
"""

import argparse
import contextlib
import os
import sys

from fairseq.dataclass import initialize
from fairseq.distributed import utils as distributed_utils

from lsg_text.errors import UserError, report
from lsg_fairseq.fairseq_fixes._wrap import wrap


def _prog() -> str:
    return os.path.basename(sys.argv[0]) or "fairseq"


def _one_line_user_errors(original):
    def run(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except UserError as e:
            sys.exit(report(e, _prog()))

    return run


def _folders_missing(cfg) -> list:
    """The output folders of a run (--save-dir, --tensorboard-logdir) and their ancestors that do not
    exist yet, deepest first: what fairseq-train's main may make before a refusal stops it."""
    missing = []
    for section, key in (("checkpoint", "save_dir"), ("common", "tensorboard_logdir")):
        folder = getattr(getattr(cfg, section, None), key, None)
        folder = os.path.abspath(folder) if folder else None
        while folder and not os.path.lexists(folder) and folder not in missing:
            missing.append(folder)
            folder = os.path.dirname(folder)
    return sorted(missing, key=len, reverse=True)


def _one_line_run_errors(original):
    def call_main(cfg, main, **kwargs):
        missing = _folders_missing(cfg)
        try:
            return original(cfg, main, **kwargs)
        except UserError as e:
            # fairseq-train makes --save-dir before it loads anything: a refusal leaves no empty folder
            for folder in missing:
                with contextlib.suppress(OSError):  # not empty, or not made: kept
                    os.rmdir(folder)
            sys.exit(report(e, _prog()))

    return call_main


def results_file(cfg):
    """The file fairseq-generate writes with ``--results-path`` (None without it); ``cfg``: the
    parsed Namespace ``cli_main`` passes, or the structured config."""
    if isinstance(cfg, argparse.Namespace):
        folder, subset = cfg.results_path, cfg.gen_subset
    else:
        folder, subset = cfg.common_eval.results_path, cfg.dataset.gen_subset
    return None if folder is None else os.path.join(folder, f"generate-{subset}.txt")


def _written(path):
    """What tells a file written since: (inode, size, mtime), or None where there is none."""
    if path is None or not os.path.isfile(path):
        return None
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _one_line_generate_errors(original):
    def main(cfg, *args, **kwargs):
        results = results_file(cfg)
        folder = None if results is None else os.path.dirname(results)
        if folder and os.path.exists(folder) and not os.path.isdir(folder):  # fairseq's: FileExistsError
            sys.exit(report(f"--results-path {folder}: exists and is not a folder (give a folder)", _prog()))
        before = _written(results)
        try:
            return original(cfg, *args, **kwargs)
        except UserError as e:
            # this run's partial output only: a refusal before fairseq opened the file (the task's
            # vet_run, run_hooks) leaves an earlier run's results as they were
            if results is not None and _written(results) not in (None, before):
                os.remove(results)
            sys.exit(report(e, _prog()))

    return main


def install() -> None:
    wrap(distributed_utils, "call_main", _one_line_run_errors)
    wrap(initialize, "add_defaults", _one_line_user_errors)  # fairseq-hydra-train, before call_main
    generate = sys.modules.get("fairseq_cli.generate")
    if generate is not None:  # fairseq-generate is importing the plugin through --user-dir
        wrap(generate, "main", _one_line_generate_errors)
    train = sys.modules.get("fairseq_cli.train")
    if train is not None:  # fairseq-train's cli_main vets its config as it makes it (run_hooks)
        wrap(train, "convert_namespace_to_omegaconf", _one_line_user_errors)
