"""BART's weights both ways, shared by every BART-shaped family (``bart``, ``lsg_bart``, ``led``):
plain functions of the state dicts, no family in them.

HF -> fairseq: the ``model.`` prefix dropped, the tied embeddings (``shared.weight``) copied to
fairseq's three tables, ``final_logits_bias`` checked to be zero (fairseq BART has no output bias),
learned position tables (fairseq's two unused leading rows kept) tiled to a new length.
fairseq -> HF: the checks of what HF's classes cannot hold, then the same names back
(:func:`hf_state`, whose family-specific names come from the family's attributes).

Deliberate fix of the reference (spec/lsg.md section 9): position extension always gives exactly
M + 2 rows (the reference's repeat count falls short when k*P < M < k*(P+2)).
"""

import re
from typing import Callable, Dict, List, Optional, Tuple

import torch

from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.checkpoint import Checkpoint

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
# every fairseq tensor the HF BART classes have a place for; anything else is refused by name
_BART_KEY = re.compile(
    r"(encoder|decoder)\.(version|embed_tokens\.weight|embed_positions\.weight|layernorm_embedding\.(weight|bias)"
    r"|layers\.\d+\.((self_attn|encoder_attn)\.(q|k|v|out)_proj|self_attn_layer_norm|encoder_attn_layer_norm"
    r"|final_layer_norm|fc1|fc2)\.(weight|bias))|decoder\.output_projection\.weight"
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


# ----------------------------------------------------------------------------- fairseq -> HF
def hf_limits(checkpoint: Checkpoint) -> List[str]:
    """Model settings HF's BART-shaped classes cannot express, naming the flag."""
    g = checkpoint.get
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
    if g("no_token_positional_embeddings", False) or not (
        g("encoder_learned_pos", False) and g("decoder_learned_pos", False)
    ):
        problems.append("sinusoidal or no positions (HF BART/LED have learned positions)")
    if g("adaptive_softmax_cutoff", None):
        problems.append("--adaptive-softmax-cutoff")
    return problems


def hf_state(
    checkpoint: Checkpoint,
    hf_prefix: str,
    hf_architecture: str,
    encoder_keys: Optional["re.Pattern"],
    required_keys: Tuple[str, ...],
    to_hf_layout: Callable,
) -> Dict[str, torch.Tensor]:
    """fairseq state -> the HF model's state (one ``shared.weight``, zero ``final_logits_bias``):
    a family's own tensors match ``encoder_keys`` (``required_keys`` must be there) and
    ``to_hf_layout(sd, enc_pos, dec_pos)`` gives its HF names and position tables."""
    sd = dict(checkpoint.state)
    extra = encoder_keys
    unknown = sorted(k for k in sd if not (_BART_KEY.fullmatch(k) or (extra is not None and extra.fullmatch(k))))
    if unknown:
        raise C.ExportError(
            f"{checkpoint.path}: weights HF's {hf_architecture} cannot hold: {', '.join(unknown[:10])}"
            + (" ..." if len(unknown) > 10 else "")
        )
    for key in ("encoder.version", "decoder.version"):
        sd.pop(key, None)
    required = (
        "encoder.embed_tokens.weight",
        "encoder.embed_positions.weight",
        "decoder.embed_positions.weight",
    ) + required_keys
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
    sd, enc_pos, dec_pos = to_hf_layout(
        sd, sd.pop("encoder.embed_positions.weight"), sd.pop("decoder.embed_positions.weight")
    )
    hf = {f"{hf_prefix}{k}": v for k, v in sd.items()}
    hf[f"{hf_prefix}shared.weight"] = emb
    hf[f"{hf_prefix}encoder.embed_positions.weight"] = enc_pos
    hf[f"{hf_prefix}decoder.embed_positions.weight"] = dec_pos
    hf["final_logits_bias"] = emb.new_zeros(1, emb.size(0))
    # safetensors wants distinct, contiguous tensors (slices above share storage with the checkpoint)
    return {k: v.detach().clone().contiguous() for k, v in sorted(hf.items())}
