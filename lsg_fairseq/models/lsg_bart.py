"""LSG-BART: BART whose encoder self-attention is LSG attention (local + sparse + global tokens).

``--arch lsg_bart_base`` / ``lsg_bart_large`` / ``lsg_bart_tiny``. Only the encoder changes
(``spec/lsg.md``): G learned global tokens are prepended to the embedded input (after token +
position embedding, before ``layernorm_embedding`` and dropout) and every encoder layer uses
:class:`~lsg_layers.modules.lsg_attention.LSGSelfAttention`. The decoder is BART's; it
cross-attends to ``[G globals + tokens]`` (``--pass-global-tokens-to-decoder``, default) or to the
tokens only, optionally with global 0's output pooled onto the first token
(``--pool-with-global``). Source padding must be on the right (blocks align from position 0).

State dict = BART's plus ``encoder.global_embeddings.weight`` [512, d] (always 512 rows, as the
reference, so HF LSG checkpoints map 1:1; only the first G are used).
"""

import functools
import logging

import torch
import torch.nn as nn

from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart.model import bart_base_architecture, bart_large_architecture

from lsg_fairseq.models.custom_encoder import LongInputEncoder, add_lean_activations_arg
from lsg_fairseq.models.long_input_bart import LongInputBARTModel
from lsg_fairseq.models.plain_bart import tiny_bart_architecture
from lsg_layers.modules.lsg_attention import LSGSelfAttention
from lsg_layers.modules.lsg_config import LSG_DEFAULTS, MAX_GLOBAL_TOKENS, SPARSITY_TYPES, check_lsg_config
from lsg_text.argtypes import NON_NEGATIVE_INT, POSITIVE_INT, bool_flag, int_range
from lsg_text.errors import ConfigError

logger = logging.getLogger(__name__)

# Source length of lsg_bart_base / lsg_bart_large when none is given (the reference's converter's)
MAX_SOURCE_POSITIONS = 4096
# The encoder's own flags' defaults (the reference's), beside the attention's LSG_DEFAULTS
ENCODER_DEFAULTS = dict(
    mask_first_token=False, pass_global_tokens_to_decoder=True, pool_with_global=True, train_global_only=False
)


def lsg_attention_kwargs(args) -> dict:
    """The LSGSelfAttention keyword arguments held by a model namespace."""
    return {name: getattr(args, name) for name in LSG_DEFAULTS}


def validate_lsg_args(args) -> None:
    """Refuse inconsistent LSG hyper-parameters at build time (messages name the flags).

    Single values are range-checked when the flags are parsed (``lsg_text.argtypes``); this
    checks what only the combination decides (``--sparsity-factor`` must divide ``--block-size``).
    """
    try:
        # messages name the flag the user typed
        check_lsg_config(**lsg_attention_kwargs(args), name=lambda dest: "--" + dest.replace("_", "-"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.mask_first_token and not args.pass_global_tokens_to_decoder and not args.pool_with_global:
        raise ConfigError(
            "--mask-first-token hides the first token, so its output must come from global token 0: "
            "use --pool-with-global true (the reference forces it) or --pass-global-tokens-to-decoder"
        )


class LSGBARTEncoder(LongInputEncoder):
    """BART encoder with G global tokens and LSG layers.

    Output: ``encoder_out`` (G + L, B, C) with the globals first and ``encoder_padding_mask``
    (B, G + L) with G leading False columns (or L and B x L without
    ``--pass-global-tokens-to-decoder``).
    """

    def __init__(self, args, dictionary, embed_tokens, return_fc=False):
        super().__init__(args, dictionary, embed_tokens, return_fc=return_fc)
        self.num_global_tokens = args.num_global_tokens
        self.mask_first_token = args.mask_first_token
        self.pass_global_tokens_to_decoder = args.pass_global_tokens_to_decoder
        self.pool_with_global = args.pool_with_global
        self.global_embeddings = nn.Embedding(MAX_GLOBAL_TOKENS, embed_tokens.embedding_dim)

    def self_attention(self, args):
        return functools.partial(LSGSelfAttention, **lsg_attention_kwargs(args))

    def forward_embedding(self, src_tokens, token_embedding=None):
        """Token + position embedding, then globals prepended, then LayerNorm and dropout.

        Returns x (B, G + L, C) and the scaled token embedding (B, L, C).
        """
        if token_embedding is None:
            token_embedding = self.embed_tokens(src_tokens)
        x = embed = self.embed_scale * token_embedding  # (B, L, C)
        if self.embed_positions is not None:
            # fairseq positions count non-pad tokens from row 2: with right padding these are
            # the reference's arange(L) + 2; pads get row 1 (they are masked everywhere).
            x = embed + self.embed_positions(src_tokens)
        n, _, C = x.shape
        G = self.num_global_tokens
        # globals get no position and go through layernorm_embedding + dropout like tokens
        glob = self.global_embeddings.weight[:G].to(x.dtype)  # (G, C)
        x = torch.cat([glob.unsqueeze(0).expand(n, G, C), x], dim=1)  # (B, G + L, C)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        return x, embed

    def _hidden(self, pad):
        """(B, L) True where a token is not attended: padding, and with ``--mask-first-token``
        token 0 (<s>, redundant with global 0; hidden from cross-attention too, as in the reference)."""
        if not self.mask_first_token:
            return pad
        hidden = pad.clone()
        hidden[:, 0] = True
        return hidden

    def prepare(self, src_tokens, pad, x):
        no_pad = pad.new_zeros(pad.size(0), self.num_global_tokens)  # (B, G)
        if pad.any():
            x = x * (1 - torch.cat([no_pad, pad], dim=1).unsqueeze(-1).type_as(x))
        key_mask = torch.cat([no_pad, self._hidden(pad)], dim=1)  # (B, G + L), True = not attended
        # block_masks: the flex path's block mask, built by the first layer, reused by the others
        return x, key_mask if bool(key_mask.any()) else None, {"block_masks": {}}

    def finish(self, x, pad):
        G = self.num_global_tokens
        hidden = self._hidden(pad)
        if self.pass_global_tokens_to_decoder:
            return x, torch.cat([pad.new_zeros(pad.size(0), G), hidden], dim=1)  # (G + L, B, C), (B, G + L)
        if self.pool_with_global:
            x = torch.cat([x[:1], x[G + 1 :]], dim=0)  # global 0 replaces token 0
        else:
            x = x[G:]
        return x, hidden  # (L, B, C), (B, L)


@register_model("lsg_bart")
class LSGBARTModel(LongInputBARTModel):
    """BART with an LSG encoder; see the module docstring.

    ``from_pretrained`` goes through ``lsg_fairseq.models.hub`` (``LongInputBARTModel``).
    """

    @staticmethod
    def add_args(parser):
        LongInputBARTModel.add_args(parser)
        LSGBARTModel.add_lsg_args(parser)
        add_lean_activations_arg(parser)
        parser.add_argument(
            "--train-global-only",
            type=bool_flag,
            nargs="?",
            const=True,
            metavar="BOOL",
            help="global tuning: freeze every parameter except the global token embeddings",
        )

    @staticmethod
    def add_lsg_args(parser):
        """The LSG attention flags: their one home, shared by fairseq-train and lsg-fairseq-convert."""
        parser.add_argument(
            "--block-size",
            type=POSITIVE_INT,
            metavar="N",
            help="LSG local block size: each block of N queries attends to 3N local keys",
        )
        parser.add_argument(
            "--sparse-block-size",
            type=NON_NEGATIVE_INT,
            metavar="N",
            help="number of sparse keys taken on EACH side of the local window (0: no sparse attention)",
        )
        parser.add_argument(
            "--sparsity-factor",
            type=POSITIVE_INT,
            metavar="N",
            help="the sparse sequence has length/N entries; must divide --block-size",
        )
        parser.add_argument(
            "--sparsity-type",
            type=str,
            choices=SPARSITY_TYPES,
            help="how the sparse sequence is built (none disables sparse attention)",
        )
        parser.add_argument(
            "--num-global-tokens",
            type=int_range(1, MAX_GLOBAL_TOKENS),
            metavar="G",
            help=f"number of learned global tokens prepended to the encoder input (1..{MAX_GLOBAL_TOKENS})",
        )
        parser.add_argument(
            "--mask-first-token",
            type=bool_flag,
            nargs="?",
            const=True,
            metavar="BOOL",
            help="hide the first source token (<s>, redundant with global 0) from self- and cross-attention",
        )
        parser.add_argument(
            "--pass-global-tokens-to-decoder",
            type=bool_flag,
            nargs="?",
            const=True,
            metavar="BOOL",
            help="decoder cross-attends to the global tokens too "
            f"(default {ENCODER_DEFAULTS['pass_global_tokens_to_decoder']})",
        )
        parser.add_argument(
            "--pool-with-global",
            type=bool_flag,
            nargs="?",
            const=True,
            metavar="BOOL",
            help="without --pass-global-tokens-to-decoder: global 0's output replaces the first "
            f"token's (default {ENCODER_DEFAULTS['pool_with_global']})",
        )
        parser.add_argument(
            "--lsh-num-pre-rounds",
            type=NON_NEGATIVE_INT,
            metavar="N",
            help="lsh sparsity only: merging rounds before the final hashing round",
        )

    @classmethod
    def weightless_settings(cls, args) -> dict:
        """The LSG settings of ``args`` (a run's, or a checkpoint's ``cfg.model``): they shape the
        attention and no weight records them (the global token table always holds 512 rows), so a
        checkpoint loads into a model built with others without a word (``checkpoint_policy``)."""
        names = [*LSG_DEFAULTS, *(n for n in ENCODER_DEFAULTS if n != "train_global_only")]
        bools = set(ENCODER_DEFAULTS)
        return {n: bool_flag(v) if n in bools else v for n in names if (v := getattr(args, n, None)) is not None}

    @classmethod
    def build_model(cls, args, task):
        lsg_architecture_defaults(args)
        validate_lsg_args(args)
        model = super().build_model(args, task)
        if args.train_global_only:
            for name, p in model.named_parameters():
                p.requires_grad = name == "encoder.global_embeddings.weight"
        return model

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return LSGBARTEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        decoder = super().build_decoder(args, tgt_dict, embed_tokens)
        # the globals passed to the decoder are not source tokens: left out of its returned attention
        decoder.leading_rows = args.num_global_tokens if args.pass_global_tokens_to_decoder else 0
        return decoder


def lsg_architecture_defaults(args):
    """Defaults of the LSG flags: the attention's (the reference's, ``LSG_DEFAULTS``), then the encoder's."""
    for name, value in LSG_DEFAULTS.items():
        setattr(args, name, getattr(args, name, value))
    for name, value in ENCODER_DEFAULTS.items():  # bool flags: a checkpoint may hold "true"
        setattr(args, name, bool_flag(getattr(args, name, value)))


@register_model_architecture("lsg_bart", "lsg_bart_large")
def lsg_bart_large_architecture(args):
    args.max_source_positions = getattr(args, "max_source_positions", MAX_SOURCE_POSITIONS)
    lsg_architecture_defaults(args)
    bart_large_architecture(args)


@register_model_architecture("lsg_bart", "lsg_bart_base")
def lsg_bart_base_architecture(args):
    args.max_source_positions = getattr(args, "max_source_positions", MAX_SOURCE_POSITIONS)
    lsg_architecture_defaults(args)
    bart_base_architecture(args)


@register_model_architecture("lsg_bart", "lsg_bart_tiny")
def lsg_bart_tiny_architecture(args):
    """A few-minute CPU model for tests and demos (``tiny_bart_architecture``, 32-token blocks)."""
    args.block_size = getattr(args, "block_size", 32)
    args.sparse_block_size = getattr(args, "sparse_block_size", 32)
    args.sparsity_factor = getattr(args, "sparsity_factor", 2)
    lsg_architecture_defaults(args)
    tiny_bart_architecture(args)
