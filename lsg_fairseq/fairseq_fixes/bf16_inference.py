"""``--bf16`` in fairseq-generate, -interactive and -validate runs the models in bfloat16 (no
upstream issue found; fairseq#4696 is bf16 training off TPUs, :mod:`.bf16_off_tpu`).

fairseq 0.12's three inference commands cast their models for ``--fp16`` only (``model.half()``
after loading them). Under ``--bf16`` they run in float32 without a word: a checkpoint trained with
``--bf16`` holds bfloat16 weights, which its loader reads back into float32 parameters. A GPU user who
asks for bfloat16 inference gets float32's time and memory.

While one of the three commands runs with ``--bf16`` (and not ``--fp16``), the models that
``checkpoint_utils.load_model_ensemble_and_task`` returns (generate's and interactive's
``load_model_ensemble`` goes through it) are cast with ``.to(torch.bfloat16)``, as fairseq's trainer
casts a model for ``--bf16`` training; what must stay float32 stays so (S4D's parameters,
``S4DKernel._apply``). The loader is put back when the command returns. As the other fixes of a
command's ``main``, installed when the command is imported first (it imports the plugin through
``--user-dir``; ``lsg-fairseq-generate`` installs the fixes again once it has imported its command).
"""

import contextlib
import sys

import torch
from fairseq import checkpoint_utils

from lsg_fairseq.fairseq_fixes._wrap import wrap

LOADER = "load_model_ensemble_and_task"
COMMANDS = ("fairseq_cli.generate", "fairseq_cli.interactive", "fairseq_cli.validate")


@contextlib.contextmanager
def models_loaded_in_bf16():
    """Within the block, the models fairseq's checkpoint loader returns are cast to bfloat16."""
    load = getattr(checkpoint_utils, LOADER)

    def cast(*args, **kwargs):
        result = load(*args, **kwargs)
        for model in result[0]:
            model.to(torch.bfloat16)
        return result

    setattr(checkpoint_utils, LOADER, cast)
    try:
        yield
    finally:
        setattr(checkpoint_utils, LOADER, load)


def _bf16_requested(cfg) -> bool:
    common = getattr(cfg, "common", None) or cfg  # a DictConfig, or the Namespace cli_main passes
    return bool(getattr(common, "bf16", False)) and not getattr(common, "fp16", False)


def _bf16_inference(original):
    def main(cfg, *args, **kwargs):
        if not _bf16_requested(cfg):
            return original(cfg, *args, **kwargs)
        with models_loaded_in_bf16():
            return original(cfg, *args, **kwargs)

    return main


def install() -> None:
    for name in COMMANDS:
        command = sys.modules.get(name)
        if command is not None:  # the command is importing the plugin through --user-dir
            wrap(command, "main", _bf16_inference)
