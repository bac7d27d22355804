"""The LOCOST family, both ways: the reference's HF-format LOCOST folder <-> fairseq ``locost``.

Source: what the reference's ``save_pretrained`` writes (spec ``shared/spec/locost.md`` section 5):
``config.json`` (no ``model_type``; ``architectures: ["LOCOSTForConditionalGeneration"]`` and/or the
LOCOST fields ``d_state``, ``num_ssm_heads``), ``pytorch_model.bin`` or safetensors, and, when
present, the T5 sentencepiece model (``spiece.model``) plus ``added_tokens.json``.

Output (``OUT_DIR``): ``model.pt``, ``dict.txt``, ``token_map.json`` (fairseq index -> HF id) and
``spm.model`` when the source has a sentencepiece model.

Ids: T5's and fairseq's specials differ, so the fairseq dictionary is a permutation of the HF
vocabulary (``locost_vocab.py``), and the embedding rows are permuted with it.

The way back writes what the reference's ``save_pretrained`` writes: ``config.json``
(``LOCOSTForConditionalGeneration``, no ``model_type``), ``generation_config.json``,
``pytorch_model.bin`` with every key including the tied copies of ``shared.weight``, and
``spiece.model`` (+ ``added_tokens.json``) when the model has a sentencepiece model. The embedding
rows go back to HF order through ``token_map.json``. Some HF ids have two fairseq rows: HF 0 is both
the decoder start (fairseq ``<s>``) and the pad, and the task's ``<mask>`` reuses an existing id. HF
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
from typing import Callable, Dict, List, Optional

import torch

from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.checkpoint import Checkpoint
from lsg_fairseq.convert.common import ConversionError, ExportError
from lsg_fairseq.convert.fields import Field, hf_fields, values_from_hf
from lsg_fairseq.convert.locost_vocab import fairseq_order, find_spm, hf_symbols, read_token_map, unpermute, write_dict
from lsg_fairseq.convert.registry import NOT_ITS_SOURCE, BenchRow, Family, SourceInfo, register_family
from lsg_fairseq.models.locost import locost_arg_ranges
from lsg_layers.modules.s4d_config import check_ssm_config
from lsg_layers.modules.t5_layers import T5_DEFAULTS
from lsg_text.argtypes import POSITIVE_INT
from lsg_text.offline_bpe import HF_SENTENCEPIECE_NAME, SENTENCEPIECE_MODEL, SENTENCEPIECE_NAMES

logger = logging.getLogger(__name__)

TIED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
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


# ----------------------------------------------------------------------------- detection
def is_locost_config(config: dict) -> bool:
    archs = config.get("architectures") or []
    if any(str(a).upper().startswith("LOCOST") for a in archs):
        return True
    return "d_state" in config and "num_ssm_heads" in config and "d_model" in config


# ----------------------------------------------------------------------------- config checks
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
    try:
        check_ssm_config(C.config_value(config, "d_state", src, POSITIVE_INT))
    except ValueError as e:
        raise ConversionError(f"{where}: {e}") from None
    if not C.config_flag(config, "is_encoder_decoder", src, True):
        raise ConversionError(f"{where}: is_encoder_decoder is false; only the encoder-decoder model converts")
    if C.config_flag(config, "use_fast_fft_conv", src, False):
        logger.warning(
            "%s: use_fast_fft_conv is true. lsg-fairseq computes the exact convolution (the reference's "
            "'ref' path), which equals the fast CUDA path only when the length is a power of two "
            "(spec locost.md section 1)",
            where,
        )


# HF LOCOST config field <-> fairseq argument, and the default of a field a config may lack (T5's,
# from their home in modules.t5_layers); num_decoder_layers absent: the encoder's depth (T5)
FIELDS = (
    Field("d_model", "d_model", to_hf=int),
    Field("d_state", "d_state", to_hf=int),
    Field("d_ff", "d_ff", to_hf=int),
    Field("d_kv", "d_kv", to_hf=int),
    Field("num_layers", "encoder_layers", to_hf=int),
    Field("num_heads", "decoder_attention_heads", to_hf=int),
    Field("layer_norm_epsilon", "layer_norm_eps", T5_DEFAULTS["layer_norm_eps"], to_hf=float),
    Field(
        "relative_attention_num_buckets",
        "relative_attention_num_buckets",
        T5_DEFAULTS["relative_attention_num_buckets"],
        to_hf=int,
    ),
    Field(
        "relative_attention_max_distance",
        "relative_attention_max_distance",
        T5_DEFAULTS["relative_attention_max_distance"],
        to_hf=int,
    ),
    Field("dropout_rate", "dropout", T5_DEFAULTS["dropout"], to_hf=float),
    Field("num_decoder_layers", "decoder_layers", None, to_hf=int),
)


def model_values(config: dict, src: str) -> dict:
    """fairseq hyper-parameters reproducing an HF LOCOST config; each value is checked against its
    flag's declared range here, where it arrives (it never goes through argparse)."""
    ranges = locost_arg_ranges()
    values = values_from_hf(FIELDS, config, src)
    values["decoder_layers"] = values["decoder_layers"] or values["encoder_layers"]
    for f in FIELDS:
        problem = ranges[f.fairseq].problem(values[f.fairseq])
        if problem:
            raise ConversionError(f"{src}/config.json: {f.hf} {problem}, got {values[f.fairseq]!r}")
    return values


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


# ----------------------------------------------------------------------------- fairseq -> HF
def hf_state(source: Checkpoint, token_map: List[int]) -> Dict[str, torch.Tensor]:
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
            raise ExportError(
                f"{source.path}: {key} differs from {EMBEDDINGS[0]}; the LOCOST format ties them (one shared.weight)"
            )
    shared = unpermute(emb, token_map, source)
    hf = {"shared.weight": shared}
    hf.update({k: v.detach().clone() for k, v in sd.items()})
    for key in TIED_COPIES:  # save_pretrained (transformers 4.27) writes the tied copies too
        hf[key] = shared
    return hf


def hf_config(source: Checkpoint, token_map: List[int], hf: Dict[str, torch.Tensor]) -> dict:
    d = source.dictionary
    config = hf_fields(FIELDS, source)
    config.update(
        {
            "architectures": ["LOCOSTForConditionalGeneration"],
            "bidirectional": True,
            "decoder_start_token_id": token_map[d.bos()],  # fairseq's decoder starts from the <s> row
            "dense_act_fn": "gelu_new",
            "eos_token_id": token_map[d.eos()],
            "feed_forward_proj": "gated-gelu",
            "gating": True,
            "initializer_factor": 1.0,
            "is_encoder_decoder": True,
            "is_gated_act": True,
            "num_ssm_heads": 1,
            "pad_token_id": token_map[d.pad()],
            "torch_dtype": C.dtype_name(hf),
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
    )
    return config


def tokenizer_writer(source: Checkpoint, token_map: List[int]) -> Callable[[str], None]:
    spm_path = source.find(*SENTENCEPIECE_NAMES, HF_SENTENCEPIECE_NAME)
    if spm_path is None:
        logger.warning(
            "%s: no sentencepiece model beside the checkpoint; the folder has no tokenizer (ids are used as they are)",
            source.path,
        )
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
        shutil.copyfile(spm_path, os.path.join(folder, HF_SENTENCEPIECE_NAME))
        if added:
            C.write_json(folder, "added_tokens.json", added)

    return write


# ----------------------------------------------------------------------------- the family
@register_family
class LOCOSTFamily(Family):
    """The reference's LOCOST folder (HF format) <-> fairseq ``locost``."""

    name = "locost"
    label = "LOCOST"

    def refusal(self, source: SourceInfo, options: dict) -> Optional[str]:
        """The reference's LOCOST folders only."""
        return None if source.hf_config is not None and is_locost_config(source.hf_config) else NOT_ITS_SOURCE

    def convert(self, source, out, max_source_positions=None, max_target_positions=None, **options) -> str:
        src, config = source.path, source.hf_config
        check_config(config, src)
        vocab_size = C.config_value(config, "vocab_size", src, POSITIVE_INT)
        values = model_values(config, src)
        hf = C.load_hf_state_dict(src)
        shared = hf.get("shared.weight")
        if shared is not None and shared.shape[0] != vocab_size:
            raise ConversionError(f"{src}: shared.weight has {shared.shape[0]} rows, config vocab_size is {vocab_size}")

        symbols, unk_id = hf_symbols(src, vocab_size)
        order = fairseq_order(config, unk_id, vocab_size, src)
        write_dict(out, order, symbols)
        spm_path = find_spm(src)
        if spm_path is not None:
            shutil.copyfile(spm_path, os.path.join(out, SENTENCEPIECE_MODEL))

        # lengths not given: the locost architecture's defaults
        cfg, task, model = C.build_model(
            out,
            self.arch("base"),
            dict(values, max_source_positions=max_source_positions, max_target_positions=max_target_positions),
        )
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
            json.dump(
                {
                    "family": self.name,
                    "source": os.path.abspath(src),
                    "vocab_size_hf": vocab_size,
                    "vocab_size_fairseq": len(dictionary),
                    "decoder_start_hf_id": order[0],
                },
                f,
                indent=1,
            )
        return path

    def export(self, checkpoint: Checkpoint) -> Callable[[str], None]:
        token_map = read_token_map(checkpoint)
        hf = hf_state(checkpoint, token_map)
        config = hf_config(checkpoint, token_map, hf)
        gen = {
            "_from_model_config": True,
            "decoder_start_token_id": config["decoder_start_token_id"],
            "eos_token_id": config["eos_token_id"],
            "pad_token_id": config["pad_token_id"],
        }
        write_tokenizer = tokenizer_writer(checkpoint, token_map)

        def write(folder):
            torch.save(hf, os.path.join(folder, "pytorch_model.bin"))
            C.write_json(folder, "config.json", config)
            C.write_json(folder, "generation_config.json", gen)
            write_tokenizer(folder)

        return write

    def benchmarks(self):
        """``locost`` as inference runs it (kernels cached up to the settings' kernel cache MiB);
        ``locost_cold`` with the cache off (``enc`` only); ``locost_ckpt`` with
        --checkpoint-activations (``train`` only). 32,128 tokens: T5's sentencepiece vocabulary."""

        def row(color, cache_off: bool = False, checkpointed: bool = False, modes=None):
            def argv(length, settings):
                cache = 0.0 if cache_off else settings.locost_kernel_cache_mb
                return (
                    [self.arch("tiny" if settings.smoke else "base"), "--max-source-positions", str(length)]
                    + ([] if cache is None else ["--ssm-kernel-cache-mb", str(cache)])
                    + (["--checkpoint-activations"] if checkpointed else [])
                    + (["--ssm-kernel-compile", "True"] if settings.locost_kernel_compile else [])
                    + (
                        ["--ssm-kernel-product", settings.locost_kernel_product]
                        if settings.locost_kernel_product
                        else []
                    )
                )

            return BenchRow(
                argv, vocab=32128, modes=modes, ssm_split=True, growth="1 (+ log L from the FFT)", color=color
            )

        return {
            "locost": row("tab:red"),
            "locost_cold": row("tab:orange", cache_off=True, modes=("enc",)),
            "locost_ckpt": row("tab:purple", checkpointed=True, modes=("train",)),
        }
