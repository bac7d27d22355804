"""The S4D convolution's math, pure functions (LOCOST's encoder; spec ``shared/spec/locost.md`` section 1).

Notation (paper / S4D / ``lsg_layers.modules.s4d``): H channels (= d_model), M = N / 2 complex
modes per channel, L tokens; per channel a step ``dt`` and complex ``A``, ``B``, and one ``C`` per
direction c (0 causal, 1 anti-causal). Zero-order-hold discretisation::

    C'[c,h,n] = C[c,h,n] B[h,n] (exp(dt_h A[h,n]) - 1) / A[h,n]
    K_c[h,l]  = 2 Re sum_n C'[c,h,n] exp(dt_h A[h,n] l),        l = 0 .. L-1

and the layer convolves its input with both kernels in one FFT: ``y[t] = sum_{s<=t} Kf[t-s] k[s]
+ sum_{s>=t} Kb[s-t] k[s]`` (lag 0 receives ``Kf[0] + Kb[0]``).

- :func:`vandermonde_naive`: the kernel sum as written (one exp per entry; tests);
  :func:`vandermonde_blocked`: the same as real batched matmuls, H*M*(A + S) exponentials instead
  of H*M*L; :class:`BlockedVandermonde`: it with its gradients written out (one more blocked
  product in backward, nothing kept but C' and dtA);
- :func:`decay_lengths` / :func:`channel_groups` / :func:`grouped_kernel`: each channel's kernel
  only until every mode has decayed below a tolerance, channels grouped by that length;
- :func:`next_fast_len`, :func:`circular_bidirectional_kernel`: FFT sizes and the two kernels laid
  out as one circular kernel (the skip ``D`` folded into lag 0);
- :func:`blocked_circular_kernel`: the blocked product and that layout as one function, and
  :func:`fused_circular_kernel`, its ``torch.compile`` (the fused generator: the exponentials, the
  operands of the product and the layout become a few kernels around the one bmm), whose product
  may run in TF32 or bfloat16 (:data:`PRODUCT_MODES`, :func:`round_to_tf32`);
- :class:`FFTConv`: the FFT convolution for training, keeping only its input and kernel.
"""

import math
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F

from lsg_layers.ops.compiling import raise_recompile_limit


def next_fast_len(n: int) -> int:
    """Smallest even 5-smooth integer >= n (2^a 3^b 5^c): FFT sizes that every backend is fast at.

    Any FFT size >= 2L - 1 gives the same (linear) bidirectional convolution as the reference's
    size 2L once the circular kernel is laid out for that size, so we are free to round up; a prime
    2L would otherwise send pocketfft/cuFFT to their slow Bluestein path.
    """
    best = 2 * n  # a power-of-two-ish fallback that is always valid
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            # smallest power of two (>= 2, so the size stays even) with p35 * 2^k >= n
            m = p35 * 2
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def compiled_fft_len(n: int) -> int:
    """Smallest size >= n of the form 2^k x {1, 5/4, 3/2, 15/8} (even, 5-smooth): four FFT sizes per
    octave, at most 25% above ``n`` (from 16 on).

    The fused generator (:func:`fused_circular_kernel`) is compiled for fixed shapes, once per FFT
    size; with :func:`next_fast_len` every few tokens of length would be a size of its own, and a
    training run whose batches change length at every step would compile at every step. On this
    ladder lengths from 1K to 16K tokens share 17 sizes.
    """
    octave = 16  # 2^k >= 16: 15/8 * 2^k is then an even integer
    while octave * 2 <= n:
        octave *= 2
    return next(size for size in (octave, octave * 5 // 4, octave * 3 // 2, octave * 15 // 8, octave * 2) if size >= n)


def vandermonde_naive(c_prime: torch.Tensor, dt_a: torch.Tensor, length: int) -> torch.Tensor:
    """Obviously-correct kernel: ``2 Re sum_n c'[c,h,n] exp(dtA[h,n] l)``, one exp per (h, n, l).

    c_prime: (2, H, M) complex, dt_a: (H, M) complex -> (2, H, L) real. O(H M L) memory: tests only.
    """
    pos = torch.arange(length, device=dt_a.device, dtype=dt_a.real.dtype)  # (L)
    powers = torch.exp(dt_a.unsqueeze(-1) * pos)  # (H M L)
    return 2 * torch.einsum("chm,hml->chl", c_prime, powers).real  # (2 H L)


def _exp_outer(x: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype):
    """(Re, Im) of exp(x[..., None] * pos) as two real tensors (..., n) of ``dtype``.

    The phase is formed in float64 and reduced modulo 2 pi before the float32 cos/sin: more
    accurate than the reference, which forms ``Im(dtA) * l`` in float32 and so loses the phase of
    fast modes at large l. Real vectorised math is also much faster on CPU than a complex ``exp``.
    """
    mag = torch.exp(x.real.to(dtype).unsqueeze(-1) * pos.to(dtype))  # (... n)
    phase = torch.fmod(x.imag.double().unsqueeze(-1) * pos, 2 * math.pi).to(dtype)  # (... n), in (-2pi, 2pi)
    return mag * torch.cos(phase), mag * torch.sin(phase)


# The fused generator's product: its one matrix product (the bulk of the generator's FLOPs) with
# float32 operands, or TF32's (a GPU's matrix units in float32: 10 mantissa bits), or bfloat16's
# (7 bits); the exponentials, their float64 phase and every sum outside the product stay float32.
# Offered for training in half precision only, where the activations' own rounding (bf16: 2^-8
# relative) is larger than what either mode adds to the kernel.
PRODUCT_MODES = ("fp32", "tf32", "bf16")
# Their errors against vandermonde_naive in float64, relative to the kernel's largest entry, as
# tests/test_whole_tensor_paths.py measures them on random layers (the bounds it asserts)
PRODUCT_BOUNDS = {"fp32": 1e-5, "tf32": 1e-3, "bf16": 1e-2}


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` rounded to TF32 (10 explicit mantissa bits; to nearest, ties away from zero,
    as CUDA's ``cvt.rna.tf32.f32``): what a GPU's matrix units read in TF32 mode, on any device."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def _product(lhs: torch.Tensor, rhs: torch.Tensor, mode: str) -> torch.Tensor:
    """``bmm(lhs, rhs)`` of float32 operands in ``mode`` (:data:`PRODUCT_MODES`), float32 out. TF32
    on CUDA is the matrix units' own (the caller enables it: :func:`tf32_matmul`); elsewhere the
    operands are rounded as they would be, and multiplied in float32."""
    if mode == "bf16":
        return torch.bmm(lhs.to(torch.bfloat16), rhs.to(torch.bfloat16)).float()
    if mode == "tf32" and not lhs.is_cuda:
        return torch.bmm(round_to_tf32(lhs), round_to_tf32(rhs))
    return torch.bmm(lhs, rhs)


class tf32_matmul:
    """Context: CUDA float32 matrix products in TF32 while ``on`` (restored on exit)."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.before = torch.backends.cuda.matmul.allow_tf32
        if self.on:
            torch.backends.cuda.matmul.allow_tf32 = True

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.before


# Floats of temporaries per channel chunk of the blocked Vandermonde product on the CPU path: small
# enough to stay near the cache (the whole-tensor path passes a larger budget).
VANDERMONDE_CHUNK_ELEMS = 1 << 21
# Channels join a decay group while their decay length is at least this fraction of the group's
# longest: no channel computes more than 1/ratio of its own kernel, and groups stay few.
GROUP_RATIO = 0.8


def vandermonde_blocked(
    c_prime: torch.Tensor,
    dt_a: torch.Tensor,
    length: int,
    max_chunk_elems: int = VANDERMONDE_CHUNK_ELEMS,
    product: str = "fp32",
) -> torch.Tensor:
    """Fast kernel: the same sum as :func:`vandermonde_naive`, as real batched matrix products.

    Write ``l = a*S + b``; then ``exp(dtA l) = exp(dtA a S) exp(dtA b)`` and

        K_c[h, a*S + b] = 2 Re sum_n exp(dtA[h,n] a S) (C'[c,h,n] exp(dtA[h,n] b))

    is, per channel h, an (A x M) @ (M x 2S) complex product (both directions side by side), i.e. a
    real bmm with inner size 2M (``2 Re(w z) = 2 (Re w Re z - Im w Im z)``). Only H*M*(A + S)
    exponentials are evaluated (precision: see :func:`_exp_outer`); products and sums run in the
    real dtype of ``c_prime`` (float32 for complex64, like the reference's complex64 sums).
    S ~ sqrt(L / 2) balances the elementwise work of the two factors (the right one is built twice,
    once per direction). Channels are processed in chunks of at most ``max_chunk_elems`` floats of
    temporaries. ``product``: the bmm's precision (:data:`PRODUCT_MODES`; float32 inputs only).

    c_prime: (2, H, M) complex, dt_a: (H, M) complex -> (2, H, L) real in c_prime's real dtype.
    """
    two, H, M = c_prime.shape
    real_dtype = c_prime.real.dtype
    step, n_blocks, idx_in, idx_out = _blocks(length, dt_a.device)

    per_channel = 2 * M * (n_blocks + 2 * step) * 3 + 2 * n_blocks * step
    h_chunk = max(1, min(H, max_chunk_elems // max(per_channel, 1)))
    out = []
    for h0 in range(0, H, h_chunk):
        sl = slice(h0, h0 + h_chunk)
        wr, wi = _exp_outer(dt_a[sl], idx_out, real_dtype)  # (h M A) each: exp(dtA a S)
        lhs = torch.cat([wr, -wi], dim=1).transpose(1, 2)  # (h A 2M)
        zr, zi = _exp_outer(dt_a[sl], idx_in, real_dtype)  # (h M S) each: exp(dtA b)
        zr, zi = zr.unsqueeze(1), zi.unsqueeze(1)  # (h 1 M S)
        cr = c_prime.real[:, sl].transpose(0, 1).unsqueeze(-1)  # (h 2 M 1)
        ci = c_prime.imag[:, sl].transpose(0, 1).unsqueeze(-1)  # (h 2 M 1)
        # rows [Re; Im] of C' exp(dtA b); columns: direction-major (c, b)
        rhs = torch.cat([cr * zr - ci * zi, cr * zi + ci * zr], dim=2)  # (h 2 2M S)
        rhs = rhs.transpose(1, 2).reshape(rhs.shape[0], 2 * M, two * step)  # (h 2M 2S)
        k = 2 * _product(lhs, rhs, product)  # (h A 2S)
        k = k.reshape(k.shape[0], n_blocks, two, step).transpose(1, 2)  # (h 2 A S)
        k = k.reshape(k.shape[0], two, n_blocks * step)[..., :length]  # (h 2 L)
        out.append(k)
    return torch.cat(out, dim=0).transpose(0, 1)  # (2 H L)


def _blocks(length: int, device):
    """The blocked product's split ``l = a*S + b``: (S, A, b (S,) and a*S (A,) in float64), with
    S ~ sqrt(L / 2) (see :func:`vandermonde_blocked`) and A*S >= L."""
    step = max(1, int(math.ceil(math.sqrt(length / 2))))  # S: inner block length
    n_blocks = -(-length // step)  # A: number of blocks
    idx_in = torch.arange(step, device=device, dtype=torch.float64)  # (S)
    idx_out = torch.arange(n_blocks, device=device, dtype=torch.float64) * step  # (A)
    return step, n_blocks, idx_in, idx_out


def vandermonde_blocked_grads(grad: torch.Tensor, c_prime: torch.Tensor, dt_a: torch.Tensor, max_chunk_elems: int):
    """Gradients of :func:`vandermonde_blocked` (PyTorch's convention for complex inputs:
    d/dRe + i d/dIm) for the real output gradient ``grad`` (2, H, L). With u = exp(dtA l):

        dC'[c,h,n] = 2 sum_l G[c,h,l] conj(u)
        d dtA[h,n] = 2 sum_c conj(C'[c,h,n]) sum_l G[c,h,l] l conj(u)

    blocked as the kernel is (``l = a*S + b``, ``conj(u) = conj(W_a) conj(Z_b)``): per channel one
    real product of the rows [G_c; l G_c] (both directions; 4S x A) with the forward's left factor
    [Re W | -Im W] (A x 2M, interleaved here) gives ``T_b = sum_a G conj(W_a)`` and
    ``U_b = sum_a l G conj(W_a)``; then dC' = 2 sum_b T_b conj(Z_b) and
    ``sum_l G l conj(u) = sum_b U_b conj(Z_b)``. The exponentials are recomputed, as the forward
    made them (:func:`_exp_outer`).

    c_prime: (2, H, M) complex, dt_a: (H, M) complex -> (dC' (2, H, M), d dtA (H, M)) complex."""
    two, H, M = c_prime.shape
    L = grad.shape[-1]
    real_dtype = c_prime.real.dtype
    step, n_blocks, idx_in, idx_out = _blocks(L, dt_a.device)
    g = F.pad(grad.to(real_dtype), (0, n_blocks * step - L)).view(two, H, n_blocks, step)  # (2 H A S)
    lag = (idx_out[:, None] + idx_in).to(real_dtype)  # (A S): l = a*S + b

    per_channel = 4 * step * n_blocks + 4 * M * n_blocks + 12 * step * M
    h_chunk = max(1, min(H, max_chunk_elems // max(per_channel, 1)))
    grad_c, grad_a = [], []
    for h0 in range(0, H, h_chunk):
        sl = slice(h0, h0 + h_chunk)
        h = dt_a[sl].shape[0]
        wr, wi = _exp_outer(dt_a[sl], idx_out, real_dtype)  # (h M A) each: exp(dtA a S)
        conj_w = torch.stack([wr, -wi], dim=-1).transpose(1, 2).reshape(h, n_blocks, 2 * M)  # (h A 2M) interleaved
        gs = g[:, sl]  # (2 h A S)
        rows = torch.cat([gs, gs * lag], dim=0).permute(1, 0, 3, 2).reshape(h, 4 * step, n_blocks)  # (h 4S A)
        tu = torch.view_as_complex(torch.bmm(rows, conj_w).view(h, 4, step, M, 2))  # (h 4 S M): T_c, U_c
        zr, zi = _exp_outer(dt_a[sl], idx_in, real_dtype)  # (h M S) each: exp(dtA b)
        tu.mul_(torch.complex(zr, -zi).transpose(1, 2)[:, None])  # times conj(Z_b)
        sums = tu.sum(2)  # (h 4 M): sum_l G conj(u), sum_l G l conj(u)
        grad_c.append(2 * sums[:, :two])  # (h 2 M)
        grad_a.append(2 * (c_prime[:, sl].transpose(0, 1).conj() * sums[:, two:]).sum(1))  # (h M)
    return torch.cat(grad_c).transpose(0, 1), torch.cat(grad_a)


class BlockedVandermonde(torch.autograd.Function):
    """:func:`vandermonde_blocked` for training: keeps only C' and dtA, and its backward is
    :func:`vandermonde_blocked_grads` (one blocked product) where autograd would keep the product's
    temporaries, or recompute the whole forward under a checkpoint and then run its backward.
    Tests hold it to autograd through :func:`vandermonde_naive` in float64. ``apply(c_prime, dt_a,
    length, max_chunk_elems)`` -> (2, H, L)."""

    @staticmethod
    def forward(ctx, c_prime: torch.Tensor, dt_a: torch.Tensor, length: int, max_chunk_elems: int) -> torch.Tensor:
        ctx.save_for_backward(c_prime, dt_a)
        ctx.max_chunk_elems = max_chunk_elems
        return vandermonde_blocked(c_prime, dt_a, length, max_chunk_elems)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        c_prime, dt_a = ctx.saved_tensors
        grad_c, grad_a = vandermonde_blocked_grads(grad, c_prime, dt_a, ctx.max_chunk_elems)
        return grad_c, grad_a, None, None


def decay_lengths(c_prime: torch.Tensor, dt_a: torch.Tensor, length: int, tail_tol: float) -> torch.Tensor:
    """Per channel h, the smallest n_h <= L such that |2 C'[c,h,m] exp(dtA[h,m] l)| < tail_tol for
    every direction c, mode m and l >= n_h: (H,) int64 (all L when ``tail_tol`` is 0).

    c_prime: (2, H, M) complex, dt_a: (H, M) complex."""
    H = dt_a.shape[0]
    full = torch.full((H,), length, dtype=torch.long)
    if tail_tol <= 0:
        return full
    with torch.no_grad():
        mag = 2 * c_prime.abs().amax(0).double().cpu()  # (H M): largest |2 C'| over both directions
        rate = dt_a.real.double().cpu()  # (H M): log|z| per step, negative for a stable SSM
        # |2C'| exp(rate l) < tol  <=>  l > log(tol / |2C'|) / rate; modes already below tol need 0
        need = torch.where(
            mag > tail_tol, torch.log(tail_tol / mag) / rate.clamp(max=-1e-300), torch.zeros_like(mag)
        )  # (H M)
        need = torch.where(rate >= 0, torch.full_like(need, float(length)), need)  # unstable: all of L
        n = torch.ceil(need.amax(-1).clamp(max=float(length))).long() + 1  # (H)
    return torch.minimum(n.clamp(min=1), full)


def channel_groups(lengths: torch.Tensor, ratio: float = GROUP_RATIO):
    """Groups channels by decay length so that each group's kernel is computed only up to its longest.

    lengths: (H,) int -> list of (channel index tensor, group length). Channels are sorted by length
    (longest first) and a new group starts when a length falls below ``ratio`` times its group's
    longest, so no channel computes more than 1/ratio of its own length (plus the one-entry floor).
    """
    order = torch.argsort(lengths, descending=True, stable=True)  # (H)
    ls = lengths[order].tolist()
    groups, start = [], 0
    for i in range(1, len(ls) + 1):
        if i == len(ls) or ls[i] < ratio * ls[start]:
            groups.append((order[start:i], int(ls[start])))
            start = i
    return groups


def grouped_kernel(
    c_prime: torch.Tensor, dt_a: torch.Tensor, groups, length: int, blocked=vandermonde_blocked
) -> torch.Tensor:
    """Kernels (2, H, length) of :func:`vandermonde_blocked`, each channel group computed up to its own
    length and zero after it. c_prime: (2, H, M) complex, dt_a: (H, M) complex. ``blocked``: the
    product to call as ``blocked(c_prime, dt_a, length)`` (training: :class:`BlockedVandermonde`)."""
    if len(groups) == 1 and groups[0][1] == length and torch.equal(groups[0][0], torch.arange(dt_a.shape[0])):
        return blocked(c_prime, dt_a, length)  # (2 H L): nothing decays early
    out = c_prime.real.new_zeros(2, dt_a.shape[0], length)  # (2 H L): zero past each group's length
    for idx, n in groups:
        idx = idx.to(dt_a.device)
        out[:, idx, :n] = blocked(c_prime[:, idx], dt_a[idx], n)  # (2 g n), differentiable
    return out


def circular_bidirectional_kernel(k: torch.Tensor, fft_size: int, skip: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Lays (2, H, L) kernels out as one circular kernel of length ``fft_size`` >= 2L - 1.

    Entry d holds lag d: ``Kf[0] + Kb[0]`` at 0, ``Kf[d]`` at d, ``Kb[d]`` at ``fft_size - d``, zeros
    between. For ``fft_size == 2L`` this is the reference's ``[Kf0+Kb0, Kf1..KfL-1, 0, KbL-1..Kb1]``.
    ``skip`` (H,), if given, is added at lag 0 (the ``D k`` term is a convolution with ``D`` at lag 0).
    """
    _, H, L = k.shape
    if fft_size < 2 * L - 1:
        raise ValueError(f"fft_size {fft_size} < 2L-1 = {2 * L - 1} would wrap around")
    kf, kb = k[0], k[1]  # (H L) each
    if torch.is_grad_enabled() and k.requires_grad:
        lag0 = kf[:, :1] + kb[:, :1]  # (H 1)
        if skip is not None:
            lag0 = lag0 + skip.unsqueeze(-1)
        zeros = k.new_zeros(H, fft_size - 2 * L + 1)  # (H F-2L+1)
        return torch.cat([lag0, kf[:, 1:], zeros, kb[:, 1:].flip(-1)], dim=-1)  # (H F)
    # no autograd: written in place into one buffer (inference does this once per chunk and call)
    out = k.new_empty(H, fft_size)  # (H F)
    out[:, :L] = kf
    out[:, L : fft_size - L + 1].zero_()
    out[:, fft_size - L + 1 :] = kb[:, 1:].flip(-1)
    out[:, 0] += kb[:, 0]
    if skip is not None:
        out[:, 0] += skip
    return out


def blocked_circular_kernel(
    c_prime: torch.Tensor,
    dt_a: torch.Tensor,
    length: int,
    fft_size: int,
    skip: Optional[torch.Tensor] = None,
    max_chunk_elems: int = VANDERMONDE_CHUNK_ELEMS,
    product: str = "fp32",
) -> torch.Tensor:
    """``circular_bidirectional_kernel(vandermonde_blocked(...), fft_size, skip)``: (H, F) from C'
    (2, H, M) and dtA (H, M), in the layout the FFT convolution reads."""
    k = vandermonde_blocked(c_prime, dt_a, length, max_chunk_elems, product)
    return circular_bidirectional_kernel(k, fft_size, skip)


_FUSED: List[Callable[..., torch.Tensor]] = []


def fused_circular_kernel():
    """:func:`blocked_circular_kernel` compiled (made once per process, on first use; one compile per
    new shape: ``dynamic=False``, as the shapes of a layer repeat; the layer asks for a few shapes
    only, :func:`compiled_fft_len`). The float64 phase of
    :func:`_exp_outer` is kept; its error against :func:`vandermonde_naive` is tested with the
    eager function's bound."""
    if not _FUSED:
        _FUSED.append(torch.compile(blocked_circular_kernel, dynamic=False))
        raise_recompile_limit()
    return _FUSED[0]


class FFTConv(torch.autograd.Function):
    """``y[b, t, h] = sum_s kc[h, (t - s) mod F] x[b, s, h]`` for t < L: the bidirectional convolution
    of x (B, L, h) with circular kernels kc (h, F), F >= 2L - 1, by FFT; y is (B, L, h).

    Autograd through ``irfft(rfft(pad(x)) * rfft(kc))`` would keep the padded input, both spectra and
    the full-size output (about 8 (B, L, h) float tensors per layer); this keeps x and kc only and
    recomputes the spectra in backward (two more rffts):

        dL/dx  = irfft(G conj(K))[:L]        (correlation with the kernel)
        dL/dkc = irfft(sum_b G conj(X))      (correlation with the input)

    with G, X, K the rffts of the zero-padded gradient, input and kernel.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, kc: torch.Tensor, fft_size: int) -> torch.Tensor:
        L = x.shape[1]
        xp = F.pad(x.transpose(1, 2), (0, fft_size - L))  # (B h F), contiguous
        y = torch.fft.irfft(torch.fft.rfft(xp) * torch.fft.rfft(kc), n=fft_size)  # (B h F)
        ctx.save_for_backward(x, kc)
        ctx.fft_size = fft_size
        return y[..., :L].transpose(1, 2).contiguous()  # (B L h)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, kc = ctx.saved_tensors
        fft_size, L = ctx.fft_size, x.shape[1]
        g_hat = torch.fft.rfft(F.pad(grad.transpose(1, 2), (0, fft_size - L)))  # (B h F/2+1)
        grad_x = grad_kc = None
        if ctx.needs_input_grad[0]:
            gx = torch.fft.irfft(g_hat * torch.fft.rfft(kc).conj(), n=fft_size)  # (B h F)
            grad_x = gx[..., :L].transpose(1, 2)  # (B L h)
        if ctx.needs_input_grad[1]:
            x_hat = torch.fft.rfft(F.pad(x.transpose(1, 2), (0, fft_size - L)))  # (B h F/2+1)
            grad_kc = torch.fft.irfft((g_hat * x_hat.conj()).sum(0), n=fft_size)  # (h F)
        return grad_x, grad_kc, None
