"""Export family ``bart`` / ``lsg_bart`` / ``led``: fairseq BART-shaped models -> HF folders.

The inverse of ``convert.bart`` and ``convert.led``, built on their tables (``HF_ACTIVATIONS``,
``HF_ATTENTION_NAMES``, ``LSG_OPTION_NAMES``, ``extend_positions``):

- weights: fairseq names get the ``model.`` (``led.``) prefix back; the tied
  ``encoder/decoder.embed_tokens`` + ``decoder.output_projection`` become ``shared.weight``
  (stored once, as HF's safetensors files do); ``final_logits_bias`` is zeros (fairseq has no
  output bias); LED attention names map back to ``longformer_self_attn.*`` and its position tables
  lose fairseq's two unused leading rows (HF LED row t = position t).
- positions: HF BART and LSG-BART hold one ``max_position_embeddings`` for both sides; when the
  fairseq encoder and decoder lengths differ, the shorter table is tiled to the longer with the
  converter's ``extend_positions`` (the rows of every position it held are unchanged), as the
  LSG reference's own conversion does for the decoder (spec/lsg.md section 6 step 4).
- ids: HF id == fairseq dictionary index. ``vocab.json`` maps each GPT-2 BPE token to the index of
  its id in ``dict.txt`` (identity for converted models); a sentencepiece model is copied as
  ``spm.model`` because HF's BART tokenizer files (byte-level BPE) cannot represent it.
"""
import json
import logging
import os
import re
import shutil
from typing import Callable, Dict

import torch

from lsg_fairseq.convert.bart import HF_ACTIVATIONS, LSG_OPTION_NAMES, extend_positions
from lsg_fairseq.convert.hf_export import SPM_NAMES, ExportError, Source, dtype_name, write_json
from lsg_fairseq.convert.led import HF_ATTENTION_NAMES

logger = logging.getLogger(__name__)

# fairseq activation_fn -> HF activation_function (gelu_accurate -> gelu_new, the first HF name)
FAIRSEQ_ACTIVATIONS: Dict[str, str] = {}
for _hf, _fs in HF_ACTIVATIONS.items():
    FAIRSEQ_ACTIVATIONS.setdefault(_fs, _hf)
LED_ATTENTION_NAMES = {fs: hf for hf, fs in HF_ATTENTION_NAMES.items()}

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
ARCHITECTURES = {"bart": "BartForConditionalGeneration", "lsg_bart": "LSGBartForConditionalGeneration",
                 "led": "LEDForConditionalGeneration"}

# every fairseq tensor the HF classes have a place for; anything else is refused by name
_BART_KEY = re.compile(
    r"(encoder|decoder)\.(version|embed_tokens\.weight|embed_positions\.weight|layernorm_embedding\.(weight|bias)"
    r"|layers\.\d+\.((self_attn|encoder_attn)\.(q|k|v|out)_proj|self_attn_layer_norm|encoder_attn_layer_norm"
    r"|final_layer_norm|fc1|fc2)\.(weight|bias))|decoder\.output_projection\.weight"
)
_FAMILY_KEY = {
    "bart": None,
    "lsg_bart": re.compile(r"encoder\.global_embeddings\.weight"),
    "led": re.compile(r"encoder\.layers\.\d+\.self_attn\.(q|k|v)_proj_global\.(weight|bias)"),
}


def check_model_cfg(source: Source, family: str) -> None:
    """Refuse model settings the HF classes cannot express, naming the flag."""
    g = source.get
    problems = []
    if g("encoder_normalize_before", False) or g("decoder_normalize_before", False):
        problems.append("pre-LayerNorm layers (--encoder/--decoder-normalize-before); HF BART is post-LN")
    if not g("layernorm_embedding", False):
        problems.append("no --layernorm-embedding; HF BART always normalises the embeddings")
    if not g("share_all_embeddings", False):
        problems.append("separate encoder/decoder embeddings (no --share-all-embeddings); HF ties them")
    if g("encoder_embed_dim") != g("decoder_embed_dim"):
        problems.append(f"--encoder-embed-dim {g('encoder_embed_dim')} != --decoder-embed-dim {g('decoder_embed_dim')}")
    if g("activation_fn", "relu") not in FAIRSEQ_ACTIVATIONS:
        problems.append(f"--activation-fn {g('activation_fn')} (HF: {', '.join(sorted(FAIRSEQ_ACTIVATIONS))})")
    if g("no_token_positional_embeddings", False) or not (g("encoder_learned_pos", False) and g("decoder_learned_pos", False)):
        problems.append("sinusoidal or no positions (HF BART/LED have learned positions)")
    if g("adaptive_softmax_cutoff", None):
        problems.append("--adaptive-softmax-cutoff")
    if family == "led" and not g("no_scale_embedding", True):
        problems.append("embedding scaling (HF LED has no scale_embedding)")
    if problems:
        raise ExportError(f"{source.path} (arch {source.arch}): HF's format cannot hold " + "; ".join(problems))


def hf_state(source: Source, family: str) -> Dict[str, torch.Tensor]:
    """fairseq state -> HF ``BartForConditionalGeneration`` / LSG / ``LEDForConditionalGeneration`` state."""
    sd = dict(source.state)
    extra = _FAMILY_KEY[family]
    unknown = sorted(k for k in sd if not (_BART_KEY.fullmatch(k) or (extra is not None and extra.fullmatch(k))))
    if unknown:
        raise ExportError(
            f"{source.path}: weights HF's {ARCHITECTURES[family]} cannot hold: {', '.join(unknown[:10])}"
            + (" ..." if len(unknown) > 10 else "")
        )
    for key in ("encoder.version", "decoder.version"):
        sd.pop(key, None)
    required = ("encoder.embed_tokens.weight", "encoder.embed_positions.weight", "decoder.embed_positions.weight")
    missing = [k for k in required if k not in sd]
    if family == "lsg_bart" and "encoder.global_embeddings.weight" not in sd:
        missing.append("encoder.global_embeddings.weight")
    if missing:
        raise ExportError(f"{source.path}: missing {', '.join(missing)}")
    emb = sd.pop("encoder.embed_tokens.weight")
    for key in ("decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        t = sd.pop(key, None)
        if t is not None and not torch.equal(t, emb):
            raise ExportError(
                f"{source.path}: {key} differs from encoder.embed_tokens.weight; HF ties input and output "
                "embeddings (one shared.weight), so it cannot hold separate ones"
            )
    enc_pos, dec_pos = sd.pop("encoder.embed_positions.weight"), sd.pop("decoder.embed_positions.weight")
    if family == "led":
        prefix = "led."
        # fairseq numbers real tokens from row 2 (rows 0-1 are never read); HF LED row t = position t
        enc_pos, dec_pos = enc_pos[2:], dec_pos[2:]
        renamed = {}
        for key, value in sd.items():
            if key.startswith("encoder.layers.") and ".self_attn." in key:
                head, tail = key.split(".self_attn.", 1)
                name, _, param = tail.rpartition(".")
                key = f"{head}.self_attn.{LED_ATTENTION_NAMES[name]}.{param}"
            renamed[key] = value
        sd = renamed
    else:
        prefix = "model."
        P = max(enc_pos.size(0), dec_pos.size(0)) - 2  # one HF table size for both sides
        if enc_pos.size(0) - 2 != P or dec_pos.size(0) - 2 != P:
            logger.warning(
                "encoder/decoder positions %d/%d: HF holds one max_position_embeddings, so the shorter table is "
                "tiled to %d (positions it held are unchanged)", enc_pos.size(0) - 2, dec_pos.size(0) - 2, P)
            enc_pos, dec_pos = extend_positions(enc_pos, P), extend_positions(dec_pos, P)
    hf = {f"{prefix}{k}": v for k, v in sd.items()}
    hf[f"{prefix}shared.weight"] = emb
    hf[f"{prefix}encoder.embed_positions.weight"] = enc_pos
    hf[f"{prefix}decoder.embed_positions.weight"] = dec_pos
    hf["final_logits_bias"] = emb.new_zeros(1, emb.size(0))
    # safetensors wants distinct, contiguous tensors (slices above share storage with the checkpoint)
    return {k: v.detach().clone().contiguous() for k, v in sorted(hf.items())}


def hf_config(source: Source, family: str, hf: Dict[str, torch.Tensor]) -> dict:
    """config.json with the fields (and BartConfig/LEDConfig defaults) HF itself writes."""
    g, d = source.get, source.dictionary
    prefix = "led." if family == "led" else "model."
    V, dim = hf[f"{prefix}shared.weight"].shape
    if len(d) != V:
        raise ExportError(f"{source.path}: the dictionary has {len(d)} symbols but the embedding has {V} rows")
    config = {
        "activation_dropout": float(g("activation_dropout", 0.0)),
        "activation_function": FAIRSEQ_ACTIVATIONS[g("activation_fn")],
        "architectures": [ARCHITECTURES[family]],
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
        "torch_dtype": dtype_name(hf),
        "use_cache": True,
        "vocab_size": int(V),
    }
    if family == "led":
        from lsg_fairseq.modules.longformer_attention import parse_attention_windows

        config.update(
            model_type="led", tie_word_embeddings=True,
            attention_window=parse_attention_windows(g("attention_window"), config["encoder_layers"]),
            max_encoder_position_embeddings=int(hf["led.encoder.embed_positions.weight"].size(0)),
            max_decoder_position_embeddings=int(hf["led.decoder.embed_positions.weight"].size(0)),
        )
        return config
    config.update(
        model_type="bart", forced_eos_token_id=d.eos(), num_hidden_layers=config["encoder_layers"],
        id2label={"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"},
        label2id={"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
        max_position_embeddings=int(hf["model.encoder.embed_positions.weight"].size(0)) - 2,
        scale_embedding=not g("no_scale_embedding", True),
    )
    if family == "lsg_bart":
        lsg = {name: g(name) for name in LSG_OPTION_NAMES}
        for name in ("mask_first_token", "pass_global_tokens_to_decoder", "pool_with_global"):
            lsg[name] = bool(lsg[name])
        config.update(lsg, adaptive=True, auto_map=dict(LSG_AUTO_MAP), base_model_prefix="lsg")
    return config


def generation_config(config: dict) -> dict:
    out = {"_from_model_config": True}
    for key in ("bos_token_id", "decoder_start_token_id", "eos_token_id", "forced_eos_token_id", "pad_token_id"):
        if key in config:
            out[key] = config[key]
    return out


# ----------------------------------------------------------------------------- tokenizer files
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


def tokenizer_writer(source: Source, family: str, max_length: int) -> Callable[[str], None]:
    encoder_json, merges = source.find("encoder.json"), source.find("vocab.bpe")
    spm_path = source.find(*SPM_NAMES)
    d = source.dictionary
    if encoder_json and merges:
        with open(encoder_json, encoding="utf-8") as f:
            vocab = hf_vocab(json.load(f), d)
        tokenizer_class = "LEDTokenizer" if family == "led" else "BartTokenizer"
        specials = {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "mask_token": "<mask>",
                    "pad_token": "<pad>", "sep_token": "</s>", "unk_token": "<unk>"}

        def write(folder):
            write_json(folder, "vocab.json", vocab)
            shutil.copyfile(merges, os.path.join(folder, "merges.txt"))  # has the "#version" header HF skips
            write_json(folder, "special_tokens_map.json", specials)
            write_json(folder, "tokenizer_config.json", dict(
                specials, add_prefix_space=False, errors="replace", trim_offsets=True,
                model_max_length=max_length, tokenizer_class=tokenizer_class))
        return write
    if spm_path:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor()
        sp.Load(spm_path)
        same_ids = all(sp.id_to_piece(i) == d[i] for i in range(4, min(sp.get_piece_size(), len(d))))
        logger.warning(
            "%s: a sentencepiece vocabulary, which HF's BART tokenizer files (byte-level BPE) cannot "
            "represent; copied as spm.model%s", spm_path,
            ": its piece ids are the model's token ids (add <s>=0 and </s>=2 around sp.encode(text))"
            if same_ids else " with dict.txt: token id = line number + 4 in dict.txt, not the piece id")

        def write(folder):
            shutil.copyfile(spm_path, os.path.join(folder, "spm.model"))
            if not same_ids:
                d.save(os.path.join(folder, "dict.txt"))
        return write
    logger.warning("%s: no tokenizer files (encoder.json + vocab.bpe, or spm.model) beside the checkpoint "
                   "or in its data folder; the HF folder has none", source.path)
    return lambda folder: None


# ----------------------------------------------------------------------------- the family
def export_bart_family(source: Source, family: str) -> Callable[[str], None]:
    """Check and map everything now; the returned function writes the files into a folder."""
    from safetensors.torch import save_file

    check_model_cfg(source, family)
    hf = hf_state(source, family)
    config = hf_config(source, family, hf)
    if family == "led":
        if source.get("global_attention") == "first":
            logger.info("HF LED takes global attention per call: pass global_attention_mask with 1 on the first "
                        "token (this model was used with --global-attention first)")
        if source.get("global_token_ids"):
            logger.warning("--global-token-ids %s: HF LED's config cannot hold it; mark those tokens in "
                           "global_attention_mask yourself", source.get("global_token_ids"))
        max_length = config["max_encoder_position_embeddings"]
    else:
        max_length = config["max_position_embeddings"]
    write_tokenizer = tokenizer_writer(source, family, max_length)

    def write(folder):
        save_file(hf, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        write_json(folder, "config.json", config)
        write_json(folder, "generation_config.json", generation_config(config))
        write_tokenizer(folder)
    return write
