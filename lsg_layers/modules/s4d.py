"""Bidirectional diagonal state-space layer (S4D) as used by LOCOST's encoder.

Pure PyTorch (CPU and GPU) port of the reference's ``S4D`` + ``SSKernelDiag`` (locost-summarization,
``s4d_models.py`` / ``kernel_computations.py``); spec: ``shared/spec/locost.md`` section 1. The
shape of state-spaces/s4's ``s4d.py``: :class:`S4DKernel` maps its parameters to the causal and
anti-causal kernels, :class:`S4D` is the gated layer around one FFT convolution.

Files: the kernel from the parameters, with its reference and the notation (H, N, M, L, dt, A, B,
C), is ``s4d_kernel.py``; the eval-mode kernel caches are ``s4d_cache.py``; the no-grad CPU
convolution is ``s4d_inference.py``; this file is the layer and its two forward paths.

The discretisation and kernel formulas, and every fast piece of math, are in
``lsg_layers.ops.ssm``. The layer computes ``y = output_linear(((K * k) + D k) q)`` with
``k = k_proj(u)`` (zeroed at padding), ``D`` the skip and the linear gate ``q = q_proj(u)``: one FFT convolution
with both kernels, the reference's exact ("ref") path. The reference's fast CUDA path displaces
the anti-causal kernel when L is not a power of two; that is a bug and is not reproduced.

Where the time goes and what is done about it (the figures behind each choice: ``benchmarks/README.md``,
"Figures behind the constants"). On CPU:

- kernels: the blocked Vandermonde product, each channel only until its modes have decayed
  (``ops.ssm``); in training the kernel keeps only C' and dtA, its backward written out
  (``ops.ssm.BlockedVandermonde``, ``recompute``), and ``ops.ssm.FFTConv`` keeps only the input and
  the circular kernel;
- without autograd the layer runs ``lsg_layers.modules.s4d_inference.forward`` (channel chunks,
  FFT size ``L + n - 1`` per decay group, wide k/q projections, no (B, L, H) intermediate), and in
  eval mode the *time-domain* kernels are cached (:meth:`S4D.kernel_groups`), the shortest first
  up to ``kernel_cache_mb`` per layer (the rest generated per call). One entry serves every
  input up to the length it was made for;
- ``D`` is folded into the kernel's lag 0.

On a GPU (``lsg_layers.modules.paths``) those pieces would each be a kernel launch, so the layer
runs :meth:`S4D._whole_forward` instead: one blocked product for every channel's kernel, one batched
FFT, nothing read back on the host; in eval mode the kernels' *spectra* are cached per FFT size
(:meth:`S4D.whole_spectrum`), so a repeated length costs no kernel generation and no kernel FFT.
"""

from typing import Optional

import torch
import torch.nn as nn
from torch.nn.modules import module as nn_module
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

from lsg_layers.modules import s4d_inference, s4d_kernel
from lsg_layers.modules.paths import PathChoice
from lsg_layers.modules.precision import autocast_on, cast_for_matmul, float32_region, matmul_dtype, within_fp16
from lsg_layers.modules.s4d_cache import KernelCache
from lsg_layers.modules.s4d_config import D_STATE, DT_MAX, DT_MIN, check_kernel_product
from lsg_layers.modules.s4d_kernel import KERNEL_TAIL_TOL, S4DKernel, fused_kernel
from lsg_layers.ops.ssm import FFTConv, circular_bidirectional_kernel, compiled_fft_len, next_fast_len

# The CPU path without autograd (``s4d_inference``) convolves a few channels at a time: its (B, chunk,
# F) FFT buffers hold at most a quarter of this many float32 elements (three such buffers and the
# kernel spectrum per group), and its projected (B, L, c) columns at most this many: temporaries
# that stay near the cache instead of several (B, H, 2L) tensors ...
MAX_FFT_ELEMS = 1 << 23
# ... and projects k and q for at least this many channels at a time: a GEMM of a few dozen output
# columns (one decay group) runs far below a wide one's rate.
MIN_PROJECTION_CHANNELS = 256
# The whole-tensor path (GPU) bounds each (B, channels, F) FFT buffer of the no-grad convolution to
# this many float32 elements (``s4d_kernel.WHOLE_KERNEL_ELEMS`` bounds its kernel products).
WHOLE_FFT_ELEMS = 1 << 27


class S4D(PathChoice, KernelCache, nn.Module):
    """LOCOST's gated bidirectional SSM block: ``output_linear(((K * k) + D k) q)``.

    ``k = k_proj(u)`` (the SSM input, zeroed at padding), ``q = q_proj(u)`` (a purely linear gate).
    No activation, dropout or normalisation inside (spec section 1).

    Two paths (``lsg_layers.modules.paths``): on CPU, decay groups and channel chunks
    (``s4d_inference`` without autograd); on a GPU, :meth:`_whole_forward`: one kernel product and
    one batched FFT over every channel.

    Kernel cache (eval mode without autograd, within ``kernel_cache_mb`` MiB per layer):
    :class:`~lsg_layers.modules.s4d_cache.KernelCache`.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = D_STATE,
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
        # (torch.compile) instead of eagerly: --ssm-kernel-compile, off until its compiles per FFT
        # size are measured in a training run on a GPU (benchmarks/locost_gpu_notes.md)
        self.kernel_compile = kernel_compile
        # the fused generator's product when training in half precision (ops.ssm.PRODUCT_MODES)
        check_kernel_product(kernel_product, kernel_compile)
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
        self.clear_kernel_cache()  # KernelCache's state: empty

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
        """``y q`` in float32 (y: the float32 convolution), then in the dtype the output projection
        computes in (:func:`matmul_dtype`): a long convolution can exceed float16's range where the
        gated product does not, and where the projection runs in float16 its input is clamped to that
        range (stored in that dtype: a bfloat16 store would round the clamp's 65504 up to 65536)."""
        return cast_for_matmul(y * q.float(), matmul_dtype(u))  # (B L H)

    def _whole_forward(self, u: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """The layer on whole tensors (the GPU path): the same function as :meth:`forward`'s.

        The kernels of every channel come from one blocked product (:meth:`S4DKernel.forward` with
        ``whole``), the convolution is a batched FFT in float32 whatever the activation dtype
        (cuFFT's half precision needs power-of-two sizes, and the kernels' decays need float32
        anyway). In training k and q come from two full projections and the convolution is one FFT
        (:class:`FFTConv`). Without autograd the channels go in chunks of at most
        ``WHOLE_FFT_ELEMS`` per FFT buffer (one chunk up to ~64K tokens at base size), each chunk's
        projections computed for it, channel by channel's rows (:meth:`_whole_channel_major`).
        """
        B, L, H = u.shape
        # the fused generator compiles once per FFT size: a few sizes per octave (compiled_fft_len)
        fft_size = compiled_fft_len(2 * L) if self.kernel_compile else next_fast_len(2 * L)
        if not torch.is_grad_enabled():
            if self._plain_projections():
                return self._whole_channel_major(u, padding_mask, fft_size)
            return self._whole_transposed(u, padding_mask, fft_size)
        k, q = self._kq(u, padding_mask)  # (B L H) each
        half = u.dtype in (torch.float16, torch.bfloat16) or autocast_on(u)
        with float32_region(u):
            kc = self._whole_circular(L, fft_size, product=self.kernel_product if half else "fp32")  # (H F)
            y = FFTConv.apply(k.float(), kc, fft_size)  # (B L H) float32; keeps k and kc only
        return self._output(self._gate(y, q, u))

    def _whole_transposed(self, u: torch.Tensor, padding_mask: Optional[torch.Tensor], fft_size: int) -> torch.Tensor:
        """The whole layer without autograd with its projections as modules, in (B, L, H): the
        reference of :meth:`_whole_channel_major`, and the call for projections it cannot read."""
        k, q = self._kq(u, padding_mask)  # (B L H) each
        dtype = matmul_dtype(u)  # asked here: inside float32_region autocast reads as off
        with float32_region(u):
            gated = self._whole_gated_convolution(k, q, fft_size, dtype)  # (B L H)
        return self._output(gated)

    def _plain_projections(self) -> bool:
        """Whether k_proj, q_proj and output_linear are plain ``nn.Linear`` with a bias and no
        forward hooks, their own or global ones (``nn.modules.module.register_module_forward_hook``):
        their weights then serve :meth:`_whole_channel_major`'s own matmuls, which would skip a hook
        or a quantized module's own forward."""
        if nn_module._global_forward_pre_hooks or nn_module._global_forward_hooks:
            return False
        return all(
            type(m) is nn.Linear and m.bias is not None and not m._forward_pre_hooks and not m._forward_hooks
            for m in (self.k_proj, self.q_proj, self.output_linear)
        )

    def _whole_channel_major(
        self, u: torch.Tensor, padding_mask: Optional[torch.Tensor], fft_size: int
    ) -> torch.Tensor:
        """The whole layer without autograd, (B, L, H) in the dtype its output projection computes in
        (:func:`matmul_dtype`), with nothing transposed by a copy: the projections write k^T and q^T
        (channels, B L) themselves (``W u^T + b``; a matmul reads a transposed operand at full speed,
        a copy writes or reads one a column at a time), k's rows go into the FFT buffer (B, c, F) as
        rows, the gate writes the output's rows, and the output projection reads those rows
        transposed. Channels in chunks (:meth:`_whole_chunks`) as in
        :meth:`_whole_gated_convolution`, the transposed form (projections in (B, L, H), one
        transposing copy each way), which is its reference and serves projections that are not
        plain ``nn.Linear`` (the figures behind the choice: ``benchmarks/locost_gpu_notes.md``).
        The matmuls run in the dtype ``nn.Linear`` would (:func:`matmul_dtype`): under autocast u
        and the weights are cast once, before the chunks; k's bias goes into the float32 buffer as
        float32.
        """
        B, L, H = u.shape
        dtype = matmul_dtype(u)
        clamp = dtype == torch.float16  # the gated product is stored for a float16 matmul
        wk, wq, wo = self.k_proj, self.q_proj, self.output_linear
        # cast once here (a no-op without autocast), not in every chunk's matmul
        u, k_w, q_w, q_b, o_w, o_b = (t.to(dtype) for t in (u, wk.weight, wq.weight, wq.bias, wo.weight, wo.bias))
        k_b = wk.bias.float()  # added into the float32 buffer
        ut = u.reshape(B * L, H).t()  # (H, B L) view
        gated = torch.empty(H, B * L, dtype=dtype, device=u.device)  # (H, B L): the gate's output rows
        for ch, kh, xc in self._whole_chunks(B, L, fft_size, u.device):
            c = xc.shape[1]
            with record_function("s4d.projection"):
                kt = torch.mm(k_w[ch], ut)  # (c, B L); its bias comes with the copy below
                qt = torch.addmm(q_b[ch, None], q_w[ch], ut)  # (c, B L)
            with float32_region(u):
                rows = xc[..., :L].transpose(0, 1)  # (c B L) view of the buffer
                torch.add(kt.view(c, B, L), k_b[ch, None, None], out=rows)  # k in float32, by rows
                if padding_mask is not None:  # k is zero at padding (its bias too)
                    xc[..., :L].masked_fill_(padding_mask[:, None, :], 0.0)
                y = torch.fft.irfft(torch.fft.rfft(xc).mul_(kh), n=fft_size)[..., :L]  # (B c L)
                q = qt.view(c, B, L).transpose(0, 1)  # (B c L) view
                out = gated[ch].view(c, B, L).transpose(0, 1)  # (B c L) view of the output rows
                if clamp:  # the gated product in float32, clamped before it meets a float16 op
                    out.copy_(within_fp16(y * q.float()))
                else:
                    torch.mul(y, q, out=out)
        with record_function("s4d.projection"):
            return torch.addmm(o_b, gated.t(), o_w.t()).view(B, L, H)  # (B L, H) -> (B L H)

    def _whole_gated_convolution(
        self, k: torch.Tensor, q: torch.Tensor, fft_size: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """``((K * k) + D k) q`` without autograd, (B, L, H) in ``dtype``: a chunk of channels at a
        time through a float32 input buffer made once per call. One copy casts, transposes and
        places k in it (its zero padding is never written), the product with the spectrum is in
        place, and one multiply takes the slice, transposes back, gates and casts. The FFTs write
        fresh tensors: given ``out=``, torch's CUDA FFTs compute into a temporary and copy it over
        (the third GPU reading's profile and conv_probe, benchmarks/locost_gpu_notes.md).
        ``dtype``: the one the output projection computes in (:func:`matmul_dtype`, asked by the
        caller outside :func:`float32_region`, inside which autocast reads as off); the gated product
        is clamped to float16's range when that is float16.
        """
        B, L, H = k.shape
        clamp = dtype == torch.float16
        out = torch.empty(B, L, H, dtype=dtype, device=k.device)  # (B L H)
        for ch, kh, xc in self._whole_chunks(B, L, fft_size, k.device):
            xc[..., :L].copy_(k[..., ch].transpose(1, 2))  # (B c L) float32
            yc = torch.fft.irfft(torch.fft.rfft(xc).mul_(kh), n=fft_size)  # (B c F)
            y = yc[..., :L].transpose(1, 2)  # (B L c) view
            if clamp:  # the gated product in float32, clamped before it meets a float16 op
                out[..., ch].copy_(within_fp16(y * q[..., ch].float()))
            else:
                torch.mul(y, q[..., ch], out=out[..., ch])
        return out

    def _whole_chunks(self, B: int, L: int, fft_size: int, device: torch.device):
        """The channel chunks of the no-grad whole-tensor convolution (:meth:`_whole_channel_major`,
        :meth:`_whole_gated_convolution`): for each, its channels (a slice), their kernel spectrum
        (c, F/2+1) (cached by :meth:`whole_spectrum`, or generated for the chunk), and their rows
        (B, c, F) of one float32 FFT buffer made per call, at most ``WHOLE_FFT_ELEMS`` floats, zero
        from lag L on (the callers write only the first L)."""
        with float32_region(self.D):
            spectrum = self.whole_spectrum(fft_size)  # (H F/2+1) or None
        chunk = max(1, min(self.H, WHOLE_FFT_ELEMS // (B * fft_size)))
        xp = torch.zeros(B, chunk, fft_size, dtype=torch.float32, device=device)  # (B c F)
        for c0 in range(0, self.H, chunk):
            ch = slice(c0, min(self.H, c0 + chunk))
            if spectrum is not None:
                kh = spectrum[ch]
            else:
                with float32_region(self.D):
                    kh = torch.fft.rfft(self._whole_circular(L, fft_size, ch))  # (c F/2+1)
            yield ch, kh, xp[:, : ch.stop - c0]

    def _whole_circular(
        self, length: int, fft_size: int, channels: slice = slice(None), product: str = "fp32"
    ) -> torch.Tensor:
        """The whole-tensor path's circular kernels (h, F) of ``channels`` for inputs of ``length``,
        ``D`` folded in: from :meth:`S4DKernel.forward` and :meth:`_circular`, or in one compiled
        function (``kernel_compile``; recomputed in backward like the eager kernel, its product in
        ``product`` precision: float32 unless training in half precision with ``kernel_product``).

        The compiled function makes the kernels of the longest length F serves, ``(F + 1) // 2 >=
        length`` (as :meth:`whole_spectrum` does), so its shapes depend on F alone: the lags past
        ``length`` only meet the zero padding of the input or land on outputs that are cut off."""
        if not self.kernel_compile:
            return self._circular(self.kernel(length, channels, whole=True), channels, fft_size)
        with record_function("s4d.kernel"), float32_region(self.D):
            c_prime, dt_a = self.kernel.discretize(channels)
            served = (fft_size + 1) // 2  # >= length: F >= 2 length - 1
            args = (c_prime, dt_a, served, fft_size, self.D[channels].float(), s4d_kernel.WHOLE_KERNEL_ELEMS, product)
            if self.kernel.recompute and torch.is_grad_enabled() and c_prime.requires_grad:
                return checkpoint(fused_kernel, *args, use_reentrant=False)  # (h F)
            return fused_kernel(*args)  # (h F)

    def _circular(self, k: torch.Tensor, channels: slice, fft_size: int) -> torch.Tensor:
        """The circular bidirectional kernel (h, F) of kernels (2, h, L) with the D skip folded into
        lag 0 (``D k`` is a convolution with ``D`` at lag 0, so the FFT does it for free)."""
        return circular_bidirectional_kernel(k, fft_size, self.D[channels].float())  # (h F)
