"""``lsg-fairseq-generate`` / ``-interactive`` / ``-hydra-train``: fairseq's commands with the plugin loaded.

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

``lsg-fairseq-hydra-train`` is ``fairseq-hydra-train`` (a YAML config, hydra overrides) with the
plugin imported before fairseq's ``main`` runs. Through ``common.user_dir`` alone, fairseq imports
it inside ``main``: too late for what the plugin does around ``main`` (the task's checks of the run
and its precision policy, :mod:`lsg_fairseq.fairseq_fixes.run_hooks`; one-line errors), and too
late for hydra to know the plugin's task, model and optimizer configs (their defaults then come only
from the task's and optimizer's own dataclasses, when fairseq builds them).
"""

import logging
import os
import sys

from lsg_fairseq._fairseq_logs import DropMessage
from lsg_text.errors import ConfigError, MissingFileError, UserError, one_line, report


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


# hydra's warnings about fairseq's use of hydra (no version_base, a deprecated package header in its
# configs, the schema fairseq stores under the config's name): not the user's to act on
HYDRA_NOTICES = (
    r"\s*The version_base parameter is not specified",
    r"In '.*': Usage of deprecated keyword in package header",
    r"\s*'.*' is validated against ConfigStore schema with the same name",
)


def check_hydra_config(argv) -> None:
    """The YAML config named up front. Without ``--config-name``, or with a name that matches no
    file, fairseq-hydra-train runs fairseq's empty defaults (hydra finds the schema fairseq stores
    under that name) and fails with an AssertionError about the batch size."""
    if any(a in ("-h", "--help", "--hydra-help", "--info") or a.startswith("--info=") for a in argv):
        return
    name = _flag_value(argv, "--config-name") or _flag_value(argv, "-cn")
    folder = _flag_value(argv, "--config-dir") or _flag_value(argv, "-cd")
    example = "e.g. --config-dir examples/lsg_summarization/hydra --config-name lsg_bart_base_4096"
    if not name:
        raise ConfigError(f"--config-name is required: the YAML config to train with ({example})")
    if _flag_value(argv, "--config-path") or _flag_value(argv, "-cp"):
        return  # hydra's path relative to its own module: left to hydra
    if not folder:
        raise ConfigError(f"--config-dir is required: the folder of {name}.yaml ({example})")
    if not os.path.isdir(folder):
        raise MissingFileError(f"--config-dir {folder}: no such folder")
    file = name if name.endswith(".yaml") else name + ".yaml"
    if not os.path.isfile(os.path.join(folder, file)):
        there = sorted(f[: -len(".yaml")] for f in os.listdir(folder) if f.endswith(".yaml"))
        raise MissingFileError(
            f"--config-name {name}: no {file} in {folder} (configs there: {', '.join(there) or 'none'})"
        )
    check_yaml(os.path.join(folder, file), f"--config-name {name}")


def check_yaml(path: str, what: str) -> None:
    """Refuse a file that is not YAML in one line naming its line and column (hydra printed its
    whole traceback). The safe loader: hydra's (OmegaConf's) is a stricter subclass of it."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            yaml.safe_load(f)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{what}: {path} is not valid YAML ({where}{e.problem or e.context})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what}: {path} is not valid YAML ({one_line(e)[:200]})") from None


def _overrides(argv, key: str) -> bool:
    return any(a.lstrip("+").startswith(key + "=") for a in argv)


def hydra_argv(argv, user_dir: str):
    """``argv`` (hydra's: flags and ``key=value`` overrides) with this wrapper's defaults added
    where not given:

    - ``hydra.job.chdir=false``: paths in the config are read from the current folder, as
      fairseq's own ``config.yaml`` means them to be (``hydra.run.dir: .``, which a config of one's
      own does not inherit); hydra 1.1's default moves the run into ``outputs/<date>/<time>/``,
      where a relative ``task.data`` is not found. Not with ``-m``/``--multirun``: there each job
      keeps the folder of its own, or the jobs of a sweep would share one ``checkpoint.save_dir``
      and each resume from the last one's checkpoint_last.pt.
    - ``common.user_dir``: this plugin, as ``--user-dir`` names it for fairseq-train (the processes
      fairseq spawns, one per GPU, import it from the config).
    """
    argv = list(argv)
    if not _overrides(argv, "hydra.job.chdir") and not any(a in ("-m", "--multirun") for a in argv):
        argv.append("hydra.job.chdir=false")
    if not _overrides(argv, "common.user_dir"):
        argv.append(f"++common.user_dir={user_dir}")
    return argv


def hydra_train(argv=None) -> None:
    """fairseq's ``fairseq_cli.hydra_train.cli_main`` after the plugin's import, with
    :func:`hydra_argv`'s defaults; hydra reads ``sys.argv`` itself (``--config-dir``,
    ``--config-name``, ``key=value`` overrides)."""
    import warnings

    import lsg_fairseq  # noqa: F401  (registrations and fixes, before hydra composes the config)

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        check_hydra_config(argv)
    except UserError as e:
        sys.exit(report(e, "lsg-fairseq-hydra-train"))
    sys.argv = ["lsg-fairseq-hydra-train"] + hydra_argv(argv, lsg_fairseq.user_dir())
    user_dir_line = f"--user-dir={lsg_fairseq.user_dir()} has already been imported."
    logging.getLogger("fairseq.utils").addFilter(DropMessage(user_dir_line))
    logging.getLogger("hydra").setLevel(logging.INFO)  # its DEBUG lines of job names
    with warnings.catch_warnings():
        for notice in HYDRA_NOTICES:
            warnings.filterwarnings("ignore", message=notice, category=UserWarning)
        from fairseq_cli import hydra_train as module  # its @hydra.main warns when imported

        module.cli_main()


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
