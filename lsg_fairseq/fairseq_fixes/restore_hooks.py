"""Let a task vet the checkpoint fairseq-train restores (no such hook upstream; cf. metaseq#602).

``checkpoint_utils.load_checkpoint(cfg, trainer)`` decides which file to restore and loads it with
no call into the task: a ``--restore-file`` that does not exist is logged as "No existing
checkpoint found" and training starts from scratch (metaseq#602, fairseq's successor, calls that a
bug), and a checkpoint of another architecture fails with a generic "please ensure that the
architectures match". This wrapper calls two optional task methods:

* ``task.check_restore(cfg, trainer)`` before anything is loaded (may raise);
* ``task.explain_restore_failure(cfg, trainer, error)`` when the load fails (may raise a clearer
  error; returning lets fairseq's own error through).

Tasks that define neither, every stock fairseq task, run exactly as without the plugin: fairseq's
own tests pass ``--restore-file x.pt`` (a file that does not exist) to mean "start fresh"
(``tests/stock_fairseq``). This plugin's tasks define both (``lsg_fairseq.checkpoint_policy``).
"""

from fairseq import checkpoint_utils

from lsg_fairseq.fairseq_fixes._wrap import wrap


def _with_task_hooks(original):
    def load_checkpoint(cfg, trainer, **passthrough_args):
        task = getattr(trainer, "task", None)
        check = getattr(task, "check_restore", None)
        if check is not None:
            check(cfg, trainer)
        try:
            return original(cfg, trainer, **passthrough_args)
        except Exception as e:
            explain = getattr(task, "explain_restore_failure", None)
            if explain is not None:
                explain(cfg, trainer, e)
            raise

    return load_checkpoint


def install() -> None:
    wrap(checkpoint_utils, "load_checkpoint", _with_task_hooks)
