"""Local self-attention (the toy encoder of tests/test_families.py): each token attends to the keys
at most ``window`` positions away.

fairseq's ``MultiheadAttention`` (same parameters, so BART weights load by name) with a band mask:
dense, O(L^2), for the recipe's sake; a real encoder computes only the band.
"""

import torch
from fairseq.modules import MultiheadAttention


class LocalSelfAttention(MultiheadAttention):
    def __init__(self, embed_dim: int, num_heads: int, window: int, dropout: float = 0.0):
        super().__init__(embed_dim, num_heads, dropout=dropout, self_attention=True)
        self.window = window

    def forward(self, query, key=None, value=None, key_padding_mask=None, attn_mask=None, **kwargs):
        T = query.size(0)  # (T, B, C)
        i = torch.arange(T, device=query.device)
        far = (i[:, None] - i[None, :]).abs() > self.window  # (T, T): True = not attended
        band = torch.zeros(T, T, dtype=query.dtype, device=query.device).masked_fill(far, float("-inf"))
        return super().forward(query, key, value, key_padding_mask=key_padding_mask, attn_mask=band, **kwargs)
