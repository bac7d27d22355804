"""The processes fairseq spawns for a multi-GPU run get the plugin's checks and one-line errors
too (no such hook upstream).

Plain ``fairseq-train`` on a machine with several GPUs (no torchrun, no SLURM) trains on all of
them: ``call_main`` spawns one fresh process per GPU (``torch.multiprocessing.spawn``) and runs
``main`` there. The plugin's wrappers of ``call_main`` (:mod:`.run_hooks`, :mod:`.one_line_errors`)
run in the launching process only, so in the spawned ones:

* a refusal raised during the run (a split that makes no update, a step out of device memory, a
  diverged training explained) reached the launcher as torch's ``ProcessRaisedException``: the
  worker's traceback inside the launcher's;
* the task's ``vet_run`` never ran, so what it records on the task class for the run (the
  ``--update-freq``, the metric to watch, the validation splits) was missing there.

When ``call_main`` is about to spawn (fairseq's own test: an init method, no
``--distributed-no-spawn``), the ``main`` it hands each process is :func:`worker_main` bound to the
real one: it vets the config as the launcher did and runs ``main``; a refusal (or a failure the
task explains) is written to a file the launcher named, by the first process to fail so, which then
exits with status 2. The launcher raises it as its own refusal: one line, printed once (not once a
GPU, nor two processes' lines run into one), by :mod:`.one_line_errors`. Anything else keeps its
traceback, as before. ``main`` is passed by reference (``functools.partial`` of module-level
functions), so it pickles as spawn needs. Runs of one process, torchrun and SLURM tasks
(``--distributed-no-spawn``) are untouched: the wrappers run in each of those processes already.

Installed before :mod:`.run_hooks`, so that its wrapper sees the real ``main``.
"""

import contextlib
import functools
import os
import sys
import tempfile

from fairseq.distributed import utils as distributed_utils

from lsg_fairseq.fairseq_fixes import run_hooks
from lsg_fairseq.fairseq_fixes._wrap import wrap
from lsg_text.errors import EXIT_USER_ERROR, UserError, one_line


def spawns(cfg) -> bool:
    """Whether fairseq's ``call_main`` will spawn processes for ``cfg`` (its own test, after it
    infers the init method from the environment as it would)."""
    dt = cfg.distributed_training
    if dt.distributed_init_method is None:
        distributed_utils.infer_init_method(dt)
    return dt.distributed_init_method is not None and not dt.distributed_no_spawn and not cfg.common.tpu


def worker_main(main, command: str, said: str, cfg, **kwargs):
    """What a spawned process runs in place of ``main``: the task's ``vet_run`` as in the launcher,
    then ``main``; a refusal or an explained failure goes to the file ``said`` (the first process's
    only) and the process exits with status 2."""
    task = run_hooks.task_class(cfg)
    try:
        run_hooks.vet(cfg, command)
        return main(cfg, **kwargs)
    except Exception as e:  # noqa: BLE001  (re-raised unless it is ours or the task explains it)
        better = run_hooks.explained(task, cfg, command, e) or (e if isinstance(e, UserError) else None)
        if better is None:
            raise
        mine = f"{said}.{os.getpid()}"
        with open(mine, "w", encoding="utf-8") as f:
            f.write(one_line(better))
        with contextlib.suppress(FileExistsError):  # another process said it first
            os.link(mine, said)  # whole or not at all: the launcher reads it once a process has exited
        sys.exit(EXIT_USER_ERROR)


def _workers_checked(original):
    def call_main(cfg, main, **kwargs):
        if not spawns(cfg):
            return original(cfg, main, **kwargs)
        import torch.multiprocessing as mp

        command = getattr(main, "__module__", "")
        with tempfile.TemporaryDirectory(prefix="lsg-fairseq-spawn-") as folder:
            said = os.path.join(folder, "refusal.txt")
            try:
                return original(cfg, functools.partial(worker_main, main, command, said), **kwargs)
            except mp.ProcessExitedException as e:
                if e.exit_code == EXIT_USER_ERROR and os.path.isfile(said):
                    with open(said, encoding="utf-8") as f:
                        raise UserError(f.read()) from None
                raise

    return call_main


def install() -> None:
    wrap(distributed_utils, "call_main", _workers_checked)
