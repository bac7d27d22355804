"""padded_projection: the no-grad path (rows written with addmm(out=)) against the obvious
pad-and-concatenate construction, and the autograd path's gradients."""

import pytest
import torch
import torch.nn as nn

from lsg_layers.modules.padded_projection import padded_projection


def reference(proj, x, pieces, length):
    y = proj(x)
    out = y.new_zeros(x.size(0), length, y.size(2))
    for rows, offset in pieces:
        part = y[:, rows]
        out[:, offset : offset + part.size(1)] = part
    return out


PIECES = [
    ([(slice(0, 2), 0), (slice(2, 9), 5)], 16),  # LSG: [globals | pad | tokens | pad]
    ([(slice(0, 9), 3)], 15),
]  # LED: [pad | tokens | pad]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("pieces,length", PIECES)
def test_no_grad_rows_written_in_place_equal_reference(bias, pieces, length):
    proj = nn.Linear(6, 4, bias=bias)
    x = torch.randn(9, 2, 6).transpose(0, 1)  # (n, S, C) in fairseq's (T, n, C) memory layout
    with torch.no_grad():
        got = padded_projection(proj, x, pieces, length)
        assert torch.allclose(got, reference(proj, x, pieces, length), atol=1e-6)


@pytest.mark.parametrize("pieces,length", PIECES)
def test_autograd_and_modules_without_weights(pieces, length):
    proj = nn.Linear(6, 4)
    x = torch.randn(2, 9, 6, requires_grad=True)
    got = padded_projection(proj, x, pieces, length)
    ref = reference(proj, x, pieces, length)
    g = torch.randn_like(ref)
    assert torch.equal(got, ref)
    assert torch.allclose(torch.autograd.grad(got, x, g)[0], torch.autograd.grad(ref, x, g)[0])

    class NoWeight(nn.Module):  # e.g. an int8 DynamicQuantizedLinear: projects, exposes no weight
        def forward(self, x):
            return proj(x)

    with torch.no_grad():
        assert torch.allclose(padded_projection(NoWeight(), x, pieces, length), ref, atol=1e-6)
