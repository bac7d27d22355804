"""The S4D kernel: from the state-space parameters to the causal and anti-causal convolution
kernels (state-spaces/s4's standalone ``s4d.py``, its ``S4DKernel``; spec ``shared/spec/locost.md``
section 1). The layer that convolves with them is :class:`lsg_layers.modules.s4d.S4D`.

Read :meth:`S4DKernel.reference` first: one complex exponential per entry, the formula itself.
:meth:`S4DKernel.forward` computes the same kernels fast (``lsg_layers.ops.ssm``: blocked
Vandermonde products, each channel only until its modes have decayed), and tests hold it to the
reference.

Notation (paper / S4D / this file):

- ``H``: number of independent channels = ``d_model`` (one SSM per channel, ``num_ssm_heads`` = 1).
- ``N``: real state size (``d_state`` in the config); it is represented by ``M = N / 2`` complex
  modes whose conjugate pairs give the real kernel ``2 Re(...)`` (released model: N 512, M 256).
- ``L``: sequence length; the kernels have length ``L`` (exact zeros once every mode has decayed).
- ``dt`` (Delta): per-channel step size ``exp(log_dt)``; ``A = -exp(inv_A_real) + i A_imag``
  (S4D-Lin init ``-1/2 + i pi n``); ``B``, ``C``: complex input / output vectors.
"""

import math
from typing import Tuple

import torch
import torch.nn as nn
from torch.profiler import record_function

from lsg_layers.modules.precision import float32_region
from lsg_layers.modules.s4d_config import D_STATE, DT_MAX, DT_MIN, check_ssm_config
from lsg_layers.ops.ssm import (
    BlockedVandermonde,
    channel_groups,
    decay_lengths,
    fused_circular_kernel,
    grouped_kernel,
    VANDERMONDE_CHUNK_ELEMS,
    tf32_matmul,
    vandermonde_blocked,
    vandermonde_naive,
)

# The kernel's "SSM parameters": no weight decay, optionally their own lr. S4DKernel tags them for
# lsg_fairseq.optim.grouped_adam when it makes them (``param_group`` / ``optim_overrides``).
SSM_PARAMETER_NAMES = ("log_dt", "inv_A_real", "A_imag", "B", "C")
# Kernel entries after every mode's term has decayed below this are exact zeros instead of computed
# (``--ssm-kernel-tail-tol``; their sum stays below M * tol, under float32 rounding of O(1) kernels).
KERNEL_TAIL_TOL = 1e-10
# The whole-tensor path (GPU, ``lsg_layers.modules.paths``) bounds its temporaries in float32
# elements, so that lengths up to ~64K run as a fixed handful of launches per layer and 600K tokens
# still fit a GPU's memory: the blocked Vandermonde product's temporaries per chunk of channels
# (``s4d.WHOLE_FFT_ELEMS`` bounds the FFT buffers).
WHOLE_KERNEL_ELEMS = 1 << 29


class S4DKernel(nn.Module):
    """Generates the causal and anti-causal S4D kernels (2, H, L) from the parameters (spec section 1).

    Parameter names and layouts are the reference's (complex tensors are stored as real tensors with
    a trailing (re, im) axis), so HF state dicts map 1:1. The kernel is always computed in float32 /
    complex64 regardless of the module dtype: half-precision phases are meaningless.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = D_STATE,
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
        # The blocked product's temporaries (H*M*(A + 2S) floats, hundreds of MiB per base layer)
        # would all be kept for backward; they depend only on the parameters, so in training only
        # C' and dtA are kept and the backward is written out (one blocked product).
        trained = self.recompute and torch.is_grad_enabled() and (c_prime.requires_grad or dt_a.requires_grad)
        blocked = _product(whole, trained)
        if whole:
            return blocked(c_prime, dt_a, length)  # (2 h L)
        lengths = decay_lengths(c_prime, dt_a, length, self.tail_tol)  # (h) ints <= L
        return grouped_kernel(c_prime, dt_a, channel_groups(lengths), length, blocked)  # (2 h L)

    def reference(self, length: int) -> torch.Tensor:
        """The same kernels, one complex exp per entry (slow; for tests)."""
        c_prime, dt_a = self.discretize()
        return vandermonde_naive(c_prime, dt_a, length)


def fused_kernel(c_prime, dt_a, length, fft_size, skip, max_chunk_elems, product):
    """``ops.ssm.fused_circular_kernel`` with CUDA's TF32 on for the ``"tf32"`` product, also when
    checkpointing recomputes it in backward (the same kernel both times)."""
    with tf32_matmul(product == "tf32" and c_prime.is_cuda):
        return fused_circular_kernel()(c_prime, dt_a, length, fft_size, skip, max_chunk_elems, product)


def _product(whole: bool, trained: bool):
    """The blocked product as ``(c_prime, dt_a, length) -> (2, h, L)`` in the path's chunks of
    channels (whole: ``WHOLE_KERNEL_ELEMS``); for training ``BlockedVandermonde``, its backward
    written out."""
    chunk = WHOLE_KERNEL_ELEMS if whole else VANDERMONDE_CHUNK_ELEMS
    if trained:
        return lambda c_prime, dt_a, length: BlockedVandermonde.apply(c_prime, dt_a, length, chunk)
    return lambda c_prime, dt_a, length: vandermonde_blocked(c_prime, dt_a, length, max_chunk_elems=chunk)
