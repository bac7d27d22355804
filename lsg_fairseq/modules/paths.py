"""Which implementation a layer runs: one shaped for a CPU's caches, or one on whole tensors (GPU).

The layers with a CPU fast path (S4D's decay groups and channel chunks, LSG's and LED's strided key
windows, the T5 FFN's position chunks) cut their work into many small GEMMs and copies that stay
in a CPU's cache. On a GPU each of those pieces is a kernel launch, and their index plans need the
host to read device values; so there the same layers run on whole tensors: one batched FFT over
all channels, one gathered key set per query block and one fused attention call, with no
host-device synchronisation in the forward. Both paths compute the same function, and each is
tested against the slow references with the other forced on CPU (``tests/test_whole_tensor_paths.py``).

``path``: ``"auto"`` (the default: whole tensors on any device but the CPU), ``"whole"`` or ``"cpu"``
to force one (tests, benchmarks, a CPU user who wants the simple path).
"""
from contextlib import contextmanager

import torch.nn as nn
from torch import Tensor

AUTO, WHOLE, CPU = "auto", "whole", "cpu"
PATHS = (AUTO, WHOLE, CPU)


class PathChoice:
    """Mixin of the layers that have both paths; ``path`` is a plain attribute (not state)."""

    path = AUTO

    def whole_tensors(self, x: Tensor) -> bool:
        """Whether this call runs the whole-tensor path for input ``x``."""
        if self.path == AUTO:
            return x.device.type != "cpu"
        return self.path == WHOLE


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
