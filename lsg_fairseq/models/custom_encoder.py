"""Shared wiring for "BART with a custom encoder self-attention" (LSG-BART, LED).

Both models follow fairseq's Linformer pattern: a ``BARTModel`` subclass overrides
``build_encoder`` -> an encoder subclass overrides ``build_encoder_layer`` -> a layer subclass
overrides ``build_self_attention``. The pieces every such model needs live here once:

- :func:`wrap_layer`: fairseq's activation-checkpointing / FSDP wrapping of a layer (every encoder
  and decoder layer of the plugin's models, LOCOST's blocks too);
- :class:`LongInputBARTModel`: ``from_pretrained`` through ``lsg_fairseq.models.hub`` (no
  1,024-token truncation of long sources) and ``--weight-init`` (how a model trained from
  scratch starts);
- the ``bart_tiny`` architecture: plain BART (full attention) of the tiny shape, the baseline
  the long-input models are compared with (``examples/long_context``);
- :class:`LongInputEncoder`: fairseq's encoder forward written once for both, with two hooks:
  :meth:`~LongInputEncoder.prepare` (the embedded input, the layers' padding mask and keyword
  arguments) and :meth:`~LongInputEncoder.finish` (what the decoder sees);
- :class:`LongInputEncoderLayer`: fairseq's encoder layer whose self-attention is built from its
  config (:class:`LongInputConfig`), takes extra keyword arguments (LED's global mask) and whose
  training step keeps less for backward (``--lean-activations``).
"""

import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.models.transformer.transformer_config import DEFAULT_MIN_PARAMS_TO_WRAP
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart import BARTModel
from fairseq.models.bart.model import bart_large_architecture
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerEncoder
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lsg_fairseq.models import hub
from lsg_fairseq.models.cross_attention import LongSourceCrossAttention
from lsg_layers.modules.lean_ffn import bool_dropout, ffn_recompute_activation
from lsg_text.argtypes import bool_flag

WEIGHT_INITS = ("bert", "fan_in")


def wrap_layer(layer, cfg):
    """Same wrapping as fairseq's ``TransformerEncoderBase.build_encoder_layer`` (no key changes);
    its decoder wraps layers the same way. ``cfg``: a TransformerConfig or an argparse namespace
    (LOCOST's), whose flags may be absent (a checkpoint saved before they existed)."""
    checkpoint = bool_flag(getattr(cfg, "checkpoint_activations", False))
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=bool_flag(getattr(cfg, "offload_activations", False)))
    min_params_to_wrap = getattr(cfg, "min_params_to_wrap", DEFAULT_MIN_PARAMS_TO_WRAP) if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def add_lean_activations_arg(parser) -> None:
    parser.add_argument(
        "--lean-activations",
        type=bool_flag,
        default=True,
        metavar="BOOL",
        help="training: encoder layers keep less for backward (self-attention recomputed "
        "from its input, the FFN activation recomputed, dropout masks kept as bool); "
        "same gradients, a few %% more time (default: %(default)s)",
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
    ``cfg.self_attention`` (:class:`LongInputConfig`), with two changes to ``forward``.

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
        if lean and self.activation_dropout_module.p == 0 and not self.quant_noise:
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


def tiny_bart_architecture(args):
    """The shared shape of the ``*_tiny`` archs: a few-minute CPU model for tests and demos
    (64-dim, 2+2 layers, 4 heads, FFN 256, 2,048 source / 256 target positions)."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 64)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 256)
    args.encoder_layers = getattr(args, "encoder_layers", 2)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    args.max_source_positions = getattr(args, "max_source_positions", 2048)
    args.max_target_positions = getattr(args, "max_target_positions", 256)
    args.weight_init = getattr(args, "weight_init", None) or "fan_in"
    # bart_large_architecture derives every decoder size from the encoder's (bart_base would
    # hard-code 768): the tiny encoder dims above then apply to the decoder too.
    bart_large_architecture(args)


def fan_in_init(module: nn.Module) -> None:
    """N(0, 1/fan_in) weights: Linear N(0, 1/sqrt(in_features)), Embedding N(0, 1/sqrt(dim)).

    BART's own init (``init_bert_params``) draws every weight from N(0, 0.02), a scale chosen for
    d = 768-1024. At d = 64 that is 6x below 1/sqrt(d), and cross-attention's signal passes
    through four such matrices (W_q W_k for where to look, W_v W_o for what to carry), so a small
    model trained from scratch sits for hundreds of updates on a plateau where the decoder has
    learned the summaries' template and ignores the encoder (examples/long_context/README.md).
    """
    if isinstance(module, nn.Linear):
        module.weight.data.normal_(0.0, 1.0 / math.sqrt(module.in_features))
        if module.bias is not None:
            module.bias.data.zero_()
    elif isinstance(module, nn.Embedding):
        module.weight.data.normal_(0.0, 1.0 / math.sqrt(module.embedding_dim))
        if module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()


def add_weight_init_arg(parser) -> None:
    parser.add_argument(
        "--weight-init",
        choices=WEIGHT_INITS,
        metavar="|".join(WEIGHT_INITS),
        help="initial weights of a model trained from scratch: bert = BART's N(0, 0.02), "
        "fan_in = N(0, 1/fan_in) (default for the *_tiny archs: 0.02 is too small at "
        "small widths and stalls learning to use the encoder). Loaded weights replace either.",
    )


class LongSourceDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer whose cross-attention keeps no probability tensor (see
    :mod:`lsg_fairseq.models.cross_attention`)."""

    def build_encoder_attention(self, embed_dim, cfg):
        return LongSourceCrossAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )


class LongSourceDecoder(TransformerDecoderBase):
    """BART's decoder (fairseq's) built from :class:`LongSourceDecoderLayer`."""

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(LongSourceDecoderLayer(cfg, no_encoder_attn), cfg)


class LongInputBARTModel(BARTModel):
    """BART subclass whose hub loads long-input models without truncating them, whose
    from-scratch weights follow ``--weight-init``, and whose decoder cross-attends to long sources
    without materialising the attention probabilities (``long_source_decoder``)."""

    long_source_decoder = True

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        if not cls.long_source_decoder:
            return super().build_decoder(args, tgt_dict, embed_tokens)
        cfg = TransformerConfig.from_namespace(args)
        return LongSourceDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    @staticmethod
    def add_args(parser):
        BARTModel.add_args(parser)
        add_weight_init_arg(parser)

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        init = getattr(args, "weight_init", None) or "bert"
        if init not in WEIGHT_INITS:
            raise ValueError(f"--weight-init {init!r}: choose from {', '.join(WEIGHT_INITS)}")
        if init == "fan_in":  # BARTModel.__init__ has applied init_bert_params; draw again
            model.apply(fan_in_init)
        return model

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", bpe=None, **kwargs):
        """Load through :func:`lsg_fairseq.models.hub.from_pretrained` (no 1,024-token truncation).

        The dictionary and tokenizer files are read from the model folder itself (what
        ``lsg-fairseq-convert`` writes); ``bpe`` overrides the detected tokenizer.
        """
        if data_name_or_path not in (".", None):
            raise ValueError(f"{cls.__name__} hub models read dict.txt from the model folder itself")
        if bpe is not None:
            kwargs["bpe"] = bpe
        return hub.from_pretrained(model_name_or_path, checkpoint_file=checkpoint_file, **kwargs)


@register_model("plain_bart")
class PlainBARTModel(LongInputBARTModel):
    """fairseq's BART, unchanged, with ``--weight-init`` and the long-input hub: the full-attention
    baseline (``--arch bart_tiny``). ``lsg-fairseq-convert`` turns its checkpoints into
    ``lsg_bart`` ones like an HF BART folder."""

    long_source_decoder = False  # fairseq's own decoder, as in every other respect


@register_model_architecture("plain_bart", "bart_tiny")
def bart_tiny_architecture(args):
    tiny_bart_architecture(args)
