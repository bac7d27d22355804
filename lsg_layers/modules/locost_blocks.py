"""LOCOST encoder block (pre-norm SSM + gated FFN) and T5 v1.1 decoder block, pure torch.

Submodule names mirror the HF reference (``layer.0.layer_prenorm``, ``layer.0.ssm_layer``,
``layer.1.DenseReluDense``, ``layer.0.SelfAttention``, ``layer.1.EncDecAttention``, ...) so that a
reference state dict loads by name (spec ``shared/spec/locost.md`` section 5). All tensors are
batch-first (B, T, C) inside the blocks. In float16 every residual sum is clamped as in HF's T5
(:func:`~lsg_layers.modules.precision.clamp_fp16`); the FFN's float32 output makes the residual
stream float32 from there on (:mod:`lsg_layers.modules.t5_layers`).
"""

from typing import Optional

import torch
import torch.nn as nn

from lsg_layers.modules.lean_ffn import LeanDropout
from lsg_layers.modules.paths import PathChoice
from lsg_layers.modules.precision import clamp_fp16, fp16_in_play
from lsg_layers.modules.s4d import S4D
from lsg_layers.modules.t5_layers import T5_DEFAULTS, IncrementalState, T5Attention, T5DenseGatedGelu, T5LayerNorm


# Rows per FFN chunk on the whole-tensor path (GPU): few launches even at 600K tokens, and the
# (rows, d_ff) intermediates stay a few hundred MiB.
WHOLE_FFN_ROWS = 1 << 16
# Rows per FFN chunk on CPU without autograd: the (L, d_ff) intermediates of a long input would
# otherwise take GiBs, and chunks of 2048 rows are still large enough to keep the matmuls efficient.
CPU_FFN_ROWS = 2048


class T5LayerFF(PathChoice, nn.Module):
    """x + dropout(FFN(RMSNorm(x)))."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, eps: float):
        super().__init__()
        self.DenseReluDense = T5DenseGatedGelu(d_model, d_ff, dropout)
        self.layer_norm = T5LayerNorm(d_model, eps)
        self.dropout = LeanDropout(dropout)
        # Without autograd the FFN is applied to at most this many positions at a time on CPU (an
        # attribute so a test can make chunks tiny).
        self.max_positions_per_chunk = CPU_FFN_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        rows = WHOLE_FFN_ROWS if self.whole_tensors(x) else self.max_positions_per_chunk
        step = max(1, rows // B)
        if torch.is_grad_enabled() or L <= step:
            return clamp_fp16(x + self.dropout(self.DenseReluDense(self.layer_norm(x))))
        # float16 in play: the FFN returns float32 (its wo), and so does the sum
        out = torch.empty_like(x, dtype=torch.float32 if fp16_in_play(x) else x.dtype)  # (B L C)
        for s in range(0, L, step):
            h = x[:, s : s + step]  # (B l C)
            out[:, s : s + step] = h + self.dropout(self.DenseReluDense(self.layer_norm(h)))
        return out


class LOCOSTSSMLayer(nn.Module):
    """x + dropout(S4D(RMSNorm(x), padding_mask))."""

    def __init__(self, d_model: int, d_state: int, dropout: float, eps: float, **ssm_kwargs):
        super().__init__()
        self.layer_prenorm = T5LayerNorm(d_model, eps)
        self.ssm_layer = S4D(d_model, d_state, **ssm_kwargs)
        self.dropout = LeanDropout(dropout)

    def forward(self, x: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        return clamp_fp16(x + self.dropout(self.ssm_layer(self.layer_prenorm(x), padding_mask)))


class LOCOSTEncoderBlock(nn.Module):
    """One LOCOST encoder layer: SSM token mixing then gated-GeLU FFN, both pre-norm residual."""

    def __init__(
        self,
        d_model: int,
        d_state: int,
        d_ff: int,
        dropout: float = 0.0,
        eps: float = T5_DEFAULTS["layer_norm_eps"],
        **ssm_kwargs,
    ):
        super().__init__()
        self.layer = nn.ModuleList(
            [LOCOSTSSMLayer(d_model, d_state, dropout, eps, **ssm_kwargs), T5LayerFF(d_model, d_ff, dropout, eps)]
        )

    def forward(self, x: torch.Tensor, padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B, L, C); padding_mask: (B, L) bool, True at padding, or None -> (B, L, C)."""
        return self.layer[1](self.layer[0](x, padding_mask))


class T5LayerSelfAttention(nn.Module):
    def __init__(self, attention: T5Attention, d_model: int, dropout: float, eps: float):
        super().__init__()
        self.SelfAttention = attention
        self.layer_norm = T5LayerNorm(d_model, eps)
        self.dropout = LeanDropout(dropout)

    def forward(self, x, bias, incremental_state):
        h = self.SelfAttention(self.layer_norm(x), bias=bias, incremental_state=incremental_state)
        return clamp_fp16(x + self.dropout(h))


class T5LayerCrossAttention(nn.Module):
    def __init__(self, attention: T5Attention, d_model: int, dropout: float, eps: float):
        super().__init__()
        self.EncDecAttention = attention
        self.layer_norm = T5LayerNorm(d_model, eps)
        self.dropout = LeanDropout(dropout)

    def forward(self, x, memory, bias, incremental_state):
        h = self.EncDecAttention(
            self.layer_norm(x), memory=memory, bias=bias, incremental_state=incremental_state, static_kv=True
        )
        return clamp_fp16(x + self.dropout(h))


class T5DecoderBlock(nn.Module):
    """T5 v1.1 decoder layer: causal self-attention, cross-attention, gated FFN (all pre-norm).

    Only the first block owns ``relative_attention_bias``; the decoder computes the bias once from
    it and hands the same tensor to every block (T5 behaviour).
    """

    def __init__(
        self,
        d_model: int,
        d_kv: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        eps: float = T5_DEFAULTS["layer_norm_eps"],
        has_relative_attention_bias: bool = False,
        relative_attention_num_buckets: int = T5_DEFAULTS["relative_attention_num_buckets"],
        relative_attention_max_distance: int = T5_DEFAULTS["relative_attention_max_distance"],
    ):
        super().__init__()
        self_attn = T5Attention(
            d_model,
            d_kv,
            num_heads,
            has_relative_attention_bias=has_relative_attention_bias,
            relative_attention_num_buckets=relative_attention_num_buckets,
            relative_attention_max_distance=relative_attention_max_distance,
            bidirectional=False,
            dropout=dropout,
        )
        cross_attn = T5Attention(d_model, d_kv, num_heads, dropout=dropout)
        self.layer = nn.ModuleList(
            [
                T5LayerSelfAttention(self_attn, d_model, dropout, eps),
                T5LayerCrossAttention(cross_attn, d_model, dropout, eps),
                T5LayerFF(d_model, d_ff, dropout, eps),
            ]
        )

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        self_bias: torch.Tensor,
        cross_bias: Optional[torch.Tensor],
        incremental_state: Optional[IncrementalState] = None,
    ):
        """x: (B, T, C); memory: (B, S, C); biases additive, broadcastable to (B, heads, T, *)."""
        x = self.layer[0](x, self_bias, incremental_state)
        x = self.layer[1](x, memory, cross_bias, incremental_state)
        return self.layer[2](x)
