"""The LED family, both ways: fairseq ``led`` <-> HF ``LEDForConditionalGeneration``.

HF -> fairseq:

- HF LED (``config.json`` with ``model_type == "led"``; spec/led.md section 7): BART's mapping
  (``convert.bart_state.hf_to_fairseq_state`` after dropping the ``led.`` prefix), plus
  ``…self_attn.longformer_self_attn.{query,key,value}[_global]`` -> ``self_attn.{q,k,v}_proj[_global]``,
  ``…self_attn.output`` -> ``self_attn.out_proj``, and both position tables moved down two rows
  (HF row t = position t; fairseq's learned positions start at row 2, rows 0-1 zero).
  ``max_source_positions`` / ``max_target_positions`` = the HF encoder / decoder table sizes.
- HF BART with ``--to led`` (spec section 8, allenai's recipe): every BART tensor unchanged,
  ``{q,k,v}_proj_global`` = copies of ``{q,k,v}_proj``, the encoder position table tiled to
  ``--max-source-positions`` (default: the ``led_*`` architecture's, 16384 = BART's 1024
  positions copied 16 times: new row 2 + t = old row 2 + (t mod 1024)), the decoder table
  unchanged, ``--attention-window`` (default: the architecture's) on every layer.

Options: ``attention_window`` (int, list or comma string; overrides the source's),
``global_attention`` (first | none), ``global_token_ids``, ``max_source_positions``
(BART -> LED only; an HF LED table is not re-tiled).

fairseq -> HF: the same names back, the position tables without fairseq's two unused rows, and
the LED config fields. HF LED takes global attention per call (``global_attention_mask``), so
``--global-attention`` / ``--global-token-ids`` are said in the log, not written.
"""

import logging
import re
from typing import Dict

import torch

from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.bart import SCALE_EMBEDDING_READ_ONLY, BartFamily, is_bart_source
from lsg_fairseq.convert.bart_state import hf_to_fairseq_state
from lsg_fairseq.convert.registry import NOT_ITS_SOURCE, BenchRow, register_family
from lsg_fairseq.models.led import LEDModel
from lsg_layers.modules.longformer_attention import parse_attention_windows
from lsg_text.argtypes import POSITIVE_INT

logger = logging.getLogger(__name__)

# HF LongformerSelfAttention names -> fairseq LongformerSelfAttention names
HF_ATTENTION_NAMES = {
    "longformer_self_attn.query": "q_proj",
    "longformer_self_attn.key": "k_proj",
    "longformer_self_attn.value": "v_proj",
    "longformer_self_attn.query_global": "q_proj_global",
    "longformer_self_attn.key_global": "k_proj_global",
    "longformer_self_attn.value_global": "v_proj_global",
    "output": "out_proj",
}
FAIRSEQ_ATTENTION_NAMES = {fs: hf for hf, fs in HF_ATTENTION_NAMES.items()}


def windows_from(value, layers: int, where: str) -> list:
    try:
        return parse_attention_windows(value, layers, name=where)
    except ValueError as e:
        raise C.ConversionError(str(e)) from e


def rename_attention(sd: Dict[str, torch.Tensor], names: Dict[str, str], src: str) -> Dict[str, torch.Tensor]:
    """Encoder self-attention tensors renamed by ``names`` (HF <-> fairseq); the others unchanged."""
    renamed = {}
    for key, value in sd.items():
        if ".self_attn." in key and key.startswith("encoder.layers."):
            head, tail = key.split(".self_attn.", 1)
            name, _, param = tail.rpartition(".")
            if name not in names:
                raise C.ConversionError(f"{src}: unexpected encoder attention tensor {key!r}")
            key = f"{head}.self_attn.{names[name]}.{param}"
        renamed[key] = value
    return renamed


def hf_led_to_fairseq_state(hf: Dict[str, torch.Tensor], src: str) -> Dict[str, torch.Tensor]:
    """HF LED(ForConditionalGeneration) names -> fairseq ``led`` names (spec section 7)."""
    unprefixed = {}
    for key, value in hf.items():
        if key.startswith("model."):
            raise C.ConversionError(f"{src}: key {key!r} looks like BART, not LED (expected 'led.' prefix)")
        unprefixed[key[len("led.") :] if key.startswith("led.") else key] = value
    # embeddings (tied), final_logits_bias check, versions
    sd = hf_to_fairseq_state(rename_attention(unprefixed, HF_ATTENTION_NAMES, src), src)
    for side in ("encoder", "decoder"):
        key = f"{side}.embed_positions.weight"
        if key not in sd:
            raise C.ConversionError(f"{src}: missing led.{key}")
        table = sd[key]
        # HF row t is position t; fairseq numbers real tokens from row 2 (rows 0-1 never used)
        sd[key] = torch.cat([table.new_zeros(2, table.size(1)), table], dim=0)
    return sd


def add_global_projections(sd: Dict[str, torch.Tensor]) -> None:
    """fairseq BART state -> LED's encoder (spec section 8), in place: the global projections are
    copies of the local ones (Longformer section 3)."""
    for key in list(sd):
        for proj in ("q_proj", "k_proj", "v_proj"):
            marker = f".self_attn.{proj}."
            if key.startswith("encoder.layers.") and marker in key:
                sd[key.replace(marker, f".self_attn.{proj}_global.")] = sd[key].clone()


def _check_led_config(config: dict, src: str) -> None:
    for key in ("max_encoder_position_embeddings", "max_decoder_position_embeddings", "attention_window"):
        if key not in config:
            raise C.ConversionError(f"{src}/config.json: missing field {key!r}")
    if not C.config_flag(config, "tie_word_embeddings", src, True):
        raise C.ConversionError(f"{src}/config.json: tie_word_embeddings false is not supported")
    if C.config_flag(config, "scale_embedding", src, False):
        raise C.ConversionError(f"{src}/config.json: scale_embedding true is not LED")


SIDES = ("encoder", "decoder")


@register_family
class LEDFamily(BartFamily):
    """fairseq ``led`` <-> HF ``LEDForConditionalGeneration``; HF BART -> ``led`` with ``--to led``."""

    name = "led"
    models = ("led",)
    label = "LED"
    hf_architecture = "LEDForConditionalGeneration"
    hf_prefix = "led."
    tokenizer_class = "LEDTokenizer"
    hf_length_field = "max_encoder_position_embeddings"
    fields = (SCALE_EMBEDDING_READ_ONLY,)  # HF LED has no scale_embedding (refused when on, both ways)
    encoder_keys = re.compile(r"encoder\.layers\.\d+\.self_attn\.(q|k|v)_proj_global\.(weight|bias)")
    common_options = ("max_source_positions",)  # the decoder table is the source's

    def refusal(self, source, options):
        """HF LED folders; HF BART folders with ``--to led`` (allenai's recipe)."""
        if source.model_type == "led":
            return None
        asked = options.get("to") == self.name
        return None if asked and source.hf_config is not None and is_bart_source(source) else NOT_ITS_SOURCE

    def add_args(self, parser):
        window = C.arch_defaults(self.arch("base")).attention_window
        LEDModel.add_led_args(
            parser.add_argument_group(
                f"{self.label} options (HF LED sources, or HF BART folders with --to {self.name}; default: the "
                f"source's, window {window} for BART -> LED)"
            )
        )

    # ------------------------------------------------------------- HF -> fairseq
    def state_from_hf(self, hf, source):
        """HF LED names (the attention renamed, tables moved down two rows), or BART's."""
        if source.model_type == "led":
            return hf_led_to_fairseq_state(hf, source.path)
        return hf_to_fairseq_state(hf, source.path)

    def hf_lengths(self, source, sd, max_source_positions, max_target_positions):
        """An HF LED folder's tables as they are; BART -> LED: the encoder's tiled to
        ``--max-source-positions`` (default: the architecture's), the decoder's unchanged."""
        config, src = source.hf_config, source.path
        layers = config.get("encoder_layers")
        if not isinstance(layers, int) or layers < 1:
            raise C.ConversionError(f"{src}/config.json: encoder_layers missing or not a positive int")
        if source.model_type != "led":
            M = max_source_positions or C.arch_defaults(self.arch_for(config)).max_source_positions
            return int(M), sd["decoder.embed_positions.weight"].size(0) - 2
        if max_source_positions is not None:
            raise C.ConversionError(
                "--max-source-positions: an HF LED encoder table is used as is "
                f"({config.get('max_encoder_position_embeddings')} positions); it is not re-tiled"
            )
        _check_led_config(config, src)
        M, T = (C.config_value(config, f"max_{side}_position_embeddings", src, POSITIVE_INT) for side in SIDES)
        for side, n in zip(SIDES, (M, T)):
            rows = sd[f"{side}.embed_positions.weight"].size(0)
            if rows != n + 2:
                raise C.ConversionError(f"{src}: {side} position table has {rows - 2} positions, config says {n}")
        return M, T

    def hf_encoder(self, source, values, sd, options, init):
        """The attention window of every layer (``--attention-window``, else an HF LED folder's,
        else the architecture's), the global attention options; BART -> LED: the global projections."""
        config, src = source.hf_config, source.path
        layers = config["encoder_layers"]
        if source.model_type == "led":
            windows = windows_from(config["attention_window"], layers, f"{src}/config.json attention_window")
        else:
            defaults = C.arch_defaults(self.arch_for(config), encoder_layers=layers)
            windows = windows_from(defaults.attention_window, layers, "the led architecture's attention_window")
            add_global_projections(sd)
        if "attention_window" in options:
            windows = windows_from(options.pop("attention_window"), layers, "--attention-window")
        values.update(
            attention_window=",".join(map(str, windows)), global_attention=options.pop("global_attention", None)
        )
        ids = options.pop("global_token_ids", None)
        if ids is not None:
            values["global_token_ids"] = (ids if isinstance(ids, str) else ",".join(map(str, ids))) or None

    # ------------------------------------------------------------- fairseq -> HF
    def hf_limits(self, checkpoint):
        problems = super().hf_limits(checkpoint)
        if not checkpoint.get("no_scale_embedding", True):
            problems.append("embedding scaling (HF LED has no scale_embedding)")
        return problems

    def to_hf_layout(self, sd, enc_pos, dec_pos):
        # fairseq numbers real tokens from row 2 (rows 0-1 are never read); HF LED row t = position t
        return rename_attention(sd, FAIRSEQ_ATTENTION_NAMES, "the checkpoint"), enc_pos[2:], dec_pos[2:]

    def hf_config_fields(self, checkpoint, config, hf):
        name = f"{checkpoint.path}: the model cfg's attention_window"
        try:
            windows = parse_attention_windows(checkpoint.get("attention_window"), config["encoder_layers"], name)
        except ValueError as e:  # absent or hand-edited: named, not a traceback
            raise C.ExportError(str(e)) from None
        return dict(
            model_type="led",
            tie_word_embeddings=True,
            attention_window=windows,
            max_encoder_position_embeddings=int(hf["led.encoder.embed_positions.weight"].size(0)),
            max_decoder_position_embeddings=int(hf["led.decoder.embed_positions.weight"].size(0)),
        )

    def export(self, checkpoint):
        write = super().export(checkpoint)
        if checkpoint.get("global_attention") == "first":
            logger.info(
                "HF LED takes global attention per call: pass global_attention_mask with 1 on the first "
                "token (this model was used with --global-attention first)"
            )
        if checkpoint.get("global_token_ids"):
            logger.warning(
                "--global-token-ids %s: HF LED's config cannot hold it; mark those tokens in "
                "global_attention_mask yourself",
                checkpoint.get("global_token_ids"),
            )
        return write

    # ------------------------------------------------------------- benchmarks/run.py
    def benchmarks(self):
        """``led``: the settings' attention window on every layer, the first token global."""

        def argv(length, settings):
            return [
                self.arch("tiny" if settings.smoke else "base"),
                "--max-source-positions",
                str(max(length, 16384)),
                "--attention-window",
                str(settings.attention_window),
            ]

        return {"led": BenchRow(argv, color="tab:green")}
