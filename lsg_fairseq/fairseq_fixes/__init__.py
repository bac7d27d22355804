"""Every change this plugin makes to fairseq's and torch's own functions, and nothing else.

fairseq 0.12 has bugs (and one missing hook) that a plugin can only address by replacing module
attributes. Each module here is one replacement: its docstring names the upstream issue and what
breaks without it, its ``install()`` is idempotent, and the replaced function stays reachable
(:func:`~lsg_fairseq.fairseq_fixes._wrap.original`) so that a test can show the bug.
:func:`install` is called once, by ``lsg_fairseq/__init__.py``; no other module of the package
patches anything.

A stock fairseq run in the same process (``--task translation``, a stock arch) sees only the fixes:
atomic checkpoint writes, load errors naming the file, ``--bf16`` off TPUs, ``--bf16`` inference in
bfloat16, a missing ``--arch`` or ``--task`` named, the weights-only allowlist, NaN reports that
reach the backward pass, ``--num-batch-buckets`` on numpy 2.4+, a legacy model's own flags under
``fairseq-hydra-train``, no data-loader worker's temp folder left behind, no best score carried from
one training to the next in a process, an EMA started from the weights of a checkpoint without one,
an EMA that keeps a pre-LN stack's final LayerNorms, ``--lr-scheduler polynomial_decay`` without
``--total-num-update``, ``--device-id`` in a run of one process. This plugin's policies (refusing a
missing ``--restore-file``, explaining a checkpoint of another arch, refusing ``--fp16`` where
fairseq's fp16 trainer needs CUDA) run through task hooks that only its own tasks define
(:mod:`.restore_hooks`, :mod:`.run_hooks`; in the processes fairseq spawns for several GPUs too,
:mod:`.spawned_workers`), and one-line errors only concern its own exceptions.
``tests/stock_fairseq`` checks that fairseq's own scenarios give identical results with and without
the plugin.
"""

from lsg_fairseq.fairseq_fixes import (
    atomic_checkpoints,
    best_per_run,
    bf16_inference,
    bf16_off_tpu,
    checkpoint_errors,
    device_id,
    ema_from_weights,
    ema_keeps_versions,
    hydra_model_flags,
    interpolated_defaults,
    missing_arch,
    missing_task,
    nan_detector_hooks,
    numpy_buckets,
    one_line_errors,
    restore_hooks,
    run_hooks,
    spawned_workers,
    weights_only_load,
    worker_temp_dir,
)

# run_hooks before one_line_errors: both wrap call_main, and the refusals of the task's vet_run are
# printed as one line only if one_line_errors is the outer wrapper.
FIXES = (
    weights_only_load,
    atomic_checkpoints,
    checkpoint_errors,
    ema_from_weights,
    ema_keeps_versions,
    restore_hooks,
    spawned_workers,
    device_id,
    run_hooks,
    bf16_off_tpu,
    bf16_inference,
    missing_arch,
    missing_task,
    hydra_model_flags,
    interpolated_defaults,
    nan_detector_hooks,
    numpy_buckets,
    worker_temp_dir,
    best_per_run,
    one_line_errors,
)


def install() -> None:
    """Apply every fix (idempotent: a second call changes nothing)."""
    for fix in FIXES:
        fix.install()
