"""BART's decoder (fairseq's) whose cross-attention keeps no probability tensor, so that it can read a
long source (:mod:`lsg_fairseq.models.cross_attention`), and whose returned attention covers the
source tokens only.

The encoder may put rows that are not source tokens before them (LSG's global tokens, passed to
the decoder). The decoder attends to them, but the attention it returns (``extra["attn"]``, fairseq's
source x target alignment, averaged over an ensemble by ``EnsembleModel.forward_decoder``) drops
their columns, so that its column j is source token j for every model: an ensemble of LSG-BART
with LED, BART or an LSG-BART of another number of global tokens would otherwise fail on adding
(G + L)- and L-column attentions.
"""

from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from lsg_fairseq.models.activation import activation_fn
from lsg_fairseq.models.layer_wrap import wrap_layer
from lsg_fairseq.models.cross_attention import LongSourceCrossAttention


class LongSourceDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer whose cross-attention keeps no probability tensor (see
    :mod:`lsg_fairseq.models.cross_attention`) and whose gelu is one pass
    (:mod:`~lsg_fairseq.models.activation`)."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv, add_zero_attn)
        self.activation_fn = activation_fn(cfg.activation_fn)

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
    """BART's decoder (fairseq's) built from :class:`LongSourceDecoderLayer`.

    ``leading_rows``: how many rows of ``encoder_out`` come before the source tokens (the model that
    builds the encoder sets it); their columns are left out of the returned attention.
    """

    leading_rows = 0

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        x, extra = super().extract_features(prev_output_tokens, encoder_out, incremental_state, **kwargs)
        attn = extra["attn"][0]
        if attn is not None and self.leading_rows:
            extra["attn"] = [attn[..., self.leading_rows :]]
        return x, extra

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(LongSourceDecoderLayer(cfg, no_encoder_attn), cfg)
