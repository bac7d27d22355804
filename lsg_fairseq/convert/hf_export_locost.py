"""Export family ``locost``: fairseq ``locost_*`` -> the reference LOCOST folder.

The inverse of ``convert.locost``: what the reference's ``save_pretrained`` writes and the
converter reads (spec/locost.md section 5): ``config.json`` (``LOCOSTForConditionalGeneration``,
no ``model_type``), ``generation_config.json``, ``pytorch_model.bin`` with every key including the
tied copies of ``shared.weight``, and ``spiece.model`` (+ ``added_tokens.json``) when the model
has a sentencepiece model.

Ids. A converted model carries ``token_map.json`` (fairseq index -> HF id); the embedding rows go
back to HF order through it. Some HF ids have two fairseq rows (spec section 8): HF 0 is both the
decoder start (fairseq ``<s>``) and the pad, and the task's ``<mask>`` reuses an existing id. HF
keeps one row per id: the first fairseq index in dictionary order (the start row for HF 0). A
differing fairseq ``<pad>`` row is dropped (fairseq never emits or attends to ``<pad>``); any other
differing duplicate is refused, since the HF file cannot hold it. A model trained here from
scratch (no ``token_map.json``) keeps HF id == fairseq index, with its own pad/eos/start ids.
"""
import json
import logging
import os
import re
import shutil
from typing import Callable, Dict, List

import torch

from lsg_fairseq.convert.hf_export import SPM_NAMES, ExportError, Source, dtype_name, write_json
from lsg_fairseq.convert.locost import TIED_COPIES

logger = logging.getLogger(__name__)

EMBEDDINGS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight")
# every fairseq tensor of the reference layout (the converter keeps HF names for everything but
# the embeddings); anything else is refused by name
_LOCOST_KEY = re.compile(
    r"encoder\.block\.\d+\.layer\.0\.(layer_prenorm\.weight|ssm_layer\.((q_proj|k_proj|output_linear)\.(weight|bias)"
    r"|D|kernel\.(C|B|log_dt|inv_A_real|A_imag)))"
    r"|encoder\.block\.\d+\.layer\.1\.(DenseReluDense\.(wi_0|wi_1|wo)\.weight|layer_norm\.weight)"
    r"|(encoder|decoder)\.final_layer_norm\.weight"
    r"|decoder\.block\.\d+\.layer\.0\.(SelfAttention\.(q|k|v|o|relative_attention_bias)\.weight|layer_norm\.weight)"
    r"|decoder\.block\.\d+\.layer\.1\.(EncDecAttention\.(q|k|v|o)\.weight|layer_norm\.weight)"
    r"|decoder\.block\.\d+\.layer\.2\.(DenseReluDense\.(wi_0|wi_1|wo)\.weight|layer_norm\.weight)"
)


def read_token_map(source: Source) -> List[int]:
    """fairseq index -> HF id (``token_map.json`` beside the checkpoint, else the identity)."""
    n = len(source.dictionary)
    path = source.find("token_map.json")
    if path is None:
        return list(range(n))
    try:
        with open(path, encoding="utf-8") as f:
            token_map = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ExportError(f"{path}: not readable JSON ({e})") from e
    if not (isinstance(token_map, list) and all(isinstance(i, int) and i >= 0 for i in token_map)):
        raise ExportError(f"{path}: expected a list of non-negative ints (fairseq index -> HF id)")
    if len(token_map) != n:
        raise ExportError(f"{path}: {len(token_map)} entries but the dictionary has {n} symbols")
    missing = sorted(set(range(max(token_map) + 1)) - set(token_map))
    if missing:
        raise ExportError(f"{path}: HF ids {missing[:10]} have no fairseq row; the HF embedding would have holes")
    return token_map


def unpermute(emb: torch.Tensor, token_map: List[int], source: Source) -> torch.Tensor:
    """(V_fairseq, d) rows -> (V_hf, d) in HF id order; see the module docstring for duplicates."""
    d = source.dictionary
    shared = emb.new_empty(max(token_map) + 1, emb.size(1))
    first: Dict[int, int] = {}
    dropped = []
    for idx, hf_id in enumerate(token_map):
        if hf_id not in first:
            first[hf_id] = idx
            shared[hf_id] = emb[idx]
        elif not torch.equal(emb[idx], emb[first[hf_id]]):
            if idx == d.pad():
                dropped.append(idx)
                continue
            raise ExportError(
                f"{source.path}: fairseq tokens {first[hf_id]} ({d[first[hf_id]]!r}) and {idx} ({d[idx]!r}) share "
                f"HF id {hf_id} (token_map.json) but their embedding rows differ; the HF file holds one row per id"
            )
    if dropped:
        logger.warning("fairseq <pad> row (index %d) differs from HF id %d's row (the decoder start); HF keeps one "
                       "row per id, the start row (fairseq never emits or attends to <pad>)", d.pad(), token_map[d.pad()])
    return shared


def hf_state(source: Source, token_map: List[int]) -> Dict[str, torch.Tensor]:
    sd = dict(source.state)
    unknown = sorted(k for k in sd if k not in EMBEDDINGS and not _LOCOST_KEY.fullmatch(k))
    if unknown:
        raise ExportError(f"{source.path}: weights the LOCOST format cannot hold: {', '.join(unknown[:10])}")
    missing = [k for k in EMBEDDINGS if k not in sd]
    if missing:
        raise ExportError(f"{source.path}: missing {', '.join(missing)}")
    emb = sd.pop(EMBEDDINGS[0])
    for key in EMBEDDINGS[1:]:
        if not torch.equal(sd.pop(key), emb):
            raise ExportError(f"{source.path}: {key} differs from {EMBEDDINGS[0]}; the LOCOST format ties them "
                              "(one shared.weight)")
    shared = unpermute(emb, token_map, source)
    hf = {"shared.weight": shared}
    hf.update({k: v.detach().clone() for k, v in sd.items()})
    for key in TIED_COPIES:  # save_pretrained (transformers 4.27) writes the tied copies too
        hf[key] = shared
    return hf


def hf_config(source: Source, token_map: List[int], hf: Dict[str, torch.Tensor]) -> dict:
    g, d = source.get, source.dictionary
    return {
        "architectures": ["LOCOSTForConditionalGeneration"],
        "bidirectional": True,
        "d_ff": int(g("d_ff")),
        "d_kv": int(g("d_kv")),
        "d_model": int(g("d_model")),
        "d_state": int(g("d_state")),
        "decoder_start_token_id": token_map[d.bos()],  # fairseq's decoder starts from the <s> row
        "dense_act_fn": "gelu_new",
        "dropout_rate": float(g("dropout", 0.1)),
        "eos_token_id": token_map[d.eos()],
        "feed_forward_proj": "gated-gelu",
        "gating": True,
        "initializer_factor": 1.0,
        "is_encoder_decoder": True,
        "is_gated_act": True,
        "layer_norm_epsilon": float(g("layer_norm_eps", 1e-6)),
        "num_decoder_layers": int(g("decoder_layers")),
        "num_heads": int(g("decoder_attention_heads")),
        "num_layers": int(g("encoder_layers")),
        "num_ssm_heads": 1,
        "pad_token_id": token_map[d.pad()],
        "relative_attention_max_distance": int(g("relative_attention_max_distance", 128)),
        "relative_attention_num_buckets": int(g("relative_attention_num_buckets", 32)),
        "torch_dtype": dtype_name(hf),
        # the fairseq model computes the exact convolution (the reference's ref path); the fast
        # CUDA path differs for lengths that are not powers of two (spec section 1)
        "use_fast_fft_conv": False,
        "use_cache": True,
        "vocab_size": int(hf["shared.weight"].size(0)),
        # read by nothing (spec section 4), kept so the folder matches the reference's
        "encoder_attention_type": "local",
        "global_block_size": 16,
        "local_radius": 127,
    }


def tokenizer_writer(source: Source, token_map: List[int]) -> Callable[[str], None]:
    spm_path = source.find(*SPM_NAMES)
    if spm_path is None:
        logger.warning("%s: no sentencepiece model beside the checkpoint; the folder has no tokenizer (ids are "
                       "used as they are)", source.path)
        return lambda folder: None
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    sp.Load(spm_path)
    d = source.dictionary
    added, seen = {}, set()
    for idx, hf_id in enumerate(token_map):  # ids past the pieces (T5's <extra_id_*>, the task's <mask>)
        if hf_id >= sp.get_piece_size() and hf_id not in seen:  # one symbol per id: the row HF keeps
            added[d[idx]] = hf_id
        seen.add(hf_id)

    def write(folder):
        shutil.copyfile(spm_path, os.path.join(folder, "spiece.model"))
        if added:
            write_json(folder, "added_tokens.json", added)
    return write


def export_locost(source: Source, family: str) -> Callable[[str], None]:
    """Check and map everything now; the returned function writes the files into a folder."""
    token_map = read_token_map(source)
    hf = hf_state(source, token_map)
    config = hf_config(source, token_map, hf)
    gen = {"_from_model_config": True, "decoder_start_token_id": config["decoder_start_token_id"],
           "eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"]}
    write_tokenizer = tokenizer_writer(source, token_map)

    def write(folder):
        torch.save(hf, os.path.join(folder, "pytorch_model.bin"))
        write_json(folder, "config.json", config)
        write_json(folder, "generation_config.json", gen)
        write_tokenizer(folder)
    return write
