"""Block and band index arithmetic shared by block-sparse attentions (LSG, Longformer/LED).

Every function here is pure (no parameters, no fairseq) and works on any dtype/device.

Glossary (LSG paper, Condevaux & Harispe 2023, and ``spec/lsg.md``):

- ``block_size`` (bs): queries are processed in blocks of bs consecutive tokens; block j holds
  tokens ``[j*bs, (j+1)*bs)``.
- local window: block j attends to the blocks ``j-backward .. j+forward`` (LSG: 1 and 1, i.e.
  ``3*bs`` keys); blocks outside ``[0, n_blocks)`` are padding (``local_window_indices``). A
  Longformer sliding window of one-sided width w is the same band with ``block_size = w`` and an
  exact-distance mask from ``relative_positions``.
- sparse sequence: a compressed copy of the sequence with ``t / sparsity_factor`` entries; its
  index p stands for tokens ``[p*sf, (p+1)*sf)``. ``step = bs / sf`` sparse entries per block.
- ``sparse_block_size`` (sbs): block j takes sbs sparse entries immediately before and sbs
  immediately after its local window (``sparse_window_indices``).

Index helpers return ``(index, valid)`` pairs: ``index`` may point outside the source sequence
and ``valid`` says where; ``clamp_index`` turns such a pair into something safe for
``index_select``/``gather`` (out-of-range entries point at a caller-chosen padding slot).
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

# Gathered key sets are padded with masked keys up to a multiple of this, so that an additive
# mask's last dimension is aligned for the fused SDPA kernels (masked keys add exactly 0 weight).
KEY_ALIGN = 8


def num_blocks(length: int, block_size: int) -> int:
    """Number of blocks of ``block_size`` needed to cover ``length`` items (ceil division)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return -(-length // block_size)


def padded_length(length: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``length``."""
    return num_blocks(length, multiple) * multiple


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int = -1, value: float = 0.0) -> Tuple[torch.Tensor, int]:
    """Right-pad ``x`` along ``dim`` with ``value`` up to a multiple of ``multiple``.

    Returns ``(padded, pad_len)``; ``padded is x`` when no padding is needed (no copy).
    """
    dim = dim % x.dim()
    length = x.size(dim)
    pad_len = padded_length(length, multiple) - length
    if pad_len == 0:
        return x, 0
    # F.pad takes (left, right) pairs starting from the LAST dimension.
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, pad_len]
    if x.dtype == torch.bool:
        return F.pad(x.to(torch.uint8), pad, value=int(bool(value))).bool(), pad_len
    return F.pad(x, pad, value=value), pad_len


def local_window_indices(
    n_blocks: int, block_size: int, backward: int = 1, forward: int = 1, device: Optional[torch.device] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Token indices of the local window of every block.

    Returns ``(index, valid)`` of shape ``(n_blocks, (backward + 1 + forward) * block_size)``:
    block j sees tokens ``[(j - backward) * bs, (j + 1 + forward) * bs)``; ``valid`` is False
    outside ``[0, n_blocks * bs)``.
    """
    width = (backward + 1 + forward) * block_size
    start = (torch.arange(n_blocks, device=device) - backward) * block_size  # (n_blocks,)
    index = start[:, None] + torch.arange(width, device=device)[None, :]  # (n_blocks, width)
    valid = (index >= 0) & (index < n_blocks * block_size)
    return index, valid


def sparse_window_indices(
    n_blocks: int,
    step: int,
    sparse_block_size: int,
    n_sparse: Optional[int] = None,
    backward: int = 1,
    forward: int = 1,
    device: Optional[torch.device] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sparse-sequence indices seen by every block (LSG, spec/lsg.md section 4 Step B).

    With ``step = block_size / sparsity_factor`` sparse entries per block and the local window
    covering blocks ``j - backward .. j + forward``, block j gets the ``sparse_block_size``
    entries immediately before the window and the ``sparse_block_size`` entries immediately
    after it::

        [(j - backward) * step - sbs, (j - backward) * step)
          U [(j + 1 + forward) * step, (j + 1 + forward) * step + sbs)

    (for LSG, backward = forward = 1: ``[(j-1)*step - sbs, (j-1)*step) U [(j+2)*step, ...)``),
    so sparse keys never duplicate local ones. This formula holds for every
    ``(bs, sbs, sf)``; the reference's pad+unfold arithmetic only reproduces it for an even
    ``step`` with ``4*sbs > 3*step`` (spec section 7), which is a bug we do not copy.

    Returns ``(index, valid)`` of shape ``(n_blocks, 2 * sparse_block_size)``, "before" entries
    first; ``valid`` is False outside ``[0, n_sparse)`` (default ``n_blocks * step``).
    """
    if n_sparse is None:
        n_sparse = n_blocks * step
    j = torch.arange(n_blocks, device=device)[:, None]  # (n_blocks, 1)
    r = torch.arange(sparse_block_size, device=device)[None, :]  # (1, sbs)
    before = (j - backward) * step - sparse_block_size + r  # (n_blocks, sbs)
    after = (j + 1 + forward) * step + r  # (n_blocks, sbs)
    index = torch.cat([before, after], dim=1)  # (n_blocks, 2*sbs)
    valid = (index >= 0) & (index < n_sparse)
    return index, valid


def clamp_index(index: torch.Tensor, valid: torch.Tensor, pad_slot: int) -> torch.Tensor:
    """Replace invalid entries of ``index`` by ``pad_slot`` (e.g. an appended zero row)."""
    return torch.where(valid, index, torch.full_like(index, pad_slot))


def relative_positions(
    block_size: int, backward: int = 1, forward: int = 1, device: Optional[torch.device] = None
) -> torch.Tensor:
    """``key_pos - query_pos`` inside a local window, shape ``(bs, (backward+1+forward)*bs)``.

    The same for every block, since blocks are aligned: query i of a block against key k of its
    local window (``local_window_indices``). A sliding window of one-sided width w keeps ``|rel| <= w``.
    """
    q = torch.arange(block_size, device=device)[:, None]  # (bs, 1)
    k = torch.arange((backward + 1 + forward) * block_size, device=device)[None, :]  # (1, W)
    return k - backward * block_size - q  # (bs, W)


def blocks(x: torch.Tensor, block_size: int, dim: int = -2) -> torch.Tensor:
    """Split ``dim`` (a multiple of ``block_size``) into ``(n_blocks, block_size)`` (a view)."""
    dim = dim % x.dim()
    n = x.size(dim)
    if n % block_size != 0:
        raise ValueError(f"length {n} must be divisible by block size {block_size}")
    shape = list(x.shape[:dim]) + [n // block_size, block_size] + list(x.shape[dim + 1 :])
    return x.reshape(shape)


def compact_indices(flags: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Positions of the True entries of each row of ``flags`` (n, L), left-aligned.

    Returns ``(index, valid)`` of shape ``(n, m)`` with m the largest count of a row: row b's
    flagged positions in increasing order, then filler entries (``valid`` False) pointing at
    position 0 so that gathers stay in range. Used for per-row global tokens (Longformer).
    """
    counts = flags.sum(dim=1)  # (n,)
    m = int(counts.max()) if flags.numel() else 0
    # stable sort of "not flagged": flagged positions first, each group in position order
    order = torch.sort((~flags.bool()).to(torch.uint8), dim=1, stable=True).indices[:, :m]  # (n, m)
    valid = torch.arange(m, device=flags.device)[None, :] < counts[:, None]  # (n, m)
    return torch.where(valid, order, torch.zeros_like(order)), valid
