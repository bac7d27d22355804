"""ops.fan_in: rows gathered by a fixed index, whose backward sums each row's readers (no atomic
adds), against ``index_select``'s own backward and a table made by hand; and LSG's and LED's
gathered paths with it, against the same paths with ``index_select`` (every LSG sparsity type,
padding, globals; LED's per-row globals)."""

import pytest
import torch

from lsg_layers.modules.longformer_attention import LongformerSelfAttention
from lsg_layers.modules.lsg_attention import LSGSelfAttention
from lsg_layers.ops import fan_in

SPARSITY = ["none", "norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh"]


def slow_table(index, valid, num_rows, shared, width):
    """The table by its definition, one position at a time: each row's readers, then the first
    masked position (the zero slot) up to the width; each row sorted."""
    B, K = index.shape
    readers = [[] for _ in range(num_rows)]
    masked = []
    for b in range(B):
        for k in range(shared, K):
            if valid[b, k]:
                readers[int(index[b, k])].append(b * K + k)
            else:
                masked.append(b * K + k)
    return [sorted(r + [masked[0]] * (width - len(r))) for r in readers]


def random_case(seed, B=5, K=9, num_rows=12, shared=2):
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(shared, num_rows, (B, K), generator=g)
    index[:, :shared] = torch.arange(shared)
    valid = torch.rand(B, K, generator=g) > 0.3
    width = int(max(torch.bincount(index[:, shared:][valid[:, shared:]], minlength=num_rows).max(), 1))
    return index, valid, num_rows, shared, width


@pytest.mark.parametrize("seed", range(4))
def test_the_table_lists_each_rows_readers(seed):
    index, valid, num_rows, shared, width = random_case(seed)
    table = fan_in.fan_in_table(index, valid, num_rows, shared, width)
    assert [sorted(row) for row in table.tolist()] == slow_table(index, valid, num_rows, shared, width)


def test_a_row_with_more_readers_than_the_width_is_an_error():
    index, valid, num_rows, shared, width = random_case(0)
    with pytest.raises(RuntimeError, match="more readers"):
        fan_in.fan_in_table(index, valid, num_rows, shared, width - 1)


def test_a_table_without_a_masked_position_is_an_error():
    """Its zero slot is a masked position; the shared columns (never masked) do not count."""
    index, valid, num_rows, shared, width = random_case(0)
    valid = valid.clone()
    valid[:, shared:] = True
    valid[:, :shared] = False
    with pytest.raises(RuntimeError, match="masked position"):
        fan_in.fan_in_table(index, valid, num_rows, shared, width + 8)


@pytest.mark.parametrize("seed", range(4))
def test_the_gradient_is_index_selects_without_the_positions_left_out(seed):
    """float64: the forward is index_select's copy; the gradient equals index_select's when the
    upstream gradient of the positions the table leaves out (masked keys) is zero, as the
    attention makes it."""
    index, valid, num_rows, shared, width = random_case(seed)
    B, K = index.shape
    g = torch.Generator().manual_seed(100 + seed)
    src = torch.randn(2, num_rows, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    upstream = torch.randn(2, B * K, 3, 4, dtype=torch.float64, generator=g)
    upstream = upstream * valid.reshape(1, B * K, 1, 1)  # what a masked key's gradient is
    table = fan_in.fan_in_table(index, valid, num_rows, shared, width)
    out = fan_in.gather_rows(src, index.reshape(-1), table, shared, B)
    assert torch.equal(out, src.index_select(1, index.reshape(-1)))
    (ours,) = torch.autograd.grad(out, src, upstream)
    (reference,) = torch.autograd.grad(src.index_select(1, index.reshape(-1)), src, upstream)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-12)


def test_left_out_positions_would_count_in_index_selects_gradient():
    """The check above can fail: with an upstream gradient at a position the table leaves out,
    index_select's gradient differs."""
    index, valid, num_rows, shared, width = random_case(1)
    assert not valid.all()
    src = torch.randn(1, num_rows, 2, dtype=torch.float64, requires_grad=True)
    upstream = torch.ones(1, index.numel(), 2, dtype=torch.float64)
    table = fan_in.fan_in_table(index, valid, num_rows, shared, width)
    (ours,) = torch.autograd.grad(
        fan_in.gather_rows(src, index.reshape(-1), table, shared, index.size(0)), src, upstream
    )
    (reference,) = torch.autograd.grad(src.index_select(1, index.reshape(-1)), src, upstream)
    assert not torch.allclose(ours, reference)


def test_bfloat16_rounds_once():
    """bfloat16: each row's readers summed in float32 and rounded once, within half a bfloat16
    step of the float64 sum."""
    index, valid, num_rows, shared, width = random_case(2, B=40, K=16, num_rows=50)
    src = torch.zeros(1, num_rows, 64, dtype=torch.bfloat16, requires_grad=True)
    upstream = (torch.randn(1, index.numel(), 64) * valid.reshape(1, -1, 1)).to(torch.bfloat16)
    table = fan_in.fan_in_table(index, valid, num_rows, shared, width)
    (ours,) = torch.autograd.grad(
        fan_in.gather_rows(src, index.reshape(-1), table, shared, index.size(0)), src, upstream
    )
    exact = torch.zeros(1, num_rows, 64, dtype=torch.float64).index_add_(1, index.reshape(-1), upstream.double())
    half_step = exact.abs() * 2.0**-8  # bfloat16 keeps 8 significant bits: half a step is at most this
    assert ((ours.double() - exact).abs() <= half_step).all()


def lsg_layer(sparsity, G=2):
    torch.manual_seed(0)
    sbs = 0 if sparsity == "none" else 8
    layer = LSGSelfAttention(
        32, 4, num_global_tokens=G, block_size=8, sparse_block_size=sbs, sparsity_factor=2, sparsity_type=sparsity
    ).double()
    layer.generator = torch.Generator().manual_seed(1)
    layer.path = "whole"
    return layer


@pytest.mark.parametrize("sparsity", SPARSITY)
def test_lsg_gathered_path_gradients_equal_index_selects(sparsity):
    """The whole-tensor (gathered) path with the fan-in backward against the same path with
    index_select's, float64, two rows of which one padded (masked keys, an input not a multiple
    of the block), globals: the same outputs bit for bit and every gradient within 1e-12."""
    T, n, C = 2 + 45, 2, 32
    x0 = torch.randn(T, n, C, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    pad = torch.zeros(n, T, dtype=torch.bool)
    pad[1, -7:] = True
    results = []
    for fan in (False, True):
        layer = lsg_layer(sparsity)
        layer.fan_in_backward = fan
        x = x0.clone().requires_grad_(True)
        layer.generator = torch.Generator().manual_seed(1)
        out, _ = layer(x, x, x, key_padding_mask=pad)
        assert layer.ran == "whole"
        grads = torch.autograd.grad((out * out.detach().sin()).sum(), [x] + list(layer.parameters()))
        results.append((out, grads))
    (out_a, grads_a), (out_b, grads_b) = results
    assert torch.equal(out_a, out_b)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_the_layer_takes_the_fan_in_backward_off_the_cpu_only(monkeypatch):
    """None (the default): index_select's backward on a CPU (the demo's numbers), the fan-in one
    elsewhere; never without autograd."""
    calls = []
    real = fan_in.gather_rows
    monkeypatch.setattr(fan_in, "gather_rows", lambda *a: calls.append(1) or real(*a))
    layer = lsg_layer("norm")
    x = torch.randn(2 + 40, 1, 32, dtype=torch.float64, requires_grad=True)
    layer(x, x, x)[0].sum().backward()
    assert not calls
    layer.fan_in_backward = True
    layer(x, x, x)[0].sum().backward()
    assert len(calls) == 2  # keys and values
    with torch.no_grad():
        layer(x, x, x)
    assert len(calls) == 2


def test_shared_columns_per_group():
    """Groups of blocks (LED: one per batch row) whose shared columns read their own rows: the
    gradient is index_select's where the masked positions' gradient is zero."""
    g = torch.Generator().manual_seed(7)
    groups, per, K, num_rows, shared = 3, 4, 10, 30, 2
    index = torch.randint(0, num_rows, (groups * per, K), generator=g)
    heads = torch.randint(0, num_rows, (groups, shared), generator=g)
    index[:, :shared] = heads.repeat_interleave(per, dim=0)
    valid = torch.rand(groups * per, K, generator=g) > 0.3
    valid[:, :shared] = True
    width = int(torch.bincount(index[:, shared:][valid[:, shared:]], minlength=num_rows).max())
    table = fan_in.fan_in_table(index, valid, num_rows, shared, width, groups=groups)
    src = torch.randn(2, num_rows, 3, dtype=torch.float64, generator=g, requires_grad=True)
    upstream = torch.randn(2, index.numel(), 3, dtype=torch.float64, generator=g) * valid.reshape(1, -1, 1)
    out = fan_in.gather_rows(src, index.reshape(-1), table, shared, groups * per, groups)
    (ours,) = torch.autograd.grad(out, src, upstream)
    (reference,) = torch.autograd.grad(src.index_select(1, index.reshape(-1)), src, upstream)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-12)
    with pytest.raises(RuntimeError, match="same rows in a group"):
        fan_in.fan_in_table(index, valid, num_rows, shared, width, groups=1)


@pytest.mark.parametrize("with_globals", [False, True])
def test_led_gathered_path_gradients_equal_index_selects(with_globals, monkeypatch):
    """LED's whole-tensor path (a window spanning neighbouring blocks, two rows, one padded,
    different global positions per row) with the fan-in backward against index_select's,
    float64: the same outputs bit for bit, every gradient within 1e-12. The loss reads no padding
    row, as the model's does (a padding query whose keys are all masked spreads its weight over
    them: the fan-in backward leaves that out)."""
    T, n, C = 70, 2, 32
    x0 = torch.randn(T, n, C, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    pad = torch.zeros(n, T, dtype=torch.bool)
    pad[1, -9:] = True
    glob = None
    if with_globals:
        glob = torch.zeros(n, T, dtype=torch.bool)
        glob[0, [0, 17]] = True
        glob[1, [3]] = True
    calls = []
    real = fan_in.gather_rows
    monkeypatch.setattr(fan_in, "gather_rows", lambda *a: calls.append(1) or real(*a))
    results = []
    for fan in (False, True):
        torch.manual_seed(0)
        layer = LongformerSelfAttention(C, 4, 8).double()
        layer.path = "whole"
        layer.fan_in_backward = fan
        x = x0.clone().requires_grad_(True)
        out, _ = layer(x, x, x, key_padding_mask=pad, global_attention_mask=glob)
        assert layer.ran == "whole"
        inputs = [x] + list(layer.parameters())
        not_pad = (~pad).t()[:, :, None].double()  # (T, n, 1)
        grads = torch.autograd.grad((out * out.detach().cos() * not_pad).sum(), inputs, allow_unused=True)
        results.append((out, grads))
        assert len(calls) == (2 if fan else 0)  # keys and values, once each
    (out_a, grads_a), (out_b, grads_b) = results
    assert torch.equal(out_a, out_b)
    for a, b in zip(grads_a, grads_b):
        assert (a is None) == (b is None) and (a is None) == (not with_globals and b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
