"""The encoder layers run as ``torch.compile`` graphs: one compiled graph per layer call instead of
one host dispatch per op.

Why: at batch 1 a GPU's training step of these models waits on the host, not on the device. On the
fifth H200 reading every training row at 16K but bart's had a host share of 1.00 (lsg_norm 79.2 ms
of wall over 39.7 ms of device time; ``benchmarks/flex_gpu_notes.md``): each of a step's ~3,600
dispatcher ops costs the host ~20 us, more than the device needs for most of them. A compiled layer
issues its fused kernels from generated code, with no autograd or dispatcher work per op.

What changes, and what does not:

- the parameters, the state dict and the checkpoints are the same (``nn.Module.compile`` compiles
  the module's call in place, no ``_orig_mod`` prefix);
- the function is the same: outputs and gradients equal the eager layers' up to the rounding of a
  different summation order (``tests/test_compiled_layers.py``, every family against its eager self);
- ``--lean-activations`` keeps its attention recompute (``torch.utils.checkpoint``, which dynamo
  traces); the FFN's hand-written backward is left to the compiler's partitioner, which recomputes
  the activation by itself (``LongInputEncoderLayer.forward``); dropout under compile draws from
  the compiler's own generator: the same distribution, other masks than eager's for a seed;
- the first call of each shape compiles (seconds to a minute); dynamo keeps up to
  ``ops.compiling.RECOMPILE_LIMIT`` versions (a new length, train or eval, grad or not), and with
  ``dynamic=None`` turns the length dynamic after its second one.

A layer whose first call builds a cache (LSG's block tables, LED's per-forward plan) writes it inside
the checkpointed attention. Eager checkpointing replays that write when it recomputes; the compiled
graph skips it in backward (``skip_fwd_side_effects_in_bwd_under_checkpoint``): the caches are
pure functions of the shapes and the batch's global positions, so the recompute reads or rebuilds
the same values. Without the setting, dynamo would run such a layer eagerly.
"""

from typing import Optional

import torch
import torch.nn as nn

from lsg_layers.ops.compiling import raise_recompile_limit
from lsg_layers.torch_version import COMPILED_LAYERS_TORCH, at_least, spelled


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The encoder layers of a fairseq encoder-decoder (``model.encoder.layers``); a clear error for
    a model without them (LOCOST's encoder has blocks, not fairseq layers)."""
    layers = getattr(getattr(model, "encoder", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(f"{type(model).__name__}: no encoder.layers to compile (BART-shaped models only)")
    return layers


def compile_encoder_layers(model: nn.Module, dynamic: Optional[bool] = None, backend: str = "inductor") -> int:
    """Compile every encoder layer of ``model`` in place (see the module's docstring); returns how
    many. ``dynamic``, ``backend``: ``torch.compile``'s (dynamic None: static until a second shape
    is seen; False: one compile per shape, what a benchmark at one length wants; backend
    ``"aot_eager"``: the same graphs, forward and backward, run by eager kernels, no code generated)."""
    from torch import _dynamo

    if not at_least(COMPILED_LAYERS_TORCH):  # no skip_fwd_side_effects_in_bwd_under_checkpoint before
        need = spelled(COMPILED_LAYERS_TORCH)
        raise RuntimeError(f"compiling the encoder layers needs torch >= {need}; this is torch {torch.__version__}")
    layers = encoder_layers(model)
    raise_recompile_limit()
    _dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    for layer in layers:
        layer.compile(dynamic=dynamic, backend=backend)
    return len(layers)
