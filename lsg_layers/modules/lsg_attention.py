"""LSG (Local, Sparse, Global) self-attention for long encoder inputs.

Condevaux & Harispe, "LSG Attention: Extrapolation of pretrained Transformers to long sequences"
(PAKDD 2023, arXiv 2210.15497); reference code ccdv-ai/convert_checkpoint_to_lsg (``spec/lsg.md``).

Glossary (code name -> paper / spec notation):

- ``num_global_tokens`` (G): learned global tokens prepended to the sequence (the encoder adds
  them); global queries attend to every key and every query attends to them.
- ``block_size`` (bs): queries are processed in blocks of bs tokens; block j attends to the
  3*bs **local** keys of blocks j-1, j, j+1 (the paper's "local attention", window 3 blocks).
- ``sparsity_factor`` (sf) and ``sparsity_type``: a **sparse** sequence of t/sf entries is built
  from the keys (norm: top-norm tokens; pooling: mean of sf tokens; stride / block_stride: one
  token out of sf; bos_pooling: attention-pooling with the first token's query; lsh: hashed
  centroids). ``sparse_block_size`` (sbs) of its entries right before and right after the local
  window are added to each block's keys (the paper's "sparse attention").
- n batch, h heads, d head dim, t tokens after adaptive padding (a multiple of bs), nb = t / bs,
  step = bs / sf, ns = t / sf, Kn = G + 2*sbs + 3*bs keys per query block.

Inputs shorter than or equal to two blocks take plain full attention (the LSG keys would be the
whole sequence anyway). Longer inputs are right-padded internally to a multiple of bs (any length
is accepted); padded keys are masked and padded outputs dropped.

Numerics follow the reference: scores ``Q.K^T / sqrt(d)``, additive masks of exactly
``finfo(dtype).min`` (never -inf: a query always sees the global keys, so no row is fully
masked), dropout on the probabilities. Memory is O(t * Kn), linear in t; nothing of size t x t is
ever built. Three key paths compute the same softmax over the same keys:

- CPU without attention dropout (``_lsg_windows``): the keys are projected into one buffer
  [globals | pad block | tokens | pad block], so every block's local window and sparse runs are
  strided views (``ops.window_attention``: fused flash kernel, no per-block copy kept for
  backward; without autograd each chunk of blocks' keys is copied into a small reused buffer
  and attended in one call);
- the whole-tensor path (GPU, ``lsg_layers.modules.paths``) and attention dropout
  (``_lsg_gathered``): per-block key sets gathered with one ``index_select`` and one
  ``F.scaled_dot_product_attention`` for every block, with no host-device synchronisation;
- FlexAttention (forced: CUDA without attention dropout, ``_lsg_flex``): the keys projected into one
  buffer [tokens | globals | sparse sequence] and the LSG pattern as a ``mask_mod`` over it
  (``ops.flex``): no per-block copy and no float mask; its block mask is built once per forward.

The sparse sequences (Step A) are the pure functions of ``ops.sparse``.

Deliberate deviations from the reference (spec section 9):
- sparse windows follow the Step-B formula for every valid (bs, sbs, sf) (the reference's
  pad+unfold arithmetic is wrong unless step is even and 4*sbs > 3*step);
- bos_pooling masks sparse groups made only of padding (the reference leaks them in fp32);
- lsh draws its random projections from ``self.generator`` when one is set (reproducible);
- unknown sparsity types and inconsistent sizes are errors (``lsg_config.check_lsg_config``), not
  warnings.
"""

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lsg_layers.modules.lsg_config import LSG_DEFAULTS, check_lsg_config
from lsg_layers.modules.padded_projection import padded_projection
from lsg_layers.modules.paths import CPU, FLEX, WHOLE, PathChoice
from lsg_layers.ops import fan_in as fan_in_ops
from lsg_layers.ops import flex, sparse
from lsg_layers.ops import window_attention as wa
from lsg_layers.ops.blocks import KEY_ALIGN, clamp_index, local_window_indices, padded_length, sparse_window_indices

# The per-layer cache of block index tables (_block_keys; one per input length, device and dtype)
# is cleared once it holds more than this many: the few padded lengths a run meets again and again
# stay cached, while a stream of ever-new lengths (generation, unbucketed batches) cannot grow it
# without bound.
MAX_CACHED_BLOCK_TABLES = 16


class LSGSelfAttention(PathChoice, nn.Module):
    """Drop-in encoder self-attention for fairseq (``MultiheadAttention``'s call signature).

    ``forward(query=x, key=x, value=x, key_padding_mask=m)`` with x of shape (T, B, C) where the
    first ``num_global_tokens`` time steps are the global tokens, and m (B, T) bool, True = pad
    (or None). Returns ``(out (T, B, C), None)``. ``block_masks``, a dict the encoder makes once
    per forward and hands to every layer, keeps the flex path's block mask for the other layers.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_global_tokens: int = LSG_DEFAULTS["num_global_tokens"],
        block_size: int = LSG_DEFAULTS["block_size"],
        sparse_block_size: int = LSG_DEFAULTS["sparse_block_size"],
        sparsity_factor: int = LSG_DEFAULTS["sparsity_factor"],
        sparsity_type: str = LSG_DEFAULTS["sparsity_type"],
        dropout: float = 0.0,
        lsh_num_pre_rounds: int = LSG_DEFAULTS["lsh_num_pre_rounds"],
        bias: bool = True,
        generator: Optional[torch.Generator] = None,
    ):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        check_lsg_config(
            block_size, sparse_block_size, sparsity_factor, sparsity_type, num_global_tokens, lsh_num_pre_rounds
        )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.num_global_tokens = num_global_tokens
        self.block_size = block_size
        self.sparse_block_size = sparse_block_size
        self.sparsity_factor = sparsity_factor
        self.sparsity_type = sparsity_type
        self.dropout = dropout
        self.lsh_num_pre_rounds = lsh_num_pre_rounds
        # Source of randomness for the lsh projections; None -> torch's global RNG (reference).
        self.generator = generator
        self.has_sparse = self.sparsity_type != "none" and sparse_block_size > 0
        self._cache: Dict[tuple, Tuple[Tensor, Tensor]] = {}  # per-length block index tables (_block_keys); not state
        self._fan_in_tables: Dict[tuple, Tensor] = {}  # their transposes (_fan_in), cleared with them
        # the gathered path's backward as each key row's readers summed (ops.fan_in.wanted: None,
        # off the CPU, where index_select's index_add_ is one atomic add an element)
        self.fan_in_backward: Optional[bool] = None

        # BART names, so BART / HF LSG-BART weights load without renaming.
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        # Same initialisation as fairseq's MultiheadAttention (qkv_same_dim case).
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        for proj in (self.k_proj, self.v_proj, self.q_proj, self.out_proj):
            if proj.bias is not None:
                nn.init.constant_(proj.bias, 0.0)

    def extra_repr(self) -> str:
        return (
            f"G={self.num_global_tokens}, block_size={self.block_size}, "
            f"sparse_block_size={self.sparse_block_size}, "
            f"sparsity_factor={self.sparsity_factor}, sparsity_type={self.sparsity_type}"
        )

    # ------------------------------------------------------------------ main entry point
    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        need_weights: bool = False,
        attn_mask: Optional[Tensor] = None,
        block_masks: Optional[dict] = None,
        **unused,
    ) -> Tuple[Tensor, None]:
        if attn_mask is not None:
            raise NotImplementedError("LSG self-attention does not take an attn_mask (encoder only)")
        # self-attention only: key and value are the same tensor as query and are not read
        T, n, C = query.shape
        G, bs = self.num_global_tokens, self.block_size
        L = T - G
        if L < 1:
            raise ValueError(f"input has {T} positions, fewer than {G} global tokens + 1")

        x = query.transpose(0, 1)  # (n, T, C)
        pad_mask = key_padding_mask  # (n, T) bool, True = pad, or None
        if L > 2 * bs and L % bs != 0:
            # adaptive padding: right-pad to a multiple of bs (padded keys masked, outputs dropped)
            extra = padded_length(L, bs) - L
            x = F.pad(x, (0, 0, 0, extra))  # (n, G + t, C)
            if pad_mask is None:
                pad_mask = torch.zeros(n, T, dtype=torch.bool, device=x.device)
            pad_mask = torch.cat([pad_mask.bool(), pad_mask.new_ones(n, extra, dtype=torch.bool)], dim=1)  # (n, G + t)

        # token-major layout (n, S, h, d) throughout: the projections' own layout, so the
        # per-block key sets and the attention outputs need no permute copies
        S = x.size(1)
        h, d = self.num_heads, self.head_dim
        q = self.q_proj(x).view(n, S, h, d)  # (n, S, h, d)
        key_mask = None
        if pad_mask is not None:
            key_mask = torch.zeros(pad_mask.shape, dtype=q.dtype, device=q.device)
            key_mask.masked_fill_(pad_mask.bool(), torch.finfo(q.dtype).min)  # (n, S) additive

        path = self.choose_attention_path(q, d, self.dropout if self.training else 0.0)
        if L <= 2 * bs:
            self.ran = WHOLE  # plain attention over every key, whatever the path
            k = self.k_proj(x).view(n, S, h, d)
            v = self.v_proj(x).view(n, S, h, d)
            mask = None if key_mask is None else key_mask[:, None, None, :]
            out = self._attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
            out = out.transpose(1, 2).reshape(n, S, C)  # (n, S, C)
        elif path == CPU:
            out = self._lsg_windows(x, q, key_mask)  # (n, S, C)
        elif path == FLEX:
            out = self._lsg_flex(x, q, pad_mask, key_mask, {} if block_masks is None else block_masks)  # (n, S, C)
        else:
            k = self.k_proj(x).view(n, S, h, d)
            v = self.v_proj(x).view(n, S, h, d)
            out = self._lsg_gathered(q, k, v, key_mask)  # (n, S, C)
        out = self.out_proj(out[:, :T])  # (n, T, C): adaptive padding dropped
        return out.transpose(0, 1), None  # (T, n, C)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
        """softmax(q k^T / sqrt(d) + mask) v with dropout on the probabilities; (B, h, L, d)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)

    def _sparse(self, q: Tensor, k: Tensor, v: Tensor, tok_mask: Optional[Tensor]):
        """The sparse sequence of the tokens (``ops.sparse``): q (n, S, h, d) (bos_pooling/lsh pool
        with the first token's query), k, v (n, t, h, d), tok_mask (n, t) additive or None.
        Returns keys, values (n, ns, h, d) and their mask (n, 1|h, ns) or None."""
        if self.sparsity_type == "lsh" and tok_mask is None:
            tok_mask = k.new_zeros(k.shape[:2])  # lsh can leave buckets empty: its mask is always needed
        G = self.num_global_tokens
        return sparse.sparse_sequence(
            self.sparsity_type,
            q[:, G],
            k,
            v,
            tok_mask,
            block_size=self.block_size,
            sparse_block_size=self.sparse_block_size,
            sparsity_factor=self.sparsity_factor,
            lsh_num_pre_rounds=self.lsh_num_pre_rounds,
            generator=self.generator,
        )

    # ------------------------------------------------------------------ LSG path, CPU
    def _lsg_windows(self, x: Tensor, q: Tensor, key_mask: Optional[Tensor]) -> Tensor:
        """The LSG key set of every block as strided windows (``ops.window_attention``).

        x (n, S, C) the layer input and q (n, S, h, d) its queries, S = G + t, t a multiple of bs;
        key_mask (n, S) additive or None. Returns the attention output (n, S, C) before out_proj;
        without autograd it is written over ``q`` (no fresh output buffer: q is not needed after).

        Sources, token-major: 0 = the keys laid out [G globals | bs zeros | t tokens | bs zeros]
        (``padded_projection``: no padded copy), so block j's local window (tokens (j-1)*bs ..
        (j+2)*bs) starts at G + j*bs; 1 = the sparse sequence
        with P = sbs + step masked entries on each side, so block j's "before" run
        [(j-1)*step - sbs, (j-1)*step) starts at j*step and its "after" run [(j+2)*step,
        (j+2)*step + sbs) at j*step + 3*step + sbs. Global queries see every real key. Nothing per
        block is copied, in forward or backward.
        """
        n, S, h, d = q.shape
        G, bs = self.num_global_tokens, self.block_size
        t = S - G
        nb = t // bs
        neg = torch.finfo(q.dtype).min
        layout = [(slice(0, G), 0), (slice(G, S), G + bs)], G + t + 2 * bs  # [globals | 0 | tokens | 0]
        k = padded_projection(self.k_proj, x, *layout).view(n, G + t + 2 * bs, h, d)
        v = padded_projection(self.v_proj, x, *layout).view(n, G + t + 2 * bs, h, d)
        tok_mask = None if key_mask is None else key_mask[:, G:]  # (n, t)
        glob_mask = q.new_zeros(n, G) if key_mask is None else key_mask[:, :G]
        blank = q.new_full((n, bs), neg)
        mask = torch.cat([glob_mask, blank, q.new_zeros(n, t) if tok_mask is None else tok_mask, blank], 1)
        sources = [(k, v, mask[:, None, :])]  # (n, G + t + 2bs, h, d), mask (n, 1, G + t + 2bs)
        block_windows = [wa.Window(0, 0, 0, G), wa.Window(0, G, bs, 3 * bs)]
        if self.has_sparse:
            tokens = slice(G + bs, G + bs + t)
            sk, sv, sm = self._sparse(q, k[:, tokens], v[:, tokens], tok_mask)  # (n, ns, h, d), (n, 1|h, ns)
            ns, sbs = sk.size(1), self.sparse_block_size
            step = bs // self.sparsity_factor
            P = sbs + step
            pad = (0, 0, 0, 0, P, P)
            sm = F.pad(q.new_zeros(n, 1, ns) if sm is None else sm, (P, P), value=neg)  # (n, 1|h, ns + 2P)
            sources.append((F.pad(sk, pad), F.pad(sv, pad), sm))
            block_windows += [wa.Window(1, 0, step, sbs), wa.Window(1, 3 * step + sbs, step, sbs)]
        groups = [
            wa.QueryGroup(0, 1, G, [wa.Window(0, 0, 0, G), wa.Window(0, G + bs, 0, t)]),
            wa.QueryGroup(G, nb, bs, block_windows),
        ]
        # the padding blocks are trimmed off the edge blocks' windows and no window of an unpadded
        # input keeps a mask: the kernel then adds none to the scores
        groups = wa.split_unmasked(groups, [m for _, _, m in sources])
        out = wa.window_attention(q, sources, groups, scale=d**-0.5, inplace=True)  # (n, S, h, d): over q
        return out.view(n, S, h * d)

    # ------------------------------------------------------------------ LSG path, FlexAttention
    def _lsg_flex(
        self, x: Tensor, q: Tensor, pad_mask: Optional[Tensor], key_mask: Optional[Tensor], block_masks: dict
    ) -> Tensor:
        """Token queries in one flex call over the keys laid out as ``flex.LSGLayout``: [t tokens |
        G globals | dead slots | ns sparse]; global queries in one SDPA over the first t + G.

        x (n, S, C) the layer input and q (n, S, h, d) its queries, S = G + t, t a multiple of bs;
        pad_mask (n, S) bool True = not attended and key_mask its additive form, or None. Returns
        the attention output (n, S, C) before out_proj: the same softmax over the same keys as
        :meth:`_lsg_gathered`. ``block_masks`` keeps the block tables for the next layers: they
        depend on the shapes and the padding only.
        """
        n, S, h, d = q.shape
        G, bs = self.num_global_tokens, self.block_size
        t = S - G
        ns = t // self.sparsity_factor if self.has_sparse else 0
        layout = flex.LSGLayout(t, G, bs, bs // self.sparsity_factor, self.sparse_block_size, ns)
        grad = torch.is_grad_enabled()
        # without autograd the sparse sequence is written into the projections' buffer (no copy
        # of the tokens); with it, appended by cat: writing into the buffer would change the
        # token keys some sparse functions save for backward
        pieces = [(slice(G, S), 0), (slice(0, G), t)]
        length = t + G if grad else layout.length
        k = padded_projection(self.k_proj, x, pieces, length).view(n, length, h, d)  # (n, t + G [+ ...], h, d)
        v = padded_projection(self.v_proj, x, pieces, length).view(n, length, h, d)
        key_ok = (
            torch.ones(n, t + G, dtype=torch.bool, device=q.device)
            if pad_mask is None
            else ~torch.cat([pad_mask[:, G:], pad_mask[:, :G]], dim=1).bool()
        )  # (n, t + G) tokens, globals
        sparse_ok = None
        if ns:
            tok_mask = None if key_mask is None else key_mask[:, G:]  # (n, t)
            sk, sv, sm = self._sparse(q, k[:, :t], v[:, :t], tok_mask)  # (n, ns, h, d), (n, 1|h, ns)
            if grad:  # (.to: under autocast a sparse function may return float32; flex takes one dtype)
                dead = k.new_zeros(n, layout.sparse_at - t - G, h, d)
                k = torch.cat([k, dead, sk.to(k.dtype)], dim=1)  # (n, layout.length, h, d)
                v = torch.cat([v, dead, sv.to(v.dtype)], dim=1)
            else:
                k[:, layout.sparse_at :], v[:, layout.sparse_at :] = sk, sv
            sparse_ok = (
                torch.ones(n, h, ns, dtype=torch.bool, device=q.device)
                if sm is None
                else (sm == 0).expand(n, h, ns).contiguous()
            )  # (n, h, ns) this layer's
        mask_mod = flex.lsg_mask_mod(layout, key_ok, sparse_ok)
        if layout not in block_masks:
            block_masks[layout] = flex.lsg_block_mask(layout, key_ok, mask_mod)
        block_mask = flex.with_mask_mod(block_masks[layout], mask_mod)

        keys, values = k.transpose(1, 2), v.transpose(1, 2)  # (n, h, layout.length, d)
        out_tok = flex.flex_attention(q[:, G:].transpose(1, 2), keys, values, block_mask, scale=d**-0.5)
        glob_mask = None
        if key_mask is not None:
            glob_mask = torch.cat([key_mask[:, G:], key_mask[:, :G]], dim=1)[:, None, None, :]  # (n, 1, 1, t + G)
        out_global = self._attend(q[:, :G].transpose(1, 2), keys[:, :, : t + G], values[:, :, : t + G], glob_mask)
        out_tok = out_tok.transpose(1, 2).reshape(n, t, h * d)  # (n, t, C)
        out_global = out_global.transpose(1, 2).reshape(n, G, h * d)
        return torch.cat([out_global, out_tok], dim=1)  # (n, S, C)

    # ------------------------------------------------------------------ LSG path, gathered keys
    def _lsg_gathered(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor]) -> Tensor:
        """The key set of every block gathered with one ``index_select`` (any device, dropout).

        q, k, v (n, S, h, d) with S = G + t, t a multiple of bs; key_mask (n, S) or None. Returns the
        attention output (n, S, C) before out_proj: the same softmax over the same keys as
        :meth:`_lsg_windows`."""
        n, S, h, d = q.shape
        G, bs = self.num_global_tokens, self.block_size
        t = S - G
        nb = t // bs

        # global queries: full attention over every key
        glob_mask = None if key_mask is None else key_mask[:, None, None, :]
        out_global = self._attend(
            q[:, :G].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), glob_mask
        )  # (n, h, G, d)

        # per-block key sets are gathered from [all keys (S) | sparse sequence (ns)]
        src_k, src_v, src_m = k, v, None
        ns = 0
        if self.has_sparse:
            tok_mask = None if key_mask is None else key_mask[:, G:]  # (n, t)
            sk, sv, sm = self._sparse(q, k[:, G:], v[:, G:], tok_mask)  # (n, ns, h, d), (n, 1|h, ns)
            ns = sk.size(1)
            src_k = torch.cat([k, sk], dim=1)  # (n, S + ns, h, d)
            src_v = torch.cat([v, sv], dim=1)
            if sm is not None:
                km = q.new_zeros(n, S) if key_mask is None else key_mask
                src_m = torch.cat([km[:, None, :].expand(n, sm.size(1), S), sm], dim=2)
        elif key_mask is not None:
            src_m = key_mask[:, None, :]  # (n, 1, S)

        index, static_mask = self._block_keys(nb, ns, S, q.device, q.dtype)  # (nb*Kn,), (nb, Kn)
        Kn = static_mask.size(1)
        if fan_in_ops.wanted(self.fan_in_backward, src_k):
            table = self._fan_in(nb, ns, S, q.device, q.dtype)
            keys = fan_in_ops.gather_rows(src_k, index, table, G, nb)
            values = fan_in_ops.gather_rows(src_v, index, table, G, nb)
        else:
            keys, values = src_k.index_select(1, index), src_v.index_select(1, index)
        keys = keys.view(n * nb, Kn, h, d).transpose(1, 2)  # (n*nb, h, Kn, d)
        values = values.view(n * nb, Kn, h, d).transpose(1, 2)
        if src_m is None:
            mask = static_mask[:, None, None, :]  # (nb, 1, 1, Kn): only out-of-range keys
            if n > 1:
                mask = mask.repeat(n, 1, 1, 1)  # (n*nb, 1, 1, Kn)
        else:
            hm = src_m.size(1)
            mask = src_m.index_select(2, index).view(n, hm, nb, Kn)
            mask = torch.minimum(mask, static_mask)  # masked if padded OR out of range
            mask = mask.transpose(1, 2).reshape(n * nb, hm, 1, Kn)  # (n*nb, 1|h, 1, Kn)

        q_tok = q[:, G:].reshape(n * nb, bs, h, d).transpose(1, 2)  # (n*nb, h, bs, d)
        out_tok = self._attend(q_tok, keys, values, mask)  # (n*nb, h, bs, d)
        out_tok = out_tok.transpose(1, 2).reshape(n, t, h * d)
        out_global = out_global.transpose(1, 2).reshape(n, G, h * d)
        return torch.cat([out_global, out_tok], dim=1)  # (n, S, C)

    def _block_keys(self, nb: int, ns: int, S: int, device, dtype) -> Tuple[Tensor, Tensor]:
        """Key positions of every query block and their static additive mask, cached.

        Index (nb * Kn,) into [keys (S) | sparse (ns)], per block: G globals, 2*sbs sparse,
        3*bs local, then padding up to a multiple of KEY_ALIGN. Out-of-range entries point at
        key 0 and are masked with finfo.min in the (nb, Kn) mask (they get exactly 0 weight,
        like the reference's zero vectors with mask min).
        """
        cache_key = (nb, ns, S, str(device), dtype)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached
        G, bs = self.num_global_tokens, self.block_size
        parts = [torch.arange(G, device=device).expand(nb, G)]
        valid_parts = [torch.ones(nb, G, dtype=torch.bool, device=device)]
        if self.has_sparse:
            step = bs // self.sparsity_factor
            idx, ok = sparse_window_indices(nb, step, self.sparse_block_size, n_sparse=ns, device=device)  # (nb, 2*sbs)
            parts.append(clamp_index(idx + S, ok, 0))
            valid_parts.append(ok)
        idx, ok = local_window_indices(nb, bs, 1, 1, device=device)  # (nb, 3*bs)
        parts.append(clamp_index(idx + G, ok, 0))
        valid_parts.append(ok)
        index, valid = torch.cat(parts, dim=1), torch.cat(valid_parts, dim=1)
        extra = -index.size(1) % KEY_ALIGN
        if extra:
            index = F.pad(index, (0, extra), value=0)
            valid = F.pad(valid, (0, extra), value=False)
        mask = torch.zeros(valid.shape, dtype=dtype, device=device)
        mask.masked_fill_(~valid, torch.finfo(dtype).min)
        if len(self._cache) > MAX_CACHED_BLOCK_TABLES:
            self._cache.clear()
            self._fan_in_tables.clear()
        self._cache[cache_key] = (index.reshape(-1), mask)
        return self._cache[cache_key]

    def _fan_in(self, nb: int, ns: int, S: int, device, dtype) -> Tensor:
        """:meth:`_block_keys`' index transposed for ``ops.fan_in.gather_rows``' backward, cached:
        (S + ns, R) the block positions that read each key row, the G global columns apart. R, the
        most readers a row has: 3 local windows for a token; for a sparse entry the before and after
        runs (sbs entries, one every step) that hold it, at most 2 * ceil(sbs / step)."""
        cache_key = (nb, ns, S, str(device), dtype)
        cached = self._fan_in_tables.get(cache_key)
        if cached is not None:
            return cached
        index, mask = self._block_keys(nb, ns, S, device, dtype)
        width = 3
        if self.has_sparse:
            step = self.block_size // self.sparsity_factor
            width = max(width, 2 * -(-self.sparse_block_size // step))
        table = fan_in_ops.fan_in_table(index.view(nb, -1), mask == 0, S + ns, self.num_global_tokens, width)
        self._fan_in_tables[cache_key] = table
        return table
