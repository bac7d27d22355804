"""S4D without autograd on CPU: the channel-chunked convolution (the layer's CPU fast path).

:func:`forward` computes exactly ``S4D.forward`` (``output_linear(((K * k) + D k) q)``) a chunk of
channels at a time, so that nothing of size (B, H, 2L) and no (B, L, H) intermediate besides the
input and output ever exists, with every input it needs passed explicitly (the layer's projections,
skip ``D``, kernel groups and kernel generator: :meth:`lsg_layers.modules.s4d.S4D.forward` is the
one caller). The math is ``lsg_layers.ops.ssm``'s. Tested against the layer's training path, the
whole-tensor path and an O(L^2) dense convolution (``tests/test_s4d.py``).

The loops, outermost first:

1. projection batches: consecutive decay groups whose k and q columns are projected together
   (:func:`projection_batches`: GEMMs at least ``min_projection_channels`` wide);
2. decay groups (:func:`convolve_group`): channels whose kernels have length n <= L need an FFT of
   ``next_fast_len(L + n - 1)`` only (no lag wraps onto an output position), not 2L; one set of
   FFT buffers per group;
3. channel chunks of the group: at most ``max_fft_elems`` floats per (B, chunk, F) buffer;
4. tiles of the transposes into and out of the FFT layout (``TRANSPOSE_TILE``, ``GATE_TILE``).

The output projection adds each batch's columns in (``out += y_b W_b^T``): ``y`` is never whole.
"""

from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import record_function

from lsg_layers.modules.precision import cast_for_matmul, matmul_dtype
from lsg_layers.ops.ssm import circular_bidirectional_kernel, next_fast_len

# Positions per tile of the (B, L, c) -> (B, c, L) copy into the FFT buffer: a tile of a chunk's
# channels stays in cache while it is transposed.
TRANSPOSE_TILE = 256
# Channels per tile of the gated (B, c, L) -> (B, L, c) write-back, for the same reason.
GATE_TILE = 8

# (channel indices (g,), kernel length n, cached kernels (2, g, n') or None): S4D.kernel_groups
Group = Tuple[Tensor, int, Optional[Tensor]]


@torch.no_grad()
def forward(
    u: Tensor,
    padding_mask: Optional[Tensor],
    *,
    groups: Sequence[Group],
    kernel: Callable[[int, Tensor], Tensor],
    skip: Tensor,
    k_proj: nn.Module,
    q_proj: nn.Module,
    output_linear: nn.Module,
    max_fft_elems: int,
    min_projection_channels: int,
) -> Tensor:
    """``output_linear(((K * k) + skip k) q)`` with ``k = k_proj(u)`` (zeroed at padding), ``q = q_proj(u)``.

    u: (B, L, H); padding_mask: (B, L) bool or None; groups: the kernels by decay group
    (:meth:`S4D.kernel_groups`; a group without cached kernels gets them from ``kernel(n, idx)``,
    (2, c, n), a chunk at a time); skip: D (H,). Returns (B, L, H) in the dtype the output
    projection computes in (:func:`matmul_dtype`: u's, or autocast's), as ``S4D``'s other paths do.
    """
    B, L, H = u.shape
    # the gated product (float32) is handed to the output projection in the dtype it computes in,
    # clamped to float16's range where that is float16
    dtype = matmul_dtype(u)
    pad = None if padding_mask is None else padding_mask.unsqueeze(-1)  # (B L 1)
    perm = torch.cat([idx for idx, _, _ in groups]).to(u.device)  # (H): y[..., j] is channel perm[j]
    k_cols = columns(k_proj, u, perm)  # columns -> (B L c) of k_proj(u), in y's order
    q_cols = columns(q_proj, u, perm)
    d = skip[perm].float()  # (H) in y's order
    # a plain Linear takes y a batch of columns at a time (out += y_b W_b^T): y never exists whole
    w_out = output_linear.weight[:, perm] if isinstance(output_linear, nn.Linear) else None  # (H H)
    b_out = output_linear.bias if isinstance(output_linear, nn.Linear) else None  # (H)
    y = None if w_out is not None else torch.empty(B, L, H, dtype=torch.float32, device=u.device)
    out = None
    j = 0  # first column of y of the current batch
    for batch in projection_batches(groups, B, L, max_fft_elems, min_projection_channels):
        width = sum(len(idx) for idx, _, _ in batch)
        cols = slice(j, j + width)
        kx = k_cols(cols).float()  # (B L w)
        if pad is not None:
            kx.masked_fill_(pad, 0.0)  # k_proj has a bias: padding is zeroed to keep it out of the conv
        q = q_cols(cols).float()  # (B L w): the gate
        yb = y[:, :, cols] if y is not None else torch.empty(B, L, width, dtype=torch.float32, device=u.device)
        o = 0  # first column of the batch of the current group
        for idx, n, cached in batch:
            g = slice(o, o + len(idx))
            convolve_group(
                kx[:, :, g],
                q[:, :, g],
                yb[:, :, g],
                idx,
                min(n, L),
                cached,
                kernel,
                d[j + o : j + o + len(idx)],
                max_fft_elems,
            )
            o += len(idx)
        del kx, q
        if w_out is not None:
            wb = w_out[:, cols].to(dtype)  # (H w); cast here: autocast leaves out += y_b W_b^T alone
            out = project(cast_for_matmul(yb, dtype), wb, b_out, out)  # (B L H)
        j += width
    if out is not None:
        return out
    with record_function("s4d.projection"):  # e.g. int8: channels back in order, one call
        assert y is not None  # no plain Linear: y was made whole
        return output_linear(cast_for_matmul(y[..., torch.argsort(perm)], dtype))  # (B L H)


def convolve_group(
    kx: Tensor,
    q: Tensor,
    y: Tensor,
    idx: Tensor,
    n: int,
    cached: Optional[Tensor],
    kernel: Callable[[int, Tensor], Tensor],
    d: Tensor,
    max_fft_elems: int,
) -> None:
    """y = ((K * kx) + d kx) q for one decay group of g channels, written into ``y`` (B, L, g).

    kx, q: (B, L, g) views; n: the group's kernel length (<= L); cached: its kernels (2, g, n') or
    None (generated per chunk by ``kernel(n, idx)``); d: (g,) skip."""
    B, L, g = kx.shape
    fft_size = next_fast_len(L + n - 1)
    chunk = min(g, max(1, max_fft_elems // (4 * B * fft_size)))
    # one set of FFT buffers per group, reused by its chunks
    xp = torch.empty(B, chunk, fft_size, dtype=torch.float32, device=kx.device)  # (B c F)
    spec = torch.empty(B, chunk, fft_size // 2 + 1, dtype=torch.complex64, device=kx.device)
    yc = torch.empty(B, chunk, fft_size, dtype=torch.float32, device=kx.device)
    for c0 in range(0, g, chunk):
        c1 = min(g, c0 + chunk)
        c = c1 - c0
        kk = kernel(n, idx[c0:c1]) if cached is None else cached[:, c0:c1, :n]  # (2 c n)
        kh = torch.fft.rfft(circular_bidirectional_kernel(kk, fft_size, d[c0:c1]))  # (c F/2+1)
        xc, sc, ycc = xp[:, :c], spec[:, :c], yc[:, :c]
        xc[..., L:].zero_()
        for l0 in range(0, L, TRANSPOSE_TILE):  # (B l c) -> (B c l)
            l1 = min(L, l0 + TRANSPOSE_TILE)
            xc[..., l0:l1] = kx[:, l0:l1, c0:c1].transpose(1, 2)
        torch.fft.rfft(xc, out=sc)
        torch.fft.irfft(sc.mul_(kh), n=fft_size, out=ycc)  # (B c F)
        for t0 in range(0, c, GATE_TILE):  # (B t L) -> (B L t), times the gate
            t1 = min(c, t0 + GATE_TILE)
            torch.mul(ycc[:, t0:t1, :L].transpose(1, 2), q[:, :, c0 + t0 : c0 + t1], out=y[:, :, c0 + t0 : c0 + t1])


def projection_batches(
    groups: Sequence[Group], B: int, L: int, max_fft_elems: int, min_projection_channels: int
) -> List[List[Group]]:
    """Consecutive decay groups taken together for the k/q projections: at least
    ``min_projection_channels`` channels per batch (the last may have fewer), and no more than
    ``max_fft_elems`` floats of projected (B, L, c) columns each."""
    cap = max(min_projection_channels, max_fft_elems // max(1, B * L))
    batches: List[List[Group]] = []
    batch: List[Group] = []
    width = 0
    for g in groups:
        if batch and width + len(g[0]) > cap:
            batches.append(batch)
            batch, width = [], 0
        batch.append(g)
        width += len(g[0])
        if width >= min_projection_channels:
            batches.append(batch)
            batch, width = [], 0
    if batch:
        batches.append(batch)
    return batches


def columns(lin: nn.Module, x: Tensor, perm: Tensor) -> Callable[[slice], Tensor]:
    """A function of a column slice ``cols`` returning those columns of ``lin(x)`` (B, L, c), in the
    channel order ``perm``. A plain ``nn.Linear`` projects each chunk from its weight rows, so the
    whole (B, L, H) output never exists; any other module (an int8 ``DynamicQuantizedLinear`` has
    no weight tensor) is called once on the whole input and sliced."""
    if isinstance(lin, nn.Linear):
        w, b = lin.weight[perm], lin.bias[perm]  # rows in y's order: chunks are slices
        return lambda cols: project(x, w[cols], b[cols])
    with record_function("s4d.projection"):
        full = lin(x)[..., perm]  # (B L H)
    return lambda cols: full[..., cols]


def project(x: Tensor, weight: Tensor, bias: Optional[Tensor], out: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)``, or with ``out`` ``out += x weight^T`` in place."""
    with record_function("s4d.projection"):
        if out is None:
            return F.linear(x, weight, bias)
        out.view(-1, out.size(-1)).addmm_(x.reshape(-1, x.size(-1)), weight.t())
        return out
