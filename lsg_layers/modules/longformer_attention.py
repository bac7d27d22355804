"""Longformer self-attention (sliding window + global tokens), the encoder attention of LED.

Beltagy, Peters & Cohan, "Longformer: The Long-Document Transformer" (arXiv 2004.05150, section 3;
LED in section 6); behaviour as HF ``LEDForConditionalGeneration`` (``spec/led.md`` section 4).

Glossary (code name -> paper / spec notation):

- ``attention_window`` (W): the FULL window of the layer, even; ``one_sided`` (w = W / 2): a local
  query i attends to the keys j with ``|i - j| <= w`` (2w + 1 positions, clipped at the edges,
  padding removed).
- global tokens (G, the set of positions flagged by ``global_attention_mask``): every local query
  also attends to every global key of its row, at any distance (a global key inside the window
  is counted once); a global query attends to every real key of its row with its own projections
  ``q_proj_global``, ``k_proj_global``, ``v_proj_global`` (the paper's Q_g, K_g, V_g).
  ``out_proj`` is shared by local and global rows.
- n batch, h heads, d = C / h head dim, T tokens, bs block size, t = T padded to a multiple of
  bs, nb = t / bs blocks, r = ceil(w / bs) neighbouring blocks per side, Gm = the largest number
  of global tokens of a row in the batch, Kn = Gm + (2r + 1) * bs keys per query block.

Algorithm (memory linear in T, nothing T x T is ever built; spec section 9). Queries are cut into
blocks of bs tokens; block j gathers the keys of blocks j - r .. j + r (``ops.blocks`` band
arithmetic: the window of any query of the block lies inside them) plus the row's Gm global keys,
with one ``index_select``. An additive mask per block keeps exactly the spec's key set: the band
``|i - j| <= w`` (``relative_positions``), real non-global window keys, real global keys. The
joint softmax over ``globals U window`` then runs in ``F.scaled_dot_product_attention`` (the
fused CPU/GPU kernels, no score tensor). Global rows are one more SDPA of (n, h, Gm) queries
against all T keys, written over the local result at the global positions. With bs = w the
block's key set is 3w (HF's chunking computes 4w products per query and builds an L x L mask).

Masks use ``finfo(dtype).min`` (not -inf), so that the rows of padding queries, which may see
no valid key, stay finite; their outputs are unspecified (spec section 4) and dropped by callers.

Forced to the flex path (``paths``; CUDA without attention dropout), the local rows run
FlexAttention instead (``_local_flex``, ``ops.flex``): the keys are the projection itself, the
band and the globals a ``mask_mod``; no gather, no per-block mask, one block mask per forward for
every layer of the same window.
"""

import math
from typing import NamedTuple, Optional, Sequence, Tuple, Union, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lsg_layers.modules.padded_projection import padded_projection
from lsg_layers.modules.paths import CPU, FLEX, PathChoice
from lsg_layers.ops import fan_in as fan_in_ops
from lsg_layers.ops import flex
from lsg_layers.ops import window_attention as wa
from lsg_layers.ops.blocks import (
    KEY_ALIGN,
    clamp_index,
    compact_indices,
    local_window_indices,
    num_blocks,
    relative_positions,
)

# Queries per block of the window path (``_local_windows``): the band's edges waste bq keys per
# query, and the fused kernel is as fast with 64 queries per block as with 128.
_QUERY_BLOCK = 64


def check_attention_window(window: int, name: str = "attention_window") -> int:
    """A Longformer window must be a positive even int (the full width W = 2w)."""
    number = isinstance(window, (int, float)) and not isinstance(window, bool)
    if not number or int(window) != window or window <= 0 or window % 2:
        raise ValueError(f"{name} must be a positive even integer (the full window 2w), got {window!r}")
    return int(window)


def parse_attention_windows(
    value: Union[int, str, Sequence[int]], num_layers: int, name: str = "--attention-window"
) -> list:
    """``1024`` / ``"1024"`` / ``"512,1024"`` / ``[512, 1024]`` -> one window per layer.

    A single value applies to every layer; a list must have exactly ``num_layers`` entries.
    """
    if isinstance(value, str):
        parts = [p for p in value.replace("[", "").replace("]", "").replace(" ", "").split(",") if p]
        try:
            windows = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{name} must be an int or a comma-separated list of ints, got {value!r}")
    elif isinstance(value, Sequence):  # a list, a tuple, hydra's ListConfig
        windows = list(cast(Sequence[int], value))
    else:  # an int; from a config also null, a float or an object: check_attention_window names it
        windows = [value]
    if len(windows) == 1:
        windows = windows * num_layers
    if len(windows) != num_layers:
        raise ValueError(
            f"{name} has {len(windows)} entries but the encoder has {num_layers} layers "
            "(give one value for all layers or one per layer)"
        )
    return [check_attention_window(w, name) for w in windows]


def global_positions_mask(g_idx: Tensor, g_valid: Tensor, length: int) -> Tensor:
    """(n, length) bool, True at the valid global positions of ``compact_indices``' (idx, valid)
    (n, Gm); filler entries are scattered into a scratch column, so no position is written twice."""
    n = g_idx.size(0)
    at = torch.where(g_valid, g_idx, torch.full_like(g_idx, length))  # (n, Gm)
    return torch.zeros(n, length + 1, dtype=torch.bool, device=g_idx.device).scatter_(1, at, True)[:, :length]


def global_targets(real: Tensor, g_idx: Tensor, g_valid: Tensor) -> Tuple[Tensor, Tensor]:
    """What the global rows' pass needs besides the tokens: ``outside`` (n, 1, 1, t) bool, True at
    the padding (the keys a global query skips), and ``rows`` (n*Gm,), the flattened (row, token)
    position each global row's output overwrites; the filler entries of rows with fewer globals
    point at scratch rows after the n*t outputs (one each: no index is written twice), so nothing
    depends on reading ``g_valid`` on the host."""
    n, t = real.shape
    Gm = g_idx.size(1)
    rows = (g_idx + torch.arange(n, device=real.device)[:, None] * t).reshape(-1)  # (n*Gm,)
    scratch = n * t + torch.arange(n * Gm, device=real.device)  # (n*Gm,)
    return ~real[:, None, None, :], torch.where(g_valid.reshape(-1), rows, scratch)


class WholePlan(NamedTuple):
    """What the layers of one forward and window share on the whole-tensor path, built by the first
    (``LongformerSelfAttention._whole_plan``): it depends on the batch's padding, its global tokens
    and the window, not on the layer. Gm = 0 (no global token in the batch): the last three are None."""

    flat: Tensor  # (n*nb*Kn,) each block's keys: positions in the (n*t) flattened rows
    mask: Tensor  # (n*nb, 1, bs, Kn) additive: the band, real non-global window keys, real globals
    g_idx: Optional[Tensor]  # (n, Gm) the global positions (``compact_indices``' form; fillers in ``rows``)
    outside: Optional[Tensor]  # (n, 1, 1, t) bool, the global rows' keys to skip (``global_targets``)
    rows: Optional[Tensor]  # (n*Gm,) where the global rows' outputs go (``global_targets``)


class LongformerSelfAttention(PathChoice, nn.Module):
    """Drop-in encoder self-attention for fairseq (``MultiheadAttention``'s call signature).

    ``forward(query=x, key=x, value=x, key_padding_mask=m, global_attention_mask=g)`` with x
    (T, n, C), m (n, T) bool True = pad (or None), g (n, T) bool True = global (or None: no
    global token). Returns ``(out (T, n, C), None)``. Instead of g, ``global_index=(idx, valid)``
    (n, Gm) gives the global positions directly (``ops.blocks.compact_indices``' form; what the
    LED encoder passes): a mask's positions must be read on the host, which a GPU pays as a
    synchronisation in every layer.

    Three key paths (``lsg_layers.modules.paths``): strided windows on CPU (``_local_windows``),
    on whole tensors (GPU, attention dropout; ``_local``): one gather and one SDPA for all blocks,
    and FlexAttention when forced (CUDA without attention dropout; ``_local_flex``). ``block_masks``, a dict
    the encoder makes once per forward and hands to every layer, keeps flex's block masks and the
    whole path's plan (``WholePlan``: key index, mask, global positions and targets) for the layers
    after the first, which then issue no op for the batch's padding or globals.

    ``block_size`` (default w) only trades speed for memory: results do not depend on it.
    ``fold_global`` (class default True) lets few global rows skip the global key/value
    projections of every token (``_global_rows``); False applies them (same results, e.g. to
    trace per-token projections in scripts/plot_attention_pattern.py).
    """

    fold_global = True

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        attention_window: int,
        dropout: float = 0.0,
        bias: bool = True,
        block_size: Optional[int] = None,
    ):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._block_size = block_size  # None: follow the window
        self.set_attention_window(attention_window)
        self.dropout = dropout
        # the whole path's gathers' backward as each key row's readers summed (ops.fan_in.wanted:
        # None, off the CPU, where index_select's index_add_ is one atomic add an element)
        self.fan_in_backward: Optional[bool] = None

        # local projections keep BART's names, so BART weights load without renaming
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj_global = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj_global = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.q_proj_global = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        # fairseq MultiheadAttention's initialisation; global projections start as the local
        # ones do (the Longformer paper copies them from the local ones when converting BART)
        for proj in (self.k_proj, self.v_proj, self.q_proj, self.k_proj_global, self.v_proj_global, self.q_proj_global):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        for proj in (
            self.k_proj,
            self.v_proj,
            self.q_proj,
            self.k_proj_global,
            self.v_proj_global,
            self.q_proj_global,
            self.out_proj,
        ):
            if proj.bias is not None:
                nn.init.constant_(proj.bias, 0.0)

    def set_attention_window(self, attention_window: int) -> None:
        """Set the full window W (even); no parameter depends on it, so an encoder can give each
        layer its own after building them all alike (LED's per-layer ``--attention-window``)."""
        self.attention_window = check_attention_window(attention_window)
        self.one_sided = self.attention_window // 2  # w
        self.block_size = self._block_size or self.one_sided

    def extra_repr(self) -> str:
        return f"attention_window={self.attention_window} (w={self.one_sided}), block_size={self.block_size}"

    # ------------------------------------------------------------------ main entry point
    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        need_weights: bool = False,
        attn_mask: Optional[Tensor] = None,
        global_attention_mask: Optional[Tensor] = None,
        global_index: Optional[Tuple[Tensor, Tensor]] = None,
        block_masks: Optional[dict] = None,
        **unused,
    ) -> Tuple[Tensor, None]:
        if attn_mask is not None:
            raise NotImplementedError("Longformer self-attention does not take an attn_mask (encoder only)")
        # self-attention only: key and value are the same tensor as query and are not read
        T, n, C = query.shape
        x = query.transpose(0, 1)  # (n, T, C)
        path = self.choose_attention_path(x, self.head_dim, self.dropout if self.training else 0.0)
        if path in (CPU, FLEX):
            real, glob, g_idx, g_valid = self._batch_rows(query, key_padding_mask, global_attention_mask, global_index)
            if path == CPU:
                out = self._local_windows(x, real, glob, g_idx, g_valid)  # (n, T, C)
            else:
                out = self._local_flex(x, real, glob, {} if block_masks is None else block_masks)  # (n, T, C)
            if g_idx is not None and g_valid is not None:
                out = self._global_rows(x, out, g_idx, *global_targets(real, g_idx, g_valid))
            return self.out_proj(out.transpose(0, 1)), None

        bs = min(self.block_size, T)
        nb = num_blocks(T, bs)
        t = nb * bs
        r = min(num_blocks(self.one_sided, bs), nb - 1)  # neighbouring blocks per side
        if t > T:
            # internal padding to the block size only; padded keys are masked, outputs dropped
            x = F.pad(x, (0, 0, 0, t - T))  # (n, t, C)
        q = self.q_proj(x).view(n, t, self.num_heads, self.head_dim)  # (n, t, h, d)
        k = self.k_proj(x).view(n, t, self.num_heads, self.head_dim)  # (n, t, h, d)
        v = self.v_proj(x).view(n, t, self.num_heads, self.head_dim)  # (n, t, h, d)
        plans = {} if block_masks is None else block_masks
        plan_key = ("led_whole", t, bs, r, self.one_sided, q.dtype)  # q's: the mask's dtype, also under autocast
        if plan_key not in plans:
            real, glob, g_idx, g_valid = self._batch_rows(query, key_padding_mask, global_attention_mask, global_index)
            plans[plan_key] = self._whole_plan(real, glob, g_idx, g_valid, t, bs, r, q.dtype)
        plan = plans[plan_key]
        table = None
        if r and fan_in_ops.wanted(self.fan_in_backward, k):  # r >= 1: block 0 has masked keys (the zero slot)
            if plan_key + ("fan_in",) not in plans:  # the plan's index transposed, once per forward
                plans[plan_key + ("fan_in",)] = self._fan_in(plan, n, t, bs, r)
            table = plans[plan_key + ("fan_in",)]
        out = self._local(q, k, v, plan, bs, table)  # (n, t, C)
        if plan.g_idx is not None:
            out = self._global_rows(x, out, plan.g_idx, plan.outside, plan.rows)
        out = out.transpose(0, 1)[:T]  # (T, n, C): drop the internal padding
        return self.out_proj(out), None

    def _batch_rows(
        self, query, key_padding_mask, global_attention_mask, global_index
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """(real, glob, g_idx, g_valid) of the batch: real (n, T) bool, True at tokens; the global
        positions as (n, Gm) index and validity and as an (n, T) mask; the last three None
        without a global token in the batch."""
        T, n, _ = query.shape
        real = torch.ones(n, T, dtype=torch.bool, device=query.device)
        if key_padding_mask is not None:
            real = ~key_padding_mask.bool()  # (n, T)
        if global_index is None and global_attention_mask is not None:
            global_index = compact_indices(global_attention_mask.bool() & real)  # a flag on a pad is ignored
        if global_index is None or global_index[0].size(1) == 0:
            return real, None, None, None
        g_idx, g_valid = global_index
        return real, global_positions_mask(g_idx, g_valid, T), g_idx, g_valid

    # ------------------------------------------------------------------ local queries
    def _local_windows(self, x, real, glob, g_idx, g_valid) -> Tensor:
        """Every query against its exact band and the row's globals, as strided windows.

        Queries in blocks of bq (any bq <= 2w; results do not depend on it); keys padded with
        w masked slots on the left and w + 1 on the right, so that for query block j (queries
        j*bq + a, a < bq) the band ``|i - k| <= w`` is three windows of the padded keys:

        - left edge, start j*bq, bq keys: key j*bq - w + b is in the band iff a <= b;
        - middle, start j*bq + bq, 2w + 1 - bq keys: in the band for every query of the block;
        - right edge, start j*bq + 2w + 1, bq keys: key j*bq + w + 1 + b iff b < a;

        plus the row's Gm global keys (local projections). 2w + 1 + bq keys per query are
        scored for the 2w + 1 of the band (bq = 64, w = 512: 6% more; blocks of w: 50% more).
        """
        n, T, C = x.shape
        h, d, w = self.num_heads, self.head_dim, self.one_sided
        bq = min(_QUERY_BLOCK, 2 * w)
        nbq = num_blocks(T, bq)
        if nbq * bq > T:  # queries padded to whole blocks; their outputs are dropped
            x = F.pad(x, (0, 0, 0, nbq * bq - T))
        q = self.q_proj(x).view(n, nbq * bq, h, d)  # (n, Tq, h, d)
        layout = [(slice(0, T), w)], w + nbq * bq + w + 1  # [w zeros | T tokens | zeros]
        keys = padded_projection(self.k_proj, x, *layout).view(n, -1, h, d)  # (n, w + Tq + w + 1, h, d)
        values = padded_projection(self.v_proj, x, *layout).view(n, -1, h, d)
        window_ok = real if glob is None else real & ~glob  # globals come through their own window
        neg = torch.finfo(q.dtype).min
        key_mask = F.pad(
            torch.zeros(n, T, dtype=q.dtype, device=x.device).masked_fill_(~window_ok, neg),
            (w, w + 1 + nbq * bq - T),
            value=neg,
        )  # (n, w + Tq + w + 1)
        sources = [(keys, values, key_mask[:, None, :])]
        edge = torch.ones(bq, bq, dtype=torch.bool, device=x.device)
        windows = [
            wa.Window(0, 0, bq, bq, edge.triu()),
            wa.Window(0, bq, bq, 2 * w + 1 - bq),
            wa.Window(0, 2 * w + 1, bq, bq, edge.tril(-1)),
        ]
        if g_idx is not None:
            Gm = g_idx.size(1)
            at = (g_idx + w)[:, :, None, None].expand(n, Gm, h, d)  # globals' rows in the padded keys
            glob_mask = torch.zeros(n, 1, Gm, dtype=q.dtype, device=x.device).masked_fill_(~g_valid[:, None, :], neg)
            sources.append((keys.gather(1, at), values.gather(1, at), glob_mask))
            windows.append(wa.Window(1, 0, 0, Gm))
        # the padding is trimmed off the edge blocks' bands; only bands that cover a global (or a
        # row's padding) keep a mask in the kernel
        groups = wa.split_unmasked([wa.QueryGroup(0, nbq, bq, windows)], [m for _, _, m in sources])
        out = wa.window_attention(q, sources, groups, scale=d**-0.5, inplace=True)  # over q
        return out[:, :T].reshape(n, T, C)

    def _local_flex(self, x, real, glob, block_masks: dict) -> Tensor:
        """Every query against its band and the row's globals in one flex call (local
        projections); the keys are the projections as they come, nothing padded or gathered.
        ``block_masks`` keeps the block mask for the next layers of the same window."""
        n, T, C = x.shape
        h, d, w = self.num_heads, self.head_dim, self.one_sided
        q = self.q_proj(x).view(n, T, h, d).transpose(1, 2)  # (n, h, T, d)
        k = self.k_proj(x).view(n, T, h, d).transpose(1, 2)
        v = self.v_proj(x).view(n, T, h, d).transpose(1, 2)
        if glob is None:
            glob = torch.zeros_like(real)  # one mask_mod (one compiled kernel) with or without globals
        tables = ("led", T, w)
        if tables not in block_masks:
            block_masks[tables] = flex.led_block_mask(w, real, glob, flex.led_mask_mod(w, real, glob))
        out = flex.flex_attention(q, k, v, block_masks[tables], scale=d**-0.5)  # (n, h, T, d)
        return out.transpose(1, 2).reshape(n, T, C)

    def _local(self, q, k, v, plan: WholePlan, bs: int, table: Optional[Tensor] = None) -> Tensor:
        """Every query against its window and the row's global keys (local projections), in blocks
        of ``bs`` queries whose keys and mask ``plan`` (:meth:`_whole_plan`) holds; ``table``
        (:meth:`_fan_in`): the gathers' backward without atomic adds."""
        n, t, h, d = q.shape
        nb = t // bs
        flat, mask = plan.flat, plan.mask
        Kn = flat.numel() // (n * nb)
        # one gather over the flattened (row, token) axis: rows have different global positions
        if table is None:
            keys, values = k.reshape(n * t, h, d).index_select(0, flat), v.reshape(n * t, h, d).index_select(0, flat)
        else:
            Gm = 0 if plan.g_idx is None else plan.g_idx.size(1)
            keys = fan_in_ops.gather_rows(k.reshape(1, n * t, h, d), flat, table, Gm, n * nb, n)
            values = fan_in_ops.gather_rows(v.reshape(1, n * t, h, d), flat, table, Gm, n * nb, n)
        keys = keys.view(n * nb, Kn, h, d).transpose(1, 2)  # (n*nb, h, Kn, d)
        values = values.view(n * nb, Kn, h, d).transpose(1, 2)

        queries = q.view(n * nb, bs, h, d).transpose(1, 2)  # (n*nb, h, bs, d)
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )  # (n*nb, h, bs, d)
        return out.transpose(1, 2).reshape(n, t, h * d)  # (n, t, C)

    def _fan_in(self, plan: WholePlan, n: int, t: int, bs: int, r: int) -> Tensor:
        """``plan.flat`` transposed for ``ops.fan_in.gather_rows``' backward: (n*t, 2r+1) the block
        positions that read each token (a token is in 2r+1 blocks' windows; a key no query of its
        block may see is left out), each row's globals, read by all its blocks, apart."""
        nb = t // bs
        Kn = plan.flat.numel() // (n * nb)
        seen = plan.mask.eq(0).any(dim=2).view(n * nb, Kn)  # a key some query of the block may see
        Gm = 0 if plan.g_idx is None else plan.g_idx.size(1)
        return fan_in_ops.fan_in_table(plan.flat.view(n * nb, Kn), seen, n * t, Gm, 2 * r + 1, groups=n)

    def _whole_plan(self, real, glob, g_idx, g_valid, t: int, bs: int, r: int, dtype) -> WholePlan:
        """The whole-tensor path's plan (:class:`WholePlan`) for blocks of ``bs`` over ``t`` (T
        padded to whole blocks) positions, from :meth:`_batch_rows`' (real, glob (n, T), g_idx,
        g_valid)."""
        n, T = real.shape
        if t > T:  # the internal padding: masked keys, dropped outputs
            real = F.pad(real, (0, t - T), value=False)  # (n, t)
            if glob is not None:
                glob = F.pad(glob, (0, t - T), value=False)
        nb = t // bs
        Gm = 0 if g_idx is None else g_idx.size(1)
        neg = torch.finfo(dtype).min
        device = real.device

        # window keys: real tokens that are not global (globals come through their own slots)
        window_ok = real if glob is None else real & ~glob  # (n, t)

        # per-block key positions: [row's globals | blocks j-r .. j+r | alignment padding];
        # masked slots point at token 0 (any finite key: a masked key gets exactly 0 weight)
        win, win_valid = local_window_indices(nb, bs, r, r, device=device)  # (nb, (2r+1)*bs)
        win = clamp_index(win, win_valid, 0)
        rel = relative_positions(bs, r, r, device=device)  # (bs, (2r+1)*bs)
        in_band = (rel.abs() <= self.one_sided)[None, None]  # (1, 1, bs, (2r+1)*bs)
        win_ok = window_ok[:, win] & win_valid  # (n, nb, (2r+1)*bs)
        parts = [win.expand(n, nb, win.size(1))]
        allow_parts = [win_ok[:, :, None, :] & in_band]  # (n, nb, bs, (2r+1)*bs)
        if Gm:
            parts.insert(0, g_idx[:, None, :].expand(n, nb, Gm))  # same globals for every block
            allow_parts.insert(0, g_valid[:, None, None, :].expand(n, nb, bs, Gm))
        extra = -(Gm + win.size(1)) % KEY_ALIGN
        if extra:
            parts.append(win.new_zeros(n, nb, extra))
            allow_parts.append(win_ok.new_zeros(n, nb, bs, extra))
        index = torch.cat(parts, dim=2)  # (n, nb, Kn) token positions
        Kn = index.size(2)
        allowed = torch.cat(allow_parts, dim=3).view(n * nb, 1, bs, Kn)  # broadcast over heads
        zero = torch.zeros((), dtype=dtype, device=device)
        mask = torch.where(allowed, zero, zero + neg)  # (n*nb, 1, bs, Kn) additive
        flat = (index + torch.arange(n, device=device)[:, None, None] * t).reshape(-1)  # (n*nb*Kn,)
        if not Gm:
            return WholePlan(flat, mask, None, None, None)
        return WholePlan(flat, mask, g_idx, *global_targets(real, g_idx, g_valid))

    # ------------------------------------------------------------------ global queries
    def _global_rows(self, x, out, g_idx, outside, rows) -> Tensor:
        """Global queries attend to every real token with the global projections; ``outside`` and
        ``rows`` as :func:`global_targets` makes them.

        With few global rows (Gm * h <= C) the global key and value projections are never
        applied to the t tokens: per head, Qg_i . Kg_j = (Wk_h^T Qg_i) . x_j + Qg_i . bk_h and
        sum_j p_j Vg_j = (sum_j p_j x_j) Wv_h^T + (sum_j p_j) bv_h, so the work on the t tokens
        is two products with Gm * h columns instead of two with C.
        """
        n, t, C = x.shape
        h, d = self.num_heads, self.head_dim
        Gm = g_idx.size(1)
        x_glob = x.gather(1, g_idx[:, :, None].expand(n, Gm, C))  # (n, Gm, C)
        qg = self.q_proj_global(x_glob).view(n, Gm, h, d) * d**-0.5  # (n, Gm, h, d)
        dropout = self.dropout if self.training else 0.0
        neg = torch.finfo(x.dtype).min
        # (a quantized projection, lsg_fairseq.quantize, exposes no weight tensor: it projects)
        if (
            self.fold_global
            and Gm * h <= C
            and all(isinstance(getattr(p, "weight", None), Tensor) for p in (self.k_proj_global, self.v_proj_global))
        ):
            wk = self.k_proj_global.weight.view(h, d, C)
            wv = self.v_proj_global.weight.view(h, d, C)
            # per head, one product of the weight with the rows of every batch row and global (the
            # batch folded into the rows: no weight copied per batch row, few ops on the host)
            qh = qg.view(n * Gm, h, d).transpose(0, 1)  # (h, n*Gm, d)
            qk = torch.bmm(qh, wk).transpose(0, 1).reshape(n, Gm * h, C)  # (n, Gm*h, C)
            scores = torch.bmm(qk, x.transpose(1, 2)).view(n, Gm, h, t)  # (n, Gm, h, t)
            if self.k_proj_global.bias is not None:
                scores = scores + (qg * self.k_proj_global.bias.view(h, d)).sum(-1)[..., None]
            p = torch.softmax(scores.masked_fill(outside, neg), dim=-1)
            p = F.dropout(p, dropout, self.training)
            pooled = torch.bmm(p.view(n, Gm * h, t), x).view(n * Gm, h, C).transpose(0, 1)  # (h, n*Gm, C)
            og = torch.bmm(pooled, wv.transpose(1, 2)).transpose(0, 1).reshape(n, Gm, h, d)  # (n, Gm, h, d)
            bv = self.v_proj_global.bias
            if bv is not None:  # sum_j p_j bv: the probabilities sum to 1 unless dropout zeroed some
                og = og + (p.sum(-1)[..., None] * bv.view(h, d) if dropout > 0 else bv.view(h, d))
        else:
            kg = self.k_proj_global(x).view(n, t, h, d).transpose(1, 2)  # (n, h, t, d)
            vg = self.v_proj_global(x).view(n, t, h, d).transpose(1, 2)  # (n, h, t, d)
            mask = torch.zeros(n, 1, 1, t, dtype=x.dtype, device=x.device).masked_fill_(outside, neg)  # (n, 1, 1, t)
            og = F.scaled_dot_product_attention(
                qg.transpose(1, 2), kg, vg, attn_mask=mask, dropout_p=dropout, scale=1.0
            ).transpose(1, 2)  # (n, Gm, h, d)
        og = og.reshape(n * Gm, C)  # (n*Gm, C)
        # overwrite the (discarded) local result of every real global position (filler entries go
        # to the scratch rows after the output); a fresh buffer (``out`` may be a view of the SDPA
        # output, which autograd still needs)
        out = torch.cat([out.reshape(n * t, C), og.new_zeros(n * Gm, C)]).index_copy_(0, rows, og)
        return out[: n * t].view(n, t, C)  # (n, t, C)
