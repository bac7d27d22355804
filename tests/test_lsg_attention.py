"""LSG attention (block-sparse fast path) against a slow dense reference with an explicit mask."""

import math

import pytest
import torch

from lsg_layers.modules.lsg_attention import LSGSelfAttention
from lsg_layers.modules.lsg_config import check_lsg_config
from lsg_layers.ops import window_attention
from test_sparse import ref_sparse  # the sparse sequences written as loops from the spec

NEG = torch.finfo(torch.float32).min
TYPES = ["none", "norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh"]


# ----------------------------------------------------------------------------- slow reference
def dense_reference(attn, x, key_padding_mask=None, gen=None):
    """Dense softmax attention over [tokens + sparse entries] with the LSG pattern as a mask."""
    T, n, C = x.shape
    G, bs, sbs, sf = attn.num_global_tokens, attn.block_size, attn.sparse_block_size, attn.sparsity_factor
    h, d = attn.num_heads, attn.head_dim
    L = T - G
    t = L if L <= 2 * bs else -(-L // bs) * bs
    pad = torch.zeros(n, T, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
    xp = torch.cat([x, x.new_zeros(t - L, n, C)], 0)
    padp = torch.cat([pad, torch.ones(n, t - L, dtype=torch.bool)], 1)
    S = G + t
    projs = None
    if attn.sparsity_type == "lsh" and L > 2 * bs:
        c = min(bs, sbs)
        projs = [
            (size, torch.randn(1, h, 1, d, size // 2, generator=gen)[0])  # (h, 1, d, size/2)
            for size in [c] * attn.lsh_num_pre_rounds + [c // sf]
        ]
    outs = []
    for b in range(n):
        q = attn.q_proj(xp[:, b]).view(S, h, d).transpose(0, 1)  # (h, S, d)
        k = attn.k_proj(xp[:, b]).view(S, h, d).transpose(0, 1)
        v = attn.v_proj(xp[:, b]).view(S, h, d).transpose(0, 1)
        valid = ~padp[b]
        if L <= 2 * bs:
            allow = valid[None, None, :].expand(h, S, S)
            keys, vals = k, v
        else:
            use_sparse = attn.sparsity_type != "none" and sbs > 0
            if use_sparse:
                sk, sv, sok = ref_sparse(attn.sparsity_type, q[:, G], k[:, G:], v[:, G:], valid[G:], bs, sbs, sf, projs)
            else:
                sk, sv, sok = k[:, :0], v[:, :0], torch.zeros(h, 0, dtype=torch.bool)
            keys, vals = torch.cat([k, sk], 1), torch.cat([v, sv], 1)
            allow = reference_allow(G, t, bs, sbs, sf, valid, sok)
        scores = q @ keys.transpose(1, 2) / math.sqrt(d)
        scores = scores.masked_fill(~allow, NEG)
        o = torch.softmax(scores, -1) @ vals  # (h, S, d)
        outs.append(o.transpose(0, 1).reshape(S, C)[:T])
    return attn.out_proj(torch.stack(outs, 1))  # (T, n, C)


def reference_allow(G, t, bs, sbs, sf, valid, sok):
    """The LSG pattern of one row as a (h, S, S + ns) bool mask over [globals | tokens | sparse]:
    valid (S,) real keys, sok (h, ns) valid sparse entries (ns = 0: no sparse keys)."""
    h, ns = sok.shape
    S = G + t
    allow = torch.zeros(h, S, S + ns, dtype=torch.bool)
    allow[:, :G, :S] = valid  # global queries: everything
    step = bs // sf
    for i in range(t):
        j = i // bs
        row = G + i
        allow[:, row, :G] = True
        for kk in range((j - 1) * bs, (j + 2) * bs):
            if 0 <= kk < t:
                allow[:, row, G + kk] = valid[G + kk]
        window = list(range((j - 1) * step - sbs, (j - 1) * step)) + list(range((j + 2) * step, (j + 2) * step + sbs))
        for p in window:
            if 0 <= p < ns:
                allow[:, row, S + p] = sok[:, p]
    return allow


def make(stype="norm", G=1, bs=4, sbs=4, sf=2, h=2, C=16, seed=0, **kw):
    torch.manual_seed(seed)
    attn = LSGSelfAttention(
        C, h, num_global_tokens=G, block_size=bs, sparse_block_size=sbs, sparsity_factor=sf, sparsity_type=stype, **kw
    )
    with torch.no_grad():  # non-trivial biases
        for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
            p.bias.normal_()
    return attn.eval()


def run_both(attn, T, n, lengths=None, seed=1, gen_seed=None):
    torch.manual_seed(seed)
    x = torch.randn(T, n, attn.embed_dim)
    mask = None
    if lengths is not None:
        mask = torch.arange(T)[None, :] >= (torch.tensor(lengths)[:, None] + attn.num_global_tokens)
    if gen_seed is not None:
        attn.generator = torch.Generator().manual_seed(gen_seed)
    with torch.no_grad():
        fast, weights = attn(x, x, x, key_padding_mask=mask, need_weights=False)
    gen = torch.Generator().manual_seed(gen_seed) if gen_seed is not None else None
    with torch.no_grad():
        slow = dense_reference(attn, x, mask, gen)
    assert weights is None
    assert fast.shape == (T, n, attn.embed_dim)
    return fast, slow, mask


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("stype", TYPES)
@pytest.mark.parametrize("G", [1, 4])
@pytest.mark.parametrize("L,lengths", [(29, None), (32, None), (29, [29, 17]), (24, [11, 24])])
def test_matches_dense_reference(stype, G, L, lengths, layer_path):
    attn = make(stype, G=G, bs=4, sbs=4, sf=2)
    n = 2
    fast, slow, mask = run_both(attn, G + L, n, lengths, gen_seed=7 if stype == "lsh" else None)
    keep = torch.ones(G + L, n, dtype=torch.bool) if mask is None else ~mask.t()
    assert torch.allclose(fast[keep], slow[keep], atol=1e-5), (fast - slow)[keep].abs().max()


@pytest.mark.parametrize(
    "bs,sbs,sf", [(4, 2, 2), (4, 3, 4), (6, 3, 2), (6, 2, 3), (8, 6, 4), (2, 2, 1), (4, 1, 4), (6, 5, 3)]
)
@pytest.mark.parametrize("stype", ["pooling", "stride", "block_stride", "bos_pooling"])
def test_odd_and_unaligned_windows(bs, sbs, sf, stype, layer_path):
    # includes odd steps, step == 1 and 4*sbs <= 3*step: where the reference's arithmetic breaks
    attn = make(stype, G=2, bs=bs, sbs=sbs, sf=sf, h=4)
    L = 7 * bs + 1
    fast, slow, mask = run_both(attn, 2 + L, 2, [L, L - bs - 1])
    keep = ~mask.t()
    assert torch.allclose(fast[keep], slow[keep], atol=1e-5)


@pytest.mark.parametrize("bs,sbs,sf", [(8, 4, 2), (8, 8, 4), (4, 8, 1), (8, 4, 4), (8, 10, 2), (8, 9, 4)])
def test_norm_chunking(bs, sbs, sf, layer_path):
    attn = make("norm", G=1, bs=bs, sbs=sbs, sf=sf)
    L = 6 * bs - 3
    fast, slow, mask = run_both(attn, 1 + L, 2, [L, L - 9])
    keep = ~mask.t()
    assert torch.allclose(fast[keep], slow[keep], atol=1e-5)


@pytest.mark.parametrize("pre_rounds", [0, 1, 2])
def test_lsh_seeded(pre_rounds):
    attn = make("lsh", G=1, bs=8, sbs=8, sf=2, lsh_num_pre_rounds=pre_rounds)
    fast, slow, mask = run_both(attn, 1 + 40, 2, [40, 30], gen_seed=3)
    keep = ~mask.t()
    assert torch.allclose(fast[keep], slow[keep], atol=1e-5)
    # the same generator seed gives the same output; another seed changes it
    x = torch.randn(41, 1, 16)
    attn.generator = torch.Generator().manual_seed(5)
    a = attn(x, x, x)[0]
    attn.generator = torch.Generator().manual_seed(5)
    assert torch.equal(a, attn(x, x, x)[0])
    attn.generator = torch.Generator().manual_seed(6)
    assert not torch.allclose(a, attn(x, x, x)[0])


def test_lsh_delegates_to_bos_pooling_when_sf_equals_sbs():
    attn = make("lsh", G=1, bs=8, sbs=4, sf=4)
    fast, slow, mask = run_both(attn, 1 + 37, 2, [37, 20])
    keep = ~mask.t()
    assert torch.allclose(fast[keep], slow[keep], atol=1e-5)


def full_attention(attn, x, mask):
    T, n, C = x.shape
    q = attn.q_proj(x).view(T, n, attn.num_heads, -1).permute(1, 2, 0, 3)
    k = attn.k_proj(x).view(T, n, attn.num_heads, -1).permute(1, 2, 0, 3)
    v = attn.v_proj(x).view(T, n, attn.num_heads, -1).permute(1, 2, 0, 3)
    s = q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)
    if mask is not None:
        s = s.masked_fill(mask[:, None, None, :], NEG)
    o = (torch.softmax(s, -1) @ v).permute(2, 0, 1, 3).reshape(T, n, C)
    return attn.out_proj(o)


@pytest.mark.parametrize("stype", ["norm", "pooling", "none"])
@pytest.mark.parametrize("L", [3, 8, 15, 16])
def test_short_inputs_are_full_attention(stype, L):
    attn = make(stype, G=2, bs=8, sbs=8, sf=2)
    x = torch.randn(2 + L, 2, 16)
    mask = torch.zeros(2, 2 + L, dtype=torch.bool)
    mask[1, 2 + L // 2 :] = True
    with torch.no_grad():
        out = attn(x, x, x, key_padding_mask=mask)[0]
        ref = full_attention(attn, x, mask)
    keep = ~mask.t()
    assert torch.allclose(out[keep], ref[keep], atol=1e-5)


@pytest.mark.parametrize("stype", TYPES)
def test_lsg_path_on_two_blocks_equals_full_attention(stype):
    # with t == 2*bs every query's local window already holds every token
    attn = make(stype, G=3, bs=8, sbs=8, sf=2)
    x = torch.randn(3 + 16, 2, 16)
    mask = torch.zeros(2, 19, dtype=torch.bool)
    mask[0, 14:] = True
    with torch.no_grad():
        xb = x.transpose(0, 1)  # (n, S, C)
        q, k, v = (p(xb).view(2, 19, 2, 8) for p in (attn.q_proj, attn.k_proj, attn.v_proj))  # (n, S, h, d)
        key_mask = torch.zeros(2, 19).masked_fill(mask, NEG)
        ref = full_attention(attn, x, mask)
        keep = ~mask.t()
        # _lsg_windows writes its output over q without autograd: give it a copy
        for o in (attn._lsg_windows(xb, q.clone(), key_mask), attn._lsg_gathered(q, k, v, key_mask)):  # (n, S, C)
            out = attn.out_proj(o).transpose(0, 1)
            assert torch.allclose(out[keep], ref[keep], atol=1e-5)


def test_batch_invariance_and_no_mask():
    attn = make("norm", G=1, bs=4, sbs=4, sf=2)
    x = torch.randn(1 + 30, 3, 16)
    mask = torch.zeros(3, 31, dtype=torch.bool)
    mask[1, 20:] = True
    with torch.no_grad():
        batched = attn(x, x, x, key_padding_mask=mask)[0]
        alone = attn(x[:20, 1:2], x[:20, 1:2], x[:20, 1:2])[0]
        nomask = attn(x[:, :1], x[:, :1], x[:, :1], key_padding_mask=None)[0]
    assert torch.allclose(batched[:20, 1], alone[:, 0], atol=1e-5)
    assert torch.allclose(batched[:, 0], nomask[:, 0], atol=1e-5)


@pytest.mark.parametrize("stype", TYPES)
def test_window_path_gradients_equal_gathered_path(stype):
    # training without attention dropout takes the window path on CPU; its custom backward must
    # give the gradients autograd gives through the gathered (whole-tensor) path (float64,
    # padding, 2 rows)
    attn = make(stype, G=2, bs=4, sbs=4, sf=2).double().train()
    attn.generator = torch.Generator().manual_seed(3) if stype == "lsh" else None
    x = torch.randn(2 + 27, 2, 16, dtype=torch.float64)
    mask = torch.zeros(2, 29, dtype=torch.bool)
    mask[1, 21:] = True
    assert _SUPPORTED(x, attn.dropout)  # CPU, no dropout: the window path runs
    grads = {}
    for path in ("cpu", "whole"):
        attn.path = path
        if stype == "lsh":
            attn.generator = torch.Generator().manual_seed(3)
        xi = x.clone().requires_grad_(True)
        out = attn(xi, xi, xi, key_padding_mask=mask)[0]
        keep = ~mask.t()
        loss = (out[keep] * torch.linspace(-1, 1, out[keep].numel(), dtype=out.dtype).view_as(out[keep])).sum()
        attn.zero_grad()
        loss.backward()
        grads[path] = [xi.grad] + [p.grad.clone() for p in attn.parameters()]
    for a, b in zip(grads["cpu"], grads["whole"]):
        assert torch.allclose(a, b, atol=1e-10), (a - b).abs().max()


_SUPPORTED = window_attention.supported


def test_gradients_and_dropout():
    attn = make("norm", G=2, bs=4, sbs=4, sf=2, dropout=0.5)
    attn.train()
    x = torch.randn(2 + 25, 2, 16, requires_grad=True)
    out = attn(x, x, x)[0]
    out.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad[:2].abs().sum() > 0
    assert all(p.grad is not None for p in attn.parameters())
    attn.eval()
    with torch.no_grad():
        a, b = attn(x, x, x)[0], attn(x, x, x)[0]
    assert torch.equal(a, b)


def test_memory_is_linear_no_square_tensor():
    # a t x t float tensor at t = 8192 would be 256 MB; the LSG path must stay far below that
    attn = make("norm", G=1, bs=64, sbs=64, sf=4, h=2, C=16)
    x = torch.randn(1 + 8192, 1, 16)
    biggest = []

    from torch.utils._python_dispatch import TorchDispatchMode

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(o, torch.Tensor):
                    biggest.append(o.numel())
            return out

    with torch.no_grad(), Track():
        attn(x, x, x)
    assert max(biggest) < 8192 * 8192 / 16


def test_float16_runs_without_nan():
    attn = make("pooling", G=1, bs=4, sbs=4, sf=2).to(torch.bfloat16)
    x = torch.randn(1 + 21, 2, 16, dtype=torch.bfloat16)
    mask = torch.zeros(2, 22, dtype=torch.bool)
    mask[1, 9:] = True
    out = attn(x, x, x, key_padding_mask=mask)[0]
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(block_size=8, sparsity_factor=3), "must divide"),
        (dict(block_size=8, sparse_block_size=2, sparsity_factor=2), "must be >="),
        (dict(num_global_tokens=0), r"\[1, 512\]"),
        (dict(num_global_tokens=513), r"\[1, 512\]"),
        (dict(block_size=0), "block_size must be >= 1"),
        (dict(sparsity_type="bogus"), "not a known sparsity type"),
        (dict(sparsity_type=None), "not a known sparsity type"),  # the reference's None is mapped by the converter
        (dict(block_size=8, sparse_block_size=6, sparsity_factor=2, sparsity_type="norm"), "chunks"),
    ],
)
def test_invalid_hyper_parameters(kwargs, message):
    cfg = dict(block_size=8, sparse_block_size=8, sparsity_factor=2, sparsity_type="norm", num_global_tokens=1)
    cfg.update(kwargs)
    with pytest.raises(ValueError, match=message):
        check_lsg_config(**cfg)
    with pytest.raises(ValueError, match=message):
        LSGSelfAttention(16, 2, **cfg)


def test_valid_edge_configurations_accepted():
    check_lsg_config(8, 0, 2, "norm", 1)  # sparse off
    check_lsg_config(8, 1, 8, "pooling", 512)
    check_lsg_config(8, 8, 1, "none", 1)
    check_lsg_config(8, 2, 2, "none", 1)
