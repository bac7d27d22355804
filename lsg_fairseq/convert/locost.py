"""The LOCOST family, both ways: the reference's HF-format LOCOST folder <-> fairseq ``locost``.

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
from typing import Callable, Dict, List, Optional, Tuple

import torch

from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.common import ConversionError, ExportError
from lsg_fairseq.convert.registry import BenchRow, Family, SourceInfo, register_family
from lsg_fairseq.models.locost import locost_arg_ranges
from lsg_text.offline_bpe import HF_SENTENCEPIECE_NAME, SENTENCEPIECE_MODEL, SENTENCEPIECE_NAMES

logger = logging.getLogger(__name__)

SPM_NAMES = (HF_SENTENCEPIECE_NAME,) + SENTENCEPIECE_NAMES  # where a source folder's is found, first wins
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
            "(spec locost.md section 1)",
            where,
        )


# HF LOCOST config field -> fairseq argument, and the reference's default (None: required)
CONFIG_FIELDS = [
    ("d_model", "d_model", None),
    ("d_state", "d_state", None),
    ("d_ff", "d_ff", None),
    ("d_kv", "d_kv", None),
    ("num_layers", "encoder_layers", None),
    ("num_heads", "decoder_attention_heads", None),
    ("layer_norm_epsilon", "layer_norm_eps", 1e-6),
    ("relative_attention_num_buckets", "relative_attention_num_buckets", 32),
    ("relative_attention_max_distance", "relative_attention_max_distance", 128),
    ("dropout_rate", "dropout", 0.1),
]


def model_values(config: dict, src: str) -> dict:
    """fairseq hyper-parameters reproducing an HF LOCOST config; each value is checked against its
    flag's declared range here, where it arrives (it never goes through argparse)."""
    ranges = locost_arg_ranges()
    values = {}
    fields = CONFIG_FIELDS + [("num_decoder_layers", "decoder_layers", None)]
    for field, name, default in fields:
        if field == "num_decoder_layers":
            value = config.get(field) or values["encoder_layers"]  # T5: same depth unless given
        else:
            value = _require(config, field, src) if default is None else config.get(field, default)
        problem = ranges[name].problem(value)
        if problem:
            raise ConversionError(f"{src}/config.json: {field} {problem}, got {value!r}")
        values[name] = value
    return values


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
    for name, i in (
        ("pad_token_id", pad),
        ("eos_token_id", eos),
        ("decoder_start_token_id", start),
        ("unk id", unk_id),
    ):
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


# ----------------------------------------------------------------------------- fairseq -> HF
def read_token_map(source: C.Checkpoint) -> List[int]:
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


def unpermute(emb: torch.Tensor, token_map: List[int], source: C.Checkpoint) -> torch.Tensor:
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
        logger.warning(
            "fairseq <pad> row (index %d) differs from HF id %d's row (the decoder start); HF keeps one "
            "row per id, the start row (fairseq never emits or attends to <pad>)",
            d.pad(),
            token_map[d.pad()],
        )
    return shared


def hf_state(source: C.Checkpoint, token_map: List[int]) -> Dict[str, torch.Tensor]:
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


def hf_config(source: C.Checkpoint, token_map: List[int], hf: Dict[str, torch.Tensor]) -> dict:
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


def tokenizer_writer(source: C.Checkpoint, token_map: List[int]) -> Callable[[str], None]:
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

    def detect(self, source: SourceInfo) -> bool:
        return source.hf_config is not None and is_locost_config(source.hf_config)

    def convert(self, source, out, max_source_positions=None, max_target_positions=None, **options) -> str:
        src, config = source.path, source.hf_config
        check_config(config, src)
        vocab_size = int(_require(config, "vocab_size", src))
        values = model_values(config, src)
        hf = C.load_hf_state_dict(src)
        shared = hf.get("shared.weight")
        if shared is not None and shared.shape[0] != vocab_size:
            raise ConversionError(f"{src}: shared.weight has {shared.shape[0]} rows, config vocab_size is {vocab_size}")

        symbols, unk_id = hf_symbols(src, vocab_size)
        order = fairseq_order(config, unk_id, vocab_size, src)
        write_dict(out, order, symbols)
        spm_path = _find_spm(src)
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

    def export(self, checkpoint: C.Checkpoint) -> Callable[[str], None]:
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
