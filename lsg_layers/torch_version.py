"""Which torch this package runs on, said once.

``MIN_TORCH`` is the oldest torch on which the whole test suite passes (``scripts/torch_versions.sh``,
its table ``scripts/torch_versions.md``); ``setup.py``'s ``torch>=`` is the same version
(``tests/test_torch_version.py`` holds both). Older ones fail in ways that name nothing of the cause
(torch 2.2: an ``AttributeError`` for a private aten op at import; 2.4: checkpoints load without the
weights-only allowlist, no FlexAttention), so importing ``lsg_layers`` (which every part of the
plugin does first) refuses them in one line. A feature that needs a newer torch than the floor
checks for itself with :func:`at_least` (the compiled encoder layers: ``COMPILED_LAYERS_TORCH``).
"""

import re
from typing import Optional, Tuple

import torch

MIN_TORCH = (2, 6)
# dynamo's skip_fwd_side_effects_in_bwd_under_checkpoint (lsg_fairseq/models/compiled_layers.py)
COMPILED_LAYERS_TORCH = (2, 10)


def version_tuple(version: str) -> Tuple[int, int]:
    """(major, minor) of a torch version string such as ``2.13.0+cpu`` or ``2.11.0a0+git1234``."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def spelled(minimum: Tuple[int, int]) -> str:
    """``(2, 10)`` as the messages write it: ``2.10``."""
    return ".".join(map(str, minimum))


def at_least(minimum: Tuple[int, int], version: Optional[str] = None) -> bool:
    """Whether torch (or ``version``) is ``minimum`` or newer."""
    return version_tuple(version or torch.__version__) >= minimum


def check(version: Optional[str] = None) -> None:
    """Raise an ImportError in one line when torch (or ``version``) is older than ``MIN_TORCH``."""
    version = version or torch.__version__
    if not at_least(MIN_TORCH, version):
        floor = spelled(MIN_TORCH)
        raise ImportError(
            f"lsg-fairseq needs torch >= {floor}, and this is torch {version}: install torch >= {floor} "
            "(the build for your CUDA; README, 'Install by hand')"
        )
