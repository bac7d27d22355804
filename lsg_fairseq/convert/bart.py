"""Converter family ``bart``: HF BART / HF LSG-BART / fairseq lsg_bart checkpoints -> fairseq.

Sources (detected automatically):

- HF BART folder (``config.json`` with ``model_type == "bart"``) -> ``--to bart`` (weights
  mapped 1:1, fairseq_notes section 3) or ``--to lsg_bart`` (the reference's conversion,
  spec/lsg.md section 6: global tokens from ordered positions + <s>/<mask> embeddings, position
  tables tiled to the new max length);
- HF LSG-BART folder (same, with ``base_model_prefix == "lsg"`` / LSG fields) -> ``lsg_bart``
  with the folder's LSG settings (``--to bart`` is refused: it would drop the global tokens);
- a fairseq ``lsg_bart`` checkpoint (``model.pt`` or a folder holding one) -> ``lsg_bart`` with a
  longer ``--max-source-positions`` and/or more ``--num-global-tokens`` (warm start, e.g.
  4,096 -> 16,384), or other LSG settings;
- a fairseq ``bart`` checkpoint (e.g. trained here at 1,024 tokens) -> ``--to bart`` with tiled
  position tables, or ``--to lsg_bart`` initialised as from an HF BART folder.

Deliberate fix of the reference (spec section 9): position extension always gives exactly
M + 2 rows (the reference's repeat count falls short when k*P < M < k*(P+2)).
"""
import logging
import os
import shutil
from typing import Dict, Optional

import torch

from lsg_fairseq.convert import ConversionError, register_family
from lsg_fairseq.convert import common as C
from lsg_fairseq.models.lsg_bart import LSGBARTModel, lsg_architecture_defaults
from lsg_fairseq.modules.lsg_attention import MAX_GLOBAL_TOKENS
from lsg_fairseq.tasks.long_document_summarization import LongDocumentSummarizationTask

logger = logging.getLogger(__name__)

LSG_OPTION_NAMES = C.option_names(LSGBARTModel.add_lsg_args)  # the LSG flags' one home is the model
HF_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_accurate",
                  "gelu_fast": "gelu_accurate", "tanh": "tanh", "linear": "linear"}
MAX_POSITIONS = 1 << 20  # a longer learned position table is surely a typo


# ----------------------------------------------------------------------------- detection
def _is_fairseq_checkpoint(src: str) -> Optional[str]:
    path = os.path.join(src, "model.pt") if os.path.isdir(src) else src
    return path if os.path.isfile(path) and path.endswith(".pt") else None


def detect(src: str) -> bool:
    if os.path.isdir(src) and os.path.exists(os.path.join(src, "config.json")):
        try:
            return C.read_hf_config(src).get("model_type") == "bart"
        except ConversionError:
            return False
    path = _is_fairseq_checkpoint(src)
    if path is None:
        return False
    arch = _checkpoint_model_args(path, quiet=True)
    return arch is not None and str(getattr(arch, "arch", "")).startswith(("lsg_bart", "bart"))


def _checkpoint_model_args(path: str, quiet: bool = False):
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (any unreadable file)
        if quiet:
            return None
        raise ConversionError(f"{path}: not a readable fairseq checkpoint ({e})") from e
    cfg = state.get("cfg") if isinstance(state, dict) else None
    model_cfg = cfg.get("model") if isinstance(cfg, dict) else None
    if model_cfg is None and isinstance(state, dict) and state.get("args") is not None:
        model_cfg = state["args"]
    return model_cfg


# ----------------------------------------------------------------------------- weight helpers
def is_lsg_config(config: dict) -> bool:
    archs = config.get("architectures") or []
    return (config.get("base_model_prefix") == "lsg" or any(str(a).startswith("LSG") for a in archs)
            or "block_size" in config and "num_global_tokens" in config)


def extend_positions(table: torch.Tensor, max_positions: int) -> torch.Tensor:
    """Learned position table (offset 2) for ``max_positions`` tokens: exactly M + 2 rows.

    ``new[0:2] = old[0:2]`` and ``new[2 + i] = old[2 + i mod P]`` (P = old rows - 2): the
    reference's tiling (spec section 6 step 4), which also truncates when M < P.
    """
    P = table.size(0) - 2
    if P < 1:
        raise ConversionError(f"position table with {table.size(0)} rows has no positions")
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
        raise ConversionError(
            f"--global-positional-stride {stride} must be a multiple of {factor} (positions/{MAX_GLOBAL_TOKENS}) "
            f"and stride/{factor} must divide {MAX_GLOBAL_TOKENS}"
        )
    positions = positions.reshape(-1, factor, d)[:, 0]  # (512, d): rows 0, factor, 2*factor...
    m = stride // factor
    return positions.reshape(-1, m, d).transpose(0, 1).reshape(-1, d)  # (512, d)


def init_global_embeddings(enc_positions: torch.Tensor, embed_tokens: torch.Tensor, bos_id: int,
                           mask_id: int, stride: int, seed: int) -> torch.Tensor:
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
        sd[key[len("model."):] if key.startswith("model.") else key] = value
    bias = sd.pop("final_logits_bias", None)
    if bias is not None and bool((bias != 0).any()):
        raise ConversionError(
            f"{src}: final_logits_bias is not zero (max |b| = {bias.abs().max():.3g}); fairseq "
            "BART has no output bias, so the converted model would differ"
        )
    candidates = [k for k in ("shared.weight", "encoder.embed_tokens.weight",
                              "decoder.embed_tokens.weight", "lm_head.weight") if k in sd]
    if not candidates:
        raise ConversionError(f"{src}: no token embedding (model.shared.weight) in the weights")
    shared = sd[candidates[0]]
    for k in candidates:
        t = sd.pop(k)
        if t.shape != shared.shape or not torch.equal(t, shared):
            raise ConversionError(
                f"{src}: {k} differs from {candidates[0]}; only tied BART embeddings are supported"
            )
    sd["encoder.embed_tokens.weight"] = shared
    sd["decoder.embed_tokens.weight"] = shared
    sd["decoder.output_projection.weight"] = shared
    sd["encoder.version"] = torch.tensor([3.0])
    sd["decoder.version"] = torch.tensor([3.0])
    return sd


def model_values(config: dict, src: str) -> dict:
    """fairseq hyper-parameters reproducing an HF BART config's shapes (and embedding scaling)."""
    for key in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size"):
        if key not in config:
            raise ConversionError(f"{src}/config.json: missing field {key!r}")
    if config.get("normalize_before") or config.get("add_final_layer_norm"):
        raise ConversionError(f"{src}/config.json: pre-LayerNorm (mBART-style) models are not BART")
    act = config.get("activation_function", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ConversionError(f"{src}/config.json: activation_function {act!r} has no fairseq equivalent")
    for key, expected in (("pad_token_id", 1), ("bos_token_id", 0), ("eos_token_id", 2)):
        if config.get(key, expected) != expected:
            raise ConversionError(
                f"{src}/config.json: {key} = {config[key]}; fairseq dictionaries need {expected}"
            )
    d = config["d_model"]
    return dict(
        encoder_embed_dim=d, decoder_embed_dim=d,
        encoder_layers=config["encoder_layers"], decoder_layers=config["decoder_layers"],
        encoder_attention_heads=config["encoder_attention_heads"],
        decoder_attention_heads=config["decoder_attention_heads"],
        encoder_ffn_embed_dim=config["encoder_ffn_dim"], decoder_ffn_embed_dim=config["decoder_ffn_dim"],
        activation_fn=HF_ACTIVATIONS[act], dropout=config.get("dropout", 0.1),
        attention_dropout=config.get("attention_dropout", 0.0),
        activation_dropout=config.get("activation_dropout", 0.0),
        no_scale_embedding=not config.get("scale_embedding", False),
    )


def _arch_for(config: dict, family: str) -> str:
    if config.get("d_model") == 1024 and config.get("encoder_layers") == 12:
        return f"{family}_large"
    return f"{family}_base"  # every shape is also passed explicitly


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


# ----------------------------------------------------------------------------- conversions
def convert(src: str, out: str, to: Optional[str] = None, max_source_positions: Optional[int] = None,
            max_target_positions: Optional[int] = None, global_positional_stride: int = 64,
            seed: int = 123, **options) -> str:
    """See the module docstring; returns the path of the written ``model.pt``."""
    unknown = set(options) - set(LSG_OPTION_NAMES)
    if unknown:
        raise ConversionError(f"unknown option(s) for the bart family: {', '.join(sorted(unknown))}")
    if to not in (None, "bart", "lsg_bart"):
        raise ConversionError(f"--to {to}: the bart family converts to bart or lsg_bart")
    for name, value in (("max_source_positions", max_source_positions),
                        ("max_target_positions", max_target_positions)):
        if value is not None and not 1 <= int(value) <= MAX_POSITIONS:
            raise ConversionError(
                f"--{name.replace('_', '-')} {value} is not achievable: it must be in "
                f"[1, {MAX_POSITIONS}]"
            )
    C.prepare_out_dir(src, out)
    ckpt = _is_fairseq_checkpoint(src) if not os.path.exists(os.path.join(src, "config.json")) else None
    if ckpt is not None:
        return _convert_fairseq(ckpt, out, to, max_source_positions, max_target_positions,
                                global_positional_stride, seed, options)
    return _convert_hf(src, out, to, max_source_positions, max_target_positions,
                       global_positional_stride, seed, options)


def _convert_hf(src, out, to, max_source_positions, max_target_positions, stride, seed, options):
    config = C.read_hf_config(src)
    if config.get("model_type") != "bart":
        raise ConversionError(f"{src}/config.json: model_type {config.get('model_type')!r} is not bart")
    source_is_lsg = is_lsg_config(config)
    lsg_requested = any(options.get(k) is not None for k in LSG_OPTION_NAMES)
    if to is None:
        to = "lsg_bart" if source_is_lsg or lsg_requested or max_source_positions else "bart"
    if to == "bart" and (source_is_lsg or lsg_requested):
        raise ConversionError(
            f"{src}: --to bart cannot keep LSG settings or global tokens; use --to lsg_bart"
        )
    values = model_values(config, src)
    arch = _arch_for(config, to)
    V = config["vocab_size"]
    vocab = C.read_hf_vocab(src)
    if vocab is not None:
        C.check_bart_vocab(vocab, V, src)

    sd = hf_to_fairseq_state(C.load_hf_state_dict(src), src)
    if sd["encoder.embed_tokens.weight"].size(0) != V:
        raise ConversionError(
            f"{src}: embedding has {sd['encoder.embed_tokens.weight'].size(0)} rows, "
            f"config vocab_size is {V}"
        )
    enc_pos = sd.get("encoder.embed_positions.weight")
    dec_pos = sd.get("decoder.embed_positions.weight")
    if enc_pos is None or dec_pos is None:
        raise ConversionError(f"{src}: missing learned position tables (embed_positions.weight)")
    P = enc_pos.size(0) - 2
    if source_is_lsg and config.get("max_position_embeddings", P) != P:
        raise ConversionError(
            f"{src}: encoder position table has {enc_pos.size(0)} rows but max_position_embeddings "
            f"is {config.get('max_position_embeddings')} (expected rows = max + 2)"
        )
    # default length: the source's own, or the architecture's for a new LSG conversion
    M = int(max_source_positions or (P if (to == "bart" or source_is_lsg)
                                     else C.arch_defaults(arch).max_source_positions))
    # decoder length: the reference tiles the decoder table to M too (BART -> LSG), so an HF
    # LSG source carries M + 2 rows; keep that unless --max-target-positions slices it
    # (fairseq_notes 3.6). Plain BART keeps its own.
    if to == "lsg_bart" and not source_is_lsg:
        default_tgt = M
    else:
        default_tgt = dec_pos.size(0) - 2
    T = int(max_target_positions or default_tgt)

    values.update(max_source_positions=M, max_target_positions=T)
    if to == "lsg_bart":
        lsg = {k: config.get(k) for k in LSG_OPTION_NAMES} if source_is_lsg else {}
        if source_is_lsg and "sparsity_type" in config and str(config["sparsity_type"]).lower() == "none":
            lsg["sparsity_type"] = "none"  # the reference's None (or "None") = no sparse keys
        if source_is_lsg and config.get("adaptive") is False:
            logger.warning("%s: adaptive=False in config; lsg-fairseq always pads adaptively", src)
        lsg.update({k: v for k, v in options.items() if v is not None})
        values.update(lsg)
        if source_is_lsg:
            if "encoder.global_embeddings.weight" not in sd:
                raise ConversionError(f"{src}: LSG config but no model.encoder.global_embeddings.weight")
        else:
            mask_id = _mask_id(src, vocab, V)
            sd["encoder.global_embeddings.weight"] = init_global_embeddings(
                enc_pos, sd["encoder.embed_tokens.weight"], config.get("bos_token_id", 0), mask_id,
                stride, seed)
        glob = sd["encoder.global_embeddings.weight"]
        if glob.shape != (MAX_GLOBAL_TOKENS, config["d_model"]):
            raise ConversionError(
                f"{src}: global_embeddings has shape {tuple(glob.shape)}, expected "
                f"({MAX_GLOBAL_TOKENS}, {config['d_model']})"
            )
    sd["encoder.embed_positions.weight"] = extend_positions(enc_pos, M)
    sd["decoder.embed_positions.weight"] = extend_positions(dec_pos, T)

    C.write_identity_dict(out, V)
    cfg, _, model = C.build_model(out, arch, values)
    C.load_strict(model, sd)
    C.write_gpt2_bpe_files(src, out)
    return C.save_checkpoint(cfg, model, os.path.join(out, "model.pt"))


def _convert_fairseq(path, out, to, max_source_positions, max_target_positions, stride, seed, options):
    """A fairseq ``lsg_bart`` checkpoint -> ``lsg_bart`` (longer, more globals, other LSG
    settings), or a fairseq ``bart`` checkpoint (one trained here) -> ``bart`` with longer position
    tables (``--to bart``) or -> ``lsg_bart``, initialised exactly as an HF BART -> LSG conversion
    (spec section 6: global tokens from ordered positions + <s>/<mask> embeddings, tiled tables)."""
    from fairseq import checkpoint_utils
    from omegaconf import open_dict

    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    cfg = state.get("cfg")
    if cfg is None or cfg.get("model") is None:
        raise ConversionError(f"{path}: checkpoint has no cfg.model; cannot rebuild the model")
    arch = str(getattr(cfg.model, "arch", ""))
    source_is_lsg = arch.startswith("lsg_bart")
    if not source_is_lsg and not arch.startswith("bart"):
        raise ConversionError(
            f"{path}: arch {arch!r}; only bart and lsg_bart checkpoints can be re-converted (convert "
            "the HF folder instead)"
        )
    lsg_requested = any(options.get(k) is not None for k in LSG_OPTION_NAMES)
    if to is None:
        to = "lsg_bart" if source_is_lsg or lsg_requested or max_source_positions else "bart"
    if to not in ("bart", "lsg_bart") or (source_is_lsg and to != "lsg_bart"):
        raise ConversionError(f"{path}: a {arch} checkpoint converts to "
                              + ("lsg_bart only" if source_is_lsg else "bart or lsg_bart"))
    if to == "bart" and lsg_requested:
        raise ConversionError(f"{path}: LSG options need --to lsg_bart")
    src_dir = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(os.path.join(src_dir, "dict.txt")):
        raise ConversionError(f"{src_dir}/dict.txt: missing (needed beside the checkpoint)")
    sd = dict(state["model"])
    model_args = cfg.model
    M = int(max_source_positions or model_args.max_source_positions)
    # BART -> LSG tiles the decoder table to M too, as the reference (and _convert_hf) does
    new_lsg = to == "lsg_bart" and not source_is_lsg
    T = int(max_target_positions or (M if new_lsg else model_args.max_target_positions))
    with open_dict(cfg):
        if new_lsg:
            # same sizes, LSG encoder: bart_large -> lsg_bart_large (a fairseq bart arch name is
            # bart_<size>); every LSG option not given takes the architecture's default
            # (fairseq builds legacy models by `_name`, which holds the arch name)
            model_args.arch = "lsg_" + arch if ("lsg_" + arch) in _LSG_ARCHS else "lsg_bart_large"
            model_args._name = model_args.arch
        model_args.max_source_positions = M
        model_args.max_target_positions = T
        for k, v in options.items():
            if v is not None:
                setattr(model_args, k, v)
        cfg.task.max_source_positions = M
        cfg.task.max_target_positions = T
        if new_lsg:
            lsg_architecture_defaults(model_args)
    if new_lsg:
        # the dictionary as the task builds it: <mask> appended, as on every model row count
        d = LongDocumentSummarizationTask.load_dictionary(os.path.join(src_dir, "dict.txt"))
        mask_id = d.index("<mask>")
        sd["encoder.global_embeddings.weight"] = init_global_embeddings(
            sd["encoder.embed_positions.weight"], sd["encoder.embed_tokens.weight"], d.bos(), mask_id,
            stride, seed)
    sd["encoder.embed_positions.weight"] = extend_positions(sd["encoder.embed_positions.weight"], M)
    sd["decoder.embed_positions.weight"] = extend_positions(sd["decoder.embed_positions.weight"], T)

    # the tokenizer files that belong to this checkpoint (tokenizer.txt, when present, says which)
    for name in ("dict.txt", "encoder.json", "vocab.bpe", "token_map.json", "spm.model", "sentencepiece.bpe.model",
                 "sentencepiece.model"):
        if os.path.exists(os.path.join(src_dir, name)):
            shutil.copyfile(os.path.join(src_dir, name), os.path.join(out, name))
    cfg, _, model = C.build_model_from_cfg(cfg, out)
    C.load_strict(model, sd)
    return C.save_checkpoint(cfg, model, os.path.join(out, "model.pt"))


_LSG_ARCHS = ("lsg_bart_tiny", "lsg_bart_base", "lsg_bart_large")


register_family("bart", detect, convert)
