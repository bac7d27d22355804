"""A linear projection written straight into a zero-padded key/value buffer.

The block-sparse attentions (LSG, LED) read every block's keys as a strided window of one
token-major source that has masked padding around the tokens. Building that source as
``F.pad(proj(x))`` allocates, fills and copies the whole (t, C) projection once more, and on long
inputs each fresh buffer of that size is also paid in page faults; so without autograd a plain
``nn.Linear`` writes its rows straight into the padded buffer (``addmm(out=)``). With autograd, or
for a projection that exposes no weight tensor (an int8 ``DynamicQuantizedLinear``), the result
is the same, made with one ``cat``.
"""

from typing import Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor


def padded_projection(proj: nn.Module, x: Tensor, pieces: Sequence[Tuple[slice, int]], length: int) -> Tensor:
    """(n, length, C_out): ``proj(x[:, rows])`` at positions ``offset ..`` for each (rows, offset) of
    ``pieces`` (in increasing offset order, not overlapping), zeros everywhere else. x: (n, S, C_in)."""
    n = x.size(0)
    if torch.is_grad_enabled() or not isinstance(proj, nn.Linear):
        y = proj(x)  # (n, S, C_out)
        parts, at = [], 0
        for rows, offset in pieces:
            part = y[:, rows]
            parts += [y.new_zeros(n, offset - at, y.size(2)), part]
            at = offset + part.size(1)
        parts.append(y.new_zeros(n, length - at, y.size(2)))
        return torch.cat([p for p in parts if p.size(1)], dim=1)
    buf = x.new_empty(n, length, proj.out_features)
    w, b, at = proj.weight.t(), proj.bias, 0
    for rows, offset in pieces:
        size = len(range(*rows.indices(x.size(1))))
        buf[:, at:offset].zero_()
        for r in range(n):
            if b is None:
                torch.mm(x[r, rows], w, out=buf[r, offset : offset + size])
            else:
                torch.addmm(b, x[r, rows], w, out=buf[r, offset : offset + size])
        at = offset + size
    buf[:, at:].zero_()
    return buf
