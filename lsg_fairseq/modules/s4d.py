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

Where the time goes and what is done about it (numbers: ``benchmarks/README.md``):

- kernel generation is a blocked Vandermonde product (:func:`vandermonde_blocked`): real batched
  matmuls, H*M*(A + S) exponentials instead of H*M*L;
- each channel's kernel is computed only until every mode has decayed below ``tail_tol``
  (:meth:`S4DKernel.decay_lengths`, channels grouped by :func:`channel_groups`);
- inference (no autograd) works a chunk of channels at a time (:meth:`S4D._forward_inference`):
  channels are taken in decay-length groups, a group of kernel length n uses FFT size
  ``next_fast_len(L + n - 1)`` instead of 2L, and the k/q projections are made for a few groups
  at a time (wide enough GEMMs), so no (B, L, H) intermediate besides the input and output exists;
- in eval mode the *time-domain* kernels are cached (:meth:`S4D.kernel_groups`), each group cut at
  its decay length, in one flat buffer per layer, the shortest first up to ``kernel_cache_mb``
  (the rest generated per call); their FFT is redone per call (cheap next to generating them).
  One entry serves every input up to the length it was made for, and past the longest decay
  length (~46K tokens for the S4D-Lin init) its size no longer grows with L: ~38 MiB per
  locost_base layer for all kernels at 16K instead of the 101 MiB spectrum;
- ``D`` is folded into the kernel's lag 0;
- in training, :class:`FFTConv` keeps only the input and the circular kernel for backward and the
  kernel's blocked-product temporaries are recomputed (``recompute``).
"""
import math
import mmap
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# Parameters of the kernel that are "SSM parameters": no weight decay, optionally their own lr.
SSM_PARAMETER_NAMES = ("log_dt", "inv_A_real", "A_imag", "B", "C")

# Per-layer budget (MiB) of the eval-mode kernel cache (``--ssm-kernel-cache-mb``). A locost_base
# layer's kernels take ~17 MiB at 4K tokens, ~38 MiB at 16K and ~50 MiB at 64K; 30 keeps all of
# them up to ~8K tokens and ~80% at 16K, where the encoder then runs at 2.10x the linear floor
# instead of 2.04x with everything cached (2.30x at 16 MiB), with 133 MiB less resident.
KERNEL_CACHE_MB = 30.0


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
    phase = torch.fmod(x.imag.double().unsqueeze(-1) * pos, 2 * math.pi).to(dtype)  # (... n), in (-2pi, 2pi)
    return mag * torch.cos(phase), mag * torch.sin(phase)


def vandermonde_blocked(
    c_prime: torch.Tensor, dt_a: torch.Tensor, length: int, max_chunk_elems: int = 1 << 21
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


def channel_groups(lengths: torch.Tensor, ratio: float = 0.8):
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


def grouped_kernel(c_prime: torch.Tensor, dt_a: torch.Tensor, groups, length: int) -> torch.Tensor:
    """Kernels (2, H, length) of :func:`vandermonde_blocked`, each channel group computed up to its own
    length and zero after it. c_prime: (2, H, M) complex, dt_a: (H, M) complex."""
    if len(groups) == 1 and groups[0][1] == length and torch.equal(groups[0][0], torch.arange(dt_a.shape[0])):
        return vandermonde_blocked(c_prime, dt_a, length)  # (2 H L): nothing decays early
    out = c_prime.real.new_zeros(2, dt_a.shape[0], length)  # (2 H L): zero past each group's length
    for idx, n in groups:
        idx = idx.to(dt_a.device)
        out[:, idx, :n] = vandermonde_blocked(c_prime[:, idx], dt_a[idx], n)  # (2 g n), differentiable
    return out


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

        Entries of channel h beyond its :meth:`decay_lengths` ``n_h`` are exactly zero instead of
        computed: there every mode's term is below ``tail_tol`` (their sum below ``M * tail_tol``,
        under float32 rounding of an O(1) kernel for the default 1e-10). Channels are generated in
        groups of similar ``n_h`` (see :func:`channel_groups`), so the cost is about
        ``O(M sum_h n_h)`` instead of ``O(H M L)``: with the S4D-Lin init (dt log-uniform in
        [1e-3, 1e-1]) that is 2.3x less at 16K and ~25x less at 256K.
        """
        c_prime, dt_a = self.discretize(channels)
        lengths = self.decay_lengths(c_prime, dt_a, length)  # (h) ints <= L
        groups = channel_groups(lengths)
        if self.recompute and torch.is_grad_enabled() and (c_prime.requires_grad or dt_a.requires_grad):
            # The blocked product's temporaries (H*M*(A + 2S) floats, ~0.6 GiB per base layer at
            # any L) would all be kept for backward; they depend only on the parameters, so they
            # are recomputed in backward instead and only C', dtA and the kernel are kept.
            return checkpoint(grouped_kernel, c_prime, dt_a, groups, length, use_reentrant=False)  # (2 h L)
        return grouped_kernel(c_prime, dt_a, groups, length)  # (2 h L)

    def decay_lengths(self, c_prime: torch.Tensor, dt_a: torch.Tensor, length: int) -> torch.Tensor:
        """Per channel h, the smallest n_h <= L such that |2 C'[c,h,m] exp(dtA[h,m] l)| < tail_tol for
        every direction c, mode m and l >= n_h: (H,) int64 (all L when ``tail_tol`` is 0)."""
        H = dt_a.shape[0]
        full = torch.full((H,), length, dtype=torch.long)
        if self.tail_tol <= 0:
            return full
        with torch.no_grad():
            mag = 2 * c_prime.abs().amax(0).double().cpu()  # (H M): largest |2 C'| over both directions
            rate = dt_a.real.double().cpu()  # (H M): log|z| per step, negative for a stable SSM
            # |2C'| exp(rate l) < tol  <=>  l > log(tol / |2C'|) / rate; modes already below tol need 0
            need = torch.where(mag > self.tail_tol, torch.log(self.tail_tol / mag) / rate.clamp(max=-1e-300),
                               torch.zeros_like(mag))  # (H M)
            need = torch.where(rate >= 0, torch.full_like(need, float(length)), need)  # unstable: all of L
            n = torch.ceil(need.amax(-1).clamp(max=float(length))).long() + 1  # (H)
        return torch.minimum(n.clamp(min=1), full)

    def reference(self, length: int) -> torch.Tensor:
        """The same kernels, one complex exp per entry (slow; for tests)."""
        c_prime, dt_a = self.discretize()
        return vandermonde_naive(c_prime, dt_a, length)


def _resident_buffer(numel: int, device: torch.device) -> torch.Tensor:
    """(numel,) float32 for data kept across calls (the kernel cache): on CPU in an anonymous memory
    mapping of its own, unmapped when the last view of it is freed.

    From the malloc heap (any block under glibc's 32 MiB mmap threshold, e.g. a 30 MiB cache), a
    block that outlives the call pins the heap between the call's temporaries, which then can never
    be returned: at 16K tokens 12 such caches left the locost_base encoder ~190 MiB above its live
    tensors."""
    if device.type != "cpu" or numel == 0:
        return torch.empty(numel, dtype=torch.float32, device=device)
    return torch.frombuffer(mmap.mmap(-1, numel * 4), dtype=torch.float32)


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
        lag0 = (kf[:, :1] + kb[:, :1])  # (H 1)
        if skip is not None:
            lag0 = lag0 + skip.unsqueeze(-1)
        zeros = k.new_zeros(H, fft_size - 2 * L + 1)  # (H F-2L+1)
        return torch.cat([lag0, kf[:, 1:], zeros, kb[:, 1:].flip(-1)], dim=-1)  # (H F)
    # no autograd: written in place into one buffer (inference does this once per chunk and call)
    out = k.new_empty(H, fft_size)  # (H F)
    out[:, :L] = kf
    out[:, L:fft_size - L + 1].zero_()
    out[:, fft_size - L + 1:] = kb[:, 1:].flip(-1)
    out[:, 0] += kb[:, 0]
    if skip is not None:
        out[:, 0] += skip
    return out


class S4D(nn.Module):
    """LOCOST's gated bidirectional SSM block: ``output_linear(((K * k) + D k) q)``.

    ``k = k_proj(u)`` (the SSM input, zeroed at padding), ``q = q_proj(u)`` (a purely linear gate).
    No activation, dropout or normalisation inside (spec section 1).

    Kernel cache: in eval mode without autograd, the kernels (time domain, truncated per channel
    group at the decay length) depend only on the SSM parameters, so the last set made is kept, as
    much of it as fits in ``kernel_cache_mb`` MiB (see :meth:`kernel_groups`); it serves every shorter input and is
    invalidated when a kernel parameter is modified in place, moved or replaced, or on
    ``train()``/``eval()``. ``D`` is applied per call, so it is not part of the cache.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        lr: Optional[float] = None,
        kernel_cache_mb: float = KERNEL_CACHE_MB,
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
        # 8M: (B, chunk, F) buffers of 8 MiB (64 channels at 16K tokens); 16M was no faster, ~36 MiB more.
        self.max_fft_elems = 1 << 23
        # (length L', [(channel idx, n, kernels (2, g, n))]): the time-domain kernels made for L'
        self._cache = None
        self._cache_signature = None

    # ---------------------------------------------------------------- kernels (+ cache)
    def _signature(self):
        ps = [getattr(self.kernel, n) for n in SSM_PARAMETER_NAMES]
        return tuple((p.data_ptr(), p._version, p.device, p.dtype) for p in ps)

    def clear_kernel_cache(self):
        self._cache = None
        self._cache_signature = None

    def train(self, mode: bool = True):
        self.clear_kernel_cache()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .half() / .cuda() replace parameter storage: drop kernels computed from the old one
        self.clear_kernel_cache()
        return super()._apply(fn, *args, **kwargs)

    def _cache_enabled(self) -> bool:
        return self.kernel_cache_mb > 0 and not self.training and not torch.is_grad_enabled()

    def cached_kernel_bytes(self) -> int:
        """Bytes held by the kernel cache (0 when empty)."""
        if self._cache is None:
            return 0
        return sum(k.numel() * k.element_size() for _, _, k in self._cache[1] if k is not None)

    def kernel_groups(self, length: int):
        """The kernels for inputs of length L, by channel group: a list of ``(idx, n, k)`` with ``idx``
        (g,) channel indices, ``n`` <= L the group's kernel length (its longest decay length, see
        :meth:`S4DKernel.decay_lengths`) and ``k`` (2, g, n') float32, n' >= n, the causal and
        anti-causal kernels of those channels (only ``k[..., :n]`` is used; beyond ``n`` they are 0).

        In eval mode without autograd the kernels are cached, as many groups as fit in
        ``kernel_cache_mb`` MiB (shortest first); a cached set made for length L' >= L serves L by
        slicing. A group not cached has ``k`` None: the convolution generates each channel chunk's
        kernel itself (bounded temporaries).
        """
        use_cache = self._cache_enabled()
        if use_cache:
            sig = self._signature()
            if sig != self._cache_signature:
                self._cache = None
                self._cache_signature = sig
            if self._cache is not None and self._cache[0] >= length:
                return [(idx, min(n, length), k) for idx, n, k in self._cache[1]]
        c_prime, dt_a = self.kernel.discretize()
        lengths = self.kernel.decay_lengths(c_prime, dt_a, length)  # (H) ints <= L
        groups = channel_groups(lengths)  # [(idx, n)]
        # The budget is filled with the shortest kernels first (a kernel's generation costs time in
        # proportion to its length plus a fixed part, so per MiB kept the short ones save the most),
        # splitting the group where it runs out; the rest is generated chunk by chunk by the caller.
        budget = self.kernel_cache_mb * 2 ** 20 if use_cache else 0
        cached = {}  # group index -> how many of its channels are cached
        used = 0
        for i in sorted(range(len(groups)), key=lambda i: groups[i][1]):
            idx, n = groups[i]
            cached[i] = min(len(idx), int((budget - used) // (2 * n * 4)))  # float32 kernels (2 g n)
            used += cached[i] * 2 * n * 4
            if cached[i] < len(idx):
                break
        if used == 0:
            return [(idx, n, None) for idx, n in groups]
        flat = _resident_buffer(used // 4, dt_a.device)  # the groups' kernels are views into it
        entries, off = [], 0
        for i, (idx, n) in enumerate(groups):
            m = cached.get(i, 0)
            if m:
                k = self.kernel(n, idx[:m])  # (2 m n)
                entries.append((idx[:m], n, flat[off:off + k.numel()].view_as(k).copy_(k)))
                off += k.numel()
                del k
            if m < len(idx):
                entries.append((idx[m:], n, None))
        self._cache = (length, entries)
        return entries

    # ---------------------------------------------------------------- layer
    def forward(self, u: torch.Tensor, padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """u: (B, L, H); padding_mask: (B, L) bool, True at padding (or None) -> (B, L, H)."""
        L = u.shape[1]
        if not torch.is_grad_enabled():
            return self._forward_inference(u, padding_mask)
        k = self.k_proj(u)  # (B L H)
        if padding_mask is not None:
            # k_proj has a bias, so padding must be zeroed explicitly to keep it out of the conv
            k = k.masked_fill(padding_mask.unsqueeze(-1), 0.0)  # (B L H)
        q = self.q_proj(u)  # (B L H): the gate is not masked (reference behaviour)
        fft_size = next_fast_len(2 * L)
        # training: FFT in float32 whatever the activation dtype; only k and the kernel are kept
        kc = self._circular(self.kernel(L), slice(None), fft_size)  # (H F)
        y = FFTConv.apply(k.float(), kc, fft_size).to(u.dtype)  # (B L H)
        return self.output_linear(y * q)

    @torch.no_grad()
    def _forward_inference(self, u: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """``output_linear(((K * k) + D k) q)`` without autograd, a chunk of channels at a time.

        Channels are taken in decay-length groups (:meth:`kernel_groups`); a group whose kernels have
        length n <= L needs FFT size ``next_fast_len(L + n - 1)`` only (no lag of the kernel wraps
        onto an output position), not 2L. ``k`` and ``q`` are projected for a few consecutive groups
        at a time (at least ``min_projection_channels`` columns, so the GEMMs stay wide; never the
        whole (B, L, H) tensors); within them, per chunk of channels, the kernel is laid out
        circularly and FFT'd (from the cache, or generated), the input is FFT-convolved and the gated
        result is written to the chunk's columns of the batch's part of a channel-permuted ``y``; the
        output projection adds each batch's part in (``out += y_b W_b^T``, so ``y`` is never whole).
        Temporaries stay below ``max_fft_elems`` floats per (B, chunk, F) buffer, one set per group
        reused by its chunks; the (B, L, c) <-> (B, c, L) transposes go in cache-sized tiles.
        """
        B, L, H = u.shape
        x = u
        pad = None if padding_mask is None else padding_mask.unsqueeze(-1)  # (B L 1)
        groups = self.kernel_groups(L)
        perm = torch.cat([idx for idx, _, _ in groups]).to(u.device)  # (H): y[..., j] is channel perm[j]
        k_cols = self._columns(self.k_proj, x, perm)  # columns -> (B L c) of k_proj(x), in y's order
        q_cols = self._columns(self.q_proj, x, perm)
        d = self.D[perm].float()
        lin = self.output_linear
        # a plain Linear takes y a batch of columns at a time (out += y_b W_b^T): y never exists whole
        w_out = lin.weight[:, perm] if isinstance(lin, nn.Linear) else None  # (H H): input columns in y's order
        y = None if w_out is not None else torch.empty(B, L, H, dtype=torch.float32, device=u.device)
        out = None
        j = 0  # first column of y of the current batch of groups
        for batch in self._projection_batches(groups, B, L):
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
                chunk = min(len(idx), max(1, self.max_fft_elems // (4 * B * fft_size)))
                # one set of FFT buffers per group, reused by its chunks
                xp = torch.empty(B, chunk, fft_size, dtype=torch.float32, device=u.device)  # (B c F)
                spec = torch.empty(B, chunk, fft_size // 2 + 1, dtype=torch.complex64, device=u.device)
                yc = torch.empty(B, chunk, fft_size, dtype=torch.float32, device=u.device)
                for c0 in range(0, len(idx), chunk):
                    c = min(chunk, len(idx) - c0)
                    kk = self.kernel(n, idx[c0:c0 + c]) if kern is None else kern[:, c0:c0 + c, :n]  # (2 c n)
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
                out = self._project(yb.to(wb.dtype), wb, lin.bias, out)  # (B L H)
            j += width
        if w_out is not None:
            return out.to(u.dtype)
        return lin(y[..., torch.argsort(perm)]).to(u.dtype)  # (B L H): e.g. int8, channels back in order

    # Inference projects k and q for at least this many channels at a time: a GEMM of a few dozen
    # output columns (one decay-length group) runs at half the speed of a wide one.
    min_projection_channels = 256

    def _projection_batches(self, groups, B: int, L: int):
        """Consecutive channel groups of :meth:`kernel_groups` taken together for the k/q
        projections: at least ``min_projection_channels`` channels per batch (the last may have
        fewer), and no more than ``max_fft_elems`` floats of projected (B, L, c) columns each."""
        cap = max(self.min_projection_channels, self.max_fft_elems // max(1, B * L))
        batch, width = [], 0
        for g in groups:
            if batch and width + len(g[0]) > cap:
                yield batch
                batch, width = [], 0
            batch.append(g)
            width += len(g[0])
            if width >= self.min_projection_channels:
                yield batch
                batch, width = [], 0
        if batch:
            yield batch

    def _columns(self, lin: nn.Module, x: torch.Tensor, perm: torch.Tensor):
        """A function of a column slice ``cols`` returning those columns of ``lin(x)`` (B, L, c), in the
        channel order ``perm``. A plain ``nn.Linear`` projects each chunk from its weight rows, so the
        whole (B, L, H) output never exists; any other module (an int8 ``DynamicQuantizedLinear`` has
        no weight tensor) is called once on the whole input and sliced."""
        if isinstance(lin, nn.Linear):
            w, b = lin.weight[perm], lin.bias[perm]  # rows in y's order: chunks are slices
            return lambda cols: self._project(x, w[cols], b[cols])
        full = lin(x)[..., perm]  # (B L H)
        return lambda cols: full[..., cols]

    def _project(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``F.linear(x, weight, bias)``, or with ``out`` ``out += x weight^T`` in place: every
        projection of the inference path goes through here (the benchmark's SSM breakdown times it
        apart from the convolution)."""
        if out is None:
            return F.linear(x, weight, bias)
        out.view(-1, out.size(-1)).addmm_(x.reshape(-1, x.size(-1)), weight.t())
        return out

    def _circular(self, k: torch.Tensor, channels: slice, fft_size: int) -> torch.Tensor:
        """The circular bidirectional kernel (h, F) of kernels (2, h, L) with the D skip folded into
        lag 0 (``D k`` is a convolution with ``D`` at lag 0, so the FFT does it for free)."""
        return circular_bidirectional_kernel(k, fft_size, self.D[channels].float())  # (h F)


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
