"""Half-precision guards of the layers: where float16's range or any half type's precision breaks the math.

A model runs in half precision two ways, and the layers must be right under both:

- cast: fairseq's ``--fp16`` / ``--bf16`` call ``model.half()`` / ``.bfloat16()``, so activations
  are half tensors;
- autocast: fairseq's ``--amp`` runs the forward under CUDA float16 autocast (weights and
  activations float32, matmuls and convolutions cast to float16 on the fly).

float16 tops out at 65504; bfloat16 has float32's range but 8 bits of mantissa. The guards:

- :func:`float32_region`: autocast off inside, for math that must stay float32 whatever the
  caller asked (the S4D kernel's Vandermonde product and FFT convolution: its phases and decays
  need float32, a bfloat16 kernel is ~1e-3 off);
- :func:`autocast_on` / :func:`fp16_in_play`: whether autocast is on / whether ops on a tensor run
  in float16 (it is float16, or float16 autocast is on for its device): where HF's T5 computes in
  float32 (its ``wo`` projection) or clamps;
- :func:`matmul_dtype`: the dtype ``nn.Linear`` computes in for an input ``x`` (autocast's, or
  x's own): a product stored for a projection is stored in it, so that it is clamped for float16
  where float16 is what the projection reads (a bfloat16 store would round 65504 up to 65536):
  :func:`cast_for_matmul`;
- :func:`clamp_fp16`: HF T5's clamp of float16 hidden states (inf -> the largest finite value less
  a margin), a no-op for any other dtype; :func:`within_fp16` clamps a float32 tensor to float16's
  range before it meets a float16 op.
"""

import contextlib

import torch
from torch import Tensor

FP16_MAX = torch.finfo(torch.float16).max  # 65504


def autocast_on(x: Tensor) -> bool:
    """Whether autocast is on for ``x``'s device type (never for a type without autocast: meta)."""
    kind = x.device.type
    return torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind)


def float32_region(x: Tensor):
    """A context in which autocast is off for ``x``'s device type: ops run in their inputs' dtypes."""
    if not autocast_on(x):
        return contextlib.nullcontext()
    return torch.autocast(device_type=x.device.type, enabled=False)


def fp16_in_play(x: Tensor) -> bool:
    """Whether ops on ``x`` run in float16: ``x`` is float16, or float16 autocast is on for its device."""
    if x.dtype == torch.float16:
        return True
    kind = x.device.type
    return autocast_on(x) and torch.get_autocast_dtype(kind) == torch.float16


def matmul_dtype(x: Tensor) -> torch.dtype:
    """The dtype a matmul (``nn.Linear``) on ``x`` computes in: autocast's dtype when autocast is on
    for ``x``'s device (float64 excepted: autocast leaves it alone), else ``x``'s own."""
    if autocast_on(x) and x.dtype != torch.float64:
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def cast_for_matmul(x: Tensor, dtype: torch.dtype) -> Tensor:
    """A float32 ``x`` in ``dtype``, the dtype of the matmul that reads it (:func:`matmul_dtype`),
    clamped to float16's range where that is float16 (a value past 65504 stays the largest float16)."""
    return (within_fp16(x) if dtype == torch.float16 else x).to(dtype)


def clamp_fp16(x: Tensor) -> Tensor:
    """HF T5's guard on float16 hidden states (``T5Block``): clamp to +-(max - 1000) where an inf
    appeared, else to +-max; other dtypes are returned as they are."""
    if x.dtype != torch.float16:
        return x
    limit = torch.where(torch.isinf(x).any(), FP16_MAX - 1000, FP16_MAX)
    return torch.clamp(x, min=-limit, max=limit)


def within_fp16(x: Tensor) -> Tensor:
    """``x`` clamped to float16's finite range (its dtype kept): a float32 value that a float16 op
    would turn into inf stays the largest float16 instead."""
    return x.clamp(-FP16_MAX, FP16_MAX)
