"""ops.window_attention (strided key windows, fused CPU kernel, log-sum-exp merge) against a naive
gather + softmax written from its definition, outputs and gradients."""

import math

import pytest
import torch

from lsg_layers.ops import window_attention as wa
from lsg_layers.ops.window_attention import QueryGroup, Window, split_unmasked, window_attention

NEG64 = torch.finfo(torch.float64).min


def naive(q, sources, groups, scale):
    """Per query: gather the keys of its block's windows, one softmax over all of them."""
    n, S, h, d = q.shape
    out = torch.zeros_like(q)
    for r in range(n):
        for g in groups:
            for b in range(g.blocks):
                ks, vs, ms = [], [], []
                for w in g.windows:
                    k, v, m = sources[w.source]
                    idx = torch.arange(w.length) + w.start + b * w.stride
                    ks.append(k[r, idx])  # (length, h, d)
                    vs.append(v[r, idx])
                    mm = torch.zeros(h, w.length, dtype=q.dtype) if m is None else m[r][:, idx].expand(h, -1)
                    ms.append(mm)
                K, V, Mk = torch.cat(ks), torch.cat(vs), torch.cat(ms, dim=1)  # (Kn, h, d), (h, Kn)
                rows = slice(g.start + b * g.size, g.start + (b + 1) * g.size)
                s = torch.einsum("mhd,khd->hmk", q[r, rows], K) * scale + Mk[:, None, :]
                allowed = torch.cat(
                    [
                        torch.ones(g.size, w.length, dtype=torch.bool) if w.allowed is None else w.allowed
                        for w in g.windows
                    ],
                    dim=1,
                )  # (M, Kn)
                s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
                out[r, rows] = torch.einsum("hmk,khd->mhd", torch.softmax(s, -1), V)
    return out


def make_sources(n, h, d, sizes, masked, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    srcs = []
    for N, hm in zip(sizes, masked):
        k = torch.randn(n, N, h, d, generator=g, dtype=dtype)
        v = torch.randn(n, N, h, d, generator=g, dtype=dtype)
        m = None
        if hm:
            m = torch.zeros(n, hm, N, dtype=dtype)
            m.masked_fill_(torch.rand(n, hm, N, generator=g) < 0.3, torch.finfo(dtype).min)
        srcs.append((k, v, m))
    return srcs


CASES = {
    # LSG-like: globals (stride 0), a 3-block local window (overlapping), two sparse runs with
    # a stride that does not divide their length, everything masked somewhere
    "lsg": dict(
        S=2 + 5 * 4,
        sizes=[2, 7 * 4, 5 * 2 + 10],
        masked=[0, 1, 3],
        groups=[
            QueryGroup(0, 1, 2, [Window(0, 0, 0, 2), Window(1, 4, 4, 20)]),
            QueryGroup(2, 5, 4, [Window(0, 0, 0, 2), Window(1, 0, 4, 12), Window(2, 0, 2, 3), Window(2, 9, 2, 3)]),
        ],
    ),
    # LED-like: a band of 5 blocks of 3, no masks at all
    "band": dict(S=4 * 3, sizes=[8 * 3], masked=[0], groups=[QueryGroup(0, 4, 3, [Window(0, 0, 3, 15)])]),
    # LED's exact band: triangular edges (per-pair ``allowed``), a key-masked middle
    "edges": dict(
        S=4 * 3,
        sizes=[4 * 3 + 8, 2],
        masked=[1, 0],
        groups=[
            QueryGroup(
                0,
                4,
                3,
                [
                    Window(0, 0, 3, 3, torch.ones(3, 3, dtype=torch.bool).triu()),
                    Window(0, 3, 3, 2),
                    Window(0, 5, 3, 3, torch.ones(3, 3, dtype=torch.bool).tril(-1)),
                    Window(1, 0, 0, 2),
                ],
            )
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n", [1, 2])
def test_outputs_and_gradients_match_naive(case, n):
    c = CASES[case]
    h, d = 3, 4
    srcs = make_sources(n, h, d, c["sizes"], c["masked"])
    q = torch.randn(n, c["S"], h, d, dtype=torch.float64)
    leaves = [q] + [t for k, v, _ in srcs for t in (k, v)]
    for t in leaves:
        t.requires_grad_(True)
    scale = 1 / math.sqrt(d)
    fast = window_attention(q, srcs, c["groups"], scale)
    slow = naive(q, srcs, c["groups"], scale)
    assert torch.allclose(fast, slow, atol=1e-12), (fast - slow).abs().max()
    go = torch.randn_like(fast)
    g_fast = torch.autograd.grad(fast, leaves, go)
    g_slow = torch.autograd.grad(slow, leaves, go)
    for a, b in zip(g_fast, g_slow):
        assert torch.allclose(a, b, atol=1e-10), (a - b).abs().max()


def test_fully_masked_window_gets_zero_weight():
    # a window whose keys are all masked must not change the result (weight exactly 0)
    h, d = 2, 4
    srcs = make_sources(1, h, d, [12, 6], [0, 1])
    srcs[1][2].fill_(NEG64)
    q = torch.randn(1, 8, h, d, dtype=torch.float64)
    with_dead = [QueryGroup(0, 2, 4, [Window(0, 0, 4, 8), Window(1, 0, 2, 4)])]
    alone = [QueryGroup(0, 2, 4, [Window(0, 0, 4, 8)])]
    a = window_attention(q, srcs, with_dead)
    b = window_attention(q, srcs, alone)
    assert torch.isfinite(a).all() and torch.equal(a, b)


def test_gradcheck_float64():
    h, d = 2, 3
    srcs = make_sources(1, h, d, [3 * 3, 2], [1, 0])
    groups = [
        QueryGroup(0, 1, 2, [Window(1, 0, 0, 2), Window(0, 0, 0, 9)]),
        QueryGroup(2, 2, 3, [Window(1, 0, 0, 2), Window(0, 0, 3, 6)]),
    ]
    q = torch.randn(1, 8, h, d, dtype=torch.float64, requires_grad=True)
    k0, v0, m0 = srcs[0]
    k1, v1, _ = srcs[1]
    k0.requires_grad_(), v0.requires_grad_(), k1.requires_grad_(), v1.requires_grad_()
    fn = lambda q, k0, v0, k1, v1: window_attention(q, [(k0, v0, m0), (k1, v1, None)], groups)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k0, v0, k1, v1))


def test_saves_no_per_block_copy():
    # what backward keeps is the inputs, the output and one lse per window and query
    h, d, bs, nb = 2, 8, 16, 32
    k = torch.randn(1, (nb + 2) * bs, h, d, requires_grad=True)
    v = torch.randn(1, (nb + 2) * bs, h, d, requires_grad=True)
    q = torch.randn(1, nb * bs, h, d, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        window_attention(q, [(k, v, None)], [QueryGroup(0, nb, bs, [Window(0, 0, bs, 3 * bs)])])
    # q, out, k, v and one lse row per query: far below the 3x gathered copy of k and v
    assert sum(saved) <= 4 * q.numel() + nb * bs * h + 2 * k.numel() - 2 * q.numel()


def test_bfloat16_close_to_float32():
    h, d = 2, 8
    srcs = make_sources(2, h, d, [6 * 4], [1], dtype=torch.float32)
    q = torch.randn(2, 16, h, d)
    groups = [QueryGroup(0, 4, 4, [Window(0, 0, 4, 12)])]
    ref = window_attention(q, srcs, groups)
    low = window_attention(q.bfloat16(), [(k.bfloat16(), v.bfloat16(), m.bfloat16()) for k, v, m in srcs], groups)
    assert low.dtype == torch.bfloat16 and torch.allclose(low.float(), ref, atol=3e-2)


def test_backward_in_chunks_of_blocks():
    # a window much longer than its source's share per block is differentiated in chunks of
    # blocks (bounded transient memory); gradients stay those of the naive reference
    h, d, M = 2, 4, 2
    srcs = make_sources(1, h, d, [2 * 8 + 16], [1])
    q = torch.randn(1, 8 * M, h, d, dtype=torch.float64, requires_grad=True)
    k, v, m = srcs[0]
    k.requires_grad_(), v.requires_grad_()
    groups = [QueryGroup(0, 8, M, [Window(0, 0, 2, 18)])]  # 8 blocks x 18 keys of a 32-key source
    scale = d**-0.5
    go = torch.randn(1, 8 * M, h, d, dtype=torch.float64)
    fast = torch.autograd.grad(window_attention(q, srcs, groups, scale), [q, k, v], go)
    slow = torch.autograd.grad(naive(q, srcs, groups, scale), [q, k, v], go)
    for a, b in zip(fast, slow):
        assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("gather_elems", [1, 1 << 21])  # one block per kernel call; whole groups
def test_inference_forward_matches_naive(case, n, gather_elems, monkeypatch):
    # without autograd the windows of a chunk of blocks are copied into one key set per call
    monkeypatch.setattr(wa, "_GATHER_ELEMS", gather_elems)
    c = CASES[case]
    h, d = 3, 4
    srcs = make_sources(n, h, d, c["sizes"], c["masked"])
    q = torch.randn(n, c["S"], h, d, dtype=torch.float64)
    with torch.no_grad():
        fast = window_attention(q, srcs, c["groups"], 0.5)
    assert torch.allclose(fast, naive(q, srcs, c["groups"], 0.5), atol=1e-12)


def test_inference_parts():
    # which windows share a kernel call: unmasked ones together (but a window more than 4x the
    # rest of its call together runs alone, on its view), then masked ones
    srcs = [(None, None, None), (None, None, torch.zeros(1, 9))]
    tri = torch.ones(2, 2, dtype=torch.bool).triu()
    g = QueryGroup(0, 1, 2, [Window(0, 0, 0, 1), Window(0, 0, 1, 6), Window(1, 0, 1, 2), Window(0, 0, 1, 3)])
    assert [[w.length for w in c] for c in wa._parts(g, srcs)] == [[1, 6, 3], [2]]
    g = QueryGroup(
        0, 1, 2, [Window(0, 0, 0, 1), Window(0, 0, 1, 13), Window(0, 0, 1, 2, tri), Window(1, 0, 1, 2, masked=False)]
    )
    assert [[w.length for w in c] for c in wa._parts(g, srcs)] == [[13], [1, 2], [2]]


def test_split_unmasked_keeps_outputs_trims_padding_and_drops_clean_masks():
    # source 0: a padding block on each side (masked in every row), one key masked in row 1 only;
    # most blocks must end up with no mask, the edge blocks with their padding cut off
    h, d, bs, nb = 2, 4, 4, 12
    srcs = make_sources(2, h, d, [(nb + 2) * bs, 3], [1, 1])
    k, v, m = srcs[0]
    m.zero_()
    m[:, :, :bs] = NEG64
    m[:, :, -bs:] = NEG64
    m[1, 0, 30] = NEG64  # in row 1 only: must stay masked, never be cut
    srcs[1][2].zero_()  # the globals' mask is all zero: never applied
    groups = [QueryGroup(0, nb, bs, [Window(1, 0, 0, 3), Window(0, 0, bs, 3 * bs)])]
    split = split_unmasked(groups, [mm for _, _, mm in srcs])
    assert sum(g.blocks for g in split) == nb and [g.start for g in split] == sorted(g.start for g in split)
    some = (m != 0).flatten(0, 1).any(0)
    every = (m != 0).flatten(0, 1).all(0)
    for g in split:
        assert not g.windows[0].masked  # the all-zero global mask is dropped everywhere
        for w in g.windows[1:]:
            for b in range(g.blocks):
                lo = w.start + b * w.stride
                keys = slice(lo, lo + w.length)
                assert w.masked == bool(some[keys].any())  # a mask only where a key needs it
                assert not every[keys].any()  # the padding is cut off, never attended
                assert w.length == 3 * bs - bs * ((g.start // bs + b) in (0, nb - 1))
    assert sum(not w.masked for g in split for w in g.windows[1:]) >= 2
    q = torch.randn(2, nb * bs, h, d, dtype=torch.float64)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            a = window_attention(q.requires_grad_(grad), srcs, groups)
            b = window_attention(q, srcs, split)
        assert torch.allclose(a, b, atol=1e-13)
    assert torch.allclose(b, naive(q.detach(), srcs, groups, d**-0.5), atol=1e-12)


def test_split_unmasked_cuts_allowed_with_the_window_and_keeps_all_masked_runs():
    # a band whose left end is padding: ``allowed`` is cut with it; a group whose only window is
    # padding everywhere keeps it (masked) rather than attending to nothing
    h, d = 2, 4
    srcs = make_sources(1, h, d, [16], [1])
    srcs[0][2].zero_()
    srcs[0][2][..., :3] = NEG64
    tri = torch.ones(4, 5, dtype=torch.bool).triu()
    groups = [QueryGroup(0, 3, 4, [Window(0, 1, 4, 5, tri)]), QueryGroup(12, 1, 2, [Window(0, 0, 0, 3)])]
    split = split_unmasked(groups, [srcs[0][2]])
    first = split[0].windows[0]
    assert (first.start, first.length) == (3, 3) and torch.equal(first.allowed, tri[:, 2:]) and not first.masked
    assert split[-1].windows == [Window(0, 0, 0, 3)]  # kept as it was
    q = torch.randn(1, 14, h, d, dtype=torch.float64)
    with torch.no_grad():
        a, b = window_attention(q, srcs, groups), window_attention(q, srcs, split)
    assert torch.allclose(a[:, :12], b[:, :12], atol=1e-13) and torch.allclose(
        a[:, :12], naive(q, srcs, groups, d**-0.5)[:, :12], atol=1e-12
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_inplace_inference_writes_over_q_with_the_same_result(case, monkeypatch):
    # one block per kernel call: every chunk's query rows are read before its outputs are written
    monkeypatch.setattr(wa, "_GATHER_ELEMS", 1)
    c = CASES[case]
    srcs = make_sources(2, 3, 4, c["sizes"], c["masked"])
    q = torch.randn(2, c["S"], 3, 4, dtype=torch.float64)
    with torch.no_grad():
        expect = window_attention(q, srcs, c["groups"])
        got = window_attention(q.clone(), srcs, c["groups"], inplace=True)
        q2 = q.clone()
        shared = window_attention(q2, srcs, c["groups"], inplace=True)
    assert torch.equal(got, expect) and shared.data_ptr() == q2.data_ptr()
    q.requires_grad_(True)  # with autograd the flag is ignored: q is kept for backward
    out = window_attention(q, srcs, c["groups"], inplace=True)
    assert out.data_ptr() != q.data_ptr() and torch.allclose(out, expect, atol=1e-12)
