"""Local-window BART (the toy family of tests/test_families.py): BART whose encoder tokens see only
their neighbours up to ``--local-window`` positions away. ``--arch local_bart_base`` / ``local_bart_tiny``."""

import functools

from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart.model import bart_base_architecture

from lsg_fairseq.models.custom_encoder import LongInputEncoder
from lsg_fairseq.models.long_input_bart import LongInputBARTModel
from lsg_fairseq.models.plain_bart import tiny_bart_architecture
from lsg_layers.modules.local_attention import LocalSelfAttention
from lsg_text.argtypes import POSITIVE_INT


class LocalBARTEncoder(LongInputEncoder):
    def self_attention(self, args):
        return functools.partial(LocalSelfAttention, window=args.local_window)


@register_model("local_bart")
class LocalBARTModel(LongInputBARTModel):
    @staticmethod
    def add_args(parser):
        LongInputBARTModel.add_args(parser)
        LocalBARTModel.add_local_args(parser)

    @staticmethod
    def add_local_args(parser):
        """The window flag's one home, shared by fairseq-train and lsg-fairseq-convert."""
        parser.add_argument(
            "--local-window",
            type=POSITIVE_INT,
            metavar="W",
            help="each encoder token attends to the tokens at most W positions away",
        )

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return LocalBARTEncoder(args, src_dict, embed_tokens)


@register_model_architecture("local_bart", "local_bart_base")
def local_bart_base_architecture(args):
    args.local_window = getattr(args, "local_window", 128)
    bart_base_architecture(args)


@register_model_architecture("local_bart", "local_bart_tiny")
def local_bart_tiny_architecture(args):
    args.local_window = getattr(args, "local_window", 16)
    tiny_bart_architecture(args)
