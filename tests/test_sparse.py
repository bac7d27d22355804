"""ops.sparse (LSG's sparse sequences, token-major) against loops written from spec/lsg.md
section 4 Step A, one sparsity type at a time, with and without padding."""

import math

import pytest
import torch

from lsg_layers.ops import sparse

NEG = torch.finfo(torch.float32).min
TYPES = ["norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh"]


def ref_sparse(stype, q0, k, v, valid, bs, sbs, sf, projs=None):
    """Sparse sequence, written as loops straight from spec/lsg.md section 4 Step A.

    q0 (h, d), k/v (h, t, d), valid (t,) bool; projs: lsh random projections, one per round,
    (h, 1, d, buckets/2), shared by the batch. Returns keys, values (h, ns, d), ok (h, ns) bool.
    """
    h, t, d = k.shape
    if sf == 1:
        return k, v, valid[None].expand(h, t)
    ns = t // sf
    sk, sv = torch.zeros(h, ns, d), torch.zeros(h, ns, d)
    ok = torch.zeros(h, ns, dtype=torch.bool)
    if stype == "norm":
        c = min(bs, sbs)
        keep = c // sf
        for hh in range(h):
            for ci in range(t // c):
                tok = list(range(ci * c, (ci + 1) * c))
                norms = [float(k[hh, i].norm()) if valid[i] else 0.0 for i in tok]
                chosen = [tok[i] for i in sorted(range(c), key=lambda i: norms[i])[-keep:]]
                for r, i in enumerate(chosen):
                    sk[hh, ci * keep + r], sv[hh, ci * keep + r] = k[hh, i], v[hh, i]
                    ok[hh, ci * keep + r] = valid[i]
    elif stype == "pooling":
        for p in range(ns):
            members = [i for i in range(p * sf, (p + 1) * sf) if valid[i]]
            if members:
                sk[:, p] = k[:, members].sum(1) / (len(members) + 1e-6)
                sv[:, p] = v[:, members].sum(1) / (len(members) + 1e-6)
                ok[:, p] = True
    elif stype == "stride":
        for hh in range(h):
            for p in range(ns):
                i = p * sf + hh % sf
                sk[hh, p], sv[hh, p], ok[hh, p] = k[hh, i], v[hh, i], valid[i]
    elif stype == "block_stride":
        step = bs // sf
        for hh in range(h):
            for b in range(t // bs):
                for r in range(step):
                    i = b * bs + (r + hh * step) % bs
                    p = b * step + r
                    sk[hh, p], sv[hh, p], ok[hh, p] = k[hh, i], v[hh, i], valid[i]
    elif stype == "bos_pooling" or (stype == "lsh" and sf == sbs):
        for hh in range(h):
            for p in range(ns):
                g = list(range(p * sf, (p + 1) * sf))
                s = torch.stack([k[hh, i] @ q0[hh] / math.sqrt(d) + (0 if valid[i] else NEG) for i in g])
                w = torch.softmax(s, 0)
                sk[hh, p] = sum(w[r] * k[hh, i] for r, i in enumerate(g))
                sv[hh, p] = sum(w[r] * v[hh, i] for r, i in enumerate(g))
                ok[hh, p] = any(bool(valid[i]) for i in g)  # fully padded groups masked (fix)
    elif stype == "lsh":
        c = min(bs, sbs)
        kc = (k * valid[None, :, None]).view(h, t // c, c, d)
        vc = (v * valid[None, :, None]).view(h, t // c, c, d)
        wc = valid.float().view(1, t // c, c, 1).expand(h, -1, -1, -1)
        for size, proj in projs:
            codes = (torch.nn.functional.normalize(kc, dim=-1) * wc.clamp(0, 1)) @ proj
            if size // 2 == 0:  # a single bucket
                bucket = torch.zeros(codes.shape[:-1], dtype=torch.long)
            else:
                bucket = torch.cat([codes, -codes], -1).argmax(-1)  # (h, t/c, c_in)
            nk, nv, nw = (
                torch.zeros(h, t // c, size, d),
                torch.zeros(h, t // c, size, d),
                torch.zeros(h, t // c, size, 1),
            )
            for hh in range(h):
                for ci in range(t // c):
                    for i in range(kc.size(2)):
                        b = bucket[hh, ci, i]
                        nk[hh, ci, b] += kc[hh, ci, i]
                        nv[hh, ci, b] += vc[hh, ci, i]
                        nw[hh, ci, b] += wc[hh, ci, i]
            kc, vc, wc = nk, nv, nw
        sk = (kc / (wc + 1e-8)).reshape(h, ns, d)
        sv = (vc / (wc + 1e-8)).reshape(h, ns, d)
        ok = wc.reshape(h, ns) > 0
    else:
        raise AssertionError(stype)
    return sk, sv, ok


def _lsh_projections(gen, h, d, chunk, sf, pre_rounds):
    """The random projections lsh draws from ``gen``, in its order: (buckets, (h, 1, d, buckets/2))."""
    return [
        (size, torch.randn(1, h, 1, d, size // 2, generator=gen)[0]) for size in [chunk] * pre_rounds + [chunk // sf]
    ]


def _by_chunk(x, chunk_entries):
    """(ns, d) -> rows sorted within each run of ``chunk_entries`` (compare selections as sets)."""
    runs = x.view(-1, chunk_entries, x.size(-1))
    order = runs[..., 0].argsort(dim=1)
    return runs.gather(1, order[..., None].expand_as(runs)).reshape(x.shape)


CONFIGS = [  # (bs, sbs, sf): the benchmark's shape in small, sbs < bs, sf == sbs (lsh -> bos_pooling)
    (8, 8, 2),
    (8, 4, 4),
    (16, 8, 2),
    (8, 8, 8),
]


@pytest.mark.parametrize("stype", TYPES)
@pytest.mark.parametrize("bs,sbs,sf", CONFIGS)
@pytest.mark.parametrize("padded", [False, True])
def test_matches_loops_from_the_spec(stype, bs, sbs, sf, padded):
    n, t, h, d = 2, 4 * 16, 3, 4
    g = torch.Generator().manual_seed(hash((stype, bs, sbs, sf, padded)) % 2**31)
    k, v = torch.randn(n, t, h, d, generator=g), torch.randn(n, t, h, d, generator=g)
    q0 = torch.randn(n, h, d, generator=g)
    valid = torch.ones(n, t, dtype=torch.bool)
    if padded:
        valid[1, t - 21 :] = False  # whole chunks of padding and a cut one
    mask = None if not padded and stype != "lsh" else torch.zeros(n, t).masked_fill(~valid, NEG)
    chunk, pre = min(bs, sbs), 1
    gen = torch.Generator().manual_seed(3)
    sk, sv, sm = sparse.sparse_sequence(
        stype,
        q0,
        k,
        v,
        mask,
        block_size=bs,
        sparse_block_size=sbs,
        sparsity_factor=sf,
        lsh_num_pre_rounds=pre,
        generator=gen,
    )
    ns = t // sf
    assert sk.shape == sv.shape == (n, ns, h, d)
    projs = _lsh_projections(torch.Generator().manual_seed(3), h, d, chunk, sf, pre) if stype == "lsh" else None
    order_matters = sbs % max(chunk // sf, 1) != 0
    for r in range(n):
        rk, rv, ok = ref_sparse(
            stype, q0[r], k[r].transpose(0, 1), v[r].transpose(0, 1), valid[r], bs, sbs, sf, projs
        )  # (h, ns, d), ok (h, ns)
        got_ok = torch.ones(h, ns, dtype=torch.bool) if sm is None else (sm[r] == 0).expand(h, ns)
        for hh in range(h):
            if stype == "norm" and not order_matters:
                # only the set of real entries per chunk is defined (which padded tokens fill a
                # chunk's remaining slots is not): compare those sets, sorted
                e = chunk // sf
                for c0 in range(0, ns, e):
                    mine, ref = got_ok[hh, c0 : c0 + e], ok[hh, c0 : c0 + e]
                    assert mine.sum() == ref.sum()
                    for a, b in (
                        (sk[r, c0 : c0 + e, hh][mine], rk[hh, c0 : c0 + e][ref]),
                        (sv[r, c0 : c0 + e, hh][mine], rv[hh, c0 : c0 + e][ref]),
                    ):
                        assert torch.allclose(
                            _by_chunk(a, len(a)) if len(a) else a, _by_chunk(b, len(b)) if len(b) else b, atol=1e-5
                        )
                continue
            assert torch.equal(got_ok[hh], ok[hh])
            real = ok[hh]
            assert torch.allclose(sk[r, :, hh][real], rk[hh][real], atol=1e-5)
            assert torch.allclose(sv[r, :, hh][real], rv[hh][real], atol=1e-5)


def test_factor_one_is_the_tokens_themselves():
    k, v = torch.randn(1, 8, 2, 4), torch.randn(1, 8, 2, 4)
    mask = torch.zeros(1, 8)
    sk, sv, sm = sparse.sparse_sequence("norm", None, k, v, mask, block_size=4, sparse_block_size=4, sparsity_factor=1)
    assert sk is k and sv is v and sm.shape == (1, 1, 8)


def test_norm_never_picks_padding_and_gathers_whole_rows():
    # one chunk of 4 tokens, keep 2: the two largest norms among the real tokens, per head
    k = torch.zeros(1, 4, 2, 3)
    k[0, :, 0] = torch.tensor([1.0, 5.0, 3.0, 9.0])[:, None]  # head 0: token 3 is padding
    k[0, :, 1] = torch.tensor([4.0, 1.0, 2.0, 0.5])[:, None]
    v = k + 100
    mask = torch.tensor([[0.0, 0.0, 0.0, NEG]])
    sk, sv, sm = sparse.norm(k, v, mask, chunk=4, sf=2, order_matters=True)
    assert sk[0, :, 0, 0].tolist() == [3.0, 5.0] and sk[0, :, 1, 0].tolist() == [2.0, 4.0]  # ascending norm
    assert torch.equal(sv, sk + 100) and (sm == 0).all()


def test_lsh_requires_a_mask():
    k = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match="lsh needs a key mask"):
        sparse.sparse_sequence("lsh", k[:, 0], k, k, None, block_size=4, sparse_block_size=4, sparsity_factor=2)
    with pytest.raises(ValueError, match="lsh needs a key mask"):  # called directly, too
        sparse.lsh(k[:, 0], k, k, None, chunk=4, sf=2, pre_rounds=1, sparse_block_size=4)


def test_gradients_flow_to_selected_keys_only():
    # two rows cut from a padded buffer, as the CPU path hands them over: not one (n * t * h, d) view
    buf = torch.randn(2, 12, 2, 4, requires_grad=True)
    vbuf = torch.randn(2, 12, 2, 4, requires_grad=True)
    k, v = buf[:, 2:10], vbuf[:, 2:10]
    sk, sv, _ = sparse.stride(k, v, None, sf=4)  # head 0: tokens 0, 4; head 1: tokens 1, 5
    assert torch.equal(sk[1, :, 1], k[1, [1, 5], 1]) and torch.equal(sv[0, :, 0], v[0, [0, 4], 0])
    (sk.sum() + 2 * sv.sum()).backward()
    expect = torch.zeros(12, 2)
    expect[[2, 6], 0] = 1
    expect[[3, 7], 1] = 1
    for r in range(2):
        assert torch.equal(buf.grad[r, :, :, 0], expect) and torch.equal(vbuf.grad[r, :, :, 0], 2 * expect)


def test_norm_gathers_each_rows_own_tokens_from_a_padded_buffer():
    # each row picks other tokens (idx (n, ns, h)); the rows are apart in the buffer
    buf = torch.randn(3, 20, 2, 4)
    buf[1, 4:6] *= 10  # row 1: tokens 2 and 3 of k win its first chunk, whatever the other rows pick
    k = buf[:, 2:18]
    sk, _, _ = sparse.norm(k, k, None, chunk=4, sf=2, order_matters=False)
    for r in range(3):
        for hh in range(2):
            want = k[r, :4, hh][k[r, :4, hh].norm(dim=-1).topk(2).indices]
            assert torch.equal(_by_chunk(sk[r, :2, hh], 2), _by_chunk(want, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,idx_rows", [(1, 1), (2, 2), (2, 1)], ids=["one_row", "per_row_index", "shared_index"])
def test_both_copy_forms_give_the_same_rows_and_gradients(n, idx_rows, dtype):
    """gather_rows' CPU form (index_select on the batch's (token, head) rows) and its form elsewhere
    (gather by the index expanded over d) copy the same rows: the same values and gradients, for
    keys that are a strided slice of a bigger buffer (the tokens after the globals)."""
    g = torch.Generator().manual_seed(0)
    t, h, d, G, ns = 40, 3, 8, 2, 10
    buf = torch.randn(n, G + t, h, d, generator=g).to(dtype)
    idx = torch.randint(0, t, (idx_rows, ns, h), generator=g)
    results = []
    for form in (sparse._rows_by_index, sparse._rows_by_gather):
        kb, vb = buf.clone().requires_grad_(True), (buf * 2).clone().requires_grad_(True)
        sk, sv = form(kb[:, G:], vb[:, G:], idx)
        weights = torch.linspace(-1, 1, sk.numel()).view(sk.shape).to(dtype)
        ((sk * weights).sum() + (sv * weights).sum()).backward()
        results.append((sk, sv, kb.grad, vb.grad))
    for a, b in zip(*results):
        assert a.shape == b.shape and torch.equal(a, b)
    assert results[0][0].shape == (n, ns, h, d)


def test_the_gather_form_issues_four_ops():
    from conftest import load_script

    OpCounter = load_script("benchmarks/op_count.py", "op_count").OpCounter
    k = torch.randn(1, 64, 4, 8)
    idx = torch.randint(0, 64, (1, 16, 4))
    with OpCounter() as by_gather:
        sparse._rows_by_gather(k, k, idx)
    with OpCounter() as by_index:
        sparse._rows_by_index(k, k, idx)
    assert sum(by_gather.ops.values()) == 4 and by_gather.ops["gather"] == 2
    assert sum(by_index.ops.values()) > 10
