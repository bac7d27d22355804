"""The BART family, both ways, and the base of every BART-shaped family (LSG-BART in
``lsg_bart.py``, LED in ``led.py``, README "Adding an encoder").

:class:`BartFamily` (fairseq ``bart`` / ``plain_bart`` <-> HF ``BartForConditionalGeneration``)
maps what every BART-shaped model shares: its config (:data:`BART_FIELDS`, one table both ways),
its weights (``bart_state.py``), its tokenizer files (``hf_tokenizer.py``). A family whose encoder
differs subclasses it and sets its HF names (``hf_architecture``, ``hf_prefix``,
``tokenizer_class``), its own config rows (``fields``) and tensors (``encoder_keys``), and
overrides only the steps of :meth:`BartFamily.convert` / :meth:`BartFamily.export` marked "step"
that its encoder changes.

Sources (detected automatically):

- HF BART folder (``config.json`` with ``model_type == "bart"``) -> ``bart`` (weights mapped 1:1,
  fairseq_notes section 3); other BART-shaped families take it with ``--to`` or their options;
- a fairseq ``bart`` checkpoint (e.g. trained here at 1,024 tokens) -> ``bart`` with tiled position
  tables, or another BART-shaped family with ``--to`` (``lsg_bart``: initialised as from HF).

The way back writes ``model.safetensors`` (``model.`` prefix, ``final_logits_bias`` zeros: fairseq
has no output bias), ``config.json`` with the fields HF itself writes, ``generation_config.json``
and the tokenizer. HF BART holds one ``max_position_embeddings`` for both sides: when the fairseq
lengths differ, the shorter table is tiled to the longer (the rows of every position it held are
unchanged), as the LSG reference's own conversion does for the decoder (spec/lsg.md section 6
step 4).
"""

import logging
import os
import re
import shutil
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

import torch

from lsg_fairseq.checkpoint_policy import model_arch
from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.bart_state import (
    FAIRSEQ_ACTIVATIONS,
    HF_ACTIVATIONS,
    extend_positions,
    hf_limits,
    hf_state,
    hf_to_fairseq_state,
)
from lsg_fairseq.convert.checkpoint import Checkpoint
from lsg_fairseq.convert.fields import Field, hf_fields, values_from_hf
from lsg_fairseq.convert.hf_tokenizer import generation_config, tokenizer_writer
from lsg_fairseq.convert.registry import NOT_ITS_SOURCE, BenchRow, Family, SourceInfo, register_family
from lsg_text.argtypes import POSITIVE_INT, PROBABILITY, OneOf
from lsg_text.fileio import check_fairseq_dict
from lsg_text.offline_bpe import GPT2_FILES, SENTENCEPIECE_NAMES

logger = logging.getLogger(__name__)

BART_MODELS = ("bart", "plain_bart")  # fairseq's BART and the plugin's bart_tiny (same weights)


def _not(value):
    return not value


# HF BartConfig field <-> fairseq argument, with BartConfig's default of a field a config may lack
# (d_model is written back from the embedding's width; layerdrop is only written back).
BART_FIELDS = (
    Field("d_model", "encoder_embed_dim", to_hf=None, kind=POSITIVE_INT),
    Field("d_model", "decoder_embed_dim", to_hf=None, kind=POSITIVE_INT),
    Field("encoder_layers", "encoder_layers", to_hf=int, kind=POSITIVE_INT),
    Field("decoder_layers", "decoder_layers", to_hf=int, kind=POSITIVE_INT),
    Field("encoder_attention_heads", "encoder_attention_heads", to_hf=int, kind=POSITIVE_INT),
    Field("decoder_attention_heads", "decoder_attention_heads", to_hf=int, kind=POSITIVE_INT),
    Field("encoder_ffn_dim", "encoder_ffn_embed_dim", to_hf=int, kind=POSITIVE_INT),
    Field("decoder_ffn_dim", "decoder_ffn_embed_dim", to_hf=int, kind=POSITIVE_INT),
    Field(
        "activation_function",
        "activation_fn",
        "gelu",
        HF_ACTIVATIONS.__getitem__,
        FAIRSEQ_ACTIVATIONS.__getitem__,
        kind=OneOf(HF_ACTIVATIONS),
    ),
    Field("dropout", "dropout", 0.1, to_hf=float, kind=PROBABILITY),
    Field("attention_dropout", "attention_dropout", 0.0, to_hf=float, kind=PROBABILITY),
    Field("activation_dropout", "activation_dropout", 0.0, to_hf=float, kind=PROBABILITY),
    Field("encoder_layerdrop", "encoder_layerdrop", 0.0, to_fairseq=None, to_hf=float),
    Field("decoder_layerdrop", "decoder_layerdrop", 0.0, to_fairseq=None, to_hf=float),
)
# BartConfig's embedding scale; a family's own row (HF LED has none: led.py reads it only)
SCALE_EMBEDDING = Field("scale_embedding", "no_scale_embedding", False, _not, _not)
SCALE_EMBEDDING_READ_ONLY = replace(SCALE_EMBEDDING, to_hf=None)


def is_lsg_config(config: dict) -> bool:
    archs = config.get("architectures") or []
    return (
        config.get("base_model_prefix") == "lsg"
        or any(str(a).startswith("LSG") for a in archs)
        or "block_size" in config
        and "num_global_tokens" in config
    )


def is_bart_source(source: SourceInfo) -> bool:
    """An HF BART folder or a fairseq BART checkpoint: not one of another BART-shaped family (an HF
    folder of LSG-BART has LSG fields, another family's names its own architecture)."""
    if source.hf_config is not None:
        archs = source.hf_config.get("architectures") or []
        return (
            source.model_type == "bart"
            and not is_lsg_config(source.hf_config)
            and all(str(a).startswith("Bart") for a in archs)
        )
    return source.model in BART_MODELS


def model_values(config: dict, src: str) -> dict:
    """fairseq hyper-parameters reproducing an HF BART config's shapes (:data:`BART_FIELDS`)."""
    values = values_from_hf(BART_FIELDS, config, src)
    if any(C.config_flag(config, k, src, False) for k in ("normalize_before", "add_final_layer_norm")):
        raise C.ConversionError(f"{src}/config.json: pre-LayerNorm (mBART-style) models are not BART")
    for key, expected in (("pad_token_id", 1), ("bos_token_id", 0), ("eos_token_id", 2)):
        if config.get(key, expected) != expected:
            raise C.ConversionError(f"{src}/config.json: {key} = {config[key]}; fairseq dictionaries need {expected}")
    return values


def read_hf(source: SourceInfo, state_from_hf) -> Tuple[dict, Dict[str, torch.Tensor], int]:
    """(model values, fairseq state, vocabulary size) of an HF BART-shaped folder; ``state_from_hf``
    maps its weights to fairseq names."""
    config, src = source.hf_config, source.path
    values = model_values(config, src)
    V = config["vocab_size"]
    vocab = C.read_hf_vocab(src)
    if vocab is not None:
        C.check_bart_vocab(vocab, V, src)
    sd = state_from_hf(C.load_hf_state_dict(src), source)
    rows = sd["encoder.embed_tokens.weight"].size(0)
    if rows != V:
        raise C.ConversionError(f"{src}: embedding has {rows} rows, config vocab_size is {V}")
    if "encoder.embed_positions.weight" not in sd or "decoder.embed_positions.weight" not in sd:
        raise C.ConversionError(f"{src}: missing learned position tables (embed_positions.weight)")
    return values, sd, V


def write_model(source: SourceInfo, out: str, arch: str, values: dict, sd: Dict[str, torch.Tensor], V: int) -> str:
    """``dict.txt`` (fairseq index == HF id), the model built as fairseq-train would, its
    weights loaded strictly, the GPT-2 BPE files and ``model.pt``."""
    C.write_identity_dict(out, V)
    cfg, _, model = C.build_model(out, arch, values)
    C.load_strict(model, sd)
    C.write_gpt2_bpe_files(source.path, out)
    return C.save_checkpoint(cfg, model, os.path.join(out, "model.pt"))


@register_family
class BartFamily(Family):
    """fairseq ``bart`` (and ``bart_tiny``) <-> HF ``BartForConditionalGeneration``."""

    name = "bart"
    models = BART_MODELS
    label = "BART"
    hf_architecture = "BartForConditionalGeneration"  # config.json "architectures"
    hf_prefix = "model."  # the HF model's attribute holding encoder and decoder
    tokenizer_class = "BartTokenizer"
    hf_length_field = "max_position_embeddings"  # its config's encoder length (the tokenizer's max length)
    fields: Tuple[Field, ...] = (SCALE_EMBEDDING,)  # its config rows beyond BART_FIELDS, both ways
    encoder_keys: Optional["re.Pattern"] = None  # fairseq tensors of its encoder beyond BART's
    required_keys: Tuple[str, ...] = ()  # of those, the ones a checkpoint must have

    def refusal(self, source, options):
        if is_bart_source(source):
            return None
        if source.hf_config is not None and source.model_type == "bart" and is_lsg_config(source.hf_config):
            return (
                f"{source.path} is an LSG-BART folder; --to {self.name} cannot keep its LSG settings and global "
                "tokens (use --to lsg_bart)"
            )
        return NOT_ITS_SOURCE

    def arch_for(self, config: dict) -> str:
        """The family's arch of an HF config's size (every shape is also passed explicitly)."""
        large = config.get("d_model") == 1024 and config.get("encoder_layers") == 12
        return self.arch("large" if large else "base")

    # ------------------------------------------------------------- HF (or fairseq) -> fairseq
    def convert(self, source, out, max_source_positions=None, max_target_positions=None, init=None, **options):
        """An HF folder: its weights and config (:data:`BART_FIELDS` and the family's ``fields``),
        the lengths (:meth:`hf_lengths`), the encoder's own settings and tensors
        (:meth:`hf_encoder`), then ``options`` (the model's flags) and the position tables tiled.
        A fairseq checkpoint: :meth:`from_checkpoint`. ``init``: how a new encoder's own weights
        start (LSG-BART's global tokens)."""
        init = init or {}
        if source.checkpoint is not None:
            return self.from_checkpoint(source, out, max_source_positions, max_target_positions, options, init)
        config = source.hf_config
        values, sd, V = read_hf(source, self.state_from_hf)
        M, T = self.hf_lengths(source, sd, max_source_positions, max_target_positions)
        values.update(values_from_hf(self.fields, config, source.path), max_source_positions=M, max_target_positions=T)
        self.hf_encoder(source, values, sd, options, init)
        values.update(options)
        sd["encoder.embed_positions.weight"] = extend_positions(sd["encoder.embed_positions.weight"], M)
        sd["decoder.embed_positions.weight"] = extend_positions(sd["decoder.embed_positions.weight"], T)
        return write_model(source, out, self.arch_for(config), values, sd, V)

    def state_from_hf(self, hf: Dict[str, torch.Tensor], source: SourceInfo) -> Dict[str, torch.Tensor]:
        """Step: HF weights -> fairseq names (BART's: tied embeddings, no output bias)."""
        return hf_to_fairseq_state(hf, source.path)

    def hf_lengths(self, source, sd, max_source_positions, max_target_positions) -> Tuple[int, int]:
        """Step: the encoder and decoder lengths (BART's: the source's tables unless given)."""
        M = int(max_source_positions or sd["encoder.embed_positions.weight"].size(0) - 2)
        T = int(max_target_positions or sd["decoder.embed_positions.weight"].size(0) - 2)
        return M, T

    def hf_encoder(self, source, values: dict, sd: Dict[str, torch.Tensor], options: dict, init: dict) -> None:
        """Step: its encoder's own values and tensors, in place; it takes out of ``options`` what
        it maps itself (BART's: nothing)."""

    def from_checkpoint(self, source, out, max_source_positions, max_target_positions, options, init) -> str:
        """A fairseq checkpoint of this family (longer tables, other settings) or, with
        :meth:`new_encoder`, of plain BART (its weights, this family's encoder)."""
        from fairseq import checkpoint_utils
        from omegaconf import open_dict

        path = source.checkpoint
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        cfg = state.get("cfg")
        if cfg is None or cfg.get("model") is None:
            raise C.ConversionError(f"{path}: checkpoint has no cfg.model; cannot rebuild the model")
        src_dir = os.path.dirname(os.path.abspath(path))
        if not os.path.exists(os.path.join(src_dir, "dict.txt")):
            # fairseq-train writes none into its --save-dir: the dictionary is in the data folder
            data = (cfg.get("task") or {}).get("data")
            hint = ""
            if data:
                hint = f"; copy there, as dict.txt, its training dictionary ({data}/dict.txt or dict.source.txt)"
            raise C.ConversionError(f"{src_dir}/dict.txt: missing (needed beside the checkpoint{hint})")
        # a damaged line named in the source's file, before the copy in OUT's staging folder is read
        check_fairseq_dict(os.path.join(src_dir, "dict.txt"), "dictionary")
        sd = dict(state["model"])
        model_args = cfg.model
        new_encoder = source.model not in self.models
        M = int(max_source_positions or model_args.max_source_positions)
        # a new encoder tiles the decoder table to M too, as the reference (and an HF source's) does
        T = int(max_target_positions or (M if new_encoder else model_args.max_target_positions))
        with open_dict(cfg):
            model_args.max_source_positions = M
            model_args.max_target_positions = T
            for k, v in options.items():
                setattr(model_args, k, v)
            cfg.task.max_source_positions = M
            cfg.task.max_target_positions = T
            if new_encoder:
                self.new_encoder(model_args, sd, src_dir, **init)
        sd["encoder.embed_positions.weight"] = extend_positions(sd["encoder.embed_positions.weight"], M)
        sd["decoder.embed_positions.weight"] = extend_positions(sd["decoder.embed_positions.weight"], T)
        # the tokenizer files that belong to this checkpoint (tokenizer.txt, when present, says which)
        for name in ("dict.txt", "token_map.json") + GPT2_FILES + SENTENCEPIECE_NAMES:
            if os.path.exists(os.path.join(src_dir, name)):
                shutil.copyfile(os.path.join(src_dir, name), os.path.join(out, name))
        cfg, _, model = C.build_model_from_cfg(cfg, out)
        C.load_strict(model, sd)
        return C.save_checkpoint(cfg, model, os.path.join(out, "model.pt"))

    def new_encoder(self, model_args, sd: Dict[str, torch.Tensor], src_dir: str, **init) -> None:
        """Step: turn a plain BART checkpoint's cfg and weights into this family's (in place)."""
        raise C.ConversionError(f"{src_dir}: a {model_arch(model_args)} checkpoint does not convert to {self.name}")

    # ------------------------------------------------------------- fairseq -> HF
    def hf_limits(self, checkpoint: Checkpoint) -> List[str]:
        """Step: model settings its HF class cannot express, naming the flag."""
        return hf_limits(checkpoint)

    def to_hf_layout(self, sd, enc_pos, dec_pos):
        """Step: (state, encoder table, decoder table) with HF's names and tables; HF BART holds one
        ``max_position_embeddings``, so the shorter table is tiled to the longer."""
        P = max(enc_pos.size(0), dec_pos.size(0)) - 2
        if enc_pos.size(0) - 2 != P or dec_pos.size(0) - 2 != P:
            logger.warning(
                "encoder/decoder positions %d/%d: HF holds one max_position_embeddings, so the shorter table is "
                "tiled to %d (positions it held are unchanged)",
                enc_pos.size(0) - 2,
                dec_pos.size(0) - 2,
                P,
            )
            enc_pos, dec_pos = extend_positions(enc_pos, P), extend_positions(dec_pos, P)
        return sd, enc_pos, dec_pos

    def hf_config(self, checkpoint: Checkpoint, hf: Dict[str, torch.Tensor]) -> dict:
        """config.json with the fields (and config class defaults) HF itself writes."""
        d = checkpoint.dictionary
        V, dim = hf[f"{self.hf_prefix}shared.weight"].shape
        if len(d) != V:
            raise C.ExportError(
                f"{checkpoint.path}: the dictionary has {len(d)} symbols but the embedding has {V} rows"
            )
        config = dict(hf_fields(BART_FIELDS + self.fields, checkpoint))
        config.update(
            {
                "architectures": [self.hf_architecture],
                "bos_token_id": d.bos(),
                "classifier_dropout": 0.0,
                "d_model": int(dim),
                "decoder_start_token_id": d.eos(),  # fairseq BART decoders start from </s>
                "eos_token_id": d.eos(),
                "init_std": 0.02,
                "is_encoder_decoder": True,
                "pad_token_id": d.pad(),
                "torch_dtype": C.dtype_name(hf),
                "use_cache": True,
                "vocab_size": int(V),
            }
        )
        config.update(self.hf_config_fields(checkpoint, config, hf))
        return config

    def hf_config_fields(self, checkpoint: Checkpoint, config: dict, hf: Dict[str, torch.Tensor]) -> dict:
        """Step: the config fields of this family's HF config class (BartConfig's here)."""
        return dict(
            model_type="bart",
            forced_eos_token_id=checkpoint.dictionary.eos(),
            num_hidden_layers=config["encoder_layers"],
            id2label={"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"},
            label2id={"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
            max_position_embeddings=int(hf["model.encoder.embed_positions.weight"].size(0)) - 2,
        )

    def export(self, checkpoint):
        from safetensors.torch import save_file

        problems = self.hf_limits(checkpoint)
        if problems:
            raise C.ExportError(
                f"{checkpoint.path} (arch {checkpoint.arch}): HF's format cannot hold " + "; ".join(problems)
            )
        hf = hf_state(
            checkpoint, self.hf_prefix, self.hf_architecture, self.encoder_keys, self.required_keys, self.to_hf_layout
        )
        config = self.hf_config(checkpoint, hf)
        write_tokenizer = tokenizer_writer(checkpoint, self.tokenizer_class, config[self.hf_length_field])

        def write(folder):
            save_file(hf, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
            C.write_json(folder, "config.json", config)
            C.write_json(folder, "generation_config.json", generation_config(config))
            write_tokenizer(folder)

        return write

    # ------------------------------------------------------------- benchmarks/run.py
    def benchmarks(self):
        """``bart``: full attention, the quadratic reference."""

        def argv(length, settings):
            return [self.arch("tiny" if settings.smoke else "base"), "--max-source-positions", str(max(length, 1024))]

        return {
            "bart": BenchRow(
                argv, full_attention=True, growth="-> 2 (attention L^2 dominates at long L)", color="black"
            )
        }
