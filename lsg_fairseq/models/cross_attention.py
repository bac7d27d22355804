"""Decoder cross-attention over long sources without a (heads x target x source) probability tensor.

fairseq's ``MultiheadAttention`` takes its fused path (``F.multi_head_attention_forward``) only for
self-attention; encoder-decoder attention (``static_kv``) always materialises the softmax in fp32
and keeps it for backward: at 16K source tokens, 256 target tokens and 12 heads that is 192 MiB per
decoder layer and step, more than any encoder layer keeps. :class:`LongSourceCrossAttention` is
the same module (same parameters and state dict) whose full-sequence calls that ask for no
attention weights run ``F.scaled_dot_product_attention`` instead, which keeps only q, k, v, the
output and one log-sum-exp per query. Same math: softmax(q k^T * d^-0.5 + pad mask) v.

Incremental decoding: the first step runs fairseq's path, which projects and caches the source's
keys and values (one row per source under beam search, ``set_beam_size``); every later step that
asks for no weights is one SDPA call over that cache (:meth:`_fused_step`), a source's hypotheses
as its query rows, where fairseq's path issues einsums and their reshapes, a masked fill, a
softmax and casts, and a decoding step waits on the host (counts: benchmarks/flex_gpu_notes.md).
``fairseq-generate`` and the hub ask for weights from the last layer only (its alignment,
``make_generation_fast_``); that layer keeps fairseq's path.

``need_weights``, ``before_softmax``, attention masks, bias_k / zero attention and attention
dropout in training keep fairseq's path. Scores stay float32 inside SDPA where fairseq's path rounds
them to a half dtype: float32 agrees to rounding (tests/test_generation.py).
"""

from typing import Optional

import torch
import torch.nn.functional as F
from fairseq.modules.multihead_attention import MultiheadAttention


class LongSourceCrossAttention(MultiheadAttention):
    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        incremental_state=None,
        need_weights=True,
        static_kv=False,
        attn_mask=None,
        before_softmax=False,
        need_head_weights=False,
    ):
        plain = (
            not need_weights
            and not need_head_weights
            and not before_softmax
            and attn_mask is None
            and self.bias_k is None
            and not self.add_zero_attn
            and (not self.training or self.dropout_module.p == 0)
        )
        if plain and incremental_state is not None and static_kv:
            cached = self._get_input_buffer(incremental_state)
            if cached.get("prev_key") is not None:
                return self._fused_step(query, cached), None
        if not (plain and incremental_state is None and key is not None):
            return super().forward(
                query,
                key,
                value,
                key_padding_mask,
                incremental_state,
                need_weights,
                static_kv,
                attn_mask,
                before_softmax,
                need_head_weights,
            )
        return self._fused(query, key, value, key_padding_mask), None

    def _fused(self, query, key, value, key_padding_mask: Optional[torch.Tensor]):
        tgt, n, C = query.shape
        src = key.size(0)
        h, d = self.num_heads, self.head_dim
        q = self.q_proj(query).view(tgt, n, h, d).permute(1, 2, 0, 3)  # (n, h, tgt, d)
        k = self.k_proj(key).view(src, n, h, d).permute(1, 2, 0, 3)  # (n, h, src, d)
        v = self.v_proj(value).view(src, n, h, d).permute(1, 2, 0, 3)
        mask = None
        if key_padding_mask is not None:
            mask = ~key_padding_mask.bool()[:, None, None, :]  # (n, 1, 1, src): True where a key is attended
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # (n, h, tgt, d)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt, n, C))

    def _fused_step(self, query, cached):
        """One decoding step over the keys and values fairseq's path cached at the first step:
        query (tgt, bsz, C), ``prev_key`` / ``prev_value`` (kv_bsz, h, S, d), ``bsz = beam * kv_bsz``
        (a source's hypotheses adjacent), ``prev_key_padding_mask`` (kv_bsz, S) True at pads."""
        tgt, bsz, C = query.shape
        h, d = self.num_heads, self.head_dim
        k, v = cached["prev_key"], cached["prev_value"]
        kv_bsz = k.size(0)
        beam = bsz // kv_bsz
        q = self.q_proj(query) * self.scaling  # scaled before the product, as fairseq's path does
        q = q.view(tgt, kv_bsz, beam, h, d).permute(1, 3, 2, 0, 4).reshape(kv_bsz, h, beam * tgt, d)
        mask = None
        pad = cached.get("prev_key_padding_mask")
        if pad is not None and pad.dim() == 2:  # fairseq may store a 0-dim tensor for "none"
            mask = ~pad.bool()[:, None, None, :]  # (kv_bsz, 1, 1, S): True where a key is attended
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)  # (kv_bsz, h, beam*tgt, d)
        out = out.view(kv_bsz, h, beam, tgt, d).permute(3, 0, 2, 1, 4).reshape(tgt, bsz, C)
        return self.out_proj(out)
