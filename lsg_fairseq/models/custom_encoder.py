"""The long-input encoder of the BART-shaped models (LSG-BART, LED).

Both follow fairseq's Linformer pattern: a ``BARTModel`` subclass
(:class:`~lsg_fairseq.models.long_input_bart.LongInputBARTModel`) overrides ``build_encoder`` -> an
encoder subclass overrides ``build_encoder_layer`` -> a layer subclass overrides
``build_self_attention``. The encoder pieces every such model needs live here once:

- :class:`LongInputEncoder`: fairseq's encoder forward written once for both, with two hooks:
  :meth:`~LongInputEncoder.prepare` (the embedded input, the layers' padding mask and keyword
  arguments) and :meth:`~LongInputEncoder.finish` (what the decoder sees);
- :class:`LongInputEncoderLayer`: fairseq's encoder layer whose self-attention is built from its
  config (:class:`LongInputConfig`), takes extra keyword arguments (LED's global mask) and whose
  training step keeps less for backward (``--lean-activations``).

The decoder is :mod:`~lsg_fairseq.models.long_source_decoder`'s, the ``--weight-init`` schemes
:mod:`~lsg_fairseq.models.weight_init`'s, and ``bart_tiny`` (with the tiny shape every ``*_tiny``
arch shares) :mod:`~lsg_fairseq.models.plain_bart`'s.
"""

from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.models.transformer import TransformerConfig, TransformerEncoder
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lsg_fairseq.models.activation import activation_fn
from lsg_fairseq.models.layer_wrap import wrap_layer
from lsg_layers.modules.lean_ffn import bool_dropout, ffn_recompute_activation
from lsg_text.argtypes import bool_flag


def add_lean_activations_arg(parser) -> None:
    parser.add_argument(
        "--lean-activations",
        type=bool_flag,
        default=True,
        metavar="BOOL",
        help="training: encoder layers keep less for backward (self-attention recomputed "
        "from its input, the FFN activation recomputed unless --activation-dropout, dropout masks kept "
        "as bool); same gradients, a few %% more time; off under --amp (default: %(default)s)",
    )


def lean_activations(args) -> bool:
    """``--lean-activations`` of a namespace (true for checkpoints saved before the flag)."""
    value = getattr(args, "lean_activations", None)
    return True if value is None else bool_flag(value)


@dataclass
class LongInputConfig(TransformerConfig):
    """fairseq's layer config plus the encoder self-attention to build: ``self_attention(embed_dim,
    num_heads, dropout=...)`` -> module with ``MultiheadAttention``'s call signature. fairseq hands
    the config to ``build_self_attention``, so this is the layer's one input."""

    self_attention: Optional[Callable[..., nn.Module]] = None

    @classmethod
    def for_layers(cls, args, self_attention: Callable[..., nn.Module]) -> "LongInputConfig":
        """``args``: an argparse namespace or the TransformerConfig fairseq built from it."""
        if not isinstance(args, TransformerConfig):
            args = TransformerConfig.from_namespace(args)
        # from_namespace would copy a TransformerConfig's sub-configs as mappings: copy the fields
        values = {f.name: getattr(args, f.name) for f in fields(TransformerConfig)}
        return cls(**values, self_attention=self_attention)


class LongInputEncoder(TransformerEncoder):
    """fairseq's ``TransformerEncoder`` forward, written once for the long-input encoders.

    Subclasses give the attention to build (:meth:`self_attention`) and override two hooks:

    - :meth:`prepare`: the embedded input -> (x, padding mask for the layers, keyword arguments for
      every layer's self-attention); the default zeroes padding and passes ``pad`` (None without);
    - :meth:`finish`: the last layer's output -> (encoder_out, its padding mask); default identity.

    The output dict is fairseq's (``encoder_out``, ``encoder_padding_mask``, ... ``src_lengths``);
    ``forward`` accepts extra keyword inputs and hands them to :meth:`prepare`.
    """

    def self_attention(self, args) -> Callable[..., nn.Module]:
        """The attention every layer builds, from the model's argparse namespace."""
        raise NotImplementedError

    def build_encoder_layer(self, cfg):
        # fairseq hands over a TransformerConfig already; the layer config is made from the
        # namespace the legacy encoder keeps (set before it builds its layers)
        layer_cfg = LongInputConfig.for_layers(self.args, self.self_attention(self.args))
        layer = LongInputEncoderLayer(layer_cfg, return_fc=self.return_fc, lean=lean_activations(self.args))
        return wrap_layer(layer, layer_cfg)

    def prepare(
        self, src_tokens: Tensor, pad: Tensor, x: Tensor, **inputs
    ) -> Tuple[Tensor, Optional[Tensor], Dict[str, Any]]:
        """x (B, T', C) from ``forward_embedding``; pad (B, T) True at source padding."""
        if inputs:
            raise TypeError(f"{type(self).__name__} takes no input {sorted(inputs)}")
        if not bool(pad.any()):
            return x, None, {}
        return x * (1 - pad.unsqueeze(-1).type_as(x)), pad, {}

    def finish(self, x: Tensor, pad: Tensor) -> Tuple[Tensor, Tensor]:
        """x (T', B, C) after the final layer norm -> (encoder_out, encoder_padding_mask)."""
        return x, pad

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None, **inputs):
        return self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings, **inputs)

    def forward_scriptable(
        self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None, **inputs
    ):
        pad = src_tokens.eq(self.padding_idx)  # (B, T)
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        x, layer_mask, layer_inputs = self.prepare(src_tokens, pad, x, **inputs)
        x = x.transpose(0, 1)  # (T', B, C)
        encoder_states = [x] if return_all_hiddens else []
        for layer in self.layers:
            lr = layer(x, encoder_padding_mask=layer_mask, **layer_inputs)
            x = lr[0] if isinstance(lr, tuple) and len(lr) == 2 else lr
            if return_all_hiddens:
                encoder_states.append(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x, out_mask = self.finish(x, pad)
        src_lengths = (~pad).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # (T', B, C)
            "encoder_padding_mask": [out_mask],  # (B, T')
            "encoder_embedding": [encoder_embedding],  # (B, T, C)
            "encoder_states": encoder_states,  # List[(T', B, C)]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class LongInputEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer (same modules and state dict) whose self-attention is
    ``cfg.self_attention`` (:class:`LongInputConfig`) and whose gelu is one pass
    (:mod:`~lsg_fairseq.models.activation`), with two changes to ``forward``.

    - Keyword arguments after ``attn_mask`` go to the self-attention (LED: the global mask), so
      subclasses need no side channel around fairseq's fixed call.
    - With ``lean`` (``--lean-activations``), a training step keeps for backward what it cannot
      cheaply recompute: the self-attention sub-block (projections and attention) is recomputed
      from its input (``torch.utils.checkpoint``, RNG state restored), the FFN keeps fc1's input
      and output only (``ffn_recompute_activation``) and dropout keeps bool masks (what that saves:
      benchmarks/README.md); outputs and gradients are those of fairseq's forward
      (tests/test_lean_layer.py).
    """

    def __init__(self, cfg: LongInputConfig, return_fc: bool = False, lean: bool = True):
        super().__init__(cfg, return_fc=return_fc)
        self.lean = lean
        self.activation_fn = activation_fn(cfg.activation_fn)  # gelu in one pass (models.activation)

    def build_self_attention(self, embed_dim, cfg):
        return cfg.self_attention(embed_dim, cfg.encoder.attention_heads, dropout=cfg.attention_dropout)

    def _attend(self, x, encoder_padding_mask, attn_mask, attention_kwargs):
        return self.self_attn(
            query=x,
            key=x,
            value=x,
            key_padding_mask=encoder_padding_mask,
            need_weights=False,
            attn_mask=attn_mask,
            **attention_kwargs,
        )[0]

    def _dropout(self, x, lean: bool):
        if lean and self.dropout_module.p > 0:
            return bool_dropout(x, self.dropout_module.p)
        return self.dropout_module(x)

    def forward(self, x, encoder_padding_mask, attn_mask=None, **attention_kwargs):
        lean = self.lean and self.training and torch.is_grad_enabled() and not torch.is_autocast_enabled()
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        # an attention drawing from its own generator (seeded LSH) would draw differently when
        # recomputed: only attentions on the global RNG (restored by checkpoint) are recomputed
        if lean and getattr(self.self_attn, "generator", None) is None:
            x = checkpoint(self._attend, x, encoder_padding_mask, attn_mask, attention_kwargs, use_reentrant=False)
        else:
            x = self._attend(x, encoder_padding_mask, attn_mask, attention_kwargs)
        x = self._dropout(x, lean)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        # the FFN's own backward calls autograd.grad, which dynamo cannot trace; a compiled layer's
        # backward recomputes the activation by itself (the partitioner recomputes pointwise ops)
        if (
            lean
            and self.activation_dropout_module.p == 0
            and not self.quant_noise
            and not torch.compiler.is_compiling()
        ):
            x = ffn_recompute_activation(x, self.fc1, self.fc2, self.activation_fn)
        else:
            x = self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))
        fc_result = x
        x = self._dropout(x, lean)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        if self.return_fc and not torch.jit.is_scripting():
            return x, fc_result
        return x
