"""Shared wiring for "BART with a custom encoder self-attention" (LSG-BART, LED).

Both models follow fairseq's Linformer pattern: a ``BARTModel`` subclass overrides
``build_encoder`` -> an encoder subclass overrides ``build_encoder_layer`` -> a layer subclass
overrides ``build_self_attention``. The pieces every such model needs live here once:

- :func:`wrap_encoder_layer`: fairseq's activation-checkpointing / FSDP wrapping of a layer;
- :class:`LongInputBARTModel`: ``from_pretrained`` through ``lsg_fairseq.models.hub`` (no
  1,024-token truncation of long sources).

Nothing here is registered with fairseq.
"""
from fairseq.distributed import fsdp_wrap
from fairseq.models.bart import BARTModel
from fairseq.models.bart.model import bart_large_architecture
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from lsg_fairseq.models import hub


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
    # bart_large_architecture derives every decoder size from the encoder's (bart_base would
    # hard-code 768): the tiny encoder dims above then apply to the decoder too.
    bart_large_architecture(args)


class LongInputBARTModel(BARTModel):
    """BART subclass whose hub loads long-input models without truncating them."""

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
