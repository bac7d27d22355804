"""Shared wiring for "BART with a custom encoder self-attention" (LSG-BART, LED).

Both models follow fairseq's Linformer pattern: a ``BARTModel`` subclass overrides
``build_encoder`` -> an encoder subclass overrides ``build_encoder_layer`` -> a layer subclass
overrides ``build_self_attention``. The pieces every such model needs live here once:

- :func:`wrap_encoder_layer`: fairseq's activation-checkpointing / FSDP wrapping of a layer;
- :class:`LongInputBARTModel`: ``from_pretrained`` through ``lsg_fairseq.models.hub`` (no
  1,024-token truncation of long sources) and ``--weight-init`` (how a model trained from
  scratch starts);
- the ``bart_tiny`` architecture: plain BART (full attention) of the tiny shape, the baseline
  the long-input models are compared with (``examples/long_context``).
"""
import math

import torch.nn as nn
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart import BARTModel
from fairseq.models.bart.model import bart_large_architecture
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from lsg_fairseq.models import hub

WEIGHT_INITS = ("bert", "fan_in")


def wrap_encoder_layer(layer, cfg):
    """Same wrapping as fairseq's ``TransformerEncoderBase.build_encoder_layer`` (no key changes)."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


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
    parser.add_argument("--weight-init", choices=WEIGHT_INITS, metavar="|".join(WEIGHT_INITS),
                        help="initial weights of a model trained from scratch: bert = BART's N(0, 0.02), "
                        "fan_in = N(0, 1/fan_in) (default for the *_tiny archs: 0.02 is too small at "
                        "small widths and stalls learning to use the encoder). Loaded weights replace either.")


class LongInputBARTModel(BARTModel):
    """BART subclass whose hub loads long-input models without truncating them, and whose
    from-scratch weights follow ``--weight-init``."""

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
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                        bpe=None, **kwargs):
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


@register_model_architecture("plain_bart", "bart_tiny")
def bart_tiny_architecture(args):
    tiny_bart_architecture(args)
