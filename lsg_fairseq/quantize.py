"""CPU inference with int8 linear layers: ``quantize_int8(model)`` (``lsg-fairseq-summarize --quantize int8``).

Dynamic quantization through PyTorch's own ``torch.ao.quantization.quantize_dynamic`` (no new
dependency): every ``nn.Linear`` except the tied output projection becomes a
``DynamicQuantizedLinear`` with int8 weights (one scale per output row, "per channel"), and its
input is quantized to int8 on the fly at each call (one scale per tensor). Embeddings, LayerNorms,
the attention math itself (LSG blocks, LED bands, the S4D FFT convolution) stay fp32. Measured
speed and logit changes: benchmarks/results/int8.md.

Three things that are not just "call quantize_dynamic":

- The tied output projection (``decoder.output_projection.weight is embed_tokens.weight``) is left
  in fp32: quantizing it would untie a copy of the embeddings, and every logit depends on it.
  Any Linear whose weight is shared with another module is skipped for the same reason.
- fairseq's ``MultiheadAttention`` (the BART decoder; plain BART encoders) has a fast path that
  reads ``q_proj.weight`` / ``.bias`` as tensors, which a quantized Linear no longer has (they are
  methods there). ``_set_skip_embed_dim_check()``, fairseq's own switch for pruned heads, sends it
  down its ordinary path, which calls ``q_proj(x)``: same math, and it only skips a shape assert.
- ``torch.ao.quantization`` warns that it is deprecated in favour of torchao (torch 2.13 still
  ships it and it works); torchao is not a dependency here, so the warnings are silenced.
"""

import warnings

import torch
from torch import nn

from lsg_text.errors import ConfigError


def shared_weight_linears(model: nn.Module) -> set:
    """Names of the ``nn.Linear`` modules whose weight is also registered elsewhere (tied)."""
    seen = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {name for name, m in model.named_modules() if isinstance(m, nn.Linear) and seen.get(id(m.weight), 0) > 1}


def quantize_int8(model: nn.Module) -> nn.Module:
    """Make ``model``'s untied ``nn.Linear`` layers dynamic int8, in place, and return it.

    CPU and fp32 only; raises :class:`ConfigError` otherwise. Meant for inference (``eval()``):
    quantized layers have no gradients.
    """
    devices = {p.device.type for p in model.parameters()}
    if devices - {"cpu"}:
        raise ConfigError(
            f"--quantize int8 runs on the CPU only; the model is on {sorted(devices - {'cpu'})[0]} (use --device cpu)"
        )
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes - {torch.float32}:
        raise ConfigError(
            f"--quantize int8 needs an fp32 model, not {sorted(map(str, dtypes - {torch.float32}))[0]} (drop --fp16)"
        )
    tied = shared_weight_linears(model)
    names = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and name not in tied]
    for m in model.modules():
        if hasattr(m, "_set_skip_embed_dim_check") and hasattr(m, "q_proj"):  # fairseq MultiheadAttention
            m._set_skip_embed_dim_check()
    with warnings.catch_warnings():
        # torch.ao.quantization's DeprecationWarning (torchao is its successor) and the quantized
        # tensor constructors' UserWarning: both still work in torch 2.13
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        return quantize_dynamic(
            model, {name: per_channel_dynamic_qconfig for name in names}, dtype=torch.qint8, inplace=True
        )
