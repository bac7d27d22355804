"""Converter family ``locost``: HF-format LOCOST folder -> fairseq ``locost`` checkpoint.

Source: what the reference's ``save_pretrained`` writes (spec ``shared/spec/locost.md`` section 5):
``config.json`` (no ``model_type``; ``architectures: ["LOCOSTForConditionalGeneration"]`` and/or the
LOCOST fields ``d_state``, ``num_ssm_heads``), ``pytorch_model.bin`` or safetensors, and, when
present, the T5 sentencepiece model (``spiece.model``) plus ``added_tokens.json``.

Output (``OUT_DIR``): ``model.pt``, ``dict.txt``, ``token_map.json`` (fairseq index -> HF id) and
``spm.model`` when the source has a sentencepiece model.

Ids. T5 uses pad 0 / eos 1 / unk 2 (no bos) and starts decoding from ``decoder_start_token_id``
(0, the pad row). fairseq's Dictionary fixes ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3. The
fairseq dictionary is therefore a permutation of the HF vocabulary, and the embedding rows are
permuted with it:

    fairseq  0 <s>    <- HF decoder_start_token_id (the decoder's start embedding, see
                         lsg_fairseq/models/locost.py: fairseq's leading </s> is embedded with <s>)
             1 <pad>  <- HF pad_token_id
             2 </s>   <- HF eos_token_id
             3 <unk>  <- HF unk id (sentencepiece's, else 2)
             4 ...    <- every other HF id, in increasing order
             last     <mask> (added by the task) <- HF ``<extra_id_0>`` if the vocabulary has it, else unk

so ``token_map.json`` lists HF 0 twice (start and pad), which is expected (spec section 8). Logits
of fairseq indices that share an HF row are equal; fairseq never emits ``<pad>``.
"""
import json
import logging
import os
import shutil
from typing import Dict, List, Optional, Tuple

import torch

from lsg_fairseq.convert import ConversionError, register_family
from lsg_fairseq.convert import common as C

logger = logging.getLogger(__name__)

SPM_NAMES = ("spiece.model", "spm.model", "sentencepiece.model")
TIED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")


# ----------------------------------------------------------------------------- detection
def is_locost_config(config: dict) -> bool:
    archs = config.get("architectures") or []
    if any(str(a).upper().startswith("LOCOST") for a in archs):
        return True
    return "d_state" in config and "num_ssm_heads" in config and "d_model" in config


def detect(src: str) -> bool:
    if not (os.path.isdir(src) and os.path.exists(os.path.join(src, "config.json"))):
        return False
    try:
        return is_locost_config(C.read_hf_config(src))
    except ConversionError:
        return False


# ----------------------------------------------------------------------------- config checks
def _require(config: dict, key: str, src: str):
    if key not in config:
        raise ConversionError(f"{src}/config.json: missing field {key!r}")
    return config[key]


def check_config(config: dict, src: str) -> None:
    """Refuse every setting the fairseq model does not implement, naming the field."""
    where = f"{src}/config.json"
    expectations = [
        ("num_ssm_heads", 1, "only one SSM head (H = d_model kernels) is supported, as in the reference's ref path"),
        ("bidirectional", True, "only the bidirectional SSM is implemented"),
        ("gating", True, "only the gated SSM block (q_proj gate) is implemented"),
        ("feed_forward_proj", "gated-gelu", "only the gated-GeLU feed-forward is implemented"),
        ("tie_word_embeddings", True, "only tied input/output embeddings are implemented"),
        ("agg_strategy", "add", "only the 'add' bidirectional aggregation is implemented"),
    ]
    for key, expected, why in expectations:
        if key in config and config[key] != expected:
            raise ConversionError(f"{where}: {key} = {config[key]!r} is not supported ({why})")
    act = config.get("dense_act_fn", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ConversionError(f"{where}: dense_act_fn {act!r} is not supported (gelu_new only)")
    if int(_require(config, "d_state", src)) % 2:
        raise ConversionError(f"{where}: d_state {config['d_state']} must be even (complex-conjugate pairs)")
    if config.get("is_encoder_decoder", True) is not True:
        raise ConversionError(f"{where}: is_encoder_decoder is false; only the encoder-decoder model converts")
    if config.get("use_fast_fft_conv"):
        logger.warning(
            "%s: use_fast_fft_conv is true. lsg-fairseq computes the exact convolution (the reference's "
            "'ref' path), which equals the fast CUDA path only when the length is a power of two "
            "(spec locost.md section 1)", where,
        )


def model_values(config: dict, src: str) -> dict:
    """fairseq hyper-parameters reproducing an HF LOCOST config."""
    num_layers = int(_require(config, "num_layers", src))
    return dict(
        d_model=int(_require(config, "d_model", src)), d_state=_require(config, "d_state", src),
        d_ff=_require(config, "d_ff", src), d_kv=_require(config, "d_kv", src), encoder_layers=num_layers,
        decoder_layers=config.get("num_decoder_layers") or num_layers,
        decoder_attention_heads=_require(config, "num_heads", src),
        layer_norm_eps=config.get("layer_norm_epsilon", 1e-6),
        relative_attention_num_buckets=config.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=config.get("relative_attention_max_distance", 128),
        dropout=config.get("dropout_rate", 0.1),
    )


# ----------------------------------------------------------------------------- vocabulary
def _find_spm(src: str) -> Optional[str]:
    for name in SPM_NAMES:
        path = os.path.join(src, name)
        if os.path.exists(path):
            return path
    return None


def hf_symbols(src: str, vocab_size: int) -> Tuple[Dict[int, str], int]:
    """HF id -> token string for every embedding row, and the unk id.

    From the sentencepiece model (+ ``added_tokens.json``, else T5's ``<extra_id_k>`` layout after
    the pieces); without a tokenizer the symbols are the ids themselves ("17").
    """
    spm_path = _find_spm(src)
    if spm_path is None:
        logger.warning("%s: no sentencepiece model; dict.txt symbols are the HF ids", src)
        return {i: str(i) for i in range(vocab_size)}, 2
    try:
        import sentencepiece as spm
    except ImportError as e:
        raise ConversionError("the sentencepiece package is needed to read " + spm_path) from e
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(spm_path)
    except Exception as e:  # noqa: BLE001  (OSError / RuntimeError, depending on the version)
        raise ConversionError(f"{spm_path}: not a readable sentencepiece model ({e}); re-download it") from None
    n = sp.GetPieceSize()
    symbols = {i: sp.IdToPiece(i) for i in range(min(n, vocab_size))}
    added_path = os.path.join(src, "added_tokens.json")
    added = C.read_json(added_path, dict) if os.path.exists(added_path) else None
    if added:
        if not all(isinstance(i, int) for i in added.values()):
            raise ConversionError(f"{added_path}: expected an object of token -> integer id")
        for tok, i in added.items():
            if i < vocab_size:
                symbols[int(i)] = tok
    for i in range(n, vocab_size):
        if i not in symbols:
            # HF T5Tokenizer (extra_ids=100): <extra_id_0> is the last id, counting down
            k = n + 99 - i
            symbols[i] = f"<extra_id_{k}>" if 0 <= k < 100 else f"<unused_{i}>"
    if n > vocab_size:
        raise ConversionError(f"{spm_path}: {n} pieces but the model has only {vocab_size} embedding rows")
    return symbols, sp.unk_id()


def fairseq_order(config: dict, unk_id: int, vocab_size: int, src: str) -> List[int]:
    """HF ids in fairseq index order for indices 0..V+0 (before the task's <mask>)."""
    pad = int(config.get("pad_token_id", 0))
    eos = int(config.get("eos_token_id", 1))
    start = config.get("decoder_start_token_id")
    start = pad if start is None else int(start)
    for name, i in (("pad_token_id", pad), ("eos_token_id", eos), ("decoder_start_token_id", start),
                    ("unk id", unk_id)):
        if not 0 <= i < vocab_size:
            raise ConversionError(f"{src}: {name} {i} is outside the vocabulary (0..{vocab_size - 1})")
    if len({pad, eos, unk_id}) != 3:
        raise ConversionError(f"{src}: pad ({pad}), eos ({eos}) and unk ({unk_id}) ids must differ")
    specials = {pad, eos, unk_id}
    return [start, pad, eos, unk_id] + [i for i in range(vocab_size) if i not in specials]


def write_dict(out_dir: str, order: List[int], symbols: Dict[int, str]) -> str:
    """dict.txt: one ``symbol 1`` line per HF id from fairseq index 4 on."""
    reserved = {"<s>", "<pad>", "</s>", "<unk>"}
    seen = set()
    path = os.path.join(out_dir, "dict.txt")
    with open(path, "w", encoding="utf-8") as f:
        for hf_id in order[4:]:
            sym = symbols[hf_id]
            if sym in reserved or sym in seen or not sym or any(c.isspace() for c in sym):
                raise ConversionError(
                    f"HF token {hf_id} ({sym!r}) cannot be a fairseq dictionary symbol (reserved, "
                    "duplicate or containing whitespace)"
                )
            seen.add(sym)
            f.write(f"{sym} 1\n")
    return path


# ----------------------------------------------------------------------------- weights
def hf_to_fairseq_state(hf: Dict[str, torch.Tensor], token_map: List[int], src: str) -> Dict[str, torch.Tensor]:
    sd = dict(hf)
    shared = None
    for key in ("shared.weight",) + TIED_COPIES:
        if key in sd:
            shared = sd[key]
            break
    if shared is None:
        raise ConversionError(f"{src}: no shared embedding (shared.weight / *.embed_tokens.weight / lm_head.weight)")
    for key in ("shared.weight",) + TIED_COPIES:
        t = sd.pop(key, None)
        if t is not None and (t.shape != shared.shape or not torch.equal(t, shared)):
            raise ConversionError(f"{src}: {key} differs from the shared embedding; only tied embeddings convert")
    if max(token_map) >= shared.shape[0]:
        raise ConversionError(f"{src}: token map refers to row {max(token_map)} of a {shared.shape[0]}-row embedding")
    emb = shared[torch.tensor(token_map)].clone()  # (V_fairseq d): rows permuted to fairseq order
    sd["encoder.embed_tokens.weight"] = emb
    sd["decoder.embed_tokens.weight"] = emb
    sd["decoder.output_projection.weight"] = emb
    return sd


# ----------------------------------------------------------------------------- conversion
def convert(src: str, out: str, to: Optional[str] = None, max_source_positions: Optional[int] = None,
            max_target_positions: Optional[int] = None, **options) -> str:
    """See the module docstring; returns the path of the written ``model.pt``."""
    if options:
        raise ConversionError(f"option(s) not applicable to LOCOST: {', '.join(sorted(options))}")
    if to not in (None, "locost"):
        raise ConversionError(f"--to {to}: a LOCOST folder converts to locost only")
    for name, value in (("--max-source-positions", max_source_positions),
                        ("--max-target-positions", max_target_positions)):
        if value is not None and int(value) < 1:
            raise ConversionError(f"{name} {value} must be positive")

    config = C.read_hf_config(src)
    if not is_locost_config(config):
        raise ConversionError(f"{src}/config.json does not describe a LOCOST model")
    check_config(config, src)
    vocab_size = int(_require(config, "vocab_size", src))
    hf = C.load_hf_state_dict(src)
    shared = hf.get("shared.weight")
    if shared is not None and shared.shape[0] != vocab_size:
        raise ConversionError(f"{src}: shared.weight has {shared.shape[0]} rows, config vocab_size is {vocab_size}")

    C.prepare_out_dir(src, out)
    symbols, unk_id = hf_symbols(src, vocab_size)
    order = fairseq_order(config, unk_id, vocab_size, src)
    write_dict(out, order, symbols)
    spm_path = _find_spm(src)
    if spm_path is not None:
        shutil.copyfile(spm_path, os.path.join(out, "spm.model"))

    # lengths not given: the locost architecture's defaults
    cfg, task, model = C.build_model(out, "locost_base", dict(
        model_values(config, src), max_source_positions=max_source_positions,
        max_target_positions=max_target_positions))
    dictionary = task.source_dictionary
    if len(dictionary) < len(order):
        raise ConversionError(f"dictionary has {len(dictionary)} entries, expected at least {len(order)}")
    token_map = list(order)
    inverse = {sym: i for i, sym in symbols.items()}
    for idx in range(len(order), len(dictionary)):  # symbols the task added (<mask>)
        sym = dictionary[idx]
        hf_id = inverse.get("<extra_id_0>" if sym == "<mask>" else sym, unk_id)
        token_map.append(hf_id)
    C.write_token_map(out, token_map)

    state = hf_to_fairseq_state(hf, token_map, src)
    C.load_strict(model, state)
    path = C.save_checkpoint(cfg, model, os.path.join(out, "model.pt"))
    with open(os.path.join(out, "conversion.json"), "w", encoding="utf-8") as f:
        json.dump({"family": "locost", "source": os.path.abspath(src), "vocab_size_hf": vocab_size,
                   "vocab_size_fairseq": len(dictionary), "decoder_start_hf_id": order[0]}, f, indent=1)
    return path


register_family("locost", detect, convert)
