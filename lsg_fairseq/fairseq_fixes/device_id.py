"""``--device-id N`` runs a one-process command on GPU N, as its help says ("which GPU to use"),
not on GPU 0 (no upstream issue found).

fairseq sets the CUDA device from ``--device-id`` only where it starts distributed training
(``distributed_utils.distributed_main``, and ``infer_init_method`` for a launcher's processes) and
in fairseq-validate's ``main``. A one-process fairseq-train (``--distributed-world-size 1``, or
one GPU visible), fairseq-interactive and fairseq-generate build everything on
``torch.device("cuda")``, the current device, GPU 0: on a shared machine the run landed on another
user's GPU, without a word. The fix sets the current device before ``main`` where the run has CUDA
and no distributed start of its own; an ``N`` that torch does not see is refused in one line
(torch's: an "invalid device ordinal" traceback from the first allocation), unless it is
``$LOCAL_RANK`` (fairseq's default), which a scheduler may set for a process that sees only its own
GPU: that runs on GPU 0, as before. ``CUDA_VISIBLE_DEVICES`` still works as before (it renumbers what
torch sees).
"""

import os
import sys

import torch
from fairseq.distributed import utils as distributed_utils

from lsg_fairseq.fairseq_fixes._wrap import wrap
from lsg_text.errors import ConfigError


def use_device_asked(cfg) -> None:
    """``torch.cuda.set_device(--device-id)`` for a run of one process on CUDA. ``cfg``: the
    structured config (installed before :mod:`.run_hooks`, whose wrapper of fairseq-generate's
    ``main`` makes its namespace one)."""
    dt = cfg.distributed_training
    if cfg.common.cpu or dt.distributed_world_size > 1 or dt.distributed_init_method is not None:
        return  # a distributed start sets each process's device itself
    if not torch.cuda.is_available():
        return
    device = int(dt.device_id)  # $LOCAL_RANK, fairseq's default, is a string
    seen = torch.cuda.device_count()
    if not 0 <= device < seen:
        if os.environ.get("LOCAL_RANK") == str(device):
            return  # a launcher's rank among GPUs this process does not see (one each): GPU 0, as fairseq
        raise ConfigError(f"--device-id {device}: torch sees {seen} GPU{'s' if seen != 1 else ''} (0 to {seen - 1})")
    if device != torch.cuda.current_device():
        torch.cuda.set_device(device)


def _on_the_device_asked(original):
    def main(cfg, *args, **kwargs):
        use_device_asked(cfg)
        return original(cfg, *args, **kwargs)

    return main


def install() -> None:
    wrap(distributed_utils, "call_main", _on_the_device_asked)  # fairseq-train, -validate, -interactive
    generate = sys.modules.get("fairseq_cli.generate")
    if generate is not None:  # fairseq-generate is importing the plugin through --user-dir
        wrap(generate, "main", _on_the_device_asked)
