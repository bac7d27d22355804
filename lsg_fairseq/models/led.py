"""LED (Longformer-Encoder-Decoder): BART whose encoder self-attention is Longformer attention.

``--arch led_base`` / ``led_large`` / ``led_tiny`` (``spec/led.md``; Beltagy et al. 2020, section 6).
Only the encoder's self-attention changes: every layer uses
:class:`~lsg_layers.modules.longformer_attention.LongformerSelfAttention` (sliding window of
one-sided width w = W / 2, W = ``--attention-window`` per layer, plus global tokens with their own
q/k/v projections). Embeddings, post-LN layers, decoder and head are BART's.

Global tokens (spec section 6): ``--global-attention first`` (default; the LED summarization
recipe) makes the first real token of every source row global, ``none`` makes none;
``--global-token-ids`` also marks every occurrence of the listed ids. A caller can instead pass an
explicit mask: ``model.encoder(src_tokens, src_lengths, global_attention_mask=g)`` (B x T bool,
True = global), which overrides the configured mode.

Positions are fairseq's learned, pad-aware positions (real tokens from row 2), so left and right
padding give the same valid outputs; the converter maps HF's offset-free table onto rows 2...

State dict = BART's plus ``encoder.layers.N.self_attn.{q,k,v}_proj_global.{weight,bias}``.
"""

import argparse
import functools
import logging

import torch

from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart.model import bart_base_architecture, bart_large_architecture

from lsg_fairseq.models.custom_encoder import LongInputEncoder, add_lean_activations_arg
from lsg_fairseq.models.long_input_bart import LongInputBARTModel
from lsg_fairseq.models.plain_bart import tiny_bart_architecture
from lsg_layers.modules.longformer_attention import LongformerSelfAttention, parse_attention_windows
from lsg_layers.ops.blocks import compact_indices
from lsg_text.errors import ConfigError

logger = logging.getLogger(__name__)

GLOBAL_ATTENTION_MODES = ("first", "none")
# Source length of led_base / led_large when none is given: allenai's LED (BART's 1,024 positions x 16)
MAX_SOURCE_POSITIONS = 16384


def parse_global_token_ids(value) -> list:
    """``"0,5"`` / ``[0, 5]`` / ``""`` -> list of ints (message names the flag)."""
    if value is None:
        return []
    if isinstance(value, str):
        parts = [p for p in value.replace(" ", "").split(",") if p]
        try:
            return [int(p) for p in parts]
        except ValueError:
            raise ConfigError(f"--global-token-ids must be a comma-separated list of ints, got {value!r}")
    return [int(v) for v in value]


def attention_window_arg(text: str) -> str:
    """argparse type of ``--attention-window``: one positive even int, or a comma list of them
    (the per-layer count is checked against ``--encoder-layers`` when the model is built)."""
    count = len([p for p in str(text).replace("[", "").replace("]", "").split(",") if p.strip()])
    try:
        parse_attention_windows(text, max(count, 1))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--attention-window ", "")) from None
    return text


def global_token_ids_arg(text: str) -> str:
    """argparse type of ``--global-token-ids``: comma-separated non-negative ints (or empty)."""
    try:
        ids = parse_global_token_ids(text)
    except ValueError:
        ids = [-1]
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"must be comma-separated dictionary ids >= 0, got {text!r}")
    return text


def validate_led_args(args, dictionary_size=None, pad=None) -> None:
    """Refuse inconsistent LED hyper-parameters at build time (messages name the flags)."""
    try:
        parse_attention_windows(args.attention_window, args.encoder_layers)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.global_attention not in GLOBAL_ATTENTION_MODES:
        raise ConfigError(
            f"--global-attention must be one of {', '.join(GLOBAL_ATTENTION_MODES)}, got {args.global_attention!r}"
        )
    ids = parse_global_token_ids(args.global_token_ids)
    if dictionary_size is not None:
        bad = [i for i in ids if not 0 <= i < dictionary_size]
        if bad:
            raise ConfigError(f"--global-token-ids {bad} outside the dictionary (size {dictionary_size})")
    if pad is not None and pad in ids:  # padding never attends: the id would mark nothing
        raise ConfigError(f"--global-token-ids: {pad} is the dictionary's <pad>, which never attends; drop it")


class LEDEncoder(LongInputEncoder):
    """BART encoder with Longformer layers and global-token selection (see module docstring)."""

    def __init__(self, args, dictionary, embed_tokens, return_fc=False):
        super().__init__(args, dictionary, embed_tokens, return_fc=return_fc)
        # the window is the one attention setting that may differ per layer (no parameter depends on
        # it); by index: iterating a LayerDropModuleList in training mode skips layers at random
        for i, window in enumerate(parse_attention_windows(args.attention_window, args.encoder_layers)):
            self.layers[i].self_attn.set_attention_window(window)
        self.global_attention = args.global_attention
        self.register_buffer(
            "global_token_ids",
            torch.tensor(parse_global_token_ids(args.global_token_ids), dtype=torch.long),
            persistent=False,
        )

    def self_attention(self, args):
        first = parse_attention_windows(args.attention_window, args.encoder_layers)[0]
        return functools.partial(LongformerSelfAttention, attention_window=first)

    def default_global_attention_mask(self, src_tokens):
        """(B, T) bool from ``--global-attention`` and ``--global-token-ids`` (None: no global)."""
        pad = src_tokens.eq(self.padding_idx)  # (B, T)
        glob = torch.zeros_like(pad)
        if self.global_attention == "first":
            # first REAL token, so left-padded rows make the same token global as right-padded ones
            first = (~pad).to(torch.uint8).argmax(dim=1)  # (B,)
            glob[torch.arange(src_tokens.size(0), device=pad.device), first] = True
        if self.global_token_ids.numel():
            glob |= torch.isin(src_tokens, self.global_token_ids.to(src_tokens.device))
        glob &= ~pad
        return glob if bool(glob.any()) else None

    def prepare(self, src_tokens, pad, x, global_attention_mask=None):
        """``global_attention_mask`` (B x T bool, True = global), an input of ``forward``, overrides
        ``--global-attention``/``--global-token-ids`` for the call. The layers get the global
        positions once for all as ``global_index`` (``ops.blocks.compact_indices``' form), and
        ``block_masks``, where the flex path's block masks are kept from one layer to the next."""
        if global_attention_mask is not None and global_attention_mask.shape != src_tokens.shape:
            raise ValueError(
                f"global_attention_mask has shape {tuple(global_attention_mask.shape)}, "
                f"src_tokens {tuple(src_tokens.shape)}"
            )
        x, layer_mask, _ = super().prepare(src_tokens, pad, x)
        return (
            x,
            layer_mask,
            {"global_index": self.global_index(src_tokens, pad, global_attention_mask), "block_masks": {}},
        )

    def global_index(self, src_tokens, pad, global_attention_mask=None):
        """(idx, valid) (B, Gm): the global positions of every row (None: no global token).

        The default (``--global-attention first``, no ``--global-token-ids``, no explicit mask) is
        one global per row, the first real token, found on the device. Any other selection has a
        number of globals per row that the host must read (``compact_indices``): one
        synchronisation per forward instead of one per layer."""
        if global_attention_mask is None and not self.global_token_ids.numel():
            if self.global_attention == "none":
                return None
            first = (~pad).to(torch.uint8).argmax(dim=1, keepdim=True)  # (B, 1)
            return first, (~pad).any(dim=1, keepdim=True)
        if global_attention_mask is None:
            glob = self.default_global_attention_mask(src_tokens)
            if glob is None:
                return None
        else:
            glob = global_attention_mask.to(pad.device).bool() & ~pad
        return compact_indices(glob)


@register_model("led")
class LEDModel(LongInputBARTModel):
    """BART with a Longformer encoder; see the module docstring.

    ``from_pretrained`` goes through ``lsg_fairseq.models.hub`` (``LongInputBARTModel``).
    """

    @staticmethod
    def add_args(parser):
        LongInputBARTModel.add_args(parser)
        LEDModel.add_led_args(parser)
        add_lean_activations_arg(parser)

    @staticmethod
    def add_led_args(parser):
        """The Longformer flags: their one home, shared by fairseq-train and lsg-fairseq-convert."""
        parser.add_argument(
            "--attention-window",
            type=attention_window_arg,
            metavar="W",
            help="full Longformer window W per encoder layer (even; a query sees W/2 "
            "tokens on each side): one int for all layers or a comma list, one per layer",
        )
        parser.add_argument(
            "--global-attention",
            type=str,
            choices=GLOBAL_ATTENTION_MODES,
            help="encoder tokens with global attention: 'first' = the first real "
            "token of every source (LED summarization default), 'none' = no token",
        )
        parser.add_argument(
            "--global-token-ids",
            type=global_token_ids_arg,
            metavar="IDS",
            help="comma-separated dictionary ids whose every occurrence in the "
            "source gets global attention (in addition to --global-attention)",
        )

    @classmethod
    def weightless_settings(cls, args) -> dict:
        """The Longformer settings of ``args`` (a run's, or a checkpoint's ``cfg.model``), as the
        encoder reads them (a window per layer, the global ids as a set): no weight records them
        (``checkpoint_policy``)."""
        values = {}
        if getattr(args, "attention_window", None) is not None and getattr(args, "encoder_layers", None):
            values["attention_window"] = parse_attention_windows(args.attention_window, args.encoder_layers)
        if getattr(args, "global_attention", None) is not None:
            values["global_attention"] = args.global_attention
        if getattr(args, "global_token_ids", None) is not None:
            values["global_token_ids"] = sorted(set(parse_global_token_ids(args.global_token_ids)))
        return values

    @classmethod
    def build_model(cls, args, task):
        led_architecture_defaults(args)
        validate_led_args(args, len(task.source_dictionary), task.source_dictionary.pad())
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return LEDEncoder(args, src_dict, embed_tokens)


def led_architecture_defaults(args):
    """Defaults of the LED flags (LED's released models: W = 1024, first token global)."""
    args.attention_window = getattr(args, "attention_window", "1024")
    args.global_attention = getattr(args, "global_attention", "first")
    args.global_token_ids = getattr(args, "global_token_ids", "")


@register_model_architecture("led", "led_base")
def led_base_architecture(args):
    """allenai/led-base-16384: bart_base with a 16K encoder position table."""
    args.max_source_positions = getattr(args, "max_source_positions", MAX_SOURCE_POSITIONS)
    led_architecture_defaults(args)
    bart_base_architecture(args)


@register_model_architecture("led", "led_large")
def led_large_architecture(args):
    """allenai/led-large-16384: bart_large with a 16K encoder position table."""
    args.max_source_positions = getattr(args, "max_source_positions", MAX_SOURCE_POSITIONS)
    led_architecture_defaults(args)
    bart_large_architecture(args)


@register_model_architecture("led", "led_tiny")
def led_tiny_architecture(args):
    """A few-minute CPU model for tests and demos (``tiny_bart_architecture``, window 32)."""
    args.attention_window = getattr(args, "attention_window", "32")
    led_architecture_defaults(args)
    tiny_bart_architecture(args)
