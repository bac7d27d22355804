"""S4D without autograd on long inputs: the channel-chunked convolution (the layer's fast path).

:func:`forward` computes exactly ``S4D.forward`` (``output_linear(((K * k) + D k) q)``) a chunk of
channels at a time, so that nothing of size (B, H, 2L) and no (B, L, H) intermediate besides the
input and output ever exists (a 256K-token input fits in a few GiB), using the layer's kernel cache
(:meth:`lsg_fairseq.modules.s4d.S4D.kernel_groups`). The math is ``lsg_fairseq.ops.ssm``'s.
Tested against the layer's training path and an O(L^2) dense convolution (``tests/test_s4d.py``).
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from lsg_fairseq.ops.ssm import circular_bidirectional_kernel, next_fast_len


@torch.no_grad()
def forward(layer, u: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``output_linear(((K * k) + D k) q)`` without autograd, a chunk of channels at a time.

    Channels are taken in decay-length groups (:meth:`S4D.kernel_groups`); a group whose kernels have
    length n <= L needs FFT size ``next_fast_len(L + n - 1)`` only (no lag of the kernel wraps
    onto an output position), not 2L. ``k`` and ``q`` are projected for a few consecutive groups
    at a time (at least ``layer.min_projection_channels`` columns, so the GEMMs stay wide; never the
    whole (B, L, H) tensors); within them, per chunk of channels, the kernel is laid out
    circularly and FFT'd (from the cache, or generated), the input is FFT-convolved and the gated
    result is written to the chunk's columns of the batch's part of a channel-permuted ``y``; the
    output projection adds each batch's part in (``out += y_b W_b^T``, so ``y`` is never whole).
    Temporaries stay below ``layer.max_fft_elems`` floats per (B, chunk, F) buffer, one set per group
    reused by its chunks; the (B, L, c) <-> (B, c, L) transposes go in cache-sized tiles.
    """
    B, L, H = u.shape
    x = u
    pad = None if padding_mask is None else padding_mask.unsqueeze(-1)  # (B L 1)
    groups = layer.kernel_groups(L)
    perm = torch.cat([idx for idx, _, _ in groups]).to(u.device)  # (H): y[..., j] is channel perm[j]
    k_cols = columns(layer.k_proj, x, perm)  # columns -> (B L c) of k_proj(x), in y's order
    q_cols = columns(layer.q_proj, x, perm)
    d = layer.D[perm].float()
    lin = layer.output_linear
    # a plain Linear takes y a batch of columns at a time (out += y_b W_b^T): y never exists whole
    w_out = lin.weight[:, perm] if isinstance(lin, nn.Linear) else None  # (H H): input columns in y's order
    y = None if w_out is not None else torch.empty(B, L, H, dtype=torch.float32, device=u.device)
    out = None
    j = 0  # first column of y of the current batch of groups
    for batch in projection_batches(layer, groups, B, L):
        width = sum(len(idx) for idx, _, _ in batch)
        kx = k_cols(slice(j, j + width)).float()  # (B L w)
        if pad is not None:
            kx.masked_fill_(pad, 0.0)  # k_proj has a bias: padding is zeroed to keep it out of the conv
        q = q_cols(slice(j, j + width)).float()  # (B L w): the gate
        yb = y[:, :, j:j + width] if y is not None else torch.empty(B, L, width, dtype=torch.float32,
                                                                     device=u.device)  # (B L w)
        o = 0  # first column of the batch of the current chunk
        for idx, n, kern in batch:
            n = min(n, L)
            fft_size = next_fast_len(L + n - 1)
            chunk = min(len(idx), max(1, layer.max_fft_elems // (4 * B * fft_size)))
            # one set of FFT buffers per group, reused by its chunks
            xp = torch.empty(B, chunk, fft_size, dtype=torch.float32, device=u.device)  # (B c F)
            spec = torch.empty(B, chunk, fft_size // 2 + 1, dtype=torch.complex64, device=u.device)
            yc = torch.empty(B, chunk, fft_size, dtype=torch.float32, device=u.device)
            for c0 in range(0, len(idx), chunk):
                c = min(chunk, len(idx) - c0)
                kk = layer.kernel(n, idx[c0:c0 + c]) if kern is None else kern[:, c0:c0 + c, :n]  # (2 c n)
                kh = torch.fft.rfft(circular_bidirectional_kernel(kk, fft_size, d[j + o:j + o + c]))  # (c F/2+1)
                del kk
                xc, sc, ycc = xp[:, :c], spec[:, :c], yc[:, :c]
                xc[..., L:].zero_()
                for l0 in range(0, L, 256):  # tiles of 256 positions: (B 256 c) -> (B c 256)
                    l1 = min(L, l0 + 256)
                    xc[..., l0:l1] = kx[:, l0:l1, o:o + c].transpose(1, 2)
                torch.fft.rfft(xc, out=sc)
                torch.fft.irfft(sc.mul_(kh), n=fft_size, out=ycc)  # (B c F)
                del kh
                for t0 in range(0, c, 8):  # tiles of 8 channels: (B c L) -> (B L c), times the gate
                    t1 = min(c, t0 + 8)
                    torch.mul(ycc[:, t0:t1, :L].transpose(1, 2), q[:, :, o + t0:o + t1], out=yb[:, :, o + t0:o + t1])
                o += c
            del xp, spec, yc
        del kx, q
        if w_out is not None:
            wb = w_out[:, j:j + width]  # (H w)
            out = project(yb.to(wb.dtype), wb, lin.bias, out)  # (B L H)
        j += width
    if w_out is not None:
        return out.to(u.dtype)
    return lin(y[..., torch.argsort(perm)]).to(u.dtype)  # (B L H): e.g. int8, channels back in order


def projection_batches(layer, groups, B: int, L: int):
    """Consecutive channel groups of :meth:`S4D.kernel_groups` taken together for the k/q
    projections: at least ``layer.min_projection_channels`` channels per batch (the last may have
    fewer), and no more than ``max_fft_elems`` floats of projected (B, L, c) columns each."""
    cap = max(layer.min_projection_channels, layer.max_fft_elems // max(1, B * L))
    batch, width = [], 0
    for g in groups:
        if batch and width + len(g[0]) > cap:
            yield batch
            batch, width = [], 0
        batch.append(g)
        width += len(g[0])
        if width >= layer.min_projection_channels:
            yield batch
            batch, width = [], 0
    if batch:
        yield batch


def columns(lin: nn.Module, x: torch.Tensor, perm: torch.Tensor):
    """A function of a column slice ``cols`` returning those columns of ``lin(x)`` (B, L, c), in the
    channel order ``perm``. A plain ``nn.Linear`` projects each chunk from its weight rows, so the
    whole (B, L, H) output never exists; any other module (an int8 ``DynamicQuantizedLinear`` has
    no weight tensor) is called once on the whole input and sliced."""
    if isinstance(lin, nn.Linear):
        w, b = lin.weight[perm], lin.bias[perm]  # rows in y's order: chunks are slices
        return lambda cols: project(x, w[cols], b[cols])
    full = lin(x)[..., perm]  # (B L H)
    return lambda cols: full[..., cols]


def project(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
            out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, or with ``out`` ``out += x weight^T`` in place: every
    projection of the inference path goes through here (the benchmark's SSM breakdown times it
    apart from the convolution)."""
    if out is None:
        return F.linear(x, weight, bias)
    out.view(-1, out.size(-1)).addmm_(x.reshape(-1, x.size(-1)), weight.t())
    return out
