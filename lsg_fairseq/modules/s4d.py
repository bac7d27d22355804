"""Bidirectional diagonal state-space layer (S4D) as used by LOCOST's encoder.

Pure PyTorch (CPU and GPU) port of the reference's ``S4D`` + ``SSKernelDiag`` (locost-summarization,
``s4d_models.py`` / ``kernel_computations.py``); spec: ``shared/spec/locost.md`` section 1.

Notation (paper / S4D / this file):

- ``H``: number of independent channels = ``d_model`` (one SSM per channel, ``num_ssm_heads`` = 1).
- ``N``: real state size (``d_state`` in the config); it is represented by ``M = N / 2`` complex
  modes whose conjugate pairs give the real kernel ``2 Re(...)`` (released model: N 512, M 256).
- ``L``: sequence length; the kernel always has length ``L`` (no truncation).
- ``dt`` (Delta): per-channel step size ``exp(log_dt)``; ``A = -exp(inv_A_real) + i A_imag``
  (S4D-Lin init ``-1/2 + i pi n``); ``B``, ``C``: complex input / output vectors; ``D``: skip.

Zero-order-hold discretisation, for direction ``c`` (0 = causal, 1 = anti-causal)::

    C'[c,h,n] = C[c,h,n] B[h,n] (exp(dt_h A[h,n]) - 1) / A[h,n]
    K_c[h,l]  = 2 Re sum_n C'[c,h,n] exp(dt_h A[h,n] l),        l = 0 .. L-1

The layer computes ``y[t] = sum_{s<=t} Kf[t-s] k[s] + sum_{s>=t} Kb[s-t] k[s]`` (lag 0 receives
``Kf[0] + Kb[0]``) with one FFT convolution, adds ``D * k`` and multiplies by the linear gate ``q``.
This is the reference's exact ("ref") path with FFT size 2L. The reference's fast CUDA path
displaces the anti-causal kernel when L is not a power of two; that is a bug and is not reproduced.
"""
import math
from collections import OrderedDict
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# Parameters of the kernel that are "SSM parameters": no weight decay, optionally their own lr.
SSM_PARAMETER_NAMES = ("log_dt", "inv_A_real", "A_imag", "B", "C")


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
    phase = torch.remainder(x.imag.double().unsqueeze(-1) * pos, 2 * math.pi).to(dtype)  # (... n)
    return mag * torch.cos(phase), mag * torch.sin(phase)


def vandermonde_blocked(
    c_prime: torch.Tensor, dt_a: torch.Tensor, length: int, max_chunk_elems: int = 1 << 23
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
    temporaries.

    c_prime: (2, H, M) complex, dt_a: (H, M) complex -> (2, H, L) real in c_prime's real dtype.
    """
    two, H, M = c_prime.shape
    real_dtype = c_prime.real.dtype
    step = max(1, int(math.ceil(math.sqrt(length / 2))))  # S: inner block length
    n_blocks = -(-length // step)  # A: number of blocks, A*S >= L
    idx_in = torch.arange(step, device=dt_a.device, dtype=torch.float64)  # (S)
    idx_out = torch.arange(n_blocks, device=dt_a.device, dtype=torch.float64) * step  # (A)

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
        k = 2 * torch.bmm(lhs, rhs)  # (h A 2S)
        k = k.reshape(k.shape[0], n_blocks, two, step).transpose(1, 2)  # (h 2 A S)
        k = k.reshape(k.shape[0], two, n_blocks * step)[..., :length]  # (h 2 L)
        out.append(k)
    return torch.cat(out, dim=0).transpose(0, 1)  # (2 H L)


class S4DKernel(nn.Module):
    """Generates the causal and anti-causal S4D kernels (2, H, L) from the parameters (spec section 1).

    Parameter names and layouts are the reference's (complex tensors are stored as real tensors with
    a trailing (re, im) axis), so HF state dicts map 1:1. The kernel is always computed in float32 /
    complex64 regardless of the module dtype: half-precision phases are meaningless.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        lr: Optional[float] = None,
        tail_tol: float = 1e-10,
        recompute: bool = True,
    ):
        super().__init__()
        self.recompute = recompute
        if tail_tol < 0:
            raise ValueError(f"tail_tol must be >= 0 (got {tail_tol})")
        self.tail_tol = tail_tol
        if d_state < 2 or d_state % 2:
            raise ValueError(f"d_state must be an even number >= 2 (got {d_state}): "
                             "the real state is stored as d_state/2 complex-conjugate modes")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max (got {dt_min}, {dt_max})")
        H, M = d_model, d_state // 2
        self.H, self.M = H, M
        log_dt = torch.rand(H) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)  # (H)
        # S4D-Lin: A_n = -1/2 + i pi n; Re(A) kept negative through A_real = -exp(inv_A_real)
        inv_a_real = torch.full((H, M), math.log(0.5))  # (H M)
        a_imag = math.pi * torch.arange(M, dtype=torch.float).expand(H, M).clone()  # (H M)
        b = torch.view_as_real(torch.ones(H, M, dtype=torch.cfloat)).clone()  # (H M 2)
        # C: complex standard normal, one per direction (0 causal, 1 anti-causal)
        c = torch.view_as_real(torch.randn(2, H, M, dtype=torch.cfloat)).clone()  # (2 H M 2)
        self.log_dt = nn.Parameter(log_dt)
        self.inv_A_real = nn.Parameter(inv_a_real)
        self.A_imag = nn.Parameter(a_imag)
        self.B = nn.Parameter(b)
        self.C = nn.Parameter(c)
        # Optimizer tags (S4 convention): no weight decay, optional own learning rate. The fairseq
        # model translates these into `param_group` / `optim_overrides` for the optimizer.
        optim = {"weight_decay": 0.0}
        if lr is not None:
            optim["lr"] = lr
        for name in SSM_PARAMETER_NAMES:
            setattr(getattr(self, name), "_optim", dict(optim))

    def _apply(self, fn, *args, **kwargs):
        # Keep the SSM parameters in float32 when the model is cast to half precision (fairseq
        # --fp16 / --memory-efficient-fp16 call model.half()): A_imag reaches pi * (N/2 - 1) ~ 800,
        # where float16 steps are 0.5 and bfloat16 steps 4, so the kernel phases would be noise.
        # Device moves still apply; float64 casts are honoured.
        def keep_float32(t):
            if t.is_floating_point() and t.dtype == torch.float32:
                probe = fn(t.new_zeros(()))  # what fn does to a float32 tensor, without rounding t
                if probe.dtype in (torch.float16, torch.bfloat16):
                    return t.to(device=probe.device)
            return fn(t)

        return super()._apply(keep_float32, *args, **kwargs)

    def discretize(self, channels: slice = slice(None)) -> Tuple[torch.Tensor, torch.Tensor]:
        """Returns (C' (2, H, M) complex64, dtA (H, M) complex64) from the float32 parameters,
        for the channels ``channels`` only (default all)."""
        dt = torch.exp(self.log_dt[channels].float())  # (H)
        a = torch.complex(-torch.exp(self.inv_A_real[channels].float()), self.A_imag[channels].float())  # (H M)
        dt_a = a * dt.unsqueeze(-1)  # (H M)
        b = torch.view_as_complex(self.B[channels].float().contiguous())  # (H M)
        c = torch.view_as_complex(self.C[:, channels].float().contiguous())  # (2 H M)
        c_prime = c * (b * (torch.exp(dt_a) - 1) / a)  # (2 H M): ZOH
        return c_prime, dt_a

    def forward(self, length: int, channels: slice = slice(None)) -> torch.Tensor:
        """Kernels for length L: (2, H, L) float32, [0] = causal Kf, [1] = anti-causal Kb.

        Entries beyond :meth:`decay_length` are exactly zero instead of computed: there every
        mode's term is below ``tail_tol`` (their sum below ``M * tail_tol``, under float32 rounding
        of an O(1) kernel for the default 1e-10), and skipping them makes the cost O(H M l_max)
        instead of O(H M L) on long inputs.
        """
        c_prime, dt_a = self.discretize(channels)
        n = self.decay_length(c_prime, dt_a, length)
        if self.recompute and torch.is_grad_enabled() and (c_prime.requires_grad or dt_a.requires_grad):
            # The blocked product's temporaries (H*M*(A + 2S) floats, ~0.6 GiB per base layer at
            # any L) would all be kept for backward; they depend only on the parameters, so they
            # are recomputed in backward instead and only C', dtA and the kernel are kept.
            k = checkpoint(vandermonde_blocked, c_prime, dt_a, n, use_reentrant=False)  # (2 H n)
        else:
            k = vandermonde_blocked(c_prime, dt_a, n)  # (2 H n)
        return F.pad(k, (0, length - n)) if n < length else k  # (2 H L)

    def decay_length(self, c_prime: torch.Tensor, dt_a: torch.Tensor, length: int) -> int:
        """Smallest n <= L such that |2 C'[c,h,m] exp(dtA[h,m] l)| < tail_tol for all l >= n."""
        if self.tail_tol <= 0:
            return length
        with torch.no_grad():
            mag = 2 * c_prime.abs().amax(0).double()  # (H M): largest |2 C'| over both directions
            rate = dt_a.real.double()  # (H M): log|z| per step, negative for a stable SSM
            if (rate >= 0).any():
                return length
            # |2C'| exp(rate l) < tol  <=>  l > log(tol / |2C'|) / rate
            need = torch.where(mag > self.tail_tol, torch.log(self.tail_tol / mag) / rate, torch.zeros_like(mag))
            n = int(math.ceil(need.max().item())) + 1
        return max(1, min(length, n))

    def reference(self, length: int) -> torch.Tensor:
        """The same kernels, one complex exp per entry (slow; for tests)."""
        c_prime, dt_a = self.discretize()
        return vandermonde_naive(c_prime, dt_a, length)


def circular_bidirectional_kernel(k: torch.Tensor, fft_size: int) -> torch.Tensor:
    """Lays (2, H, L) kernels out as one circular kernel of length ``fft_size`` >= 2L - 1.

    Entry d holds lag d: ``Kf[0] + Kb[0]`` at 0, ``Kf[d]`` at d, ``Kb[d]`` at ``fft_size - d``, zeros
    between. For ``fft_size == 2L`` this is the reference's ``[Kf0+Kb0, Kf1..KfL-1, 0, KbL-1..Kb1]``.
    """
    _, H, L = k.shape
    if fft_size < 2 * L - 1:
        raise ValueError(f"fft_size {fft_size} < 2L-1 = {2 * L - 1} would wrap around")
    kf, kb = k[0], k[1]  # (H L) each
    lag0 = (kf[:, :1] + kb[:, :1])  # (H 1)
    zeros = k.new_zeros(H, fft_size - 2 * L + 1)  # (H F-2L+1)
    return torch.cat([lag0, kf[:, 1:], zeros, kb[:, 1:].flip(-1)], dim=-1)  # (H F)


class S4D(nn.Module):
    """LOCOST's gated bidirectional SSM block: ``output_linear(((K * k) + D k) q)``.

    ``k = k_proj(u)`` (the SSM input, zeroed at padding), ``q = q_proj(u)`` (a purely linear gate).
    No activation, dropout or normalisation inside (spec section 1).

    Kernel cache: in eval mode without autograd, the FFT of the circular kernel depends only on the
    parameters and L, so it is kept per length (LRU, at most ``kernel_cache_mb`` MiB per layer) and
    invalidated when a parameter is modified in place, moved or replaced, or on ``train()``/``eval()``.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        lr: Optional[float] = None,
        kernel_cache_mb: float = 64.0,
        kernel_tail_tol: float = 1e-10,
        kernel_recompute: bool = True,
    ):
        super().__init__()
        self.H = d_model
        self.kernel = S4DKernel(d_model, d_state, dt_min=dt_min, dt_max=dt_max, lr=lr, tail_tol=kernel_tail_tol,
                                recompute=kernel_recompute)
        self.D = nn.Parameter(torch.randn(d_model))  # (H): skip term
        self.k_proj = nn.Linear(d_model, d_model)  # SSM input ("V" in the paper)
        self.q_proj = nn.Linear(d_model, d_model)  # gate
        self.output_linear = nn.Linear(d_model, d_model)
        self.kernel_cache_mb = kernel_cache_mb
        # Inference without autograd on long inputs: channels are independent, so the kernel and the
        # FFT convolution are done a few channels at a time, keeping temporaries below this many
        # float32 elements (memory O(B*L*H) for the activations + O(chunk*L), not several (B,H,2L)).
        self.max_fft_elems = 1 << 26
        self._cache: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
        self._cache_signature = None

    # ---------------------------------------------------------------- kernel FFT (+ cache)
    def _signature(self):
        ps = [getattr(self.kernel, n) for n in SSM_PARAMETER_NAMES]
        return tuple((p.data_ptr(), p._version, p.device, p.dtype) for p in ps)

    def clear_kernel_cache(self):
        self._cache.clear()
        self._cache_signature = None

    def train(self, mode: bool = True):
        self.clear_kernel_cache()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .half() / .cuda() replace parameter storage: drop kernels computed from the old one
        self.clear_kernel_cache()
        return super()._apply(fn, *args, **kwargs)

    def kernel_fft(self, length: int, fft_size: int) -> torch.Tensor:
        """rfft of the circular bidirectional kernel: (H, fft_size // 2 + 1) complex64."""
        use_cache = self.kernel_cache_mb > 0 and not self.training and not torch.is_grad_enabled()
        if use_cache:
            sig = self._signature()
            if sig != self._cache_signature:
                self._cache.clear()
                self._cache_signature = sig
            key = (length, fft_size)
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        k = self.kernel(length)  # (2 H L)
        k_hat = torch.fft.rfft(circular_bidirectional_kernel(k, fft_size), n=fft_size)  # (H F/2+1)
        if use_cache:
            budget = self.kernel_cache_mb * 2 ** 20
            size = k_hat.numel() * k_hat.element_size()
            if size <= budget:
                self._cache[key] = k_hat
                while sum(t.numel() * t.element_size() for t in self._cache.values()) > budget:
                    self._cache.popitem(last=False)
        return k_hat

    # ---------------------------------------------------------------- layer
    def forward(self, u: torch.Tensor, padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """u: (B, L, H); padding_mask: (B, L) bool, True at padding (or None) -> (B, L, H)."""
        L = u.shape[1]
        k = self.k_proj(u)  # (B L H)
        if padding_mask is not None:
            # k_proj has a bias, so padding must be zeroed explicitly to keep it out of the conv
            k = k.masked_fill(padding_mask.unsqueeze(-1), 0.0)  # (B L H)
        q = self.q_proj(u)  # (B L H): the gate is not masked (reference behaviour)

        fft_size = next_fast_len(2 * L)
        x = k.float().transpose(1, 2)  # (B H L): FFT in float32 whatever the activation dtype
        B, H = x.shape[0], x.shape[1]
        chunk = H if torch.is_grad_enabled() else max(1, self.max_fft_elems // (4 * B * fft_size))
        if chunk >= H:
            y = self._conv(x, self.kernel_fft(L, fft_size), slice(None), fft_size)  # (B H L)
            y = y.transpose(1, 2).to(u.dtype)  # (B L H)
        else:
            y = u.new_empty(B, L, H)  # (B L H)
            for h0 in range(0, H, chunk):
                sl = slice(h0, h0 + chunk)
                k = self.kernel(L, sl)  # (2 h L)
                k_hat = torch.fft.rfft(circular_bidirectional_kernel(k, fft_size), n=fft_size)  # (h F/2+1)
                y[:, :, sl] = self._conv(x[:, sl], k_hat, sl, fft_size).transpose(1, 2).to(u.dtype)  # (B L h)
        return self.output_linear(y * q)

    def _conv(self, x: torch.Tensor, k_hat: torch.Tensor, channels: slice, fft_size: int) -> torch.Tensor:
        """(B, h, L) float32 -> bidirectional convolution + D skip, (B, h, L) float32."""
        L = x.shape[-1]
        y = torch.fft.irfft(torch.fft.rfft(x, n=fft_size) * k_hat, n=fft_size)[..., :L]  # (B h L)
        return y + self.D[channels].float().unsqueeze(-1) * x  # (B h L)
