"""``plain_bart`` / ``--arch bart_tiny``: fairseq's BART with full attention, the baseline the long-input
models are compared with (``examples/long_context``); and the tiny shape every ``*_tiny`` arch
shares (:func:`tiny_bart_architecture`)."""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart.model import bart_large_architecture

from lsg_fairseq.models.long_input_bart import LongInputBARTModel


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


@register_model("plain_bart")
class PlainBARTModel(LongInputBARTModel):
    """fairseq's BART, unchanged, with ``--weight-init`` and the long-input hub: the full-attention
    baseline (``--arch bart_tiny``). ``lsg-fairseq-convert`` turns its checkpoints into
    ``lsg_bart`` ones like an HF BART folder."""

    long_source_decoder = False  # fairseq's own decoder, as in every other respect


@register_model_architecture("plain_bart", "bart_tiny")
def bart_tiny_architecture(args):
    tiny_bart_architecture(args)
