"""Longformer self-attention (lsg_layers.modules.longformer_attention) against a dense reference.

The reference is written from spec/led.md section 4 directly: one (T x T) key set per row and
float64 softmax; the module's blocked path must give the same valid outputs for odd lengths,
padding, per-row global counts, every block size and windows wider than the input.
"""

import math

import pytest
import torch

from lsg_layers.modules.longformer_attention import (
    LongformerSelfAttention,
    check_attention_window,
    parse_attention_windows,
)


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: tiny tensors, one thread


def dense_reference(attn, x, pad=None, glob=None):
    """Spec section 4, literally: (T, n, C) -> (T, n, C), float64, pad rows zeroed."""
    T, n, C = x.shape
    h, d, w = attn.num_heads, attn.head_dim, attn.one_sided
    x = x.transpose(0, 1).double()  # (n, T, C)
    real = torch.ones(n, T, dtype=torch.bool) if pad is None else ~pad
    glob = torch.zeros(n, T, dtype=torch.bool) if glob is None else glob & real

    def proj(layer, inp):
        return (inp @ layer.weight.double().t() + layer.bias.double()).view(n, T, h, d).transpose(1, 2)

    q, k, v = proj(attn.q_proj, x) / math.sqrt(d), proj(attn.k_proj, x), proj(attn.v_proj, x)
    qg, kg, vg = (proj(attn.q_proj_global, x) / math.sqrt(d), proj(attn.k_proj_global, x), proj(attn.v_proj_global, x))
    out = torch.zeros(n, h, T, d, dtype=torch.float64)
    for b in range(n):
        R, G = real[b], glob[b]
        local_keys = reference_local_keys(R, G, w)  # (T, T)
        s = q[b] @ k[b].transpose(-1, -2)  # (h, T, T)
        p = torch.softmax(s.masked_fill(~local_keys, float("-inf")), dim=-1)
        o_local = p @ v[b]
        sg = qg[b] @ kg[b].transpose(-1, -2)
        pg = torch.softmax(sg.masked_fill(~R[None, None, :], float("-inf")), dim=-1)
        o_glob = pg @ vg[b]
        o = torch.where(G[None, :, None], o_glob, o_local)
        out[b] = torch.where(R[None, :, None], o, torch.zeros_like(o))
    out = out.transpose(1, 2).reshape(n, T, C)
    W = attn.out_proj
    return (out @ W.weight.double().t() + W.bias.double()).transpose(0, 1)


def reference_local_keys(R, G, w):
    """(T, T) bool, the keys of local query i: globals anywhere, plus real non-global keys within
    |i - j| <= w; R real tokens, G global tokens (G within R), (T,) bool each."""
    i = torch.arange(R.size(0))[:, None]
    j = torch.arange(R.size(0))[None, :]
    return G[None, :] | (R & ~G)[None, :] & ((i - j).abs() <= w)


def make(window, block_size=None, C=16, h=4, seed=0):
    torch.manual_seed(seed)
    attn = LongformerSelfAttention(C, h, window, block_size=block_size).eval()
    with torch.no_grad():  # non-trivial biases, global projections different from local ones
        for p in attn.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return attn


def inputs(lengths, T, C=16, n_glob=(), seed=1):
    g = torch.Generator().manual_seed(seed)
    n = len(lengths)
    x = torch.randn(T, n, C, generator=g)
    pad = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # (n, T) right padding
    glob = torch.zeros(n, T, dtype=torch.bool)
    for b, positions in enumerate(n_glob):
        glob[b, list(positions)] = True
    return x, pad, glob


def check(attn, x, pad, glob, lengths, tol=1e-5):
    out, _ = attn(x, x, x, key_padding_mask=pad, global_attention_mask=glob)
    ref = dense_reference(attn, x, pad, glob)
    assert out.shape == x.shape
    for b, L in enumerate(lengths):
        diff = (out[:L, b].double() - ref[:L, b]).abs().max().item()
        assert diff < tol, (b, L, diff)
    return out


@pytest.mark.parametrize("window,block_size", [(2, None), (4, None), (6, 2), (8, 3), (10, None), (16, 5), (64, None)])
@pytest.mark.parametrize("lengths,T", [([37, 37], 37), ([37, 20], 37), ([5, 1], 5), ([50, 33], 50)])
def test_matches_dense_reference(window, block_size, lengths, T, layer_path):
    attn = make(window, block_size)
    globs = ([0, 1, 7, min(T, lengths[0]) - 1], [0, 3, lengths[1] - 1]) if lengths[1] > 3 else ([0], [0])
    x, pad, glob = inputs(lengths, T, n_glob=globs)
    check(attn, x, pad, glob, lengths)  # per-row global counts, adjacent and last-token globals
    check(attn, x, pad, None, lengths)  # no global token at all
    check(attn, x, pad, glob & False, lengths)  # an all-False mask is "no global" too
    no_pad = [T] * len(lengths)
    check(attn, x, None, glob, no_pad)


@pytest.mark.parametrize("n_glob", [4, 9])
def test_many_globals_match_dense_reference(n_glob, layer_path):
    # Gm * h <= C folds the global key/value projections into the queries; more globals
    # project every token (C = 16, h = 4: the switch is at 4 globals)
    attn = make(6)
    x, pad, glob = inputs([40, 31], 40, n_glob=(range(0, 40, 40 // n_glob), range(1, 31, 31 // n_glob)))
    assert int(glob[0].sum()) >= n_glob
    check(attn, x, pad, glob, [40, 31])


def test_window_path_gradients_equal_gathered_path():
    from lsg_layers.ops import window_attention

    supported = window_attention.supported
    attn = make(6, 4).double().train()  # training, no attention dropout: the window path
    x, pad, glob = inputs([23, 14], 23, n_glob=([0, 9], [2]))
    x = x.double()
    assert supported(x, attn.dropout)
    grads = {}
    for path in ("cpu", "whole"):
        attn.path = path
        xi = x.clone().requires_grad_(True)
        out, _ = attn(xi, xi, xi, key_padding_mask=pad, global_attention_mask=glob)
        valid = (~pad).t()[:, :, None].double()
        attn.zero_grad()
        (out * valid * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads[path] = [xi.grad] + [p.grad.clone() for p in attn.parameters()]
    for a, b in zip(grads["cpu"], grads["whole"]):
        assert torch.allclose(a, b, atol=1e-10), (a - b).abs().max()


def test_global_flags_on_padding_are_ignored():
    attn = make(6)
    x, pad, glob = inputs([20, 12], 20, n_glob=([0], [0, 15, 19]))  # 15, 19 are pads of row 1
    out = check(attn, x, pad, glob, [20, 12])
    clean = glob & ~pad
    out2, _ = attn(x, x, x, key_padding_mask=pad, global_attention_mask=clean)
    assert torch.equal(out[:12, 1], out2[:12, 1])


def test_valid_outputs_ignore_padding_and_batch():
    attn = make(8)
    x, pad, glob = inputs([29, 17], 29, n_glob=([0, 5], [0]))
    out, _ = attn(x, x, x, key_padding_mask=pad, global_attention_mask=glob)
    alone, _ = attn(x[:17, 1:], x[:17, 1:], x[:17, 1:], global_attention_mask=glob[1:, :17])
    assert (out[:17, 1] - alone[:, 0]).abs().max() < 1e-5
    # garbage in padded positions must not leak into valid outputs
    x2 = x.clone()
    x2[17:, 1] = 1e3 * torch.randn(12, 16)
    out2, _ = attn(x2, x2, x2, key_padding_mask=pad, global_attention_mask=glob)
    assert (out[:17, 1] - out2[:17, 1]).abs().max() < 1e-5
    assert torch.isfinite(out2).all()


def test_block_size_does_not_change_results():
    x, pad, glob = inputs([45, 31], 45, n_glob=([0, 22], [0, 1]))
    outs = []
    for bs in (None, 1, 3, 4, 7, 100):
        attn = make(8, bs)
        outs.append(attn(x, x, x, key_padding_mask=pad, global_attention_mask=glob)[0])
    for o in outs[1:]:
        assert (o[:31] - outs[0][:31]).abs().max() < 1e-5


def test_globals_matter():
    attn = make(4)
    x, pad, glob = inputs([30, 30], 30, n_glob=([0], [0, 10]))
    with_g, _ = attn(x, x, x, global_attention_mask=glob)
    without, _ = attn(x, x, x)
    assert (with_g - without).abs().max() > 1e-2  # every query sees the globals


def test_gradients_match_reference(layer_path):
    attn = make(6, 4).double()
    x, pad, glob = inputs([23, 14], 23, n_glob=([0, 9], [2]))
    x = x.double().requires_grad_(True)
    out, _ = attn(x, x, x, key_padding_mask=pad, global_attention_mask=glob)
    ref = dense_reference(attn, x, pad, glob)
    valid = (~pad).t()[:, :, None].double()  # (T, n, 1)
    g = torch.randn_like(ref)
    (gx,) = torch.autograd.grad((out * valid * g).sum(), x, retain_graph=True)
    (rx,) = torch.autograd.grad((ref * valid * g).sum(), x)
    assert (gx - rx).abs().max() < 1e-8
    # the global projections receive gradient only through global rows
    loss = (out * valid).sum()
    loss.backward()
    assert attn.q_proj_global.weight.grad.abs().sum() > 0
    assert attn.k_proj.weight.grad.abs().sum() > 0


def test_dropout_only_in_training():
    attn = make(4)
    attn.dropout = 0.5
    x, pad, glob = inputs([20], 20, n_glob=([0],))
    eval_a = attn(x, x, x, global_attention_mask=glob)[0]
    assert torch.equal(eval_a, attn(x, x, x, global_attention_mask=glob)[0])
    attn.train()
    torch.manual_seed(0)
    a = attn(x, x, x, global_attention_mask=glob)[0]
    assert (a - eval_a).abs().max() > 1e-3


def test_window_validation():
    assert parse_attention_windows("32", 3) == [32, 32, 32]
    assert parse_attention_windows("32,64", 2) == [32, 64]
    assert parse_attention_windows([16, 8], 2) == [16, 8]
    assert parse_attention_windows(1024, 2) == [1024, 1024]
    with pytest.raises(ValueError, match="--attention-window has 3 entries but the encoder has 2"):
        parse_attention_windows("2,4,6", 2)
    for bad in ("7", "0", "-2", "a,b"):
        with pytest.raises(ValueError, match="--attention-window"):
            parse_attention_windows(bad, 2)
    with pytest.raises(ValueError, match="even"):
        check_attention_window(3)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        make(4)(torch.randn(3, 1, 16), attn_mask=torch.zeros(3, 3))


def test_half_precision_is_finite():
    attn = make(8)
    x, pad, glob = inputs([40, 25], 40, n_glob=([0], [0, 3]))
    ref, _ = attn(x, x, x, key_padding_mask=pad, global_attention_mask=glob)
    out, _ = attn.to(torch.bfloat16)(x.bfloat16(), key_padding_mask=pad, global_attention_mask=glob)
    assert torch.isfinite(out).all()
    assert (out[:25].float() - ref[:25]).abs().max() < 0.1 * ref.abs().max()


def test_no_quadratic_allocation():
    """Nothing T x T is ever allocated: every op's allocation stays far below T^2 floats."""
    from torch.profiler import ProfilerActivity, profile

    T = 8192
    attn = make(16, C=8, h=2)
    x = torch.randn(T, 1, 8)
    glob = torch.zeros(1, T, dtype=torch.bool)
    glob[0, [0, 100, 8000]] = True
    pad = torch.zeros(1, T, dtype=torch.bool)
    pad[0, -5:] = True
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out, _ = attn(x, x, x, key_padding_mask=pad, global_attention_mask=glob)
    assert torch.isfinite(out).all()
    largest = max(e.self_cpu_memory_usage for e in prof.key_averages())
    # (summed over the calls of each op) a (T, T) fp32 mask alone would be T^2 * 4 bytes = 268 MB
    assert 0 < largest < T * T * 4 / 32, largest
