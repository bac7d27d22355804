"""Local self-attention (the toy encoder of tests/test_families.py): each token attends to the keys
at most ``window`` positions away.

Plain torch, like every layer of ``lsg_layers``: BART's attention parameters by their fairseq names
(``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, so BART weights load by name) and
``MultiheadAttention``'s call signature, with a band mask: dense, O(L^2), for the recipe's sake; a
real encoder computes only the band.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class LocalSelfAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, window: int, dropout: float = 0.0):
        super().__init__()
        self.num_heads, self.head_dim, self.window, self.dropout = num_heads, embed_dim // num_heads, window, dropout
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(embed_dim, embed_dim) for _ in range(4))

    def forward(self, query, key=None, value=None, key_padding_mask=None, **unused):
        T, B, C = query.shape
        x = query.transpose(0, 1)  # (B, T, C)
        q, k, v = (
            p(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        i = torch.arange(T, device=query.device)
        allowed = ((i[:, None] - i[None, :]).abs() <= self.window)[None, None]  # (1, 1, T, T)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask.bool()[:, None, None, :]  # (B, 1, T, T)
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p)  # (B, heads, T, d)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, C)).transpose(0, 1), None
