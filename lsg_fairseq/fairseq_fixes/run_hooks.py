"""Let a task vet a fairseq command's whole configuration before any work (no such hook upstream).

fairseq-train (and -validate, -interactive) run ``main(cfg)`` through
``fairseq.distributed.utils.call_main`` without calling into the task first: a task is set up
from ``cfg.task`` alone, so it cannot refuse a precision its device cannot run, nor settle a flag
that its optimizer needs, until the run has loaded data and built the model (and then fails with
fairseq's traceback: ``--fp16`` on a CPU ends in "Torch not compiled with CUDA enabled" when the
optimizer is built). This wrapper calls the optional classmethod
``vet_run(cfg, command)`` of the task class named by ``cfg.task._name`` (``command``: the module
of the ``main`` being run, e.g. ``"fairseq_cli.train"``) before ``main``; it may raise a
:class:`~lsg_text.errors.UserError` (printed as one line by :mod:`.one_line_errors`, installed
after this fix so that it wraps this one) or settle a flag of ``cfg`` with a log line.

Stock fairseq tasks define no ``vet_run`` and run exactly as without the plugin; this plugin's
tasks define it (``lsg_fairseq.device_policy``).
"""

from fairseq.distributed import utils as distributed_utils

from lsg_fairseq.fairseq_fixes._wrap import wrap


def task_class(cfg):
    """The registered class of the task ``cfg`` names, or None (no task, or an unknown one)."""
    from fairseq.tasks import TASK_REGISTRY

    task = getattr(cfg, "task", None)
    name = getattr(task, "_name", None) if task is not None else None
    return TASK_REGISTRY.get(name) if name else None


def _vetted_by_the_task(original):
    def call_main(cfg, main, **kwargs):
        vet = getattr(task_class(cfg), "vet_run", None)
        if vet is not None:
            vet(cfg, getattr(main, "__module__", ""))
        return original(cfg, main, **kwargs)

    return call_main


def install() -> None:
    wrap(distributed_utils, "call_main", _vetted_by_the_task)
