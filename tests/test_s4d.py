"""S4D layer (LOCOST's token mixer): every fast path against a slow, obviously-correct reference."""

import math

import numpy as np
import pytest
import torch

from conftest import FIXTURES, locost_kernels
from lsg_layers.modules.s4d import S4D
from lsg_layers.modules.s4d_kernel import S4DKernel
from lsg_layers.ops.ssm import (
    BlockedVandermonde,
    FFTConv,
    channel_groups,
    circular_bidirectional_kernel,
    compiled_fft_len,
    decay_lengths,
    next_fast_len,
    vandermonde_blocked,
    vandermonde_naive,
)

FIXTURE = f"{FIXTURES}/locost"


def _perturbed_layer(H=8, N=8, seed=0, **kw):
    """A layer whose parameters are moved off their init values (B != 1, A not S4D-Lin)."""
    torch.manual_seed(seed)
    layer = S4D(H, N, **kw)
    with torch.no_grad():
        layer.kernel.B.add_(0.3 * torch.randn_like(layer.kernel.B))
        layer.kernel.inv_A_real.add_(0.5 * torch.randn_like(layer.kernel.inv_A_real))
        layer.kernel.A_imag.add_(0.2 * torch.randn_like(layer.kernel.A_imag))
        layer.kernel.log_dt.add_(0.5)  # larger steps: kernels decay within the short test lengths
    return layer


def _masked_batch(H, L, cut):
    """Two rows of L random inputs (B, L, H), the second padded from position ``cut`` on."""
    u = torch.randn(2, L, H)
    mask = torch.zeros(2, L, dtype=torch.bool)
    mask[1, cut:] = True
    return u, mask


# ---------------------------------------------------------------------------- helpers
def test_next_fast_len_is_minimal_even_5_smooth():
    def smooth(m):
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        return m == 1

    for n in range(1, 400):
        f = next_fast_len(n)
        assert f >= n and f % 2 == 0 and smooth(f), (n, f)
        assert not any(m % 2 == 0 and smooth(m) for m in range(max(n, 2), f)), (n, f)


def test_compiled_fft_len_is_a_ladder_of_four_even_5_smooth_sizes_per_octave():
    """The fused generator's FFT sizes: even, 5-smooth, >= n and within 25% of it (n >= 16), and
    so few that lengths from 1K to 16K tokens share 17 of them (next_fast_len: hundreds)."""
    for n in range(1, 5000):
        f = compiled_fft_len(n)
        assert f >= n and f % 2 == 0 and next_fast_len(f) == f and (n < 16 or f <= 1.25 * n), (n, f)
    assert len({compiled_fft_len(2 * L) for L in range(1024, 16385)}) == 17
    assert len({next_fast_len(2 * L) for L in range(1024, 16385)}) > 100


@pytest.mark.parametrize("length", [1, 2, 3, 17, 100, 1000])
def test_blocked_vandermonde_equals_naive_formula(length):
    layer = _perturbed_layer(H=6, N=16)
    c_prime, dt_a = layer.kernel.discretize()
    fast = vandermonde_blocked(c_prime, dt_a, length)  # float32 path
    exact = vandermonde_naive(c_prime.to(torch.complex128), dt_a.to(torch.complex128), length)
    assert fast.shape == (2, 6, length) and fast.dtype == torch.float32
    assert (fast.double() - exact).abs().max() < 2e-6 * max(1.0, exact.abs().max().item())
    # channel chunking must not change the result
    chunked = vandermonde_blocked(c_prime, dt_a, length, max_chunk_elems=1)
    assert torch.allclose(chunked, fast, atol=1e-6)
    # and the kernel is the ZOH formula written out with the parameters directly
    k = layer.kernel
    dt = torch.exp(k.log_dt.double())
    a = torch.complex(-torch.exp(k.inv_A_real.double()), k.A_imag.double())
    b = torch.view_as_complex(k.B.double())
    c = torch.view_as_complex(k.C.double())
    pos = torch.arange(length, dtype=torch.float64)
    manual = torch.stack(
        [
            2
            * (
                c[i, :, :, None]
                * b[..., None]
                * (torch.exp(dt[:, None] * a) - 1)[..., None]
                / a[..., None]
                * torch.exp(dt[:, None, None] * a[..., None] * pos)
            )
            .sum(1)
            .real
            for i in range(2)
        ]
    )
    assert (fast.double() - manual).abs().max() < 2e-6 * max(1.0, manual.abs().max().item())


def test_kernel_gradients_match_naive():
    layer = _perturbed_layer(H=4, N=8)
    k = layer.kernel
    weights = torch.randn(2, 4, 50)
    g_fast = torch.autograd.grad((k(50) * weights).sum(), list(k.parameters()))
    g_slow = torch.autograd.grad((k.reference(50) * weights).sum(), list(k.parameters()))
    for a, b in zip(g_fast, g_slow):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)


def test_kernel_matches_reference_fixture():
    """Layer 0 of the fixture model, L=3000: max |diff| <= 1e-5 (README), vs both fixture kernels."""
    sd = torch.load(f"{FIXTURE}/model/pytorch_model.bin", map_location="cpu")
    pre = "encoder.block.0.layer.0.ssm_layer."
    layer = S4D(64, 32)
    layer.load_state_dict({k[len(pre) :]: v for k, v in sd.items() if k.startswith(pre)})
    ref = locost_kernels()
    k = layer.kernel(3000).detach().numpy()
    assert np.abs(k - ref["kernel_raw"]).max() < 1e-5
    assert np.abs(k - ref["kernel_raw_fp64"]).max() < 1e-5
    bi = circular_bidirectional_kernel(torch.from_numpy(k), 6000).numpy()
    assert np.abs(bi - ref["kernel_bidirectional"]).max() < 1e-5


# ---------------------------------------------------------------------------- convolution
def _direct_conv(layer, u, mask=None):
    """O(L^2) definition: y[t] = sum_{s<=t} Kf[t-s] k[s] + sum_{s>=t} Kb[s-t] k[s] + D k[t]."""
    B, L, H = u.shape
    k = layer.k_proj(u)
    if mask is not None:
        k = k.masked_fill(mask.unsqueeze(-1), 0.0)
    q = layer.q_proj(u)
    kern = layer.kernel.reference(L).double()  # (2 H L)
    kd = k.double()
    t = torch.arange(L)
    lag = t[:, None] - t[None, :]  # (t s)
    fwd = torch.where(lag >= 0, kern[0][:, lag.clamp(min=0)], 0.0)  # (H t s)
    bwd = torch.where(lag <= 0, kern[1][:, (-lag).clamp(min=0)], 0.0)  # (H t s)
    y = torch.einsum("hts,bsh->bth", fwd + bwd, kd) + layer.D.double() * kd
    return layer.output_linear((y * q.double()).float())


def _recurrent(layer, u, mask=None):
    """Step-by-step ZOH recurrence x_l = exp(dt A) x_{l-1} + Bbar k_l, y_l = 2 Re(C x_l), run left
    to right with C[0] and right to left with C[1] (complex128)."""
    B, L, H = u.shape
    k = layer.k_proj(u)
    if mask is not None:
        k = k.masked_fill(mask.unsqueeze(-1), 0.0)
    q = layer.q_proj(u)
    kern = layer.kernel
    dt = torch.exp(kern.log_dt.double())
    a = torch.complex(-torch.exp(kern.inv_A_real.double()), kern.A_imag.double())  # (H M)
    abar = torch.exp(dt[:, None] * a)
    bbar = (abar - 1) / a * torch.view_as_complex(kern.B.double())
    c = torch.view_as_complex(kern.C.double())
    kd = k.double()
    y = torch.zeros(B, L, H, dtype=torch.float64)
    for direction, order in ((0, range(L)), (1, reversed(range(L)))):
        x = torch.zeros(B, H, a.shape[1], dtype=torch.complex128)
        for t in order:
            x = abar * x + bbar * kd[:, t, :, None]
            y[:, t] += 2 * (c[direction] * x).sum(-1).real
    y = y + layer.D.double() * kd
    return layer.output_linear((y * q.double()).float())


@pytest.mark.parametrize("length", [1, 5, 16, 37])
def test_fft_conv_equals_direct_conv_and_recurrence(length, layer_path):
    layer = _perturbed_layer(H=8, N=8).eval()
    u = torch.randn(2, length, 8)
    with torch.no_grad():
        fast = layer(u)
        direct = _direct_conv(layer, u)
        rec = _recurrent(layer, u)
    assert fast.shape == (2, length, 8)
    assert torch.allclose(fast, direct, atol=2e-5), (fast - direct).abs().max()
    assert torch.allclose(fast, rec, atol=2e-5), (fast - rec).abs().max()


def test_fft_conv_function_gradients_are_exact():
    """The memory-saving FFTConv backward (correlations by FFT) against finite differences."""
    torch.manual_seed(0)
    for L, fft_size in ((5, 10), (6, 11), (7, 16)):
        x = torch.randn(2, L, 3, dtype=torch.float64, requires_grad=True)
        kc = torch.randn(3, fft_size, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda a, b: FFTConv.apply(a, b, fft_size), (x, kc))


@pytest.mark.parametrize("length", [1, 9, 37])
def test_training_forward_and_gradients_equal_direct_conv(length, layer_path):
    """Training path (kernel of length L, FFTConv) vs the O(L^2) definition under autograd:
    same output, same gradients for every parameter and the input, padding included."""
    layer = _perturbed_layer(H=6, N=8).train()
    u = torch.randn(2, length, 6, requires_grad=True)
    mask = torch.zeros(2, length, dtype=torch.bool)
    mask[1, (length + 1) // 2 :] = True
    w = torch.randn(2, length, 6)
    grads = []
    for fn in (lambda: layer(u, mask), lambda: _direct_conv(layer, u, mask)):
        layer.zero_grad()
        u.grad = None
        out = fn()
        (out * w).sum().backward()
        grads.append([out.detach()] + [p.grad.clone() for p in layer.parameters()] + [u.grad.clone()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max()


def test_both_directions_and_lag0_matter():
    """Sanity for the reference above: the anti-causal half really contributes."""
    layer = _perturbed_layer(H=4, N=8).eval()
    u = torch.randn(1, 12, 4)
    with torch.no_grad():
        full = layer(u)
        layer.kernel.C[1].zero_()  # kill the anti-causal kernel
        causal_only = layer(u)
    assert (full - causal_only).abs().max() > 1e-3
    # with Kb = 0, output at t depends only on inputs <= t
    u2 = u.clone()
    u2[:, 6:] += 1.0
    with torch.no_grad():
        assert torch.allclose(layer(u2)[:, :6], causal_only[:, :6], atol=1e-6)


def test_padding_invariance_left_and_right(layer_path):
    layer = _perturbed_layer(H=8, N=8).eval()
    torch.manual_seed(1)
    u = torch.randn(1, 20, 8)
    with torch.no_grad():
        ref = layer(u)
        junk = torch.randn(1, 7, 8) * 5
        right = layer(torch.cat([u, junk], 1), torch.tensor([[False] * 20 + [True] * 7]))
        left = layer(torch.cat([junk, u], 1), torch.tensor([[True] * 7 + [False] * 20]))
        unmasked = layer(torch.cat([u, junk], 1))
    assert torch.allclose(right[:, :20], ref, atol=1e-5)
    assert torch.allclose(left[:, 7:], ref, atol=1e-5)
    assert (unmasked[:, :20] - ref).abs().max() > 1e-3  # the mask is what makes it invariant


def test_fft_size_rounding_does_not_change_result():
    """FFT size 2L (the reference) vs the rounded-up fast size give the same convolution."""
    layer = _perturbed_layer(H=4, N=8).eval()
    L = 37  # 2L = 74 = 2*37 is not 5-smooth: next_fast_len gives 75 -> 80
    assert next_fast_len(2 * L) != 2 * L
    k = torch.randn(1, 4, L)
    kern = layer.kernel(L).detach()
    outs = []
    for f in (2 * L, next_fast_len(2 * L), 2 * L - 1):
        kh = torch.fft.rfft(circular_bidirectional_kernel(kern, f), n=f)
        outs.append(torch.fft.irfft(torch.fft.rfft(k, n=f) * kh, n=f)[..., :L])
    assert torch.allclose(outs[0], outs[1], atol=1e-5) and torch.allclose(outs[0], outs[2], atol=1e-5)
    with pytest.raises(ValueError):
        circular_bidirectional_kernel(kern, 2 * L - 2)


# ---------------------------------------------------------------------------- cache
def _dense_reference(layer, u, mask=None):
    """The slow reference: dense bidirectional convolution with the exact length-L kernels."""
    L = u.shape[1]
    k = layer.kernel.reference(L)  # (2 H L)
    x = layer.k_proj(u)
    if mask is not None:
        x = x.masked_fill(mask.unsqueeze(-1), 0.0)
    x = x.transpose(1, 2)  # (B H L)
    t = torch.arange(L)
    lag = t.view(-1, 1) - t.view(1, -1)  # (L L): t - s
    kmat = torch.where(lag >= 0, k[0][:, lag.clamp(min=0)], k[1][:, (-lag).clamp(min=0)])  # (H L L)
    kmat = kmat + torch.where(lag == 0, k[1][:, :1, None], torch.zeros(())).expand_as(kmat)
    y = torch.einsum("hts,bhs->bht", kmat, x) + layer.D.view(-1, 1) * x
    return layer.output_linear(y.transpose(1, 2) * layer.q_proj(u))


def test_kernel_cache_hits_and_invalidation():
    layer = _perturbed_layer(H=8, N=8).eval()
    u = torch.randn(2, 30, 8)
    with torch.no_grad():
        y1 = layer(u)
        cache = layer._cache
        assert cache is not None and cache[0] == 30
        assert torch.equal(layer(u), y1) and layer._cache is cache  # cached kernels reused
        # in-place parameter update (optimizer step, load_state_dict) invalidates
        layer.kernel.log_dt.add_(0.1)
        y2 = layer(u)
        assert layer._cache is not cache
        # D is not part of the cached kernels: changing it needs no invalidation and is honoured
        layer.D.add_(1.0)
        y3 = layer(u)
        layer.D.sub_(1.0)
    fresh = _perturbed_layer(H=8, N=8)
    with torch.no_grad():
        fresh.kernel.log_dt.add_(0.1)
        fresh.eval()
        assert torch.allclose(y2, fresh(u), atol=1e-6)
        assert (y2 - y1).abs().max() > 1e-4
        fresh.D.add_(1.0)
        assert torch.allclose(y3, fresh(u), atol=1e-6)
        # load_state_dict into the same module also invalidates
        layer.load_state_dict(_perturbed_layer(H=8, N=8, seed=5).state_dict())
        assert torch.allclose(layer(u), _perturbed_layer(H=8, N=8, seed=5).eval()(u), atol=1e-6)


def test_no_cache_in_training_or_with_grad():
    layer = _perturbed_layer(H=4, N=8)
    u = torch.randn(1, 20, 4)
    layer.train()
    with torch.no_grad():
        layer(u)
    assert layer._cache is None
    layer.eval()
    layer(u)  # autograd on
    assert layer._cache is None
    with torch.no_grad():
        layer(u)
    assert layer._cache is not None and layer.cached_kernel_bytes() > 0
    layer.train()
    assert layer._cache is None and layer.cached_kernel_bytes() == 0
    zero = S4D(4, 8, kernel_cache_mb=0).eval()
    with torch.no_grad():
        zero(u)
    assert zero._cache is None


def test_cache_budget_is_a_bound_filled_shortest_first():
    """The cache never holds more than its budget: it keeps the shortest kernels first (a group is
    split where the budget runs out) and the others are generated per call; the output is the same
    whatever the budget, and a budget below one channel's kernel keeps nothing."""
    H, L = 8, 50
    layer = _perturbed_layer(H=H, N=8).eval()
    u = torch.randn(1, L, H)
    with torch.no_grad():
        full = layer(u)
    need = layer.cached_kernel_bytes()
    assert 0 < need <= 2 * H * L * 4
    assert torch.allclose(full, _dense_reference(layer, u), atol=1e-4)
    lengths = sorted(n for _, n, _ in layer._cache[1] for _ in range(1))
    for budget in (need - 1, need // 2, need // 4):
        tight = _perturbed_layer(H=H, N=8, kernel_cache_mb=budget / 2**20).eval()
        with torch.no_grad():
            out = tight(u)
        assert torch.allclose(out, full, atol=1e-6)
        assert 0 < tight.cached_kernel_bytes() <= budget
        entries = tight._cache[1]
        assert sorted(int(i) for idx, _, _ in entries for i in idx) == list(range(H))  # every channel once
        kept = [n for _, n, k in entries if k is not None]
        left = [n for _, n, k in entries if k is None]
        assert left and max(kept) <= min(left)  # the shortest kernels are the ones kept
    smallest = 2 * min(lengths) * 4
    none = _perturbed_layer(H=H, N=8, kernel_cache_mb=(smallest - 1) / 2**20).eval()
    with torch.no_grad():
        assert torch.allclose(none(u), full, atol=1e-6)
    assert none._cache is None and none.cached_kernel_bytes() == 0


def test_one_cached_kernel_serves_every_shorter_length():
    """The kernels cached for the longest input serve every shorter one (sliced): generated once,
    and each output equals the uncached layer's and the dense reference's."""
    cached = _perturbed_layer(H=6, N=8).eval()
    plain = _perturbed_layer(H=6, N=8, kernel_cache_mb=0).eval()
    calls = []
    orig = cached.kernel.forward
    cached.kernel.forward = lambda length, channels=slice(None): calls.append(length) or orig(length, channels)
    with torch.no_grad():
        for L in (40, 33, 17, 40, 5, 1):
            u = torch.randn(2, L, 6)
            ref = plain(u)
            assert torch.allclose(ref, _dense_reference(plain, u), atol=1e-4)
            assert torch.allclose(cached(u), ref, atol=1e-5)
    n_generated = len(calls)
    assert cached._cache[0] == 40
    with torch.no_grad():
        cached(torch.randn(1, 60, 6))  # longer: generated again and the cache replaced
    assert len(calls) > n_generated and cached._cache[0] == 60


# ---------------------------------------------------------------------------- decay groups
def test_channel_groups_cover_every_channel_once_within_ratio():
    torch.manual_seed(0)
    lengths = torch.randint(1, 5000, (300,))
    groups = channel_groups(lengths)
    seen = torch.cat([idx for idx, _ in groups])
    assert sorted(seen.tolist()) == list(range(300))
    for idx, n in groups:
        assert n == int(lengths[idx].max())
        assert (lengths[idx] >= 0.8 * n).all()  # nobody computes more than 1/0.8 of its own length
    assert 1 < len(groups) < 60


def test_per_channel_decay_lengths_are_honest_and_kernel_unchanged():
    """Channels with large dt decay early; each is cut at its own length, and the kernel still equals
    the exact complex128 formula to float32 precision at every entry."""
    torch.manual_seed(0)
    k = S4DKernel(48, 16)  # S4D-Lin init, dt log-uniform in [1e-3, 1e-1]
    L = 20_000
    c_prime, dt_a = k.discretize()
    n = decay_lengths(c_prime, dt_a, L, k.tail_tol)
    assert n.min() < L / 5 and n.max() == L  # a wide spread: fast channels really are cut short
    with torch.no_grad():
        fast = k(L)
    exact = vandermonde_naive(c_prime.to(torch.complex128), dt_a.to(torch.complex128), L)
    assert (fast.double() - exact).abs().max() < 2e-6
    zeros = 0
    for h in range(48):
        if n[h] < L:
            assert exact[:, h, int(n[h]) :].abs().max() < k.M * 1e-10 * 1.01  # the cut-off tail was tiny
        cut = int(n[h] / 0.8) + 1  # its group computes at most 1/0.8 of its own length
        assert torch.equal(fast[:, h, cut:], torch.zeros_like(fast[:, h, cut:]))
        zeros += (fast[:, h] == 0).sum().item()
    assert zeros > 0.3 * fast.numel()  # work really skipped
    # gradients through the grouped kernel equal those of the uncut one
    grads = []
    for tol in (1e-10, 0.0):
        k.zero_grad()
        k.tail_tol = tol
        out = k(3000)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append([p.grad.clone() for p in k.parameters()])
    for a, b in zip(*grads):  # float32 sums in other groupings: equal to ~1e-6 of the gradient's size
        assert (a - b).abs().max() < 1e-5 * a.abs().max() and (a - b).norm() < 1e-5 * a.norm()


# ---------------------------------------------------------------------------- training bits
def test_gradients_flow_to_every_parameter():
    layer = _perturbed_layer(H=4, N=8)
    layer(torch.randn(2, 9, 4)).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_model_keeps_ssm_parameters_float32(dtype):
    layer = _perturbed_layer(H=4, N=64).eval()
    u = torch.randn(1, 16, 4)
    with torch.no_grad():
        ref = layer(u)
        k_ref = layer.kernel(16)
        layer.to(dtype)
        for name in ("log_dt", "inv_A_real", "A_imag", "B", "C"):
            assert getattr(layer.kernel, name).dtype == torch.float32, name
        assert layer.k_proj.weight.dtype == dtype and layer.D.dtype == dtype
        assert torch.equal(layer.kernel(16), k_ref)  # the kernel is unaffected by the cast
        out = layer(u.to(dtype))
    assert out.dtype == dtype
    assert (out.float() - ref).abs().max() < 0.1 * ref.abs().max()
    # without the exemption, bf16 rounding of A_imag (up to pi * 31 here) changes the kernel a lot
    a_imag = layer.kernel.A_imag.detach().clone()
    with torch.no_grad():
        layer.kernel.A_imag.copy_(a_imag.bfloat16().float())
        assert (layer.kernel(16) - k_ref).abs().max() > 1e-3


def test_invalid_hyperparameters_are_refused():
    with pytest.raises(ValueError, match="d_state"):
        S4DKernel(4, 7)
    with pytest.raises(ValueError, match="dt_min"):
        S4DKernel(4, 8, dt_min=0.1, dt_max=0.01)


def test_init_is_s4d_lin():
    k = S4DKernel(3, 8)
    assert torch.allclose(-torch.exp(k.inv_A_real), torch.full((3, 4), -0.5))
    assert torch.allclose(k.A_imag, math.pi * torch.arange(4.0).expand(3, 4))
    assert torch.equal(k.B[..., 0], torch.ones(3, 4)) and torch.equal(k.B[..., 1], torch.zeros(3, 4))
    assert ((k.log_dt >= math.log(1e-3)) & (k.log_dt <= math.log(1e-1))).all()


def test_channel_chunked_inference_equals_full():
    layer = _perturbed_layer(H=8, N=8).eval()
    u, mask = _masked_batch(8, 40, 25)
    with torch.no_grad():
        full = layer(u, mask)
        layer.max_fft_elems = 4 * 2 * next_fast_len(80) * 3  # at most 3 channels per chunk
        chunked = layer(u, mask)
        layer.clear_kernel_cache()
        layer.kernel_cache_mb = 0
        cold = layer(u, mask)  # kernels generated chunk by chunk
        assert torch.allclose(
            full, _dense_reference(layer, u, mask) * (~mask).unsqueeze(-1) + full * mask.unsqueeze(-1), atol=1e-4
        )
    assert torch.allclose(full, chunked, atol=1e-6) and torch.allclose(full, cold, atol=1e-6)


def test_ffn_position_chunking_equals_full():
    from lsg_layers.modules.locost_blocks import T5LayerFF

    ff = T5LayerFF(8, 12, dropout=0.0, eps=1e-6).eval()
    x = torch.randn(2, 50, 8)
    with torch.no_grad():
        full = ff(x)
        ff.max_positions_per_chunk = 14  # 7 positions per chunk for batch 2
        chunked = ff(x)
    assert torch.allclose(full, chunked, atol=1e-6)


def test_decayed_tail_is_skipped_but_kernel_unchanged():
    layer = _perturbed_layer(H=6, N=8)
    k = layer.kernel
    with torch.no_grad():
        k.log_dt.fill_(math.log(0.1))
        k.inv_A_real.fill_(math.log(0.5))
    c_prime, dt_a = k.discretize()
    L = 3000
    n = int(decay_lengths(c_prime, dt_a, L, k.tail_tol).max())  # entries at l >= n are zero in every channel
    assert 1 < n < L  # large dt: the modes have decayed well before 3000 steps
    with torch.no_grad():
        fast = k(L)
        k.tail_tol = 0.0
        assert int(decay_lengths(c_prime, dt_a, L, k.tail_tol).max()) == L
        exact = k(L)
    assert torch.equal(fast[..., n:], torch.zeros_like(fast[..., n:]))
    assert (fast - exact).abs().max() < 1e-7
    # the bound is honest: the exact kernel's tail really is below M * tol
    assert exact[..., n:].abs().max() < k.M * 1e-10 * 1.01


def test_fixture_kernel_with_and_without_tail_skipping():
    sd = torch.load(f"{FIXTURE}/model/pytorch_model.bin", map_location="cpu")
    pre = "encoder.block.1.layer.0.ssm_layer."
    ref = {}
    for tol in (1e-10, 0.0):
        layer = S4D(64, 32, kernel_tail_tol=tol)
        layer.load_state_dict({k[len(pre) :]: v for k, v in sd.items() if k.startswith(pre)})
        with torch.no_grad():
            ref[tol] = layer.kernel(3000)
            if tol > 0:
                lengths = decay_lengths(*layer.kernel.discretize(), 3000, layer.kernel.tail_tol)
    assert lengths.min() < 1000  # the trained checkpoint's channels are cut at their own lengths
    # float32 rounding of an O(1) kernel (each group's block size differs, so sums round differently)
    assert (ref[1e-10] - ref[0.0]).abs().max() < 3e-7


def test_long_kernel_accuracy_beats_float32_phase():
    """At L = 200K with slow, high-frequency modes (phase Im(dtA) l up to ~1e3 rad) the float64 phase
    keeps the kernel within 1e-9 of complex128, better than the reference's float32 phase."""
    torch.manual_seed(0)
    k = S4DKernel(2, 16, dt_min=1e-5, dt_max=1e-4, tail_tol=0.0)
    with torch.no_grad():
        k.A_imag.mul_(20)
    c_prime, dt_a = k.discretize()
    L = 200_000
    exact = vandermonde_naive(c_prime.to(torch.complex128), dt_a.to(torch.complex128), L)
    err_fast = (vandermonde_blocked(c_prime, dt_a, L).double() - exact).abs().max().item()
    err_fp32_phase = (vandermonde_naive(c_prime, dt_a, L).double() - exact).abs().max().item()
    assert err_fast < 1e-9 and err_fast < err_fp32_phase / 5


def _saved_bytes(fn):
    sizes = []

    def pack(t):
        sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(sizes)


def test_kernel_recompute_same_gradients_less_saved_memory():
    """Training keeps only C', dtA and the kernel (the product's gradients written out:
    BlockedVandermonde) and gets autograd's gradients: two float32 computations, each ~5e-6 of its
    largest entry from a float64 one here (tail skipping, float32 discretisation), within 1e-5 of
    each other."""
    torch.manual_seed(0)
    grads, saved = {}, {}
    for recompute in (False, True):
        kernel = S4DKernel(32, 64)
        kernel.recompute = recompute
        torch.manual_seed(1)
        kernel.load_state_dict(S4DKernel(32, 64).state_dict())
        k, saved[recompute] = _saved_bytes(lambda: kernel(512))
        (k * torch.linspace(-1, 1, k.numel()).view_as(k)).sum().backward()
        grads[recompute] = [p.grad.clone() for p in kernel.parameters()]
    for a, b in zip(grads[False], grads[True]):
        assert (a - b).abs().max() <= 1e-5 * a.abs().max(), (a - b).abs().max() / a.abs().max()
    assert saved[True] * 3 < saved[False]


@pytest.mark.parametrize(
    "length,chunk", [(7, 1 << 21), (300, 1 << 21), (1000, 1)], ids=["one_block", "L300", "chunked"]
)
def test_blocked_vandermonde_gradients_equal_autograd_of_the_naive_formula(length, chunk):
    """BlockedVandermonde's written-out backward (one blocked product, exponentials recomputed) gives
    the gradients autograd finds through the one-exp-per-entry formula: complex128 to rounding,
    lengths that are no multiple of the block, one channel per chunk too."""
    torch.manual_seed(0)
    H, M = 5, 8
    dt = torch.exp(torch.rand(H, dtype=torch.float64) * 4 - 7)
    a = torch.complex(-0.5 * torch.ones(H, M, dtype=torch.float64), math.pi * torch.arange(M).double().expand(H, M))
    dt_a = (a * dt[:, None]).requires_grad_()  # (H M) complex128
    c_prime = torch.randn(2, H, M, dtype=torch.complex128, requires_grad=True)
    g = torch.randn(2, H, length, dtype=torch.float64)
    expected = torch.autograd.grad((vandermonde_naive(c_prime, dt_a, length) * g).sum(), (c_prime, dt_a))
    out = BlockedVandermonde.apply(c_prime, dt_a, length, chunk)
    got = torch.autograd.grad((out * g).sum(), (c_prime, dt_a))
    assert torch.allclose(out, vandermonde_naive(c_prime, dt_a, length), rtol=0, atol=1e-12)
    for x, y in zip(got, expected):
        assert (x - y).abs().max() <= 1e-12 * y.abs().max(), (x - y).abs().max()


def test_training_kernel_runs_the_product_once(monkeypatch):
    """A training step generates the kernel once: the backward recomputes only the exponentials (it
    ran the whole product again under a checkpoint, then autograd's backward through it)."""
    from lsg_layers.ops import ssm

    calls = []
    original = ssm.vandermonde_blocked
    monkeypatch.setattr(ssm, "vandermonde_blocked", lambda *a, **k: calls.append(1) or original(*a, **k))
    for whole in (False, True):
        calls.clear()
        kernel = S4DKernel(8, 16, tail_tol=0.0)
        kernel(300, whole=whole).sum().backward()
        assert len(calls) == 1 and all(p.grad is not None for p in kernel.parameters())


def test_kernel_product_has_one_check_at_every_entry():
    """--ssm-kernel-product's rule (a known mode; not fp32 only with the fused generator) is one
    function, s4d_config.check_kernel_product, which the layer's constructor calls too."""
    from lsg_layers.modules.s4d_config import check_kernel_product

    check_kernel_product("bf16", kernel_compile=True)
    for product, compiled, message in (("fp8", True, "must be one of fp32, tf32, bf16"), ("tf32", False, "fused")):
        with pytest.raises(ValueError, match=message):
            check_kernel_product(product, compiled)
        with pytest.raises(ValueError, match=message):
            S4D(4, 8, kernel_compile=compiled, kernel_product=product)
