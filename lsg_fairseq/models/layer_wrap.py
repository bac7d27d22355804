"""fairseq's activation-checkpointing and FSDP wrapping of one layer, as its own encoder and decoder
wrap theirs: every encoder and decoder layer of the plugin's models (LOCOST's blocks too)."""

from fairseq.models.transformer.transformer_config import DEFAULT_MIN_PARAMS_TO_WRAP
from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from lsg_text.argtypes import bool_flag


def wrap_layer(layer, cfg):
    """Same wrapping as fairseq's ``TransformerEncoderBase.build_encoder_layer`` (no key changes);
    its decoder wraps layers the same way. ``cfg``: a TransformerConfig or an argparse namespace
    (LOCOST's), whose flags may be absent (a checkpoint saved before they existed)."""
    offload = bool_flag(getattr(cfg, "offload_activations", False))
    # offloading implies checkpointing, as fairseq's transformer flags set it (LOCOST's namespace
    # does not go through them)
    checkpoint = bool_flag(getattr(cfg, "checkpoint_activations", False)) or offload
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=offload)
    min_params_to_wrap = getattr(cfg, "min_params_to_wrap", DEFAULT_MIN_PARAMS_TO_WRAP) if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)
