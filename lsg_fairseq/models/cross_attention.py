"""Decoder cross-attention over long sources without a (heads x target x source) probability tensor.

fairseq's ``MultiheadAttention`` takes its fused path (``F.multi_head_attention_forward``) only for
self-attention; encoder-decoder attention (``static_kv``) always materialises the softmax in fp32
and keeps it for backward: at 16K source tokens, 256 target tokens and 12 heads that is 192 MiB per
decoder layer and step, more than any encoder layer keeps. :class:`LongSourceCrossAttention` is
the same module (same parameters and state dict) whose full-sequence calls that ask for no
attention weights run ``F.scaled_dot_product_attention`` instead, which keeps only q, k, v, the
output and one log-sum-exp per query. Same math: softmax(q k^T * d^-0.5 + pad mask) v.
Incremental decoding, ``need_weights`` (the alignment layer), ``before_softmax``, attention masks,
bias_k / zero attention and attention dropout in training keep fairseq's path.
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
        fused = (
            incremental_state is None
            and key is not None
            and not need_weights
            and not need_head_weights
            and not before_softmax
            and attn_mask is None
            and self.bias_k is None
            and not self.add_zero_attn
            and (not self.training or self.dropout_module.p == 0)
        )
        if not fused:
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
            mask = torch.zeros(n, 1, 1, src, dtype=q.dtype, device=q.device)
            mask.masked_fill_(key_padding_mask.bool()[:, None, None, :], torch.finfo(q.dtype).min)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # (n, h, tgt, d)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt, n, C))
