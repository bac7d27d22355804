"""Bidirectional diagonal state-space layer (S4D) as used by LOCOST's encoder.

Pure PyTorch (CPU and GPU) port of the reference's ``S4D`` + ``SSKernelDiag`` (locost-summarization,
``s4d_models.py`` / ``kernel_computations.py``); spec: ``shared/spec/locost.md`` section 1. The
shape of state-spaces/s4's ``s4d.py``: :class:`S4DKernel` maps its parameters to the causal and
anti-causal kernels, :class:`S4D` is the gated layer around one FFT convolution.

Notation (paper / S4D / this file):

- ``H``: number of independent channels = ``d_model`` (one SSM per channel, ``num_ssm_heads`` = 1).
- ``N``: real state size (``d_state`` in the config); it is represented by ``M = N / 2`` complex
  modes whose conjugate pairs give the real kernel ``2 Re(...)`` (released model: N 512, M 256).
- ``L``: sequence length; the kernels have length ``L`` (exact zeros once every mode has decayed).
- ``dt`` (Delta): per-channel step size ``exp(log_dt)``; ``A = -exp(inv_A_real) + i A_imag``
  (S4D-Lin init ``-1/2 + i pi n``); ``B``, ``C``: complex input / output vectors; ``D``: skip.

The discretisation and kernel formulas, and every fast piece of math, are in
``lsg_fairseq.ops.ssm``. The layer computes ``y = output_linear(((K * k) + D k) q)`` with
``k = k_proj(u)`` (zeroed at padding) and the linear gate ``q = q_proj(u)``: one FFT convolution
with both kernels, the reference's exact ("ref") path. The reference's fast CUDA path displaces
the anti-causal kernel when L is not a power of two; that is a bug and is not reproduced.

Where the time goes and what is done about it (the figures behind each choice: ``benchmarks/README.md``,
"Figures behind the constants"). On CPU:

- kernels: the blocked Vandermonde product, each channel only until its modes have decayed
  (``ops.ssm``); in training their temporaries are recomputed in backward (``recompute``) and
  ``ops.ssm.FFTConv`` keeps only the input and the circular kernel;
- without autograd the layer runs ``lsg_fairseq.modules.s4d_inference.forward`` (channel chunks,
  FFT size ``L + n - 1`` per decay group, wide k/q projections, no (B, L, H) intermediate), and in
  eval mode the *time-domain* kernels are cached (:meth:`S4D.kernel_groups`), the shortest first
  up to ``kernel_cache_mb`` per layer (the rest generated per call). One entry serves every
  input up to the length it was made for;
- ``D`` is folded into the kernel's lag 0.

On a GPU (``lsg_fairseq.modules.paths``) those pieces would each be a kernel launch, so the layer
runs :meth:`S4D._whole_forward` instead: one blocked product for every channel's kernel, one batched
FFT, nothing read back on the host; in eval mode the kernels' *spectra* are cached per FFT size
(:meth:`S4D.whole_spectrum`), so a repeated length costs no kernel generation and no kernel FFT.
"""

import math
import mmap
from collections import OrderedDict
from typing import Optional, Tuple

import torch
import torch.nn as nn
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

from lsg_fairseq.modules import s4d_inference
from lsg_fairseq.modules.paths import PathChoice
from lsg_fairseq.modules.precision import autocast_on, float32_region, fp16_in_play, within_fp16
from lsg_fairseq.modules.s4d_init import DT_MAX, DT_MIN, check_ssm_config
from lsg_fairseq.ops.ssm import (
    PRODUCT_MODES,
    FFTConv,
    fused_circular_kernel,
    tf32_matmul,
    channel_groups,
    circular_bidirectional_kernel,
    decay_lengths,
    grouped_kernel,
    next_fast_len,
    vandermonde_blocked,
    vandermonde_naive,
)

# The kernel's "SSM parameters": no weight decay, optionally their own lr. S4DKernel tags them for
# lsg_fairseq.optim.grouped_adam when it makes them (``param_group`` / ``optim_overrides``).
SSM_PARAMETER_NAMES = ("log_dt", "inv_A_real", "A_imag", "B", "C")

# Per-layer budget (MiB) of the eval-mode kernel cache where ``--ssm-kernel-cache-mb`` is not given,
# by device. On CPU (time-domain kernels, cut at their decay lengths): every kernel of a locost_base
# layer up to ~8K tokens, most of them at 16K, for a few percent of the encoder's time there
# against keeping them all.
KERNEL_CACHE_MB = 30.0
# On a GPU (the whole-tensor path's kernel spectra, one per FFT size): room for a locost_base
# layer's spectrum at 64K tokens and a shorter bucket beside it (the sizes: benchmarks/README,
# "Figures behind the constants").
GPU_KERNEL_CACHE_MB = 512.0
# Kernel entries after every mode's term has decayed below this are exact zeros instead of computed
# (``--ssm-kernel-tail-tol``; their sum stays below M * tol, under float32 rounding of O(1) kernels).
KERNEL_TAIL_TOL = 1e-10
# The CPU path without autograd (``s4d_inference``) convolves a few channels at a time: its (B, chunk,
# F) FFT buffers hold at most a quarter of this many float32 elements (three such buffers and the
# kernel spectrum per group), and its projected (B, L, c) columns at most this many: temporaries
# that stay near the cache instead of several (B, H, 2L) tensors ...
MAX_FFT_ELEMS = 1 << 23
# ... and projects k and q for at least this many channels at a time: a GEMM of a few dozen output
# columns (one decay group) runs far below a wide one's rate.
MIN_PROJECTION_CHANNELS = 256
# The whole-tensor path (GPU, ``lsg_fairseq.modules.paths``) bounds its temporaries in float32
# elements, so that lengths up to ~64K run as a fixed handful of launches per layer and 600K tokens
# still fit a GPU's memory: the blocked Vandermonde product's temporaries per chunk of channels ...
WHOLE_KERNEL_ELEMS = 1 << 29
# ... and each (B, channels, F) FFT buffer of the no-grad convolution.
WHOLE_FFT_ELEMS = 1 << 27


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
        dt_min: float = DT_MIN,
        dt_max: float = DT_MAX,
        tail_tol: float = KERNEL_TAIL_TOL,
        recompute: bool = True,
        lr_scale: float = 1.0,
    ):
        super().__init__()
        self.recompute = recompute
        if tail_tol < 0:
            raise ValueError(f"tail_tol must be >= 0 (got {tail_tol})")
        self.tail_tol = tail_tol
        check_ssm_config(d_state, dt_min, dt_max)
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
        for name in SSM_PARAMETER_NAMES:  # for lsg_fairseq.optim.grouped_adam: own lr, no weight decay
            p = getattr(self, name)
            p.param_group = "ssm"
            p.optim_overrides = {"optimizer": {"lr_scale": lr_scale, "weight_decay_scale": 0.0}}

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

    def forward(self, length: int, channels: slice = slice(None), whole: bool = False) -> torch.Tensor:
        """Kernels for length L: (2, H, L) float32, [0] = causal Kf, [1] = anti-causal Kb.

        Entries of channel h beyond its decay length ``n_h`` (``ops.ssm.decay_lengths``) are exactly zero instead of
        computed: there every mode's term is below ``tail_tol`` (their sum below ``M * tail_tol``,
        under float32 rounding of an O(1) kernel for the default 1e-10). Channels are generated in
        groups of similar ``n_h`` (see :func:`channel_groups`), so the cost is about
        ``O(M sum_h n_h)`` instead of ``O(H M L)``, much less at long L with the S4D-Lin init (dt
        log-uniform in [1e-3, 1e-1]: most channels decay within a few thousand steps).

        ``whole``: every channel to length L in one blocked product (chunked only beyond
        ``WHOLE_KERNEL_ELEMS``): no decay lengths, whose grouping needs the host to read them (the
        GPU path). Equal to the grouped kernels up to the decayed tail.
        """
        # float32 under autocast too: a float16 / bfloat16 bmm in the Vandermonde product is ~1e-3 off
        with record_function("s4d.kernel"), float32_region(self.log_dt):
            return self._generate(length, channels, whole)

    def _generate(self, length: int, channels, whole: bool) -> torch.Tensor:
        c_prime, dt_a = self.discretize(channels)
        if whole:
            groups = None
            fn = _whole_kernel
        else:
            lengths = decay_lengths(c_prime, dt_a, length, self.tail_tol)  # (h) ints <= L
            groups = channel_groups(lengths)
            fn = grouped_kernel
        if self.recompute and torch.is_grad_enabled() and (c_prime.requires_grad or dt_a.requires_grad):
            # The blocked product's temporaries (H*M*(A + 2S) floats, hundreds of MiB per base
            # layer) would all be kept for backward; they depend only on the parameters, so they
            # are recomputed in backward instead and only C', dtA and the kernel are kept.
            return checkpoint(fn, c_prime, dt_a, groups, length, use_reentrant=False)  # (2 h L)
        return fn(c_prime, dt_a, groups, length)  # (2 h L)

    def reference(self, length: int) -> torch.Tensor:
        """The same kernels, one complex exp per entry (slow; for tests)."""
        c_prime, dt_a = self.discretize()
        return vandermonde_naive(c_prime, dt_a, length)


def _fused_kernel(c_prime, dt_a, length, fft_size, skip, max_chunk_elems, product):
    """``ops.ssm.fused_circular_kernel`` with CUDA's TF32 on for the ``"tf32"`` product, also when
    checkpointing recomputes it in backward (the same kernel both times)."""
    with tf32_matmul(product == "tf32" and c_prime.is_cuda):
        return fused_circular_kernel()(c_prime, dt_a, length, fft_size, skip, max_chunk_elems, product)


def _whole_kernel(c_prime: torch.Tensor, dt_a: torch.Tensor, groups, length: int) -> torch.Tensor:
    """``grouped_kernel``'s signature for the ungrouped kernel (``groups`` unused)."""
    return vandermonde_blocked(c_prime, dt_a, length, max_chunk_elems=WHOLE_KERNEL_ELEMS)  # (2 h L)


def _resident_buffer(numel: int, device: torch.device) -> torch.Tensor:
    """(numel,) float32 for data kept across calls (the kernel cache): on CPU in an anonymous memory
    mapping of its own, unmapped when the last view of it is freed.

    From the malloc heap (any block under glibc's 32 MiB mmap threshold, e.g. a 30 MiB cache), a
    block that outlives the call pins the heap between the call's temporaries, which then can never
    be returned (12 such caches left the locost_base encoder well above its live tensors)."""
    if device.type != "cpu" or numel == 0:
        return torch.empty(numel, dtype=torch.float32, device=device)
    return torch.frombuffer(mmap.mmap(-1, numel * 4), dtype=torch.float32)


class S4D(PathChoice, nn.Module):
    """LOCOST's gated bidirectional SSM block: ``output_linear(((K * k) + D k) q)``.

    ``k = k_proj(u)`` (the SSM input, zeroed at padding), ``q = q_proj(u)`` (a purely linear gate).
    No activation, dropout or normalisation inside (spec section 1).

    Two paths (``lsg_fairseq.modules.paths``): on CPU, decay groups and channel chunks
    (``s4d_inference`` without autograd); on a GPU, :meth:`_whole_forward`: one kernel product and
    one batched FFT over every channel.

    Kernel cache: in eval mode without autograd the kernels depend only on the parameters, so they
    are kept within ``kernel_cache_mb`` MiB per layer (None: :data:`KERNEL_CACHE_MB` on CPU,
    :data:`GPU_KERNEL_CACHE_MB` elsewhere), and invalidated when a parameter they depend on is
    modified in place, moved or replaced, or on ``train()``/``eval()``. The CPU path keeps the last
    set of time-domain kernels made (truncated per channel group at the decay length; it serves
    every shorter input; ``D`` is applied per call, so it is not part of it; :meth:`kernel_groups`).
    The whole-tensor path keeps kernel *spectra*, the rfft of the circular kernel with ``D``
    folded in, one per FFT size, least recently used out (:meth:`whole_spectrum`): inputs of
    different lengths share a spectrum when they share an FFT size.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        dt_min: float = DT_MIN,
        dt_max: float = DT_MAX,
        kernel_cache_mb: Optional[float] = None,
        kernel_tail_tol: float = KERNEL_TAIL_TOL,
        kernel_recompute: bool = True,
        lr_scale: float = 1.0,
        kernel_compile: bool = False,
        kernel_product: str = "fp32",
    ):
        super().__init__()
        self.H = d_model
        # the whole-tensor path generates its circular kernels with ops.ssm.fused_circular_kernel
        # (torch.compile) instead of eagerly: --ssm-kernel-compile, off until measured on a GPU
        self.kernel_compile = kernel_compile
        # the fused generator's product when training in half precision (ops.ssm.PRODUCT_MODES)
        if kernel_product not in PRODUCT_MODES:
            raise ValueError(f"kernel_product must be one of {PRODUCT_MODES}, got {kernel_product!r}")
        if kernel_product != "fp32" and not kernel_compile:
            raise ValueError(
                f"kernel_product {kernel_product!r} is a mode of the fused generator: needs kernel_compile"
            )
        self.kernel_product = kernel_product
        self.kernel = S4DKernel(
            d_model,
            d_state,
            dt_min=dt_min,
            dt_max=dt_max,
            tail_tol=kernel_tail_tol,
            recompute=kernel_recompute,
            lr_scale=lr_scale,
        )
        self.D = nn.Parameter(torch.randn(d_model))  # (H): skip term
        self.k_proj = nn.Linear(d_model, d_model)  # SSM input ("V" in the paper)
        self.q_proj = nn.Linear(d_model, d_model)  # gate
        self.output_linear = nn.Linear(d_model, d_model)
        self.kernel_cache_mb = kernel_cache_mb
        self.max_fft_elems = MAX_FFT_ELEMS
        self.min_projection_channels = MIN_PROJECTION_CHANNELS
        # (length L', [(channel idx, n, kernels (2, g, n))]): the time-domain kernels made for L'
        self._cache = None
        self._cache_signature = None
        # {FFT size F: rfft of the circular kernel (H, F/2+1) complex64}: the whole-tensor path's
        # cache, least recently used first
        self._spectra = OrderedDict()

    # ---------------------------------------------------------------- kernels (+ cache)
    def _signature(self, with_skip: bool = False):
        ps = [getattr(self.kernel, n) for n in SSM_PARAMETER_NAMES] + ([self.D] if with_skip else [])
        return tuple((p.data_ptr(), p._version, p.device, p.dtype) for p in ps)

    def clear_kernel_cache(self):
        self._cache = None
        self._cache_signature = None
        self._spectra = OrderedDict()

    def train(self, mode: bool = True):
        self.clear_kernel_cache()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .half() / .cuda() replace parameter storage: drop kernels computed from the old one
        self.clear_kernel_cache()
        return super()._apply(fn, *args, **kwargs)

    def cache_budget(self, device: torch.device) -> float:
        """Bytes the kernel cache may hold on ``device`` (0 outside eval mode without autograd)."""
        if self.training or torch.is_grad_enabled():
            return 0.0
        mb = self.kernel_cache_mb
        if mb is None:
            mb = KERNEL_CACHE_MB if device.type == "cpu" else GPU_KERNEL_CACHE_MB
        return mb * 2**20

    def cached_kernel_bytes(self) -> int:
        """Bytes held by the kernel cache (0 when empty)."""
        total = sum(x.numel() * x.element_size() for x in self._spectra.values())
        if self._cache is None:
            return total
        return total + sum(k.numel() * k.element_size() for _, _, k in self._cache[1] if k is not None)

    def kernel_groups(self, length: int):
        """The kernels for inputs of length L, by channel group: a list of ``(idx, n, k)`` with ``idx``
        (g,) channel indices, ``n`` <= L the group's kernel length (its longest decay length, see
        ``ops.ssm.decay_lengths``) and ``k`` (2, g, n') float32, n' >= n, the causal and
        anti-causal kernels of those channels (only ``k[..., :n]`` is used; beyond ``n`` they are 0).

        In eval mode without autograd the kernels are cached, as many groups as fit in
        ``kernel_cache_mb`` MiB (shortest first); a cached set made for length L' >= L serves L by
        slicing. A group not cached has ``k`` None: the convolution generates each channel chunk's
        kernel itself (bounded temporaries).
        """
        budget = self.cache_budget(self.D.device)
        use_cache = budget > 0
        if use_cache:
            sig = self._signature()
            if sig != self._cache_signature:
                self._cache = None
                self._cache_signature = sig
            if self._cache is not None and self._cache[0] >= length:
                return [(idx, min(n, length), k) for idx, n, k in self._cache[1]]
        c_prime, dt_a = self.kernel.discretize()
        lengths = decay_lengths(c_prime, dt_a, length, self.kernel.tail_tol)  # (H) ints <= L
        groups = channel_groups(lengths)  # [(idx, n)]
        # The budget is filled with the shortest kernels first (a kernel's generation costs time in
        # proportion to its length plus a fixed part, so per MiB kept the short ones save the most),
        # splitting the group where it runs out; the rest is generated chunk by chunk by the caller.
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
                entries.append((idx[:m], n, flat[off : off + k.numel()].view_as(k).copy_(k)))
                off += k.numel()
                del k
            if m < len(idx):
                entries.append((idx[m:], n, None))
        self._cache = (length, entries)
        self._spectra = OrderedDict()  # one cache at a time (a layer runs one path)
        return entries

    def whole_spectrum(self, fft_size: int) -> Optional[torch.Tensor]:
        """The whole-tensor path's kernel spectrum for FFT size F: ``rfft`` of the circular kernel
        (``D`` folded in), (H, F/2+1) complex64, from the cache or made now if it fits the budget
        (eval mode without autograd); None: the caller makes it per call.

        One spectrum serves every length L with ``next_fast_len(2L) == F``: it is made from the
        kernels of length ``Lb = (F + 1) // 2 >= L`` (F >= 2 Lb - 1, so nothing wraps around), and
        the lags from L to Lb only ever meet the zero padding of an input of length L or land on
        outputs past L, which are cut off. Least recently used spectra leave first.
        """
        budget = self.cache_budget(self.D.device)
        if budget <= 0:
            return None
        sig = self._signature(with_skip=True)
        if sig != self._cache_signature:
            self.clear_kernel_cache()
            self._cache_signature = sig
        hit = self._spectra.get(fft_size)
        if hit is not None:
            self._spectra.move_to_end(fft_size)
            return hit
        need = self.H * (fft_size // 2 + 1) * 8
        if need > budget:
            return None
        self._cache = None  # one cache at a time (a layer runs one path)
        while self._spectra and self.cached_kernel_bytes() + need > budget:
            self._spectra.popitem(last=False)
        circular = self._whole_circular((fft_size + 1) // 2, fft_size)  # (H F) from kernels of length Lb
        self._spectra[fft_size] = torch.fft.rfft(circular)  # (H F/2+1)
        return self._spectra[fft_size]

    # ---------------------------------------------------------------- layer
    def forward(self, u: torch.Tensor, padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """u: (B, L, H); padding_mask: (B, L) bool, True at padding (or None) -> (B, L, H).

        Profiler labels (``torch.profiler.record_function``, free when no profiler runs):
        ``s4d.layer`` the whole call, ``s4d.kernel`` kernel generation, ``s4d.projection`` the
        k/q/output projections; the rest of the layer is the convolution (benchmarks/run.py)."""
        with record_function("s4d.layer"):
            return self._forward(u, padding_mask)

    def _forward(self, u: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        L = u.shape[1]
        if self.whole_tensors(u):
            return self._whole_forward(u, padding_mask)
        if not torch.is_grad_enabled():
            return s4d_inference.forward(
                u,
                padding_mask,
                groups=self.kernel_groups(L),
                kernel=self.kernel,
                skip=self.D,
                k_proj=self.k_proj,
                q_proj=self.q_proj,
                output_linear=self.output_linear,
                max_fft_elems=self.max_fft_elems,
                min_projection_channels=self.min_projection_channels,
            )
        k, q = self._kq(u, padding_mask)  # (B L H) each
        fft_size = next_fast_len(2 * L)
        # training: FFT in float32 whatever the activation dtype; only k and the kernel are kept
        with float32_region(u):
            kc = self._circular(self.kernel(L), slice(None), fft_size)  # (H F)
            y = FFTConv.apply(k.float(), kc, fft_size)  # (B L H) float32
        return self._output(self._gate(y, q, u))

    def _kq(self, u: torch.Tensor, padding_mask: Optional[torch.Tensor]):
        """k = k_proj(u) zeroed at padding (k_proj has a bias: keep it out of the convolution) and
        the gate q = q_proj(u), not masked (reference behaviour)."""
        with record_function("s4d.projection"):
            k = self.k_proj(u)  # (B L H)
            if padding_mask is not None:
                k = k.masked_fill(padding_mask.unsqueeze(-1), 0.0)
            return k, self.q_proj(u)

    def _output(self, y: torch.Tensor) -> torch.Tensor:
        with record_function("s4d.projection"):
            return self.output_linear(y)

    @staticmethod
    def _gate(y: torch.Tensor, q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``y q`` in float32 (y: the float32 convolution), then in u's dtype for the output
        projection: a long convolution can exceed float16's range where the gated product does not,
        and where the projection runs in float16 its input is clamped to that range."""
        g = y * q.float()  # (B L H) float32
        return (within_fp16(g) if fp16_in_play(u) else g).to(u.dtype)

    def _whole_forward(self, u: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """The layer on whole tensors (the GPU path): the same function as :meth:`forward`'s.

        k and q come from two full projections, the kernels of every channel from one blocked
        product (:meth:`S4DKernel.forward` with ``whole``), the convolution is one batched FFT in
        float32 whatever the activation dtype (cuFFT's half precision needs power-of-two sizes, and
        the kernels' decays need float32 anyway). Without autograd the channels go in chunks of at
        most ``WHOLE_FFT_ELEMS`` per FFT buffer: one chunk up to ~64K tokens at base size.
        """
        B, L, H = u.shape
        fft_size = next_fast_len(2 * L)
        k, q = self._kq(u, padding_mask)  # (B L H) each
        if not torch.is_grad_enabled():
            with float32_region(u):
                gated = self._whole_gated_convolution(k, q, u, fft_size)  # (B L H) in u's dtype
            return self._output(gated)
        half = u.dtype in (torch.float16, torch.bfloat16) or autocast_on(u)
        with float32_region(u):
            kc = self._whole_circular(L, fft_size, product=self.kernel_product if half else "fp32")  # (H F)
            y = FFTConv.apply(k.float(), kc, fft_size)  # (B L H) float32; keeps k and kc only
        return self._output(self._gate(y, q, u))

    def _whole_gated_convolution(
        self, k: torch.Tensor, q: torch.Tensor, u: torch.Tensor, fft_size: int
    ) -> torch.Tensor:
        """``((K * k) + D k) q`` without autograd, (B, L, H) in u's dtype: a chunk of channels at a
        time through float32 buffers made once per call. One copy casts, transposes and places k in
        the FFT buffer (its zero padding is never written), the product with the spectrum is in
        place, and one multiply takes the slice, transposes back, gates and casts.
        """
        B, L, H = k.shape
        spectrum = self.whole_spectrum(fft_size)  # (H F/2+1) or None
        chunk = max(1, min(H, WHOLE_FFT_ELEMS // (B * fft_size)))
        xp = torch.zeros(B, chunk, fft_size, dtype=torch.float32, device=k.device)  # (B c F)
        spec = torch.empty(B, chunk, fft_size // 2 + 1, dtype=torch.complex64, device=k.device)  # (B c F/2+1)
        yp = torch.empty(B, chunk, fft_size, dtype=torch.float32, device=k.device)  # (B c F)
        out = torch.empty(B, L, H, dtype=u.dtype, device=u.device)  # (B L H)
        clamp = fp16_in_play(u)
        for c0 in range(0, H, chunk):
            ch = slice(c0, min(H, c0 + chunk))
            c = ch.stop - c0
            if spectrum is None:
                kh = torch.fft.rfft(self._whole_circular(L, fft_size, ch))  # (c F/2+1)
            else:
                kh = spectrum[ch]
            xc, sc, yc = xp[:, :c], spec[:, :c], yp[:, :c]
            xc[..., :L].copy_(k[..., ch].transpose(1, 2))  # (B c L) float32
            torch.fft.rfft(xc, out=sc)
            torch.fft.irfft(sc.mul_(kh), n=fft_size, out=yc)  # (B c F)
            y = yc[..., :L].transpose(1, 2)  # (B L c) view
            if clamp:  # the gated product in float32, clamped before it meets a float16 op
                out[..., ch].copy_(within_fp16(y * q[..., ch].float()))
            else:
                torch.mul(y, q[..., ch], out=out[..., ch])
        return out

    def _whole_circular(
        self, length: int, fft_size: int, channels: slice = slice(None), product: str = "fp32"
    ) -> torch.Tensor:
        """The whole-tensor path's circular kernels (h, F) of ``channels`` for inputs of ``length``,
        ``D`` folded in: from :meth:`S4DKernel.forward` and :meth:`_circular`, or in one compiled
        function (``kernel_compile``; recomputed in backward like the eager kernel, its product in
        ``product`` precision: float32 unless training in half precision with ``kernel_product``)."""
        if not self.kernel_compile:
            return self._circular(self.kernel(length, channels, whole=True), channels, fft_size)
        with record_function("s4d.kernel"), float32_region(self.D):
            c_prime, dt_a = self.kernel.discretize(channels)
            args = (c_prime, dt_a, length, fft_size, self.D[channels].float(), WHOLE_KERNEL_ELEMS, product)
            if self.kernel.recompute and torch.is_grad_enabled() and c_prime.requires_grad:
                return checkpoint(_fused_kernel, *args, use_reentrant=False)  # (h F)
            return _fused_kernel(*args)  # (h F)

    def _circular(self, k: torch.Tensor, channels: slice, fft_size: int) -> torch.Tensor:
        """The circular bidirectional kernel (h, F) of kernels (2, h, L) with the D skip folded into
        lag 0 (``D k`` is a convolution with ``D`` at lag 0, so the FFT does it for free)."""
        return circular_bidirectional_kernel(k, fft_size, self.D[channels].float())  # (h F)
