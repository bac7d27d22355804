import itertools

import pytest
import torch
import torch.nn.functional as F

from lsg_layers.ops import blocks as B


def test_num_blocks_and_padded_length():
    assert B.num_blocks(0, 4) == 0
    assert B.num_blocks(1, 4) == 1
    assert B.num_blocks(8, 4) == 2
    assert B.num_blocks(9, 4) == 3
    assert B.padded_length(9, 4) == 12
    with pytest.raises(ValueError, match="block_size"):
        B.num_blocks(3, 0)


@pytest.mark.parametrize("length", [1, 7, 8, 13])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_pad_to_multiple(length, dim):
    shape = [3, 5, 2]
    shape[dim] = length
    x = torch.randn(*shape)
    y, pad = B.pad_to_multiple(x, 4, dim=dim, value=7.0)
    assert y.size(dim) % 4 == 0 and y.size(dim) == length + pad and 0 <= pad < 4
    assert torch.equal(y.narrow(dim, 0, length), x)
    assert bool((y.narrow(dim, length, pad) == 7.0).all())
    if pad == 0:
        assert y is x


def test_pad_to_multiple_bool():
    m = torch.tensor([[False, True, False]])
    y, pad = B.pad_to_multiple(m, 2, dim=1, value=True)
    assert pad == 1 and y.dtype == torch.bool
    assert y.tolist() == [[False, True, False, True]]


@pytest.mark.parametrize("backward,forward", [(1, 1), (0, 1), (2, 0), (1, 3)])
def test_local_window_indices(backward, forward):
    nb, bs = 5, 3
    index, valid = B.local_window_indices(nb, bs, backward, forward)
    width = (backward + 1 + forward) * bs
    assert index.shape == valid.shape == (nb, width)
    for j in range(nb):
        # block j sees blocks j-backward .. j+forward in order; its own tokens at offset backward*bs
        assert index[j].tolist() == list(range((j - backward) * bs, (j + 1 + forward) * bs))
        assert index[j, backward * bs : (backward + 1) * bs].tolist() == list(range(j * bs, (j + 1) * bs))
    assert torch.equal(valid, (index >= 0) & (index < nb * bs))


def test_relative_positions():
    rel = B.relative_positions(2, 1, 1)
    assert rel.tolist() == [[-2, -1, 0, 1, 2, 3], [-3, -2, -1, 0, 1, 2]]


def test_sparse_window_formula():
    index, valid = B.sparse_window_indices(n_blocks=4, step=2, sparse_block_size=3)
    # block j: [(j-1)*2-3, (j-1)*2) U [(j+2)*2, (j+2)*2+3)
    assert index[0].tolist() == [-5, -4, -3, 4, 5, 6]
    assert index[2].tolist() == [-1, 0, 1, 8, 9, 10]
    assert valid[2].tolist() == [False, True, True, False, False, False]


def test_sparse_windows_never_overlap_local_window():
    for bs, sf, sbs in itertools.product([2, 4, 6, 8], [1, 2, 3, 4], [1, 2, 3, 5, 8]):
        if bs % sf:
            continue
        step = bs // sf
        nb = 6
        index, valid = B.sparse_window_indices(nb, step, sbs)
        for j in range(nb):
            covered = set(index[j][valid[j]].tolist())
            # sparse entry p stands for tokens [p*sf, (p+1)*sf); local window is [(j-1)bs, (j+2)bs)
            tokens = {p * sf + r for p in covered for r in range(sf)}
            local = set(range((j - 1) * bs, (j + 2) * bs))
            assert not tokens & local
            assert len(covered) == len(index[j][valid[j]])  # no duplicates


def _reference_sparse_blocks(x, bs, sbs, sf):
    """The reference's pad+unfold Step B (spec/lsg.md section 4), for x of shape (n_sparse, 1)."""
    size, step = sbs * 3, bs // sf
    odd_offset = step % 2
    size = size * 2
    s = (size - step) // 2 + odd_offset
    x = F.pad(x.t(), (s, s), value=-1.0).t()
    x = x.unfold(-2, size=size, step=step).transpose(-1, -2)
    if odd_offset:
        x = x[..., :-1, :, :]
    u = (size - bs * 3 // sf) // 2 + odd_offset
    u_ = u + odd_offset
    return torch.cat([x[..., u - sbs : u, :], x[..., -u_ : -u_ + sbs, :]], dim=-2)


def test_sparse_window_matches_reference_on_its_valid_domain():
    checked = 0
    for bs, sf, sbs in itertools.product([4, 8, 16, 32], [1, 2, 4, 8], [2, 4, 8, 16, 32]):
        if bs % sf or sbs < bs // sf:
            continue
        step = bs // sf
        if step % 2 or 4 * sbs <= 3 * step:
            continue  # outside the reference's correct domain (spec section 7)
        nb = 5
        ns = nb * step
        ref = _reference_sparse_blocks(torch.arange(ns, dtype=torch.float)[:, None], bs, sbs, sf)
        index, valid = B.sparse_window_indices(nb, step, sbs)
        ours = torch.where(valid, index, torch.full_like(index, -1)).float()
        assert torch.equal(ref[..., 0], ours), (bs, sf, sbs)
        checked += 1
    assert checked > 20


def test_clamp_index_and_blocks():
    index, valid = B.local_window_indices(2, 2)
    safe = B.clamp_index(index, valid, pad_slot=99)
    assert safe[0].tolist() == [99, 99, 0, 1, 2, 3]
    x = torch.arange(12).reshape(1, 6, 2)
    assert B.blocks(x, 3, dim=1).shape == (1, 2, 3, 2)
    with pytest.raises(ValueError, match="divisible"):
        B.blocks(x, 4, dim=1)


def test_compact_indices():
    flags = torch.tensor(
        [[False, True, False, True, True], [True, False, False, False, False], [False, False, False, False, False]]
    )
    index, valid = B.compact_indices(flags)
    assert index.shape == (3, 3)
    assert valid.tolist() == [[True, True, True], [True, False, False], [False, False, False]]
    assert index[0].tolist() == [1, 3, 4]
    assert index[1, 0].item() == 0 and index[valid].tolist() == [1, 3, 4, 0]
    assert bool((index[~valid] == 0).all())  # fillers stay in range
    # rows with many flags: order kept, every flagged position listed once
    big = torch.rand(4, 300) < 0.3
    index, valid = B.compact_indices(big)
    for row in range(4):
        assert index[row][valid[row]].tolist() == big[row].nonzero().flatten().tolist()
    empty_index, empty_valid = B.compact_indices(torch.zeros(2, 5, dtype=torch.bool))
    assert empty_index.shape == (2, 0) and empty_valid.shape == (2, 0)
