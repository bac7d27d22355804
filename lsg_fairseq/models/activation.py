"""The FFN activation of the BART-shaped layers: fairseq's, with its gelu in one pass.

fairseq's ``gelu`` (``fairseq.modules.gelu``, what ``--activation-fn gelu``, BART's, gives) is
``F.gelu(x.float()).type_as(x)``: for bf16 or fp16 activations, three passes over the FFN's widest
tensor (the cast up, the gelu, the cast down; the enc profiles of ``benchmarks/results/h200_*/``
show the three kernels in every layer). ``F.gelu`` on the half tensor is one pass, and its CUDA
kernel computes in float32 and rounds once, as fairseq's three passes do, so the numbers are the
same; the GPU check's conformance stage compares both forms, values and gradients, on the card. On
a CPU the two forms are one and the same op in float32 (fairseq's casts do nothing there) but not
in half precision on every CPU: the float16 kernel rounds otherwise, and in bfloat16 the gradients
differ in the last bit at tiny values on some CPUs and not on others (an AMD EPYC of family 23
computes fairseq's float32 gradient there with a cancellation that the bfloat16 kernel avoids). So
on a CPU the layers keep fairseq's function, whose bits do not depend on which CPU runs it; the one
pass is for the device where its passes cost time.

:func:`activation_fn` is what :class:`~lsg_fairseq.models.custom_encoder.LongInputEncoderLayer`
and :class:`~lsg_fairseq.models.long_source_decoder.LongSourceDecoderLayer` use in place of
fairseq's lookup; every other activation is fairseq's own.
"""

from typing import Callable

import torch.nn.functional as F
from fairseq import utils
from fairseq.modules.gelu import gelu as fairseq_gelu
from torch import Tensor


def one_pass_gelu(x: Tensor) -> Tensor:
    """fairseq's ``gelu``, bit for bit: off the CPU in one pass, without its float32 copies."""
    if x.device.type == "cpu":
        return fairseq_gelu(x)
    return F.gelu(x)


def activation_fn(name: str) -> Callable[[Tensor], Tensor]:
    """fairseq's ``utils.get_activation_fn(name)``, its gelu replaced by :func:`one_pass_gelu`."""
    fn = utils.get_activation_fn(name)
    return one_pass_gelu if fn is fairseq_gelu else fn
