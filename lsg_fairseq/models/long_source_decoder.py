"""BART's decoder (fairseq's) whose cross-attention keeps no probability tensor, so that it can read a
long source (:mod:`lsg_fairseq.models.cross_attention`)."""

from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from lsg_fairseq.models.layer_wrap import wrap_layer
from lsg_fairseq.models.cross_attention import LongSourceCrossAttention


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
