"""LSG's and Longformer's attention patterns as FlexAttention masks (the GPU path without gathers).

``torch.nn.attention.flex_attention`` runs one fused kernel over tiles of ``BLOCK`` queries x
``BLOCK`` keys of ONE key/value tensor and skips the tiles a :class:`BlockMask` leaves out; inside
a kept tile a ``mask_mod(b, h, q_idx, kv_idx) -> bool`` says which pairs attend. So a block-sparse
pattern needs neither the per-block key copies nor the float masks of the gathered path
(``LSGSelfAttention._lsg_gathered``, ``LongformerSelfAttention._local``): each key is read from
the projection's own buffer, and "masked" is a bool computed in the kernel.

This module holds, as pure functions of index arithmetic (no parameters, no host reads):

- the mask_mods, written from the patterns' definitions (``spec/lsg.md`` section 3, ``spec/led.md``
  section 4) and tested with ``create_mask`` against the dense masks of the slow references;
- the block masks, built from per-tile ranges (``_block_mask``): which key tiles a query tile
  touches and which it keeps whole. Nothing of size queries x keys is built (``create_block_mask``
  would evaluate the mask_mod on every pair: 6e9 pairs at 64K tokens), only the
  (rows, query tiles, key tiles) grid, and it is built once per forward and shared by the layers;
- :func:`flex_attention`: the compiled kernel (compiled once per process, lazily).

Glossary as ``ops.blocks``: n rows, h heads, t tokens (LSG: a multiple of bs), G global tokens, bs
block size, step = bs / sf, sbs sparse block size, ns sparse entries, w Longformer's one-sided
window. Tiles are ``BLOCK`` = 128 positions (flex's default).

Limits (torch 2.11-2.13): no dropout on the probabilities; on CPU forward only, compiled (eager
flex evaluates the dense mask), and a head dim under 16 gives wrong results there (the last row
and head of the batch; seen with torch 2.13), so :func:`supported` refuses it on every device.
"""

import copy
from typing import Callable, Dict, NamedTuple, Optional

import torch
from torch import Tensor

from lsg_layers.ops.compiling import raise_recompile_limit

BLOCK = 128
MIN_HEAD_DIM = 16

# device type -> torch.compile(flex_attention), made on first use (a compile takes seconds)
_compiled: Dict[str, Callable] = {}
# The forward kernel's key tile on CUDA: with the layers' mask_mods, flex's default configuration ran
# far slower than key tiles of 64, with the same results (an LSG layer's call on the one card
# measured: the flexprobe rows model and opt_bn64 in benchmarks/flex_gpu_notes.md).
CUDA_KERNEL_OPTIONS = {"BLOCK_N": 64}


def available() -> bool:
    """Whether this torch has FlexAttention (2.5 and later)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def supported(device_type: str, head_dim: int, dropout: float, grad: bool) -> bool:
    """Whether a flex call can compute this attention: CUDA (forward and backward) or CPU
    (forward only), no attention dropout, head dim >= 16."""
    if not available() or dropout > 0 or head_dim < MIN_HEAD_DIM:
        return False
    return device_type == "cuda" or (device_type == "cpu" and not grad)


def flex_attention(q: Tensor, k: Tensor, v: Tensor, block_mask, scale: float) -> Tensor:
    """softmax(q k^T * scale, over the pairs ``block_mask`` keeps) v; q (n, h, Lq, d), k, v
    (n, h, Lk, d), any strides with a contiguous last dim. Returns (n, h, Lq, d) laid out as q."""
    device = q.device.type
    if device not in _compiled:
        from torch.nn.attention.flex_attention import flex_attention as flex

        # CUDA: one recompile at the second length, then the lengths are dynamic (dynamo's
        # default). CPU (tests): static shapes, a compile per shape; inductor's C++ code for a
        # dynamic-shape flex kernel did not compile with torch 2.13
        _compiled[device] = torch.compile(flex, dynamic=False if device == "cpu" else None)
        raise_recompile_limit()
    options = CUDA_KERNEL_OPTIONS if device == "cuda" else None
    return _compiled[device](q, k, v, block_mask=block_mask, scale=scale, kernel_options=options)


def with_mask_mod(block_mask, mask_mod: Callable):
    """The same block tables with another mask_mod (a layer whose sparse keys' validity differs
    from the layer the tables were built for; the tables keep every tile such keys lie in)."""
    other = copy.copy(block_mask)
    other.mask_mod = mask_mod
    return other


# ---------------------------------------------------------------------------------------- LSG
class LSGLayout(NamedTuple):
    """Where LSG's keys lie in the one key/value tensor of a flex call: [t tokens | G globals |
    dead slots up to the next tile | ns sparse entries]. Tokens first, so that query and key
    tiles start together (a local window of bs = 128 is three whole key tiles); globals next, so
    that the global queries' keys are one run [0, t + G); the sparse entries on a tile boundary,
    so that a run of sbs = 128 entries starting on a multiple of step = 64 spans 1 or 2 tiles
    (3 per query tile, where an unaligned start spans 2 and 2)."""

    t: int
    G: int
    bs: int
    step: int
    sbs: int
    ns: int  # 0: no sparse keys

    @property
    def sparse_at(self) -> int:
        return -(-(self.t + self.G) // BLOCK) * BLOCK if self.ns else self.t + self.G

    @property
    def length(self) -> int:
        return self.sparse_at + self.ns


def lsg_mask_mod(layout: LSGLayout, key_ok: Tensor, sparse_ok: Optional[Tensor]) -> Callable:
    """Token query i (block j = i // bs) against the keys of ``layout``:

    - globals: always (when not padded);
    - tokens of blocks j-1, j, j+1 (the local window), when not padded;
    - sparse entries [(j-1)*step - sbs, (j-1)*step) and [(j+2)*step, (j+2)*step + sbs) of [0, ns)
      (spec section 4 Step B), when valid.

    key_ok (n, t + G) bool: real tokens then globals; sparse_ok (n, h, ns) bool, the validity of
    each head's sparse entries (this layer's), or None without sparse keys (ns = 0). Indices are
    clamped before every read: the kernel evaluates the mod on the padding of its last tile.
    """
    t, G, bs, step, sbs, ns = layout
    sparse_at = layout.sparse_at

    def mask_mod(b, h, q_idx, kv_idx):
        j = q_idx // bs
        local = (kv_idx < t) & ((kv_idx // bs - j).abs() <= 1)
        is_glob = (kv_idx >= t) & (kv_idx < t + G)
        keep = (local | is_glob) & key_ok[b, kv_idx.clamp(max=t + G - 1)]
        if sparse_ok is None:
            return keep
        p = kv_idx - sparse_at
        before = (p >= (j - 1) * step - sbs) & (p < (j - 1) * step)
        after = (p >= (j + 2) * step) & (p < (j + 2) * step + sbs)
        sparse = (p >= 0) & (p < ns) & (before | after) & sparse_ok[b, h, p.clamp(0, ns - 1)]
        return keep | sparse

    return mask_mod


def lsg_block_mask(layout: LSGLayout, key_ok: Tensor, mask_mod: Callable):
    """The tiles of :func:`lsg_mask_mod`'s pattern; key_ok (n, t + G) as there. Tiles of sparse
    entries are never kept whole (their validity differs per layer and head); a tile of token
    keys is whole where every query of the query tile sees all its keys and none is padded."""
    t, G, bs, step, sbs, ns = layout
    n, device = key_ok.size(0), key_ok.device
    r0, r1 = _query_tiles(t, device)  # (nq, 1): first and last query of each tile
    j0, j1 = r0 // bs, r1 // bs  # first and last LSG block of the tile
    runs = [
        (((j0 - 1) * bs).clamp(min=0), ((j1 + 2) * bs).clamp(max=t)),  # local windows
        (torch.full_like(r0, t), torch.full_like(r0, t + G)),
    ]  # globals
    if ns:
        s0 = layout.sparse_at
        runs += [
            (s0 + ((j0 - 1) * step - sbs).clamp(0, ns), s0 + ((j1 - 1) * step).clamp(0, ns)),  # before
            (s0 + ((j0 + 2) * step).clamp(0, ns), s0 + ((j1 + 2) * step + sbs).clamp(0, ns)),
        ]  # after
    # every query of the tile sees the tokens of the blocks all its LSG blocks share
    whole = (((j1 - 1) * bs).clamp(min=0), ((j0 + 2) * bs).clamp(max=t))
    dead = key_ok.new_zeros(n, layout.sparse_at - t - G)
    key_real = torch.cat([key_ok, dead, key_ok.new_ones(n, ns)], dim=1)  # (n, KV): sparse validity unknown here
    return _block_mask(runs, whole, key_real, mask_mod, t, layout.length)


# ---------------------------------------------------------------------------------------- LED
def led_mask_mod(w: int, real: Tensor, glob: Tensor) -> Callable:
    """Local query i against key j of the same tokens (spec/led.md section 4): j real, and
    ``|i - j| <= w`` or j global; real, glob (n, T) bool."""
    T = real.size(1)

    def mask_mod(b, h, q_idx, kv_idx):
        j = kv_idx.clamp(max=T - 1)
        return real[b, j] & (((q_idx - kv_idx).abs() <= w) | glob[b, j])

    return mask_mod


def led_block_mask(w: int, real: Tensor, glob: Tensor, mask_mod: Callable):
    """The tiles of :func:`led_mask_mod`'s pattern: the band's tiles, the tiles holding a row's
    global tokens (kept whole only inside the band) and none made of padding only."""
    n, T = real.shape
    r0, r1 = _query_tiles(T, real.device)
    band = [((r0 - w).clamp(min=0), (r1 + w + 1).clamp(max=T))]
    whole = ((r1 - w).clamp(min=0), (r0 + w + 1).clamp(max=T))
    return _block_mask(band, whole, real, mask_mod, T, T, extra=_tiles_any(glob & real, T))


# ---------------------------------------------------------------------------------------- tiles
def _query_tiles(length: int, device):
    """First and last query index of every tile of ``length`` queries, (nq, 1) each."""
    r0 = torch.arange(0, length, BLOCK, device=device)[:, None]
    return r0, (r0 + BLOCK).clamp(max=length) - 1


def _tiles_any(flags: Tensor, length: int) -> Tensor:
    """(n, nk): whether any position of each key tile is flagged."""
    n = flags.size(0)
    nk = -(-length // BLOCK)
    padded = flags.new_zeros(n, nk * BLOCK)
    padded[:, :length] = flags
    return padded.view(n, nk, BLOCK).any(-1)


def _block_mask(
    runs, whole, key_real: Tensor, mask_mod: Callable, q_len: int, kv_len: int, extra: Optional[Tensor] = None
):
    """A BlockMask from ranges of keys per query tile.

    runs: [(lo, hi)] each (nq, 1), the half-open key ranges some query of the tile may see;
    whole: (lo, hi), the range every query of the tile sees entirely; key_real (n, kv_len) bool,
    keys not padded; extra (n, nk) bool: tiles touched in every query tile (LED's globals).
    A key tile is kept if it meets a run (or is extra) and holds a real key, and kept whole (no
    mask_mod evaluated) if it lies inside ``whole`` and holds no padded key.
    """
    from torch.nn.attention.flex_attention import BlockMask

    device = key_real.device
    c0 = torch.arange(0, kv_len, BLOCK, device=device)[None, :]  # (1, nk) first key of each tile
    c1 = (c0 + BLOCK).clamp(max=kv_len) - 1  # last key
    touched = torch.zeros(runs[0][0].size(0), c0.size(1), dtype=torch.bool, device=device)
    for lo, hi in runs:
        touched |= (c0 < hi) & (c1 >= lo) & (lo < hi)  # (nq, nk)
    touched = touched[None]  # (1, nq, nk)
    if extra is not None:
        touched = touched | extra[:, None, :]
    any_real = _tiles_any(key_real, kv_len)  # (n, nk)
    all_real = ~_tiles_any(~key_real, kv_len)
    full = ((c0 >= whole[0]) & (c1 < whole[1]))[None] & all_real[:, None, :]  # (n, nq, nk)
    partial = touched & any_real[:, None, :] & ~full
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(q_len, kv_len)
    )


def _ordered(grid: Tensor):
    """(n, nq, nk) bool -> flex's tables: counts (n, 1, nq) and kept tiles first, in order,
    (n, 1, nq, nk), int32 (one head row: the tiles are the same for every head)."""
    num = grid.sum(-1, dtype=torch.int32)
    idx = torch.argsort((~grid).to(torch.uint8), dim=-1, stable=True).to(torch.int32)
    return num[:, None].contiguous(), idx[:, None].contiguous()
