"""Rows gathered by a fixed index, with a backward that sums each row's readers instead of adding
them one by one into the source.

The whole-tensor paths copy every query block's key set out of the keys with one ``index_select``
(``LSGSelfAttention._lsg_gathered``, ``LongformerSelfAttention._local``). Autograd's backward of
that is ``index_add_``: every gathered row added into its source row, on a GPU with one atomic add
per element, far slower there than the forward's copy of the same bytes (measured in
``benchmarks/flex_gpu_notes.md``).
The index is the same for every call of a shape, so its transpose can be made once: for every
source row the positions that read it (its *fan-in*, bounded by the pattern: 3 local windows for a
token, a few sparse windows for a sparse entry). The backward is then a gather of those positions
and a sum over them: plain copies and one reduction, and the same bits in every run (the only
atomic adds left are the few global rows', each added once, or with zeros).

Glossary: B blocks in ``groups`` groups of consecutive blocks (LED: one per batch row), K positions
a block (its key set), P = B * K positions in all, N source rows, R the largest fan-in (the table's
width). A block's first ``shared`` positions read the same source rows in every block of its group
(the global tokens: a fan-in of B / groups); their gradient is a sum over the group's blocks, added
to those few rows, and kept out of the table. Positions the caller masks (``valid`` False: padding,
out-of-range keys) are left out of the backward: a masked key has softmax weight exactly 0 for a
query that sees any key, so its gradient is exactly 0 (``tests/test_fan_in.py`` shows it through
the attention). A query that sees none (a padding row of LED, or of LSG without global tokens)
spreads its weight over masked keys, but the model reads no padding row's output, so no gradient
comes back through one. A masked position fills the table where a row has fewer readers than R,
so that the backward reads no padded copy.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor


def wanted(setting: Optional[bool], keys: Tensor) -> bool:
    """Whether a layer's gathers take :func:`gather_rows`: ``setting`` (its ``fan_in_backward``)
    True or False, or None: off the CPU (a CPU adds in order, and keeps its numbers); and only
    where a gradient will flow back to ``keys``."""
    on = keys.device.type != "cpu" if setting is None else setting
    return on and torch.is_grad_enabled() and keys.requires_grad


def fan_in_table(index: Tensor, valid: Tensor, num_rows: int, shared: int, width: int, groups: int = 1) -> Tensor:
    """The positions reading each source row, for :func:`gather_rows`' backward.

    index, valid (B, K): the source row of every position of every block and whether it counts
    (see the module's docstring; the first ``shared`` columns read the same rows in every block of
    a group and are not in the table; at least one other position must be masked). Returns
    (num_rows, width) int64: the flattened positions (b * K + k) that read each row, then the first
    masked position (whose gradient is zero) up to ``width``. No host-device synchronisation: a
    broken precondition trips an asynchronous device assert.
    """
    B, K = index.shape
    device = index.device
    counted = valid.clone()
    counted[:, :shared] = False
    pos = torch.arange(B * K, device=device)
    rows = torch.where(counted, index, num_rows).reshape(-1)  # not counted: row num_rows
    rows, order = torch.sort(rows, stable=True)
    pos = pos[order]
    counts = torch.zeros(num_rows + 1, dtype=torch.long, device=device).index_add_(0, rows, torch.ones_like(rows))
    torch._assert_async(counts[:num_rows].max() <= width, "a source row has more readers than the fan-in table's width")
    masked = ~valid
    masked[:, :shared] = False
    torch._assert_async(masked.any(), "the fan-in table needs a masked position (its zero slot)")
    zero = torch.argmax(masked.view(-1).to(torch.int32))  # the first masked position
    first = torch.cumsum(counts, 0) - counts  # where each row's readers start in the sorted order
    slot = torch.arange(rows.numel(), device=device) - first[rows]
    keep = (rows < num_rows) & (slot < width)
    # one more row and column take what is not kept (a boolean selection would wait for the device)
    table = zero.expand(num_rows + 1, width + 1).clone()
    table.index_put_((torch.where(keep, rows, num_rows), torch.where(keep, slot, width)), pos)
    if shared:
        head = index[:, :shared].reshape(groups, B // groups, shared)
        torch._assert_async((head == head[:, :1]).all(), "the shared columns must read the same rows in a group")
    return table[:num_rows, :width].contiguous()


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src: Tensor, index: Tensor, table: Tensor, shared: int, blocks: int, groups: int) -> Tensor:
        ctx.save_for_backward(index, table)
        ctx.shared, ctx.blocks, ctx.groups = shared, blocks, groups
        return src.index_select(1, index)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, None, None, None, None, None]:
        index, table = ctx.saved_tensors
        n, P = grad.shape[:2]
        rest = grad.shape[2:]
        N, R = table.shape
        # each row's readers summed (accumulated in float32 by the reduction, rounded once)
        out = grad.index_select(1, table.view(-1)).view(n, N, R, *rest).sum(2)  # (n, N, ...)
        if ctx.shared:
            B, G, S = ctx.blocks, ctx.groups, ctx.shared
            K = P // B
            summed = grad.reshape(n, G, B // G, K, *rest)[:, :, :, :S].sum(2)  # (n, G, S, ...)
            rows = index.view(G, B // G, K)[:, 0, :S].reshape(-1)  # (G*S,) the groups' shared rows
            out.index_add_(1, rows, summed.reshape(n, G * S, *rest))
        return out, None, None, None, None, None


def gather_rows(src: Tensor, index: Tensor, table: Tensor, shared: int, blocks: int, groups: int = 1) -> Tensor:
    """``src.index_select(1, index)`` (src (n, N, ...), index (P,) = (blocks * K,) flattened), whose
    backward sums each row's readers from ``table`` (:func:`fan_in_table` of the same index) and
    the ``shared`` columns over each group's blocks. The forward is the same copy; the gradient is
    ``index_select``'s where the masked positions' gradient is zero (as the attention makes it)."""
    return _GatherRows.apply(src, index, table, shared, blocks, groups)
