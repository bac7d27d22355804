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
masked), dropout on the probabilities. Attention itself runs in
``F.scaled_dot_product_attention`` on per-block key sets gathered with one ``index_select``:
memory is O(t * Kn), linear in t; nothing of size t x t is ever built.

Deliberate deviations from the reference (spec section 9):
- sparse windows follow the Step-B formula for every valid (bs, sbs, sf) (the reference's
  pad+unfold arithmetic is wrong unless step is even and 4*sbs > 3*step);
- bos_pooling masks sparse groups made only of padding (the reference leaks them in fp32);
- lsh draws its random projections from ``self.generator`` when one is set (reproducible);
- unknown sparsity types and inconsistent sizes are errors (``check_lsg_config``), not warnings.
"""
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lsg_fairseq.ops import window_attention as wa
from lsg_fairseq.ops.blocks import (
    clamp_index,
    local_window_indices,
    padded_length,
    sparse_window_indices,
)

SPARSITY_TYPES = ("none", "norm", "pooling", "stride", "block_stride", "lsh", "bos_pooling")

# Key sets are padded with masked keys up to a multiple of this, so that the additive mask's
# last dimension is aligned for the fused SDPA kernels (masked keys add exactly 0 weight).
_KEY_ALIGN = 8


def normalize_sparsity_type(sparsity_type) -> str:
    """Map the reference's spellings (None, "None") to "none"; other values pass unchanged."""
    if sparsity_type is None or str(sparsity_type).lower() == "none":
        return "none"
    return str(sparsity_type)


def check_lsg_config(
    block_size: int,
    sparse_block_size: int,
    sparsity_factor: int,
    sparsity_type,
    num_global_tokens: int,
    lsh_num_pre_rounds: int = 1,
    names: Optional[Dict[str, str]] = None,
) -> None:
    """Raise ``ValueError`` for hyper-parameters the LSG attention cannot honour.

    ``names`` maps argument names to how the caller calls them (e.g. CLI flags), so messages
    name what the user typed.
    """
    n = {k: k for k in ("block_size", "sparse_block_size", "sparsity_factor", "sparsity_type",
                        "num_global_tokens", "lsh_num_pre_rounds")}
    n.update(names or {})
    stype = normalize_sparsity_type(sparsity_type)
    if stype not in SPARSITY_TYPES:
        raise ValueError(
            f"{n['sparsity_type']}={sparsity_type!r} is not a known sparsity type; choose one of "
            f"{', '.join(SPARSITY_TYPES)}"
        )
    if block_size < 1:
        raise ValueError(f"{n['block_size']} must be >= 1, got {block_size}")
    if not 1 <= num_global_tokens <= 512:
        raise ValueError(f"{n['num_global_tokens']} must be in [1, 512], got {num_global_tokens}")
    if sparse_block_size < 0:
        raise ValueError(f"{n['sparse_block_size']} must be >= 0, got {sparse_block_size}")
    if sparsity_factor < 1:
        raise ValueError(f"{n['sparsity_factor']} must be >= 1, got {sparsity_factor}")
    if block_size % sparsity_factor != 0:
        raise ValueError(
            f"{n['sparsity_factor']} ({sparsity_factor}) must divide {n['block_size']} ({block_size})"
        )
    if stype == "none" or sparse_block_size == 0:
        return
    step = block_size // sparsity_factor
    if sparse_block_size < step:
        raise ValueError(
            f"{n['sparse_block_size']} ({sparse_block_size}) must be >= {n['block_size']} / "
            f"{n['sparsity_factor']} ({step}) when sparse attention is on (or use "
            f"{n['sparsity_type']}=none / {n['sparse_block_size']}=0)"
        )
    if stype in ("norm", "lsh") and sparsity_factor > 1:
        # these types select/merge tokens inside chunks of c = min(bs, sbs) tokens
        c = min(block_size, sparse_block_size)
        if block_size % c != 0 or c % sparsity_factor != 0:
            raise ValueError(
                f"{n['sparsity_type']}={stype} works on chunks of min({n['block_size']}, "
                f"{n['sparse_block_size']}) = {c} tokens, which must divide {n['block_size']} "
                f"({block_size}) and be a multiple of {n['sparsity_factor']} ({sparsity_factor})"
            )
    if stype == "lsh" and lsh_num_pre_rounds < 0:
        raise ValueError(f"{n['lsh_num_pre_rounds']} must be >= 0, got {lsh_num_pre_rounds}")


class LSGSelfAttention(nn.Module):
    """Drop-in encoder self-attention for fairseq (``MultiheadAttention``'s call signature).

    ``forward(query=x, key=x, value=x, key_padding_mask=m)`` with x of shape (T, B, C) where the
    first ``num_global_tokens`` time steps are the global tokens, and m (B, T) bool, True = pad
    (or None). Returns ``(out (T, B, C), None)``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_global_tokens: int = 1,
        block_size: int = 128,
        sparse_block_size: int = 128,
        sparsity_factor: int = 2,
        sparsity_type: Optional[str] = "norm",
        dropout: float = 0.0,
        lsh_num_pre_rounds: int = 1,
        bias: bool = True,
        generator: Optional[torch.Generator] = None,
    ):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        check_lsg_config(block_size, sparse_block_size, sparsity_factor, sparsity_type,
                         num_global_tokens, lsh_num_pre_rounds)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.num_global_tokens = num_global_tokens
        self.block_size = block_size
        self.sparse_block_size = sparse_block_size
        self.sparsity_factor = sparsity_factor
        self.sparsity_type = normalize_sparsity_type(sparsity_type)
        self.dropout = dropout
        self.lsh_num_pre_rounds = lsh_num_pre_rounds
        # Source of randomness for the lsh projections; None -> torch's global RNG (reference).
        self.generator = generator
        self.has_sparse = self.sparsity_type != "none" and sparse_block_size > 0
        self._cache = {}  # per-length block index tables (_block_keys); not state
        c = min(block_size, sparse_block_size)
        # norm: do sparse windows cut through the chunks of c/sf selected tokens?
        self._norm_order_matters = sparse_block_size % max(c // sparsity_factor, 1) != 0

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
        return (f"G={self.num_global_tokens}, block_size={self.block_size}, "
                f"sparse_block_size={self.sparse_block_size}, "
                f"sparsity_factor={self.sparsity_factor}, sparsity_type={self.sparsity_type}")

    # ------------------------------------------------------------------ main entry point
    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        need_weights: bool = False,
        attn_mask: Optional[Tensor] = None,
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
            pad_mask = torch.cat(
                [pad_mask.bool(), pad_mask.new_ones(n, extra, dtype=torch.bool)], dim=1
            )  # (n, G + t)

        # token-major layout (n, S, h, d) throughout: the projections' own layout, so the
        # per-block gathers and the attention outputs need no permute copies
        S = x.size(1)
        q = self.q_proj(x).view(n, S, self.num_heads, self.head_dim)  # (n, S, h, d)
        k = self.k_proj(x).view(n, S, self.num_heads, self.head_dim)
        v = self.v_proj(x).view(n, S, self.num_heads, self.head_dim)
        key_mask = None
        if pad_mask is not None:
            key_mask = torch.zeros(pad_mask.shape, dtype=q.dtype, device=q.device)
            key_mask.masked_fill_(pad_mask.bool(), torch.finfo(q.dtype).min)  # (n, S) additive

        if L <= 2 * bs:
            mask = None if key_mask is None else key_mask[:, None, None, :]
            out = self._attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
            out = out.transpose(1, 2).reshape(n, S, C)  # (n, S, C)
        else:
            out = self._lsg(q, k, v, key_mask)  # (n, S, C)
        out = self.out_proj(out[:, :T])  # (n, T, C): adaptive padding dropped
        return out.transpose(0, 1), None  # (T, n, C)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
        """softmax(q k^T / sqrt(d) + mask) v with dropout on the probabilities; (B, h, L, d)."""
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )

    # ------------------------------------------------------------------ LSG path
    def _lsg(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor]) -> Tensor:
        """q, k, v (n, S, h, d) with S = G + t, t a multiple of bs; key_mask (n, S) or None.

        Returns the attention output (n, S, C) before out_proj. On CPU without attention dropout
        the key sets are strided views (``_lsg_windows``); elsewhere they are gathered
        (``_lsg_gathered``). Both compute the same softmax over the same keys.
        """
        if wa.supported(q, self.dropout if self.training else 0.0):
            return self._lsg_windows(q, k, v, key_mask)
        return self._lsg_gathered(q, k, v, key_mask)

    def _lsg_windows(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor]) -> Tensor:
        """The LSG key set of every block as four strided windows (``ops.window_attention``).

        Sources, token-major: 0 = the G global keys; 1 = the tokens with one masked block of
        padding on each side, so block j's local window is padded blocks j .. j+2 (start 0,
        stride bs, 3*bs keys); 2 = the sparse sequence with P = sbs + step masked entries on
        each side, so block j's "before" run [(j-1)*step - sbs, (j-1)*step) starts at j*step and
        its "after" run [(j+2)*step, (j+2)*step + sbs) at j*step + 3*step + sbs. Global queries
        see sources 0 and 1 (every real key). Nothing per block is copied, in forward or
        backward.
        """
        n, S, h, d = q.shape
        G, bs = self.num_global_tokens, self.block_size
        t = S - G
        nb = t // bs
        neg = torch.finfo(q.dtype).min
        if key_mask is None and self.sparsity_type == "lsh":
            key_mask = q.new_zeros(n, S)  # lsh can leave buckets empty: its mask is always needed
        tok_mask = None if key_mask is None else key_mask[:, G:]  # (n, t)

        # clones, not views: what backward keeps must not hold the whole k/v projections alive
        glob = (k[:, :G].clone(), v[:, :G].clone(),
                None if key_mask is None else key_mask[:, None, :G].clone())  # (n, G, h, d)
        pad = (0, 0, 0, 0, bs, bs)
        local_mask = F.pad(q.new_zeros(n, t) if tok_mask is None else tok_mask, (bs, bs), value=neg)
        local = (F.pad(k[:, G:], pad), F.pad(v[:, G:], pad), local_mask[:, None, :])  # (n, t + 2bs, h, d)
        sources = [glob, local]
        block_windows = [wa.Window(0, 0, 0, G), wa.Window(1, 0, bs, 3 * bs)]
        if self.has_sparse:
            sk, sv, sm = self._sparse_tokens(
                q[:, G:G + 1].transpose(1, 2), k[:, G:].transpose(1, 2), v[:, G:].transpose(1, 2),
                tok_mask)  # (n, h, ns, d), mask (n, 1|h, ns) or None
            ns, sbs = sk.size(2), self.sparse_block_size
            step = bs // self.sparsity_factor
            P = sbs + step
            pad = (0, 0, 0, 0, P, P)
            sm = F.pad(q.new_zeros(n, 1, ns) if sm is None else sm, (P, P), value=neg)  # (n, 1|h, ns + 2P)
            sources.append((F.pad(sk.transpose(1, 2), pad), F.pad(sv.transpose(1, 2), pad), sm))
            block_windows += [wa.Window(2, 0, step, sbs), wa.Window(2, 3 * step + sbs, step, sbs)]
        groups = [wa.QueryGroup(0, 1, G, [wa.Window(0, 0, 0, G), wa.Window(1, bs, 0, t)]),
                  wa.QueryGroup(G, nb, bs, block_windows)]
        out = wa.window_attention(q, sources, groups, scale=d ** -0.5)  # (n, S, h, d)
        return out.view(n, S, h * d)

    def _lsg_gathered(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor]) -> Tensor:
        """The key set of every block gathered with one ``index_select`` (any device, dropout)."""
        n, S, h, d = q.shape
        G, bs = self.num_global_tokens, self.block_size
        t = S - G
        nb = t // bs
        if key_mask is None and self.sparsity_type == "lsh":
            key_mask = q.new_zeros(n, S)  # lsh can leave buckets empty: its mask is always needed

        # global queries: full attention over every key
        glob_mask = None if key_mask is None else key_mask[:, None, None, :]
        out_global = self._attend(q[:, :G].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  glob_mask)  # (n, h, G, d)

        # per-block key sets are gathered from [all keys (S) | sparse sequence (ns)]
        src_k, src_v, src_m = k, v, None
        ns = 0
        if self.has_sparse:
            tok_mask = None if key_mask is None else key_mask[:, G:]  # (n, t)
            sk, sv, sm = self._sparse_tokens(
                q[:, G:G + 1].transpose(1, 2), k[:, G:].transpose(1, 2), v[:, G:].transpose(1, 2),
                tok_mask)  # (n, h, ns, d), mask (n, 1|h, ns) or None
            ns = sk.size(2)
            src_k = torch.cat([k, sk.transpose(1, 2)], dim=1)  # (n, S + ns, h, d)
            src_v = torch.cat([v, sv.transpose(1, 2)], dim=1)
            if key_mask is not None:
                src_m = torch.cat([key_mask[:, None, :].expand(n, sm.size(1), S), sm], dim=2)
        elif key_mask is not None:
            src_m = key_mask[:, None, :]  # (n, 1, S)

        index, static_mask = self._block_keys(nb, ns, S, q.device, q.dtype)  # (nb*Kn,), (nb, Kn)
        Kn = static_mask.size(1)
        keys = src_k.index_select(1, index).view(n * nb, Kn, h, d).transpose(1, 2)  # (n*nb, h, Kn, d)
        values = src_v.index_select(1, index).view(n * nb, Kn, h, d).transpose(1, 2)
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
        3*bs local, then padding up to a multiple of _KEY_ALIGN. Out-of-range entries point at
        key 0 and are masked with finfo.min in the (nb, Kn) mask (they get exactly 0 weight,
        like the reference's zero vectors with mask min).
        """
        cache_key = (nb, ns, S, str(device), dtype)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached
        G, bs = self.num_global_tokens, self.block_size
        parts = [torch.arange(G, device=device).expand(nb, G)]
        valid = [torch.ones(nb, G, dtype=torch.bool, device=device)]
        if self.has_sparse:
            step = bs // self.sparsity_factor
            idx, ok = sparse_window_indices(nb, step, self.sparse_block_size, n_sparse=ns,
                                            device=device)  # (nb, 2*sbs)
            parts.append(clamp_index(idx + S, ok, 0))
            valid.append(ok)
        idx, ok = local_window_indices(nb, bs, 1, 1, device=device)  # (nb, 3*bs)
        parts.append(clamp_index(idx + G, ok, 0))
        valid.append(ok)
        index, valid = torch.cat(parts, dim=1), torch.cat(valid, dim=1)
        extra = -index.size(1) % _KEY_ALIGN
        if extra:
            index = F.pad(index, (0, extra), value=0)
            valid = F.pad(valid, (0, extra), value=False)
        mask = torch.zeros(valid.shape, dtype=dtype, device=device)
        mask.masked_fill_(~valid, torch.finfo(dtype).min)
        if len(self._cache) > 16:
            self._cache.clear()
        self._cache[cache_key] = (index.reshape(-1), mask)
        return self._cache[cache_key]

    # ------------------------------------------------------------------ sparse keys (Step A)
    def _sparse_tokens(self, q0: Tensor, k: Tensor, v: Tensor, mask: Tensor):
        """Build the sparse sequence from the token keys/values.

        q0 (n, h, 1, d): query of the first non-global token (bos_pooling); k, v (n, h, t, d);
        mask (n, t) additive, or None when nothing is padded. Returns sparse keys, values
        (n, h, ns, d) and their mask (n, 1|h, ns) (None when ``mask`` is None).
        """
        if self.sparsity_factor == 1:
            return k, v, None if mask is None else mask[:, None, :]
        return getattr(self, "_sparse_" + self.sparsity_type)(q0, k, v, mask)

    def _sparse_norm(self, q0, k, v, mask):
        # per chunk of c tokens keep the c/sf keys of largest norm, independently per head
        n, h, t, d = k.shape
        c = min(self.block_size, self.sparse_block_size)
        keep = c // self.sparsity_factor
        with torch.no_grad():
            norms = k.detach().norm(dim=-1)  # (n, h, t)
            if mask is not None:
                norms = norms.masked_fill(mask[:, None, :] != 0, 0.0)  # padding never wins
            norms = norms.view(n, h, t // c, c)
            idx = norms.topk(keep, dim=-1, largest=True, sorted=self._norm_order_matters).indices
            if self._norm_order_matters:
                # windows cut through chunks: keep the reference's order (ascending norm, as
                # its argsort-then-take-last gives); otherwise only the set matters
                idx = idx.flip(-1)
            idx = idx + torch.arange(0, t, c, device=k.device)[:, None]  # (n, h, t/c, keep)
            idx = idx.reshape(n, h, -1)  # (n, h, ns)
        full = idx[..., None].expand(n, h, idx.size(2), d)
        sm = None if mask is None else mask[:, None, :].expand(n, h, t).gather(2, idx)  # (n, h, ns)
        return k.gather(2, full), v.gather(2, full), sm

    def _sparse_pooling(self, q0, k, v, mask):
        # mean of each group of sf tokens over its valid tokens; empty groups masked
        n, h, t, d = k.shape
        sf = self.sparsity_factor
        if mask is None:  # every group full: sum / (sf + 1e-6) as the reference computes it
            sk = k.view(n, h, t // sf, sf, d).sum(dim=-2) / (sf + 1e-6)
            sv = v.view(n, h, t // sf, sf, d).sum(dim=-2) / (sf + 1e-6)
            return sk, sv, None
        valid = (mask == 0).to(k.dtype).view(n, 1, t // sf, sf, 1)
        count = valid.sum(dim=-2)  # (n, 1, ns, 1)
        sk = (k.view(n, h, t // sf, sf, d) * valid).sum(dim=-2) / (count + 1e-6)  # (n, h, ns, d)
        sv = (v.view(n, h, t // sf, sf, d) * valid).sum(dim=-2) / (count + 1e-6)
        sm = (count[..., 0] == 0).to(k.dtype) * torch.finfo(k.dtype).min  # (n, 1, ns)
        return sk, sv, sm

    def _gather_per_head(self, k, v, mask, idx):
        """Gather token positions idx (h, ns), a different set per head."""
        n, h, t, d = k.shape
        full = idx[None, :, :, None].expand(n, h, idx.size(1), d)
        sm = None
        if mask is not None:
            sm = mask[:, None, :].expand(n, h, t).gather(2, idx[None].expand(n, h, idx.size(1)))
        return k.gather(2, full), v.gather(2, full), sm

    def _sparse_stride(self, q0, k, v, mask):
        # head hh takes tokens p*sf + (hh mod sf)
        n, h, t, d = k.shape
        sf = self.sparsity_factor
        heads = torch.arange(h, device=k.device)[:, None] % sf  # (h, 1)
        idx = torch.arange(0, t, sf, device=k.device)[None, :] + heads  # (h, ns)
        return self._gather_per_head(k, v, mask, idx)

    def _sparse_block_stride(self, q0, k, v, mask):
        # inside every block, head hh takes the run b*bs + ((r + hh*step) mod bs), r < step
        n, h, t, d = k.shape
        bs = self.block_size
        step = bs // self.sparsity_factor
        r = torch.arange(step, device=k.device)[None, None, :]  # (1, 1, step)
        heads = torch.arange(h, device=k.device)[:, None, None] * step  # (h, 1, 1)
        starts = torch.arange(0, t, bs, device=k.device)[None, :, None]  # (1, nb, 1)
        idx = ((r + heads) % bs + starts).reshape(h, -1)  # (h, nb*step)
        return self._gather_per_head(k, v, mask, idx)

    def _sparse_bos_pooling(self, q0, k, v, mask):
        # attention-pool each group of sf tokens with the first token's query (per head)
        n, h, t, d = k.shape
        sf = self.sparsity_factor
        kg = k.view(n, h, t // sf, sf, d)
        vg = v.view(n, h, t // sf, sf, d)
        scores = torch.einsum("nhgsd,nhd->nhgs", kg, q0[:, :, 0]) / math.sqrt(d)
        if mask is not None:
            mg = mask.view(n, 1, t // sf, sf)
            scores = scores + mg
        w = torch.softmax(scores, dim=-1)  # (n, h, ns, sf)
        sk = torch.einsum("nhgs,nhgsd->nhgd", w, kg)  # (n, h, ns, d)
        sv = torch.einsum("nhgs,nhgsd->nhgd", w, vg)
        if mask is None:
            return sk, sv, None
        # Fix of the reference (spec section 7): a group made only of padding is masked. The
        # reference averages the mask, which overflows to -inf in fp32 and unmasks the group.
        empty = (mg != 0).all(dim=-1)  # (n, 1, ns)
        sm = empty.to(k.dtype) * torch.finfo(k.dtype).min
        return sk, sv, sm

    def _sparse_lsh(self, q0, k, v, mask):
        if self.sparsity_factor == self.sparse_block_size:
            return self._sparse_bos_pooling(q0, k, v, mask)
        n, h, t, d = k.shape
        c = min(self.block_size, self.sparse_block_size)
        valid = (mask == 0).to(k.dtype).view(n, 1, t // c, c, 1)
        kc = k.view(n, h, t // c, c, d) * valid  # (n, h, t/c, c, d)
        vc = v.view(n, h, t // c, c, d) * valid
        weight = valid.expand(n, h, t // c, c, 1)  # tokens merged into each bucket
        for _ in range(self.lsh_num_pre_rounds):
            kc, vc, weight = self._lsh_round(kc, vc, weight, c)
        kc, vc, weight = self._lsh_round(kc, vc, weight, c // self.sparsity_factor)
        sk = (kc / (weight + 1e-8)).reshape(n, h, -1, d)  # bucket centroids (n, h, ns, d)
        sv = (vc / (weight + 1e-8)).reshape(n, h, -1, d)
        sm = (weight.reshape(n, h, -1) == 0).to(k.dtype) * torch.finfo(k.dtype).min
        return sk, sv, sm

    def _lsh_round(self, k, v, weight, buckets: int):
        """Hash each key direction into ``buckets`` bins per chunk (random projections,
        argmax over [xR, -xR]) and sum keys, values and weights per bin."""
        n, h, nc, c, d = k.shape
        with torch.no_grad():
            n_hashes = buckets // 2
            proj = torch.randn(1, h, 1, d, n_hashes, generator=self.generator,
                               device=k.device if self.generator is None else self.generator.device,
                               dtype=k.dtype).to(k.device)
            codes = (F.normalize(k, dim=-1) * weight.clamp(0, 1)) @ proj  # (n, h, nc, c, hashes)
            if n_hashes == 0:  # one bucket: everything merges (the reference would crash)
                bucket = torch.zeros(n, h, nc, c, 1, dtype=torch.long, device=k.device)
            else:
                bucket = torch.cat([codes, -codes], dim=-1).argmax(dim=-1, keepdim=True)  # (.., c, 1)
        zeros = k.new_zeros(n, h, nc, buckets, d)
        k = zeros.scatter_add(3, bucket.expand(n, h, nc, c, d), k)
        v = zeros.scatter_add(3, bucket.expand(n, h, nc, c, d), v)
        weight = weight.new_zeros(n, h, nc, buckets, 1).scatter_add(3, bucket, weight)
        return k, v, weight
