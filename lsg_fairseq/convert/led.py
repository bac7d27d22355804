"""Converter family ``led``: HF LED folders, and HF BART folders with ``--to led`` -> fairseq ``led``.

- HF LED (``config.json`` with ``model_type == "led"``; spec/led.md section 7): BART's mapping
  (``convert.bart.hf_to_fairseq_state`` after dropping the ``led.`` prefix), plus
  ``…self_attn.longformer_self_attn.{query,key,value}[_global]`` -> ``self_attn.{q,k,v}_proj[_global]``,
  ``…self_attn.output`` -> ``self_attn.out_proj``, and both position tables moved down two rows
  (HF row t = position t; fairseq's learned positions start at row 2, rows 0-1 zero).
  ``max_source_positions`` / ``max_target_positions`` = the HF encoder / decoder table sizes.
- HF BART with ``--to led`` (spec section 8, allenai's recipe): every BART tensor unchanged,
  ``{q,k,v}_proj_global`` = copies of ``{q,k,v}_proj``, the encoder position table tiled to
  ``--max-source-positions`` (default: the ``led_*`` architecture's, 16384 = BART's 1024
  positions copied 16 times: new row 2 + t = old row 2 + (t mod 1024)), the decoder table
  unchanged, ``--attention-window`` (default: the architecture's, 1024) on every layer.

Options: ``attention_window`` (int, list or comma string; overrides the source's),
``global_attention`` (first | none), ``global_token_ids``, ``max_source_positions``
(BART -> LED only; an HF LED table is not re-tiled).
"""
import logging
import os
from typing import Dict, Optional

import torch

from lsg_fairseq.convert import ConversionError, register_family
from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.bart import MAX_POSITIONS, extend_positions, hf_to_fairseq_state, model_values

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


def detect(src: str) -> bool:
    if not (os.path.isdir(src) and os.path.exists(os.path.join(src, "config.json"))):
        return False
    try:
        return C.read_hf_config(src).get("model_type") == "led"
    except ConversionError:
        return False


def accepts(src: str, to: Optional[str]) -> bool:
    """``--to led`` on an HF BART folder is ours (the bart family converts to bart/lsg_bart)."""
    if to != "led" or not (os.path.isdir(src) and os.path.exists(os.path.join(src, "config.json"))):
        return False
    try:
        return C.read_hf_config(src).get("model_type") in ("bart", "led")
    except ConversionError:
        return False


def windows_from(value, layers: int, where: str) -> list:
    from lsg_fairseq.modules.longformer_attention import parse_attention_windows

    try:
        return parse_attention_windows(value, layers, name=where)
    except ValueError as e:
        raise ConversionError(str(e)) from e


def hf_led_to_fairseq_state(hf: Dict[str, torch.Tensor], src: str) -> Dict[str, torch.Tensor]:
    """HF LED(ForConditionalGeneration) names -> fairseq ``led`` names (spec section 7)."""
    renamed = {}
    for key, value in hf.items():
        if key.startswith("led."):
            key = key[len("led."):]
        elif key.startswith("model."):
            raise ConversionError(f"{src}: key {key!r} looks like BART, not LED (expected 'led.' prefix)")
        if ".self_attn." in key and key.startswith("encoder.layers."):
            head, tail = key.split(".self_attn.", 1)
            name, _, param = tail.rpartition(".")
            if name not in HF_ATTENTION_NAMES:
                raise ConversionError(f"{src}: unexpected encoder attention tensor {key!r}")
            key = f"{head}.self_attn.{HF_ATTENTION_NAMES[name]}.{param}"
        renamed[key] = value
    sd = hf_to_fairseq_state(renamed, src)  # embeddings (tied), final_logits_bias check, versions
    for side in ("encoder", "decoder"):
        key = f"{side}.embed_positions.weight"
        if key not in sd:
            raise ConversionError(f"{src}: missing led.{key}")
        table = sd[key]
        # HF row t is position t; fairseq numbers real tokens from row 2 (rows 0-1 never used)
        sd[key] = torch.cat([table.new_zeros(2, table.size(1)), table], dim=0)
    return sd


def bart_to_led_state(sd: Dict[str, torch.Tensor], max_source_positions: int) -> Dict[str, torch.Tensor]:
    """fairseq BART state -> fairseq LED state (spec section 8): global projections copied from
    the local ones (Longformer section 3), encoder positions tiled; the input is not modified."""
    sd = dict(sd)
    for key in list(sd):
        for proj in ("q_proj", "k_proj", "v_proj"):
            marker = f".self_attn.{proj}."
            if key.startswith("encoder.layers.") and marker in key:
                sd[key.replace(marker, f".self_attn.{proj}_global.")] = sd[key].clone()
    sd["encoder.embed_positions.weight"] = extend_positions(sd["encoder.embed_positions.weight"],
                                                            max_source_positions)
    return sd


def _check_led_config(config: dict, src: str) -> None:
    for key in ("max_encoder_position_embeddings", "max_decoder_position_embeddings", "attention_window"):
        if key not in config:
            raise ConversionError(f"{src}/config.json: missing field {key!r}")
    if not config.get("tie_word_embeddings", True):
        raise ConversionError(f"{src}/config.json: tie_word_embeddings false is not supported")
    if config.get("scale_embedding"):
        raise ConversionError(f"{src}/config.json: scale_embedding true is not LED")


def convert(src: str, out: str, to: Optional[str] = None, attention_window=None,
            global_attention: Optional[str] = None, global_token_ids=None,
            max_source_positions: Optional[int] = None, **options) -> str:
    """See the module docstring; returns the path of the written ``model.pt``."""
    if options:
        raise ConversionError(f"unknown option(s) for the led family: {', '.join(sorted(options))}")
    if to not in (None, "led"):
        raise ConversionError(f"--to {to}: an LED source converts to led only")
    config = C.read_hf_config(src)
    model_type = config.get("model_type")
    if model_type not in ("led", "bart"):
        raise ConversionError(f"{src}/config.json: model_type {model_type!r} is neither led nor bart")
    if model_type == "led" and max_source_positions is not None:
        raise ConversionError(
            "--max-source-positions: an HF LED encoder table is used as is "
            f"({config.get('max_encoder_position_embeddings')} positions); it is not re-tiled"
        )
    C.prepare_out_dir(src, out)
    layers = config.get("encoder_layers")
    if not isinstance(layers, int) or layers < 1:
        raise ConversionError(f"{src}/config.json: encoder_layers missing or not a positive int")
    values = model_values(config, src)  # shapes, activation, dropouts, embedding scale
    arch = "led_large" if config.get("d_model") == 1024 and layers == 12 else "led_base"
    V = config["vocab_size"]
    vocab = C.read_hf_vocab(src)
    if vocab is not None:
        C.check_bart_vocab(vocab, V, src)
    hf = C.load_hf_state_dict(src)

    if model_type == "led":
        _check_led_config(config, src)
        source_windows = windows_from(config["attention_window"], layers, f"{src}/config.json attention_window")
        sd = hf_led_to_fairseq_state(hf, src)
        M = int(config["max_encoder_position_embeddings"])
        T = int(config["max_decoder_position_embeddings"])
    else:
        if any(k.startswith(("model.encoder.global_embeddings", "encoder.global_embeddings")) for k in hf):
            raise ConversionError(f"{src}: an LSG-BART checkpoint; convert plain BART to LED")
        defaults = C.arch_defaults(arch, encoder_layers=layers)
        source_windows = windows_from(defaults.attention_window, layers, "the led architecture's attention_window")
        M = int(max_source_positions or defaults.max_source_positions)
        if not 1 <= M <= MAX_POSITIONS:
            raise ConversionError(f"--max-source-positions {M} must be in [1, {MAX_POSITIONS}]")
        sd = bart_to_led_state(hf_to_fairseq_state(hf, src), M)
        T = sd["decoder.embed_positions.weight"].size(0) - 2
    windows = source_windows if attention_window is None else windows_from(
        attention_window, layers, "--attention-window")

    emb = sd["encoder.embed_tokens.weight"]
    if emb.size(0) != V:
        raise ConversionError(f"{src}: embedding has {emb.size(0)} rows, config vocab_size is {V}")
    for side, n in (("encoder", M), ("decoder", T)):
        rows = sd[f"{side}.embed_positions.weight"].size(0)
        if rows != n + 2:
            raise ConversionError(
                f"{src}: {side} position table has {rows - 2} positions, config says {n}"
            )

    values.update(max_source_positions=M, max_target_positions=T, attention_window=",".join(map(str, windows)),
                  global_attention=global_attention)
    if global_token_ids is not None:
        ids = global_token_ids if isinstance(global_token_ids, str) else ",".join(map(str, global_token_ids))
        values["global_token_ids"] = ids or None

    C.write_identity_dict(out, V)
    cfg, _, model = C.build_model(out, arch, values)
    C.load_strict(model, sd)
    C.write_gpt2_bpe_files(src, out)
    return C.save_checkpoint(cfg, model, os.path.join(out, "model.pt"))


register_family("led", detect, convert, accepts=accepts)
