"""Training-memory helpers for long encoder layers: what backward keeps, not what is computed.

At 16K tokens a base-size encoder layer's position-wise FFN keeps two (t, 4C) tensors for
backward (fc1's output for the activation's gradient, the activation's output for fc2's weight
gradient: 2 x 192 MiB), and CPU dropout keeps a float mask (``F.dropout`` on CPU multiplies by a
float noise tensor, 4 bytes per element). These helpers keep less and give the same gradients:

- :func:`ffn_recompute_activation`: ``fc2(act(fc1(x)))`` keeping x and fc1's output only; the
  activation is recomputed in backward (an elementwise op: cheap next to the two matmuls);
- :func:`bool_dropout`: inverted dropout keeping a bool mask (1 byte per element), and
  :class:`LeanDropout`, an ``nn.Dropout`` that uses it in training (torch's ``native_dropout``,
  which ``F.dropout`` calls on CUDA and not on a CPU).
"""

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


class _FFNRecomputeActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, activation):
        h = F.linear(x, w1, b1)  # (..., F)
        y = F.linear(activation(h), w2, b2)  # (..., C)
        ctx.activation = activation
        ctx.has_bias = (b1 is not None, b2 is not None)
        ctx.save_for_backward(x, h, w1, w2)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, h, w1, w2 = ctx.saved_tensors
        with torch.enable_grad():
            h_ = h.detach().requires_grad_(True)
            a = ctx.activation(h_)  # recomputed: the one tensor not kept
        gy = grad_y.reshape(-1, grad_y.size(-1))  # (N, C)
        grad_w2 = gy.t() @ a.detach().reshape(-1, a.size(-1))
        grad_b2 = gy.sum(0) if ctx.has_bias[1] else None
        (grad_h,) = torch.autograd.grad(a, h_, grad_y @ w2)
        del a
        gh = grad_h.reshape(-1, grad_h.size(-1))  # (N, F)
        grad_w1 = gh.t() @ x.reshape(-1, x.size(-1))
        grad_b1 = gh.sum(0) if ctx.has_bias[0] else None
        return grad_h @ w1, grad_w1, grad_b1, grad_w2, grad_b2, None


def ffn_recompute_activation(x: Tensor, fc1: torch.nn.Linear, fc2: torch.nn.Linear, activation) -> Tensor:
    """``fc2(activation(fc1(x)))`` whose backward recomputes the activation (see module doc)."""
    return _FFNRecomputeActivation.apply(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, activation)


def native_dropout_ok(x: Tensor) -> bool:
    """Whether dropout on ``x`` runs as torch's ``native_dropout`` (one op each way; on CUDA the one
    kernel ``F.dropout`` runs there) rather than the formula written out (:func:`where_dropout`,
    five ops forward and three backward). Not on a CPU in half precision: its kernel rounds the scale
    to the half dtype first; in float32 and float64 it gives the formula's bits
    (tests/test_lean_layer.py)."""
    return x.is_cuda or x.dtype not in (torch.float16, torch.bfloat16)


def bool_dropout(x: Tensor, p: float) -> Tensor:
    """Inverted dropout (training) whose backward keeps only its bool mask: ``x * keep / (1 - p)``
    with ``keep`` drawn as ``empty(bool).bernoulli_(1 - p)``."""
    if native_dropout_ok(x):
        return torch.native_dropout(x, p, True)[0]
    return where_dropout(x, p)


def dropout_with_mask(x: Tensor, p: float) -> Tuple[Tensor, Tensor]:
    """Dropout outside autograd, for a backward written out (``t5_layers.GatedGeluFFN``): the output
    and ``keep``. ``x`` is a temporary the result may overwrite: on CUDA torch's ``native_dropout``
    (one kernel), elsewhere ``keep`` drawn as :func:`bool_dropout` draws it and :func:`masked_scale`."""
    if x.is_cuda:
        return torch.native_dropout(x, p, True)
    keep = _draw_keep(x, p)
    return masked_scale(x, keep, p), keep


def masked_scale(x: Tensor, keep: Tensor, p: float) -> Tensor:
    """``x * keep / (1 - p)`` for a mask already drawn: dropout's backward, or its forward replayed.
    ``x`` is a temporary the result may overwrite: on CUDA torch's ``native_dropout_backward`` (one
    kernel), elsewhere two products in place (a CPU's ``native_dropout_backward`` is the same two
    products, each allocating its result: slower, benchmarks/results/ab_0911a25_d28760c.md)."""
    if x.is_cuda:
        return torch.ops.aten.native_dropout_backward(x, keep, 1.0 / (1.0 - p))
    return x.mul_(keep).mul_(1.0 / (1.0 - p))


def where_dropout(x: Tensor, p: float) -> Tensor:
    """:func:`bool_dropout` written out: ``where`` keeps only the bool mask for backward."""
    return torch.where(_draw_keep(x, p), x, x.new_zeros(())) * (1.0 / (1.0 - p))


def _draw_keep(x: Tensor, p: float) -> Tensor:
    return torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1.0 - p)


class LeanDropout(torch.nn.Dropout):
    """``nn.Dropout`` whose training step keeps a bool mask for backward (:func:`bool_dropout`)
    instead of CPU dropout's float one: a quarter of the memory, the same distribution."""

    def forward(self, x: Tensor) -> Tensor:
        if self.training and 0 < self.p < 1 and torch.is_grad_enabled():
            return bool_dropout(x, self.p)
        return super().forward(x)
