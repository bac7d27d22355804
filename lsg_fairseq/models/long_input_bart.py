"""The BART model the long-input models subclass (LSG-BART, LED, ``plain_bart``): its hub loads long
inputs without truncating them, its from-scratch weights follow ``--weight-init``
(:mod:`~lsg_fairseq.models.weight_init`) and its decoder cross-attends to long sources
(:mod:`~lsg_fairseq.models.long_source_decoder`). The encoder each subclass builds is a
:class:`~lsg_fairseq.models.custom_encoder.LongInputEncoder`."""

from fairseq.models.bart import BARTModel
from fairseq.models.transformer import TransformerConfig

from lsg_fairseq.models import hub
from lsg_fairseq.models.long_source_decoder import LongSourceDecoder
from lsg_fairseq.models.weight_init import add_weight_init_arg, init_weights


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
        init_weights(model, args)
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
