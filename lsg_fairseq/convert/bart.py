"""The BART family and the LSG-BART family, both ways; the base of every BART-shaped family.

:class:`BartFamily` (fairseq ``bart`` / ``plain_bart`` <-> HF ``BartForConditionalGeneration``)
maps what every BART-shaped model shares: embeddings (tied, one ``shared.weight`` in HF), learned
positions (fairseq's two unused leading rows kept), post-LN layers, the decoder. A family whose
encoder attention differs (LSG-BART here, LED in ``led.py``, README "Adding an encoder") subclasses
it and overrides the hooks of its encoder: which sources it takes, its extra tensors
(:attr:`~BartFamily.encoder_keys`, :meth:`~BartFamily.from_hf`), its config fields
(:meth:`~BartFamily.hf_config_fields`) and its benchmark rows.

Sources (detected automatically):

- HF BART folder (``config.json`` with ``model_type == "bart"``) -> ``bart`` (weights mapped 1:1,
  fairseq_notes section 3), or ``lsg_bart`` with ``--to lsg_bart``, LSG options or
  ``--max-source-positions`` (the reference's conversion, spec/lsg.md section 6: global tokens from
  ordered positions + <s>/<mask> embeddings, position tables tiled to the new max length);
- HF LSG-BART folder (``base_model_prefix == "lsg"`` / LSG fields) -> ``lsg_bart`` with the folder's
  LSG settings (``--to bart`` is refused: it would drop the global tokens);
- a fairseq ``lsg_bart`` checkpoint (``model.pt`` or a folder holding one) -> ``lsg_bart`` with a
  longer ``--max-source-positions`` and/or more ``--num-global-tokens`` (warm start, e.g.
  4,096 -> 16,384), or other LSG settings;
- a fairseq ``bart`` checkpoint (e.g. trained here at 1,024 tokens) -> ``bart`` with tiled position
  tables, or ``lsg_bart`` initialised as from an HF BART folder.

The way back writes ``model.safetensors`` (``model.`` prefix, ``final_logits_bias`` zeros: fairseq
has no output bias), ``config.json`` with the fields HF itself writes, and the tokenizer: HF id ==
fairseq dictionary index, so ``vocab.json`` maps each GPT-2 BPE token to the index of its id in
``dict.txt`` (identity for converted models); a sentencepiece model is copied as ``spm.model``
because HF's BART tokenizer files (byte-level BPE) cannot represent it. HF BART holds one
``max_position_embeddings`` for both sides: when the fairseq lengths differ, the shorter table is
tiled to the longer (the rows of every position it held are unchanged), as the LSG reference's own
conversion does for the decoder (spec/lsg.md section 6 step 4).

Deliberate fix of the reference (spec section 9): position extension always gives exactly
M + 2 rows (the reference's repeat count falls short when k*P < M < k*(P+2)).
"""

import json
import logging
import os
import re
import shutil
from typing import Callable, Dict, List, Optional, Tuple

import torch

from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.registry import BenchRow, Family, SourceInfo, register_family
from lsg_fairseq.models.lsg_bart import LSGBARTModel, lsg_architecture_defaults
from lsg_layers.modules.lsg_attention import MAX_GLOBAL_TOKENS, SPARSITY_TYPES
from lsg_fairseq.tasks.long_document_summarization import LongDocumentSummarizationTask
from lsg_text.argtypes import NON_NEGATIVE_INT, POSITIVE_INT
from lsg_text.offline_bpe import GPT2_FILES, SENTENCEPIECE_MODEL, SENTENCEPIECE_NAMES

logger = logging.getLogger(__name__)

BART_MODELS = ("bart", "plain_bart")  # fairseq's BART and the plugin's bart_tiny (same weights)
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "relu": "relu",
    "gelu_new": "gelu_accurate",
    "gelu_fast": "gelu_accurate",
    "tanh": "tanh",
    "linear": "linear",
}
# fairseq activation_fn -> HF activation_function (gelu_accurate -> gelu_new, the first HF name)
FAIRSEQ_ACTIVATIONS = {fs: hf for hf, fs in reversed(HF_ACTIVATIONS.items())}
LSG_OPTION_NAMES = C.option_names(LSGBARTModel.add_lsg_args)  # the LSG flags' one home is the model
# BART -> LSG global-token initialisation (spec/lsg.md section 6 step 3): the reference's defaults
GLOBAL_POSITIONAL_STRIDE = 64
INIT_SEED = 123
# every fairseq tensor the HF BART classes have a place for; anything else is refused by name
_BART_KEY = re.compile(
    r"(encoder|decoder)\.(version|embed_tokens\.weight|embed_positions\.weight|layernorm_embedding\.(weight|bias)"
    r"|layers\.\d+\.((self_attn|encoder_attn)\.(q|k|v|out)_proj|self_attn_layer_norm|encoder_attn_layer_norm"
    r"|final_layer_norm|fc1|fc2)\.(weight|bias))|decoder\.output_projection\.weight"
)
# What the LSG reference writes (spec/lsg.md section 1); the modeling file it names is the LSG
# authors' (lsg_converter/bart/modeling_lsg_bart.py), not shipped here.
LSG_AUTO_MAP = {
    "AutoConfig": "modeling_lsg_bart.LSGBartConfig",
    "AutoModel": "modeling_lsg_bart.LSGBartModel",
    "AutoModelForCausalLM": "modeling_lsg_bart.LSGBartForCausalLM",
    "AutoModelForQuestionAnswering": "modeling_lsg_bart.LSGBartForQuestionAnswering",
    "AutoModelForSeq2SeqLM": "modeling_lsg_bart.LSGBartForConditionalGeneration",
    "AutoModelForSequenceClassification": "modeling_lsg_bart.LSGBartForSequenceClassification",
}


# ----------------------------------------------------------------------------- weights and configs
def is_lsg_config(config: dict) -> bool:
    archs = config.get("architectures") or []
    return (
        config.get("base_model_prefix") == "lsg"
        or any(str(a).startswith("LSG") for a in archs)
        or "block_size" in config
        and "num_global_tokens" in config
    )


def extend_positions(table: torch.Tensor, max_positions: int) -> torch.Tensor:
    """Learned position table (offset 2) for ``max_positions`` tokens: exactly M + 2 rows.

    ``new[0:2] = old[0:2]`` and ``new[2 + i] = old[2 + i mod P]`` (P = old rows - 2): the
    reference's tiling (spec section 6 step 4), which also truncates when M < P.
    """
    P = table.size(0) - 2
    if P < 1:
        raise C.ConversionError(f"position table with {table.size(0)} rows has no positions")
    index = 2 + torch.arange(max_positions) % P
    return torch.cat([table[:2], table[index]], dim=0)


def order_positions(positions: torch.Tensor, stride: int, generator: torch.Generator) -> torch.Tensor:
    """512 position rows for the global tokens (spec section 6 step 3).

    P rows are brought to a multiple of 512 (cut, or completed with rows drawn from
    N(column mean, column std) with ``generator``), subsampled to 512 rows (every factor-th),
    then reordered so that global g gets subsampled row
    ``(g mod (512/m)) * m + g // (512/m)`` with ``m = stride / factor``.
    """
    n, d = positions.shape
    if n % MAX_GLOBAL_TOKENS != 0:
        if n > MAX_GLOBAL_TOKENS:
            positions = positions[: MAX_GLOBAL_TOKENS * (n // MAX_GLOBAL_TOKENS)]
        else:
            mean = positions.mean(dim=0, keepdim=True).expand(MAX_GLOBAL_TOKENS - n, -1)
            std = positions.std(dim=0, keepdim=True).expand(MAX_GLOBAL_TOKENS - n, -1)
            extra = torch.normal(mean, std, generator=generator)
            positions = torch.cat([positions, extra.to(positions.dtype)], dim=0)
        n = positions.size(0)
    factor = n // MAX_GLOBAL_TOKENS
    if stride % factor != 0 or MAX_GLOBAL_TOKENS % (stride // factor) != 0:
        raise C.ConversionError(
            f"--global-positional-stride {stride} must be a multiple of {factor} (positions/{MAX_GLOBAL_TOKENS}) "
            f"and stride/{factor} must divide {MAX_GLOBAL_TOKENS}"
        )
    positions = positions.reshape(-1, factor, d)[:, 0]  # (512, d): rows 0, factor, 2*factor...
    m = stride // factor
    return positions.reshape(-1, m, d).transpose(0, 1).reshape(-1, d)  # (512, d)


def init_global_embeddings(
    enc_positions: torch.Tensor, embed_tokens: torch.Tensor, bos_id: int, mask_id: int, stride: int, seed: int
) -> torch.Tensor:
    """The reference's global-token initialisation (spec section 6 step 3), [512, d]."""
    generator = torch.Generator().manual_seed(seed)
    ordered = order_positions(enc_positions[2:].float(), stride, generator)
    glob = ordered + embed_tokens[mask_id].float()
    glob[0] = ordered[0] + embed_tokens[bos_id].float()
    return glob.to(embed_tokens.dtype)


def hf_to_fairseq_state(hf: Dict[str, torch.Tensor], src: str) -> Dict[str, torch.Tensor]:
    """HF Bart(ForConditionalGeneration) names -> fairseq BART names (fairseq_notes 3.1-3.3)."""
    sd = {}
    for key, value in hf.items():
        sd[key[len("model.") :] if key.startswith("model.") else key] = value
    bias = sd.pop("final_logits_bias", None)
    if bias is not None and bool((bias != 0).any()):
        raise C.ConversionError(
            f"{src}: final_logits_bias is not zero (max |b| = {bias.abs().max():.3g}); fairseq "
            "BART has no output bias, so the converted model would differ"
        )
    candidates = [
        k
        for k in ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
        if k in sd
    ]
    if not candidates:
        raise C.ConversionError(f"{src}: no token embedding (model.shared.weight) in the weights")
    shared = sd[candidates[0]]
    for k in candidates:
        t = sd.pop(k)
        if t.shape != shared.shape or not torch.equal(t, shared):
            raise C.ConversionError(f"{src}: {k} differs from {candidates[0]}; only tied BART embeddings are supported")
    sd["encoder.embed_tokens.weight"] = shared
    sd["decoder.embed_tokens.weight"] = shared
    sd["decoder.output_projection.weight"] = shared
    sd["encoder.version"] = torch.tensor([3.0])
    sd["decoder.version"] = torch.tensor([3.0])
    return sd


def model_values(config: dict, src: str) -> dict:
    """fairseq hyper-parameters reproducing an HF BART config's shapes (and embedding scaling)."""
    for key in (
        "d_model",
        "encoder_layers",
        "decoder_layers",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
        "vocab_size",
    ):
        if key not in config:
            raise C.ConversionError(f"{src}/config.json: missing field {key!r}")
    if config.get("normalize_before") or config.get("add_final_layer_norm"):
        raise C.ConversionError(f"{src}/config.json: pre-LayerNorm (mBART-style) models are not BART")
    act = config.get("activation_function", "gelu")
    if act not in HF_ACTIVATIONS:
        raise C.ConversionError(f"{src}/config.json: activation_function {act!r} has no fairseq equivalent")
    for key, expected in (("pad_token_id", 1), ("bos_token_id", 0), ("eos_token_id", 2)):
        if config.get(key, expected) != expected:
            raise C.ConversionError(f"{src}/config.json: {key} = {config[key]}; fairseq dictionaries need {expected}")
    d = config["d_model"]
    return dict(
        encoder_embed_dim=d,
        decoder_embed_dim=d,
        encoder_layers=config["encoder_layers"],
        decoder_layers=config["decoder_layers"],
        encoder_attention_heads=config["encoder_attention_heads"],
        decoder_attention_heads=config["decoder_attention_heads"],
        encoder_ffn_embed_dim=config["encoder_ffn_dim"],
        decoder_ffn_embed_dim=config["decoder_ffn_dim"],
        activation_fn=HF_ACTIVATIONS[act],
        dropout=config.get("dropout", 0.1),
        attention_dropout=config.get("attention_dropout", 0.0),
        activation_dropout=config.get("activation_dropout", 0.0),
        no_scale_embedding=not config.get("scale_embedding", False),
    )


def _mask_id(src: str, vocab: Optional[dict], vocab_size: int) -> int:
    special = os.path.join(src, "special_tokens_map.json")
    token = "<mask>"
    if os.path.exists(special):
        entry = C.read_json(special, dict).get("mask_token")
        if isinstance(entry, dict):
            token = entry.get("content", token)
        elif isinstance(entry, str):
            token = entry
    if vocab is not None and token in vocab:
        return vocab[token]
    return vocab_size - 1


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


# ----------------------------------------------------------------------------- fairseq -> HF helpers
def hf_vocab(encoder: Dict[str, int], dictionary) -> Dict[str, int]:
    """GPT-2 BPE token -> HF id (= fairseq index of that GPT-2 id in dict.txt).

    Tokens whose GPT-2 id is not in the dictionary are ``<unk>`` in fairseq; they are left out, so
    HF's tokenizer gives ``<unk>`` for them too. fairseq's specials keep their own indices.
    """
    vocab = {tok: dictionary.indices[str(gid)] for tok, gid in encoder.items() if str(gid) in dictionary.indices}
    for sym in ("<s>", "<pad>", "</s>", "<unk>", "<mask>"):
        if sym in dictionary.indices:
            vocab[sym] = dictionary.index(sym)
    return vocab


def tokenizer_writer(checkpoint: C.Checkpoint, tokenizer_class: str, max_length: int) -> Callable[[str], None]:
    """What the HF folder gets of the model's tokenizer: GPT-2 BPE files, or the sentencepiece model."""
    encoder_json, merges = (checkpoint.find(name) for name in GPT2_FILES)
    spm_path = checkpoint.find(*SENTENCEPIECE_NAMES)
    d = checkpoint.dictionary
    if encoder_json and merges:
        with open(encoder_json, encoding="utf-8") as f:
            vocab = hf_vocab(json.load(f), d)
        specials = {
            "bos_token": "<s>",
            "cls_token": "<s>",
            "eos_token": "</s>",
            "mask_token": "<mask>",
            "pad_token": "<pad>",
            "sep_token": "</s>",
            "unk_token": "<unk>",
        }

        def write(folder):
            C.write_json(folder, "vocab.json", vocab)
            shutil.copyfile(merges, os.path.join(folder, "merges.txt"))  # has the "#version" header HF skips
            C.write_json(folder, "special_tokens_map.json", specials)
            C.write_json(
                folder,
                "tokenizer_config.json",
                dict(
                    specials,
                    add_prefix_space=False,
                    errors="replace",
                    trim_offsets=True,
                    model_max_length=max_length,
                    tokenizer_class=tokenizer_class,
                ),
            )

        return write
    if spm_path:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor()
        sp.Load(spm_path)
        same_ids = all(sp.id_to_piece(i) == d[i] for i in range(4, min(sp.get_piece_size(), len(d))))
        logger.warning(
            "%s: a sentencepiece vocabulary, which HF's BART tokenizer files (byte-level BPE) cannot "
            "represent; copied as %s%s",
            spm_path,
            SENTENCEPIECE_MODEL,
            ": its piece ids are the model's token ids (add <s>=0 and </s>=2 around sp.encode(text))"
            if same_ids
            else " with dict.txt: token id = line number + 4 in dict.txt, not the piece id",
        )

        def write(folder):
            shutil.copyfile(spm_path, os.path.join(folder, SENTENCEPIECE_MODEL))
            if not same_ids:
                d.save(os.path.join(folder, "dict.txt"))

        return write
    logger.warning(
        "%s: no tokenizer files (%s, or %s) beside the checkpoint or in its data folder; the HF folder has none",
        checkpoint.path,
        " + ".join(GPT2_FILES),
        SENTENCEPIECE_MODEL,
    )
    return lambda folder: None


def generation_config(config: dict) -> dict:
    out = {"_from_model_config": True}
    for key in ("bos_token_id", "decoder_start_token_id", "eos_token_id", "forced_eos_token_id", "pad_token_id"):
        if key in config:
            out[key] = config[key]
    return out


# ----------------------------------------------------------------------------- the BART family
@register_family
class BartFamily(Family):
    """fairseq ``bart`` (and ``bart_tiny``) <-> HF ``BartForConditionalGeneration``; the hooks a
    BART-shaped family overrides are marked "hook"."""

    name = "bart"
    models = BART_MODELS
    label = "BART"
    hf_architecture = "BartForConditionalGeneration"  # hook: config.json "architectures"
    hf_prefix = "model."  # hook: the HF model's attribute holding encoder and decoder
    tokenizer_class = "BartTokenizer"  # hook
    encoder_keys: Optional["re.Pattern"] = None  # hook: fairseq tensors of its encoder beyond BART's
    required_keys: Tuple[str, ...] = ()  # hook: of those, the ones a checkpoint must have

    def detect(self, source):
        return is_bart_source(source)

    def why_not(self, source):
        if source.hf_config is not None and source.model_type == "bart" and is_lsg_config(source.hf_config):
            return (
                f"{source.path} is an LSG-BART folder; --to {self.name} cannot keep its LSG settings and global "
                "tokens (use --to lsg_bart)"
            )
        return None

    def arch_for(self, config: dict) -> str:
        """The family's arch of an HF config's size (every shape is also passed explicitly)."""
        large = config.get("d_model") == 1024 and config.get("encoder_layers") == 12
        return self.arch("large" if large else "base")

    # ------------------------------------------------------------- HF (or fairseq) -> fairseq
    def convert(self, source, out, max_source_positions=None, max_target_positions=None, init=None, **options):
        """``options``: the model's flags; ``init``: how a new encoder's own weights start
        (:meth:`new_encoder`; LSG-BART's global tokens)."""
        read = self.from_checkpoint if source.checkpoint is not None else self.from_hf
        return read(source, out, max_source_positions, max_target_positions, options, init or {})

    def read_hf(self, source: SourceInfo) -> Tuple[dict, Dict[str, torch.Tensor], int]:
        """(model values, fairseq state, vocabulary size) of an HF BART-shaped folder."""
        config, src = source.hf_config, source.path
        values = model_values(config, src)
        V = config["vocab_size"]
        vocab = C.read_hf_vocab(src)
        if vocab is not None:
            C.check_bart_vocab(vocab, V, src)
        sd = self.state_from_hf(C.load_hf_state_dict(src), source)
        rows = sd["encoder.embed_tokens.weight"].size(0)
        if rows != V:
            raise C.ConversionError(f"{src}: embedding has {rows} rows, config vocab_size is {V}")
        if "encoder.embed_positions.weight" not in sd or "decoder.embed_positions.weight" not in sd:
            raise C.ConversionError(f"{src}: missing learned position tables (embed_positions.weight)")
        return values, sd, V

    def state_from_hf(self, hf: Dict[str, torch.Tensor], source: SourceInfo) -> Dict[str, torch.Tensor]:
        """Hook: HF weights -> fairseq names (BART's: tied embeddings, no output bias)."""
        return hf_to_fairseq_state(hf, source.path)

    def hf_values(self, config: dict) -> dict:
        """Hook: the model values of the family's own config fields (its encoder's settings)."""
        return {}

    def from_hf(self, source, out, max_source_positions, max_target_positions, options, init) -> str:
        """The source's lengths unless given (tables tiled or cut), its encoder settings unless given."""
        values, sd, V = self.read_hf(source)
        M = int(max_source_positions or sd["encoder.embed_positions.weight"].size(0) - 2)
        T = int(max_target_positions or sd["decoder.embed_positions.weight"].size(0) - 2)
        values.update(self.hf_values(source.hf_config), max_source_positions=M, max_target_positions=T, **options)
        sd["encoder.embed_positions.weight"] = extend_positions(sd["encoder.embed_positions.weight"], M)
        sd["decoder.embed_positions.weight"] = extend_positions(sd["decoder.embed_positions.weight"], T)
        return self.write_model(source, out, self.arch_for(source.hf_config), values, sd, V)

    def write_model(self, source, out, arch: str, values: dict, sd: Dict[str, torch.Tensor], V: int) -> str:
        """``dict.txt`` (fairseq index == HF id), the model built as fairseq-train would, its
        weights loaded strictly, the GPT-2 BPE files and ``model.pt``."""
        C.write_identity_dict(out, V)
        cfg, _, model = C.build_model(out, arch, values)
        C.load_strict(model, sd)
        C.write_gpt2_bpe_files(source.path, out)
        return C.save_checkpoint(cfg, model, os.path.join(out, "model.pt"))

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
            raise C.ConversionError(f"{src_dir}/dict.txt: missing (needed beside the checkpoint)")
        sd = dict(state["model"])
        model_args = cfg.model
        new_encoder = source.model not in self.models
        M = int(max_source_positions or model_args.max_source_positions)
        # a new encoder tiles the decoder table to M too, as the reference (and from_hf) does
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
        """Hook: turn a plain BART checkpoint's cfg and weights into this family's (in place)."""
        raise C.ConversionError(f"{src_dir}: a {model_args.arch} checkpoint does not convert to {self.name}")

    # ------------------------------------------------------------- fairseq -> HF
    def hf_limits(self, checkpoint: C.Checkpoint) -> List[str]:
        """Hook: model settings the HF classes cannot express, naming the flag."""
        g = checkpoint.get
        problems = []
        if g("encoder_normalize_before", False) or g("decoder_normalize_before", False):
            problems.append("pre-LayerNorm layers (--encoder/--decoder-normalize-before); HF BART is post-LN")
        if not g("layernorm_embedding", False):
            problems.append("no --layernorm-embedding; HF BART always normalises the embeddings")
        if not g("share_all_embeddings", False):
            problems.append("separate encoder/decoder embeddings (no --share-all-embeddings); HF ties them")
        if g("encoder_embed_dim") != g("decoder_embed_dim"):
            problems.append(
                f"--encoder-embed-dim {g('encoder_embed_dim')} != --decoder-embed-dim {g('decoder_embed_dim')}"
            )
        if g("activation_fn", "relu") not in FAIRSEQ_ACTIVATIONS:
            problems.append(f"--activation-fn {g('activation_fn')} (HF: {', '.join(sorted(FAIRSEQ_ACTIVATIONS))})")
        if g("no_token_positional_embeddings", False) or not (
            g("encoder_learned_pos", False) and g("decoder_learned_pos", False)
        ):
            problems.append("sinusoidal or no positions (HF BART/LED have learned positions)")
        if g("adaptive_softmax_cutoff", None):
            problems.append("--adaptive-softmax-cutoff")
        return problems

    def to_hf_layout(self, sd, enc_pos, dec_pos):
        """Hook: (state, encoder table, decoder table) with HF's names and tables; HF BART holds one
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

    def hf_state(self, checkpoint: C.Checkpoint) -> Dict[str, torch.Tensor]:
        """fairseq state -> the HF model's state (one ``shared.weight``, zero ``final_logits_bias``)."""
        sd = dict(checkpoint.state)
        extra = self.encoder_keys
        unknown = sorted(k for k in sd if not (_BART_KEY.fullmatch(k) or (extra is not None and extra.fullmatch(k))))
        if unknown:
            raise C.ExportError(
                f"{checkpoint.path}: weights HF's {self.hf_architecture} cannot hold: {', '.join(unknown[:10])}"
                + (" ..." if len(unknown) > 10 else "")
            )
        for key in ("encoder.version", "decoder.version"):
            sd.pop(key, None)
        required = (
            "encoder.embed_tokens.weight",
            "encoder.embed_positions.weight",
            "decoder.embed_positions.weight",
        ) + self.required_keys
        missing = [k for k in required if k not in sd]
        if missing:
            raise C.ExportError(f"{checkpoint.path}: missing {', '.join(missing)}")
        emb = sd.pop("encoder.embed_tokens.weight")
        for key in ("decoder.embed_tokens.weight", "decoder.output_projection.weight"):
            t = sd.pop(key, None)
            if t is not None and not torch.equal(t, emb):
                raise C.ExportError(
                    f"{checkpoint.path}: {key} differs from encoder.embed_tokens.weight; HF ties input and output "
                    "embeddings (one shared.weight), so it cannot hold separate ones"
                )
        sd, enc_pos, dec_pos = self.to_hf_layout(
            sd, sd.pop("encoder.embed_positions.weight"), sd.pop("decoder.embed_positions.weight")
        )
        hf = {f"{self.hf_prefix}{k}": v for k, v in sd.items()}
        hf[f"{self.hf_prefix}shared.weight"] = emb
        hf[f"{self.hf_prefix}encoder.embed_positions.weight"] = enc_pos
        hf[f"{self.hf_prefix}decoder.embed_positions.weight"] = dec_pos
        hf["final_logits_bias"] = emb.new_zeros(1, emb.size(0))
        # safetensors wants distinct, contiguous tensors (slices above share storage with the checkpoint)
        return {k: v.detach().clone().contiguous() for k, v in sorted(hf.items())}

    def hf_config(self, checkpoint: C.Checkpoint, hf: Dict[str, torch.Tensor]) -> dict:
        """config.json with the fields (and config class defaults) HF itself writes."""
        g, d = checkpoint.get, checkpoint.dictionary
        V, dim = hf[f"{self.hf_prefix}shared.weight"].shape
        if len(d) != V:
            raise C.ExportError(
                f"{checkpoint.path}: the dictionary has {len(d)} symbols but the embedding has {V} rows"
            )
        config = {
            "activation_dropout": float(g("activation_dropout", 0.0)),
            "activation_function": FAIRSEQ_ACTIVATIONS[g("activation_fn")],
            "architectures": [self.hf_architecture],
            "attention_dropout": float(g("attention_dropout", 0.0)),
            "bos_token_id": d.bos(),
            "classifier_dropout": 0.0,
            "d_model": int(dim),
            "decoder_attention_heads": int(g("decoder_attention_heads")),
            "decoder_ffn_dim": int(g("decoder_ffn_embed_dim")),
            "decoder_layerdrop": float(g("decoder_layerdrop", 0.0)),
            "decoder_layers": int(g("decoder_layers")),
            "decoder_start_token_id": d.eos(),  # fairseq BART decoders start from </s>
            "dropout": float(g("dropout", 0.1)),
            "encoder_attention_heads": int(g("encoder_attention_heads")),
            "encoder_ffn_dim": int(g("encoder_ffn_embed_dim")),
            "encoder_layerdrop": float(g("encoder_layerdrop", 0.0)),
            "encoder_layers": int(g("encoder_layers")),
            "eos_token_id": d.eos(),
            "init_std": 0.02,
            "is_encoder_decoder": True,
            "pad_token_id": d.pad(),
            "torch_dtype": C.dtype_name(hf),
            "use_cache": True,
            "vocab_size": int(V),
        }
        config.update(self.hf_config_fields(checkpoint, config, hf))
        return config

    def hf_config_fields(self, checkpoint: C.Checkpoint, config: dict, hf: Dict[str, torch.Tensor]) -> dict:
        """Hook: the config fields of this family's HF config class (BartConfig's here)."""
        return dict(
            model_type="bart",
            forced_eos_token_id=checkpoint.dictionary.eos(),
            num_hidden_layers=config["encoder_layers"],
            id2label={"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"},
            label2id={"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
            max_position_embeddings=int(hf["model.encoder.embed_positions.weight"].size(0)) - 2,
            scale_embedding=not checkpoint.get("no_scale_embedding", True),
        )

    def max_length(self, config: dict) -> int:
        """Hook: the tokenizer's ``model_max_length``: the encoder's positions."""
        return config["max_position_embeddings"]

    def export(self, checkpoint):
        from safetensors.torch import save_file

        problems = self.hf_limits(checkpoint)
        if problems:
            raise C.ExportError(
                f"{checkpoint.path} (arch {checkpoint.arch}): HF's format cannot hold " + "; ".join(problems)
            )
        hf = self.hf_state(checkpoint)
        config = self.hf_config(checkpoint, hf)
        write_tokenizer = tokenizer_writer(checkpoint, self.tokenizer_class, self.max_length(config))

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


# ----------------------------------------------------------------------------- the LSG-BART family
@register_family
class LSGBartFamily(BartFamily):
    """fairseq ``lsg_bart`` <-> the LSG-BART folder the LSG authors publish (spec/lsg.md sections 1
    and 6); also BART (HF or fairseq) -> ``lsg_bart``, initialised as the reference converts."""

    name = "lsg_bart"
    models = ("lsg_bart",)
    label = "LSG-BART"
    option_label = "LSG"
    hf_architecture = "LSGBartForConditionalGeneration"
    encoder_keys = re.compile(r"encoder\.global_embeddings\.weight")
    required_keys = ("encoder.global_embeddings.weight",)

    def detect(self, source):
        if source.hf_config is not None:
            return source.model_type == "bart" and is_lsg_config(source.hf_config)
        return source.model in self.models

    def can_convert(self, source):
        return self.detect(source) or is_bart_source(source)

    def claims(self, source, options):
        """LSG options or a new ``--max-source-positions`` on a BART source: the reference's conversion."""
        return is_bart_source(source) and bool(set(options) & (set(LSG_OPTION_NAMES) | {"max_source_positions"}))

    def add_args(self, parser):
        LSGBARTModel.add_lsg_args(
            parser.add_argument_group(
                f"{self.option_label} options (default: the source's settings, else the reference's)"
            )
        )
        init = parser.add_argument_group("BART -> LSG initialisation (spec lsg.md section 6)")
        init.add_argument(
            "--global-positional-stride",
            type=POSITIVE_INT,
            metavar="N",
            help=f"position stride of the global-token init (default {GLOBAL_POSITIONAL_STRIDE})",
        )
        init.add_argument(
            "--seed", type=NON_NEGATIVE_INT, help=f"seed of the random parts of the init (default {INIT_SEED})"
        )

    def convert(
        self,
        source,
        out,
        max_source_positions=None,
        max_target_positions=None,
        global_positional_stride=GLOBAL_POSITIONAL_STRIDE,
        seed=INIT_SEED,
        **options,
    ):
        init = dict(stride=global_positional_stride, seed=seed)
        return super().convert(source, out, max_source_positions, max_target_positions, init, **options)

    def from_hf(self, source, out, max_source_positions, max_target_positions, options, init) -> str:
        config, src = source.hf_config, source.path
        source_is_lsg = self.detect(source)
        values, sd, V = self.read_hf(source)
        arch = self.arch_for(config)
        enc_pos, dec_pos = sd["encoder.embed_positions.weight"], sd["decoder.embed_positions.weight"]
        P = enc_pos.size(0) - 2
        if source_is_lsg and config.get("max_position_embeddings", P) != P:
            raise C.ConversionError(
                f"{src}: encoder position table has {enc_pos.size(0)} rows but max_position_embeddings "
                f"is {config.get('max_position_embeddings')} (expected rows = max + 2)"
            )
        # default length: the source's own, or the architecture's for a new LSG conversion
        M = int(max_source_positions or (P if source_is_lsg else C.arch_defaults(arch).max_source_positions))
        # decoder length: the reference tiles the decoder table to M too (BART -> LSG), so an HF
        # LSG source carries M + 2 rows; keep that unless --max-target-positions slices it
        # (fairseq_notes 3.6).
        T = int(max_target_positions or (dec_pos.size(0) - 2 if source_is_lsg else M))
        values.update(self.hf_values(config) if source_is_lsg else {}, max_source_positions=M, max_target_positions=T)
        values.update(options)
        if source_is_lsg:
            if "encoder.global_embeddings.weight" not in sd:
                raise C.ConversionError(f"{src}: LSG config but no model.encoder.global_embeddings.weight")
        else:
            sd["encoder.global_embeddings.weight"] = init_global_embeddings(
                enc_pos,
                sd["encoder.embed_tokens.weight"],
                config.get("bos_token_id", 0),
                _mask_id(src, C.read_hf_vocab(src), V),
                **init,
            )
        glob = sd["encoder.global_embeddings.weight"]
        if glob.shape != (MAX_GLOBAL_TOKENS, config["d_model"]):
            raise C.ConversionError(
                f"{src}: global_embeddings has shape {tuple(glob.shape)}, expected "
                f"({MAX_GLOBAL_TOKENS}, {config['d_model']})"
            )
        sd["encoder.embed_positions.weight"] = extend_positions(enc_pos, M)
        sd["decoder.embed_positions.weight"] = extend_positions(dec_pos, T)
        return self.write_model(source, out, arch, values, sd, V)

    def hf_values(self, config):
        """The LSG settings of an HF LSG-BART config; the reference's ``None`` (or ``"None"``) sparsity
        type, no sparse keys, becomes ``"none"`` here, the one place it is translated."""
        if config.get("adaptive") is False:
            logger.warning("adaptive=False in the HF config; lsg-fairseq always pads adaptively")
        values = {k: config.get(k) for k in LSG_OPTION_NAMES}
        if "sparsity_type" in config and str(config["sparsity_type"]).lower() == "none":
            values["sparsity_type"] = "none"
        return values

    def new_encoder(self, model_args, sd, src_dir, **init):
        """A fairseq BART checkpoint -> lsg_bart: same sizes (bart_large -> lsg_bart_large), every LSG
        option not given the architecture's, global tokens initialised exactly as from an HF folder."""
        from fairseq.models import ARCH_MODEL_NAME_REGISTRY

        arch = "lsg_" + model_args.arch
        model_args.arch = arch if ARCH_MODEL_NAME_REGISTRY.get(arch) == self.name else self.arch("large")
        model_args._name = model_args.arch  # fairseq builds legacy models by `_name`
        lsg_architecture_defaults(model_args)
        # the dictionary as the task builds it: <mask> appended, as on every model row count
        d = LongDocumentSummarizationTask.load_dictionary(os.path.join(src_dir, "dict.txt"))
        sd["encoder.global_embeddings.weight"] = init_global_embeddings(
            sd["encoder.embed_positions.weight"], sd["encoder.embed_tokens.weight"], d.bos(), d.index("<mask>"), **init
        )

    def hf_config_fields(self, checkpoint, config, hf):
        fields = super().hf_config_fields(checkpoint, config, hf)
        lsg = {name: checkpoint.get(name) for name in LSG_OPTION_NAMES}
        for name in ("mask_first_token", "pass_global_tokens_to_decoder", "pool_with_global"):
            lsg[name] = bool(lsg[name])
        fields.update(lsg, adaptive=True, auto_map=dict(LSG_AUTO_MAP), base_model_prefix="lsg")
        return fields

    # Plot colours of the sparsity types: norm (run.py's --main-lsg) distinct, the others muted.
    BENCH_COLORS = {
        "norm": "tab:blue",
        "pooling": "tab:cyan",
        "stride": "tab:olive",
        "block_stride": "tab:pink",
        "lsh": "tab:brown",
        "bos_pooling": "steelblue",
        "none": "lightskyblue",
    }
    SMOKE_TYPES = ("norm", "pooling")  # the types run.py --smoke runs by default

    def benchmarks(self):
        """``lsg_<type>``: one row per sparsity type (the settings' block sizes, factor and global
        tokens), each a variant: run.py's --main-lsg runs every mode, the others fewer."""

        def row(sparsity_type):
            def argv(length, settings):
                return [
                    self.arch("tiny" if settings.smoke else "base"),
                    "--max-source-positions",
                    str(max(length, 1024)),
                    "--block-size",
                    str(settings.block_size),
                    "--sparse-block-size",
                    str(settings.sparse_block_size),
                    "--sparsity-factor",
                    str(settings.sparsity_factor),
                    "--sparsity-type",
                    sparsity_type,
                    "--num-global-tokens",
                    str(settings.num_global_tokens),
                ]

            return BenchRow(
                argv, variant=True, smoke=sparsity_type in self.SMOKE_TYPES, color=self.BENCH_COLORS.get(sparsity_type)
            )

        return {f"lsg_{t}": row(t) for t in SPARSITY_TYPES}
