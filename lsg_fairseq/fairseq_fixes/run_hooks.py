"""Let a task vet a fairseq command's whole configuration before any work, and explain how the run
failed (no such hooks upstream).

fairseq-train (and -validate, -interactive) run ``main(cfg)`` through
``fairseq.distributed.utils.call_main``, and fairseq-generate its module's ``main(args)``, without
calling into the task first: a task is set up from ``cfg.task`` alone, so it cannot refuse a
precision its device cannot run, nor settle a flag that its optimizer needs, until the run has
loaded data and built the model (and then fails with fairseq's traceback: ``--fp16`` on a CPU ends
in "Torch not compiled with CUDA enabled" when the optimizer is built). This wrapper calls the
optional classmethod ``vet_run(cfg, command)`` of the task class named by ``cfg.task._name``
(``command``: the module of the ``main`` being run, e.g. ``"fairseq_cli.train"``) before ``main``.
fairseq-generate's ``main`` is wrapped too when the plugin is imported through its ``--user-dir``;
its parsed arguments are first made the structured config its ``main`` makes of them. ``vet_run``
may raise a :class:`~lsg_text.errors.UserError` (printed as one line by :mod:`.one_line_errors`,
installed after this fix so that it wraps this one) or settle a flag of ``cfg`` with a log line.

The same wrapper calls the optional classmethod ``explain_failure(cfg, command, error)`` when
``main`` raises: a :class:`~lsg_text.errors.UserError` it returns is raised instead (a training that
diverged is fairseq's FloatingPointError traceback otherwise); None keeps the error as it is.

Stock fairseq tasks define neither and run exactly as without the plugin; this plugin's tasks
define both (``lsg_fairseq.tasks.run_settings``, ``lsg_fairseq.device_policy``).

fairseq-train's ``cli_main`` acts on two flags between parsing and ``call_main``: it starts a plasma
store (``--use-plasma-view``) and enters the CUDA profiler (``--profile``), both tracebacks where
they cannot run. So when fairseq-train imports the plugin (``fairseq_cli.train`` loaded, as its
console script does), its module's ``convert_namespace_to_omegaconf`` is wrapped too: the config it
returns is vetted there, and ``call_main`` does not vet that config again.

fairseq-hydra-train first completes the config hydra composed (``add_defaults``: the task's,
model's, ... dataclass defaults, where a key that is no setting ends in omegaconf's ConfigKeyError
traceback, or for a legacy model is ignored without a word): the task's ``vet_run(cfg,
"fairseq_cli.hydra_train")`` is called before that, then ``vet_run(cfg, "fairseq_cli.train")`` in
``call_main`` as for fairseq-train. It imports ``common.user_dir`` inside ``main``, though, after both
have been looked up: installed then, the wrappers never run, and a warning says which command runs
the checks (``lsg-fairseq-hydra-train``, which imports the plugin first).
"""

import argparse
import logging
import sys

from fairseq.dataclass import initialize
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils

from lsg_fairseq.fairseq_fixes._wrap import wrap, wrapped_by

logger = logging.getLogger(__name__)

HYDRA_CONFIG = "fairseq_cli.hydra_train"  # vet_run's command for fairseq-hydra-train's composed config

TOO_LATE = (
    "fairseq-hydra-train imported this plugin inside its main, past the point where the plugin checks a "
    "run: no checks, fairseq's tracebacks. lsg-fairseq-hydra-train runs the same config with them"
)


def task_class(cfg):
    """The registered class of the task ``cfg`` names, or None (no task, or an unknown one)."""
    from fairseq.tasks import TASK_REGISTRY

    task = getattr(cfg, "task", None)
    name = getattr(task, "_name", None) if task is not None else None
    return TASK_REGISTRY.get(name) if name else None


def vet(cfg, command: str):
    """The task's ``vet_run(cfg, command)``, when its class defines one; returns that class."""
    task = task_class(cfg)
    vet_run = getattr(task, "vet_run", None)
    if vet_run is not None:
        vet_run(cfg, command)
    return task


# the config fairseq-train's cli_main made and vetted (_train_config_vetted_by_the_task), which its
# call_main does not vet again
_vetted_early: list = []


def _train_config_vetted_by_the_task(original):
    def convert_namespace_to_omegaconf(args):
        cfg = original(args)
        vet(cfg, "fairseq_cli.train")
        _vetted_early[:] = [cfg]
        return cfg

    return convert_namespace_to_omegaconf


def explained(task, cfg, command: str, error: BaseException):
    """The task class's ``explain_failure(cfg, command, error)``: a clearer error, or None (also
    for a task that defines none)."""
    explain = getattr(task, "explain_failure", None)
    return None if explain is None else explain(cfg, command, error)


def _vetted_by_the_task(original):
    def call_main(cfg, main, **kwargs):
        command = getattr(main, "__module__", "")
        early = any(cfg is vetted for vetted in _vetted_early)
        task = task_class(cfg) if early else vet(cfg, command)
        try:
            return original(cfg, main, **kwargs)
        except Exception as e:  # noqa: BLE001  (re-raised unless the task explains it)
            better = explained(task, cfg, command, e)
            if better is None:
                raise
            raise better from e

    return call_main


def _config_vetted_by_the_task(original):
    def add_defaults(cfg):
        vet(cfg, HYDRA_CONFIG)
        return original(cfg)

    return add_defaults


def _generate_vetted_by_the_task(original):
    def main(cfg, *args, **kwargs):
        if isinstance(cfg, argparse.Namespace):  # what fairseq-generate's cli_main passes
            cfg = convert_namespace_to_omegaconf(cfg)
        vet(cfg, "fairseq_cli.generate")
        return original(cfg, *args, **kwargs)

    return main


def install() -> None:
    if "fairseq_cli.hydra_train" in sys.modules and not wrapped_by(distributed_utils, "call_main", _vetted_by_the_task):
        logger.warning(TOO_LATE)
    wrap(distributed_utils, "call_main", _vetted_by_the_task)
    wrap(initialize, "add_defaults", _config_vetted_by_the_task)
    generate = sys.modules.get("fairseq_cli.generate")
    if generate is not None:  # fairseq-generate is importing the plugin through --user-dir
        wrap(generate, "main", _generate_vetted_by_the_task)
    train = sys.modules.get("fairseq_cli.train")
    if train is not None:  # fairseq-train (or another command that imported its module)
        wrap(train, "convert_namespace_to_omegaconf", _train_config_vetted_by_the_task)
