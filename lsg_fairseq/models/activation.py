"""The FFN activation of the BART-shaped layers: fairseq's, with its gelu in one pass.

fairseq's ``gelu`` (``fairseq.modules.gelu``, what ``--activation-fn gelu``, BART's, gives) is
``F.gelu(x.float()).type_as(x)``: for bf16 or fp16 activations, three passes over the FFN's widest
tensor (the cast up, the gelu, the cast down; the enc profiles of ``benchmarks/results/h200_*/``
show the three kernels in every layer). ``F.gelu`` on the half tensor is one pass, and its kernel
computes in float32 and rounds once, so the result is the same number: on CUDA every dtype, and on
a CPU for float32 and bfloat16 (tests/test_activation.py holds it, values and gradients). The
CPU's float16 kernel computes otherwise and differs in the last bit, so a float16 tensor on a CPU
keeps fairseq's function. The GPU check's conformance stage compares both forms on the card.

:func:`activation_fn` is what :class:`~lsg_fairseq.models.custom_encoder.LongInputEncoderLayer`
and :class:`~lsg_fairseq.models.long_source_decoder.LongSourceDecoderLayer` use in place of
fairseq's lookup; every other activation is fairseq's own.
"""

from typing import Callable

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules.gelu import gelu as fairseq_gelu
from torch import Tensor


def one_pass_gelu(x: Tensor) -> Tensor:
    """fairseq's ``gelu``, bit for bit, without its float32 copies where the kernel allows."""
    if x.dtype == torch.float16 and x.device.type == "cpu":
        return fairseq_gelu(x)
    return F.gelu(x)


def activation_fn(name: str) -> Callable[[Tensor], Tensor]:
    """fairseq's ``utils.get_activation_fn(name)``, its gelu replaced by :func:`one_pass_gelu`."""
    fn = utils.get_activation_fn(name)
    return one_pass_gelu if fn is fairseq_gelu else fn
