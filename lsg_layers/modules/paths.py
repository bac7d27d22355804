"""Which implementation a layer runs: one shaped for a CPU's caches, or one on whole tensors (GPU).

The layers with a CPU fast path (S4D's decay groups and channel chunks, LSG's and LED's strided key
windows, the T5 FFN's position chunks) cut their work into many small GEMMs and copies that stay
in a CPU's cache. On a GPU each of those pieces is a kernel launch, and their index plans need the
host to read device values; so there the same layers run on whole tensors: one batched FFT over
all channels, one gathered key set per query block and one fused attention call, with no
host-device synchronisation in the forward. Both paths compute the same function, and each is
tested against the slow references with the other forced on CPU (``tests/test_whole_tensor_paths.py``).

The attentions (LSG, LED) have a third path, ``"flex"`` (``lsg_layers.ops.flex``): their patterns
as FlexAttention masks, one fused kernel over the keys where they lie, no per-block key copies and
no float masks. It cannot drop attention probabilities, runs backward on CUDA only, and needs a
head dim of 16 or more; where it cannot run, the layer takes the whole-tensor path. It is taken only
when forced: on the one GPU measured its kernel alone took longer than the whole-tensor path's
entire encoder (``benchmarks/results/h200_49a7388``, ``benchmarks/flex_gpu_notes.md``).

``path``: ``"auto"`` (the default: the CPU paths on a CPU, except the attentions' for heads under
:data:`CPU_WINDOWS_MIN_HEAD_DIM` features; whole tensors on any other device), or ``"cpu"``,
``"whole"``, ``"flex"`` to force one (tests, benchmarks, a CPU user who wants the simple path); a
layer without a flex path takes whole tensors for ``"flex"``.
Each layer notes in ``ran`` the path its last call took (what benchmarks record).
"""

from contextlib import contextmanager
from typing import Optional, cast

import torch
import torch.nn as nn
from torch import Tensor

from lsg_layers.ops import flex

AUTO, WHOLE, CPU, FLEX = "auto", "whole", "cpu", "flex"
PATHS = (AUTO, WHOLE, CPU, FLEX)
# On a CPU the attentions' strided windows pay a fixed cost per small call, which heads of 16 or 32
# features do not amortise: there one gathered call per query block (the whole-tensor path) was
# faster, training, at every shape measured, and the windows from a head of 64 (base size) on
# (benchmarks/results/cpu_path_by_head_dim.md).
CPU_WINDOWS_MIN_HEAD_DIM = 64


def attention_path(path: str, device_type: str, head_dim: int, dropout: float, grad: bool) -> str:
    """The path an attention layer set to ``path`` runs: "cpu" (the strided-window kernels: CPU
    tensors, no attention dropout), "flex" (``flex.supported``) or "whole"; ``dropout`` is the
    attention dropout of this call (0 outside training), ``grad`` whether it builds a graph."""
    if path == AUTO:
        path = CPU if device_type == "cpu" and head_dim >= CPU_WINDOWS_MIN_HEAD_DIM else WHOLE
    if path == CPU and (device_type != "cpu" or dropout > 0):
        return WHOLE
    if path == FLEX and not flex.supported(device_type, head_dim, dropout, grad):
        return WHOLE
    return path


class PathChoice:
    """Mixin of the layers that have several paths; ``path`` is a plain attribute (not state)."""

    path = AUTO
    ran: Optional[str] = None  # the path of the last call: "cpu", "whole" or "flex"

    def whole_tensors(self, x: Tensor) -> bool:
        """Whether this call runs the whole-tensor path for input ``x`` (layers without flex)."""
        whole = x.device.type != "cpu" if self.path == AUTO else self.path in (WHOLE, FLEX)
        self.ran = WHOLE if whole else CPU
        return whole

    def choose_attention_path(self, x: Tensor, head_dim: int, dropout: float) -> str:
        """:func:`attention_path` for a call of this layer (an ``nn.Module``) on ``x``."""
        parameters = cast(nn.Module, self).parameters()  # the mixin sits on an nn.Module
        grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in parameters))
        self.ran = attention_path(self.path, x.device.type, head_dim, dropout, grad)
        return self.ran


def paths_ran(model: nn.Module) -> Optional[str]:
    """The paths the :class:`PathChoice` layers of ``model`` took in their last calls, e.g.
    "flex" or "cpu+whole" (None: no such layer ran)."""
    ran = sorted({m.ran for m in model.modules() if isinstance(m, PathChoice) and m.ran})
    return "+".join(ran) or None


@contextmanager
def forced_path(model: nn.Module, path: str):
    """Every :class:`PathChoice` module of ``model`` runs ``path`` inside the block, then its own again."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    saved = [(m, m.__dict__.get("path")) for m in model.modules() if isinstance(m, PathChoice)]
    try:
        for m, _ in saved:
            m.path = path
        yield model
    finally:
        for m, old in saved:
            if old is None:
                m.__dict__.pop("path", None)
            else:
                m.path = old
