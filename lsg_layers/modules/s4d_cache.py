"""The S4D layer's eval-mode kernel caches: in eval mode without autograd the kernels depend only on
the parameters, so :class:`S4D <lsg_layers.modules.s4d.S4D>` keeps them between calls.

In eval mode without autograd the kernels depend only on the parameters, so they
are kept within ``kernel_cache_mb`` MiB per layer (None: :data:`KERNEL_CACHE_MB` on CPU,
:data:`GPU_KERNEL_CACHE_MB` elsewhere), and invalidated when a parameter they depend on is
modified in place, moved or replaced, or on ``train()``/``eval()``. The CPU path keeps the last
set of time-domain kernels made (truncated per channel group at the decay length; it serves
every shorter input; ``D`` is applied per call, so it is not part of it; :meth:`kernel_groups`).
The whole-tensor path keeps kernel *spectra*, the rfft of the circular kernel with ``D``
folded in, one per FFT size, least recently used out (:meth:`whole_spectrum`): inputs of
different lengths share a spectrum when they share an FFT size.
"""

import mmap
from collections import OrderedDict
from typing import List, Optional

import torch
import torch.nn as nn

from lsg_layers.modules.s4d_inference import Group
from lsg_layers.modules.s4d_kernel import SSM_PARAMETER_NAMES, S4DKernel
from lsg_layers.ops.ssm import channel_groups, decay_lengths

# Per-layer budget (MiB) of the eval-mode kernel cache where ``--ssm-kernel-cache-mb`` is not given,
# by device. On CPU (time-domain kernels, cut at their decay lengths): every kernel of a locost_base
# layer up to ~8K tokens, most of them at 16K, for a few percent of the encoder's time there
# against keeping them all.
KERNEL_CACHE_MB = 30.0
# On a GPU (the whole-tensor path's kernel spectra, one per FFT size): room for a locost_base
# layer's spectrum at 64K tokens and a shorter bucket beside it (the sizes: benchmarks/README,
# "Figures behind the constants").
GPU_KERNEL_CACHE_MB = 512.0


def _resident_buffer(numel: int, device: torch.device) -> torch.Tensor:
    """(numel,) float32 for data kept across calls (the kernel cache): on CPU in an anonymous memory
    mapping of its own, unmapped when the last view of it is freed.

    From the malloc heap (any block under glibc's 32 MiB mmap threshold, e.g. a 30 MiB cache), a
    block that outlives the call pins the heap between the call's temporaries, which then can never
    be returned (12 such caches left the locost_base encoder well above its live tensors)."""
    if device.type != "cpu" or numel == 0:
        return torch.empty(numel, dtype=torch.float32, device=device)
    return torch.frombuffer(mmap.mmap(-1, numel * 4), dtype=torch.float32)


class KernelCache(nn.Module):
    """The caches of an S4D layer, a base of :class:`~lsg_layers.modules.s4d.S4D`: they read the
    layer's attributes declared here and keep ``_cache`` (time-domain kernels), ``_cache_signature``
    and ``_spectra`` (kernel spectra by FFT size)."""

    kernel: S4DKernel  # the layer's kernel generator
    D: torch.Tensor  # (H) the skip term, folded into the spectra
    H: int
    kernel_cache_mb: Optional[float]

    def _whole_circular(
        self, length: int, fft_size: int, channels: slice = slice(None), product: str = "fp32"
    ) -> torch.Tensor:
        raise NotImplementedError  # the layer's: its circular kernels (h, F) from kernels of ``length``

    def _signature(self, with_skip: bool = False):
        ps = [getattr(self.kernel, n) for n in SSM_PARAMETER_NAMES] + ([self.D] if with_skip else [])
        return tuple((p.data_ptr(), p._version, p.device, p.dtype) for p in ps)

    def clear_kernel_cache(self):
        # (length L', [(channel idx, n, kernels (2, g, n))]): the time-domain kernels made for L'
        self._cache = None
        self._cache_signature = None
        # {FFT size F: rfft of the circular kernel (H, F/2+1) complex64}: the whole-tensor path's
        # cache, least recently used first
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
        entries: List[Group] = []
        off = 0
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
