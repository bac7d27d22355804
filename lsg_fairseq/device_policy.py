"""What this plugin's tasks demand of the device and precision flags (policies, not fixes), and how
they report running out of device memory and a training that diverged.

:func:`vet_run` is called before any work by ``fairseq-train`` (and -validate, -interactive)
through the task hook of :mod:`lsg_fairseq.fairseq_fixes.run_hooks`, so it holds for
``--task long_document_summarization`` / ``gap_sentence_generation`` only:

* ``--optimizer grouped_adam`` with ``--fp16``: fairseq's fp16 optimizer copies every parameter
  into one flat, untagged float32 tensor, which would put LOCOST's SSM parameters into the main
  group (weight decay, the main learning rate) without a word; the float32 copies are kept per
  tensor instead (``--fp16-no-flatten-grads``, which carries the tags), said in the log.
  (``--bf16``, ``--memory-efficient-fp16`` and ``--amp`` keep the tensors apart already.)
* ``--distributed-world-size N`` with more processes than GPUs for fairseq to spawn, and no
  launcher (:func:`check_process_count`); with ``--cpu``, fairseq's default N (the GPUs it counts)
  is settled to one process (:func:`one_cpu_process`); across SLURM nodes, no ``--distributed-port``
  (:func:`check_slurm_port`);
* ``--fp16`` where fairseq's flat fp16 copies need CUDA (``--cpu``, or no GPU), and ``--amp``
  there (CUDA float16 autocast: on a CPU it trains in float32 and says nothing), are refused in one
  line that names the flag and the CPU's half precision (``--bf16``);
* ``--profile`` there too (:func:`check_profiler`): fairseq-train enters the CUDA profiler with it.

:func:`explain_out_of_memory` turns a device out-of-memory error of a training, validation or
generation step into a one-line refusal naming the batch's length and the flags that shrink it
(fairseq's trainer would log the OOM, skip the batch and go on, batch after batch), and
:func:`explain_divergence` a training whose gradients became NaN/Inf (or whose float16 loss scale
hit its floor) into one line naming the flags that help, instead of fairseq's traceback.
"""

import contextlib
import logging
import os
from typing import Optional

import torch

from lsg_text.errors import ConfigError, UserError

logger = logging.getLogger(__name__)


def first_line(error: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class TrainingDiverged(UserError, FloatingPointError):
    """Gradients became NaN/Inf, or float16's loss scale reached its floor; the message names the
    flags that help."""


def explain_divergence(cfg, command: str, error: BaseException):
    """fairseq's FloatingPointError of a training (``command`` ``fairseq_cli.train``) as a
    :class:`TrainingDiverged` naming the flags that help, or None for anything else.

    The error may be the context of another: after a FloatingPointError fairseq's trainer reruns
    the step under its NanDetector (which logs the first module with a NaN output or gradient), and
    that rerun may fail in turn (it did on every encoder before ``fairseq_fixes.nan_detector_hooks``)."""
    if command != "fairseq_cli.train" or isinstance(error, UserError):
        return None
    while error is not None and not isinstance(error, FloatingPointError):
        error = error.__cause__ or error.__context__
    if error is None:
        return None
    helps = ["lower --lr", "add warmup (--lr-scheduler inverse_sqrt --warmup-updates N)"]
    if not cfg.optimization.clip_norm:
        helps.append("clip gradients (--clip-norm 1.0)")
    if cfg.common.fp16 or cfg.common.memory_efficient_fp16:
        helps.append("train in --bf16 (float16 overflows where bfloat16 does not)")
    return TrainingDiverged(
        f"training diverged ({first_line(error)}): {', '.join(helps)}; the checkpoints saved before it in "
        "--save-dir are intact: resume with the new flags"
    )


class DeviceMemoryError(UserError, RuntimeError):
    """A step ran out of device memory; the message names the batch and the flags that shrink it.

    A RuntimeError whose message never says "out of memory": fairseq's trainer re-raises such an
    error as it is, where it would skip a batch whose error says so (and save ``crash.pt`` for any
    other exception). ``stage``, ``batch`` and ``detail`` are kept so that an enclosing caller, which
    knows the command's flags, can give its own ``advice`` (:meth:`advised`)."""

    def __init__(self, stage: str, batch: str, advice: str, detail: str):
        self.stage, self.batch, self.advice, self.detail = stage, batch, advice, detail
        super().__init__(
            f"device memory ran out in {stage} on a batch of {batch}: {advice}, or shorten the inputs "
            f"with --max-source-positions ({detail})"
        )

    def advised(self, advice: str, stage: Optional[str] = None) -> "DeviceMemoryError":
        """The same error with the flags of the command that ran it."""
        return DeviceMemoryError(stage or self.stage, self.batch, advice, self.detail)


# What shrinks a step's memory, by stage: the flags of the fairseq command that runs it (validation
# in fairseq-train batches with the -valid flags, which default to the training ones; fairseq-validate
# with --max-tokens and --batch-size themselves)
MEMORY_ADVICE = {
    "training": "lower --max-tokens (or --batch-size), pass --checkpoint-activations (activations recomputed "
    "in backward)",
    "validation": "lower --max-tokens-valid (or --batch-size-valid; fairseq-validate: --max-tokens, --batch-size)",
    "generation": "lower --max-tokens (or --batch-size) or --beam",
}


def without_cuda(common) -> Optional[str]:
    """Why a run has no CUDA device, in words (``--cpu``, or a torch that sees no GPU), or None
    where it has one."""
    if common.cpu:
        return "--cpu is given"
    return None if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA GPU"


def vet_run(cfg, command: str) -> None:
    """Refuse or settle precision flags before a ``command`` (``fairseq_cli.train``, ...) runs."""
    if command != "fairseq_cli.train":
        return  # generation and validation run fp16 on a CPU (slowly) and have no optimizer
    common = cfg.common
    flat_fp16 = common.fp16 and not common.memory_efficient_fp16 and not common.fp16_no_flatten_grads
    optimizer = getattr(cfg.optimizer, "_name", None) if cfg.get("optimizer") is not None else None
    if flat_fp16 and optimizer == "grouped_adam":
        common.fp16_no_flatten_grads = True
        flat_fp16 = False
        logger.info(
            "--optimizer grouped_adam with --fp16: float32 master copies kept per tensor "
            "(--fp16-no-flatten-grads), so that its parameter groups survive"
        )
    if common.cpu:
        one_cpu_process(cfg.distributed_training)
    check_process_count(cfg.distributed_training)
    check_slurm_port(cfg.distributed_training)
    where = without_cuda(common)
    if where is None:
        return
    if common.amp:
        raise ConfigError(
            f"--amp: fairseq's --amp is CUDA float16 autocast, and here ({where}) it would "
            "train in float32 without a word; drop it, or use --bf16 for half precision on a CPU"
        )
    if flat_fp16:
        raise ConfigError(
            f"--fp16: fairseq's fp16 trainer keeps its float32 master weights in one flat "
            f"CUDA tensor, and here {where}; use --bf16 for half precision on a CPU "
            "(or add --fp16-no-flatten-grads)"
        )


def check_profiler(common) -> None:
    """``--profile``: fairseq-train's ``cli_main`` (and fairseq-hydra-train's ``main``) run the whole
    command inside ``torch.cuda.profiler.profile()`` and ``emit_nvtx()`` (NVTX ranges for Nsight
    Systems or nvprof): where torch runs no CUDA that is an AssertionError traceback before the run
    starts, so it is refused before it (this check runs there, ``fairseq_fixes.run_hooks``)."""
    where = without_cuda(common) if common.profile else None
    if where is None:
        return
    raise ConfigError(
        f"--profile: fairseq runs the command under the CUDA profiler with it (NVTX ranges for Nsight Systems), "
        f"and here {where}; drop it"
    )


def start_inferred(dist) -> bool:
    """Whether fairseq infers how several processes meet: no ``--distributed-init-method``, no port."""
    return dist.distributed_world_size > 1 and dist.distributed_init_method is None and dist.distributed_port <= 0


def fairseq_spawns(dist) -> bool:
    """Whether fairseq-train would start processes itself for ``dist``: several, and nothing else to
    start them (no ``--distributed-init-method``, no torchrun or SLURM environment, no port)."""
    launched = all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"))
    launched = launched or "SLURM_JOB_NODELIST" in os.environ
    return start_inferred(dist) and not launched


def one_cpu_process(dist) -> None:
    """``--cpu`` on a machine with several GPUs: fairseq-train's default ``--distributed-world-size``
    counts them, and it spawned one process per GPU, each on the CPU with its NCCL backend, which
    cannot run there (a RuntimeError traceback from every process; ``make demo`` with DEVICE=cpu on
    such a machine). Trains in one process, said in the log. A world size above the GPUs is
    :func:`check_process_count`'s."""
    n = dist.distributed_world_size
    if not fairseq_spawns(dist) or n > torch.cuda.device_count():
        return
    logger.info(
        f"--cpu: --distributed-world-size {n} (fairseq's default counts the GPUs torch sees) would spawn {n} "
        "processes on the CPU with fairseq's NCCL backend, which needs GPUs; training in one process (several "
        "CPU processes: README, 'Distributed')"
    )
    dist.distributed_world_size = 1


def check_process_count(dist) -> None:
    """``--distributed-world-size N`` with nothing to start the processes but fairseq itself (no
    ``--distributed-init-method``, no torchrun or SLURM environment, no port): fairseq then spawns
    one process per visible GPU and asserts there are N ("world size is 2 but have 0 available
    devices"), after the command has started. Refused here, with the ways that work."""
    n = dist.distributed_world_size
    if not fairseq_spawns(dist):
        return
    gpus = torch.cuda.device_count()
    if n > gpus:
        raise ConfigError(
            f"--distributed-world-size {n}: fairseq starts one process per GPU itself, and torch sees {gpus}; "
            "launch the processes with torchrun (GPUs), or on CPUs start each one with --distributed-rank R "
            "--distributed-init-method tcp://HOST:PORT --distributed-no-spawn --distributed-backend gloo "
            "(README, 'Distributed')"
        )


def check_slurm_port(dist) -> None:
    """fairseq-train across SLURM nodes without ``--distributed-port``: fairseq reads the nodes from
    SLURM, then, with no port to meet on, falls back to one node's own start and asserts that node has
    every process's GPU ("world size is 16 but have 8 available devices"), in every task."""
    nodes = os.environ.get("SLURM_NNODES", "1")
    slurm = "SLURM_JOB_NODELIST" in os.environ or "SLURM_STEP_NODELIST" in os.environ
    if not slurm or not nodes.isdigit() or int(nodes) <= 1 or not start_inferred(dist):
        return
    raise ConfigError(
        f"--distributed-port is required to train across the {nodes} SLURM nodes (any free port, the same in "
        "every task, e.g. --distributed-port 12345): without it fairseq starts each node on its own and fails "
        "(README, 'Distributed')"
    )


def is_out_of_memory(error: BaseException) -> bool:
    """A device (or host) allocator's out-of-memory error."""
    oom = getattr(torch, "OutOfMemoryError", None)
    if oom is not None and isinstance(error, oom):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error)


def describe_batch(sample) -> str:
    """'N documents of up to L source tokens (T target tokens)' of a fairseq sample."""
    net_input = (sample or {}).get("net_input", {})
    src = net_input.get("src_tokens")
    if src is None:
        return "a batch"
    text = f"{src.size(0)} document{'s' if src.size(0) != 1 else ''} of up to {src.size(1):,} source tokens"
    target = sample.get("target")
    if target is not None:
        text += f" ({target.size(1):,} target tokens)"
    return text


@contextlib.contextmanager
def explain_out_of_memory(sample, stage: str, advice: Optional[str] = None):
    """Re-raise an out-of-memory error of the block as a :class:`DeviceMemoryError` naming the batch.

    ``stage``: "training", "validation" or "generation"; ``advice``: the flags that shrink it
    (default: the stage's, :data:`MEMORY_ADVICE`). A :class:`DeviceMemoryError` of a step inside the
    block (validation's ROUGE generation) takes this block's stage and advice: the outer caller
    knows which command's flags apply."""
    advice = advice or MEMORY_ADVICE[stage]
    try:
        yield
    except DeviceMemoryError as e:
        raise e.advised(advice, stage) from e.__cause__
    except Exception as e:  # noqa: BLE001  (only out-of-memory errors are replaced)
        if not is_out_of_memory(e):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        detail = first_line(e).replace("out of memory", "OOM")
        raise DeviceMemoryError(stage, describe_batch(sample), advice, detail) from e
