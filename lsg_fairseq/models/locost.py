"""LOCOST (Le Bronnec et al., EACL 2024): SSM encoder + T5 v1.1 decoder, as a fairseq model.

``--arch locost_base`` (the released model's shape) / ``locost_tiny`` (tests, demos). Spec:
``shared/spec/locost.md``. Encoder: token embedding (no scaling, **no positions**, so any input
length) -> dropout -> N x [pre-RMSNorm bidirectional S4D + residual, pre-RMSNorm gated-GeLU FFN +
residual] -> RMSNorm -> dropout. Decoder: T5 v1.1 (relative position bias computed by layer 0 and
shared, no score scaling, output projection tied to the shared embedding with d_model^-0.5).

Token conventions (T5, not BART):

* the source is ``x </s>`` without ``<s>``: the model declares ``prepend_bos = False``, which the
  summarization task reads when it builds the model;
* the decoder starts from a dedicated start embedding: fairseq feeds ``</s>`` at decoder position 0
  (teacher forcing and generation alike) and :class:`LOCOSTDecoder` embeds it with the row of
  ``<s>`` instead. For converted checkpoints that row holds the HF row 0 (T5's pad / decoder start).
  Pads are never masked as decoder keys: the decoder is causal and targets are right-padded.

Generation: ``set_beam_size`` (called by fairseq's SequenceGenerator for beam > 1) keeps the encoder
output and the cross-attention key/value caches at one row per source instead of one per hypothesis.

SSM parameters (``log_dt, inv_A_real, A_imag, B, C``) are tagged ``param_group="ssm"`` with no weight
decay and ``lr_scale = --ssm-lr / --lr`` where they are made (``S4DKernel``); ``--optimizer
grouped_adam`` honours the tags.
"""

import argparse
import logging

import torch
import torch.nn as nn
from omegaconf import OmegaConf

from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    FairseqIncrementalDecoder,
    register_model,
    register_model_architecture,
)

from lsg_fairseq.models.layer_wrap import wrap_layer
from lsg_fairseq.models.vocabulary_fit import VocabularyCheckedLoad
from lsg_layers.modules.lean_ffn import LeanDropout
from lsg_layers.modules.locost_blocks import LOCOSTEncoderBlock, T5DecoderBlock
from lsg_layers.modules.s4d import KERNEL_TAIL_TOL
from lsg_layers.modules.s4d_config import DT_MAX, DT_MIN, check_kernel_product, check_ssm_config
from lsg_layers.modules.t5_layers import T5_DEFAULTS, T5LayerNorm
from lsg_text.argtypes import FINITE_FLOAT, POSITIVE_INT, PROBABILITY, bool_flag, float_range, int_range
from lsg_text.errors import ConfigError

logger = logging.getLogger(__name__)


def product_mode(value: str) -> str:
    """argparse type of --ssm-kernel-product: one of ``ops.ssm.PRODUCT_MODES``."""
    try:
        check_kernel_product(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


# Every model hyper-parameter: (flag, type, help). Defaults live in the arch functions only.
LOCOST_ARGS = [
    ("--d-model", POSITIVE_INT, "model width d (= H, the number of SSM channels)"),
    ("--d-state", int_range(2), "real SSM state size N per channel (stored as N/2 complex modes; released: 512)"),
    ("--d-ff", POSITIVE_INT, "inner size of the gated-GeLU feed-forward blocks"),
    ("--d-kv", POSITIVE_INT, "size of one decoder attention head (heads x d_kv may differ from d_model)"),
    ("--encoder-layers", POSITIVE_INT, "number of LOCOST (SSM) encoder layers"),
    ("--decoder-layers", POSITIVE_INT, "number of T5 decoder layers"),
    ("--decoder-attention-heads", POSITIVE_INT, "number of decoder attention heads"),
    (  # RMSNorm divides by sqrt(mean(x^2) + eps): an eps near the mean square (~1) stops normalizing
        "--layer-norm-eps",
        float_range(0, 1, lo_open=True, hi_open=True),
        "RMSNorm epsilon (T5's: 1e-6); below 1",
    ),
    ("--relative-attention-num-buckets", int_range(4), "T5 relative position buckets (decoder self-attention)"),
    (
        "--relative-attention-max-distance",
        POSITIVE_INT,
        "distance beyond which relative positions share the last bucket",
    ),
    ("--dropout", PROBABILITY, "dropout on embeddings, residual branches, FFN inner activations and attention weights"),
    ("--ssm-dt-min", float_range(0, lo_open=True), "lower bound of the log-uniform init of the SSM step size dt"),
    ("--ssm-dt-max", float_range(0, lo_open=True), "upper bound of the log-uniform init of the SSM step size dt"),
    (
        "--ssm-lr",
        FINITE_FLOAT,
        "learning rate of the SSM parameters (log_dt, inv_A_real, A_imag, B, C); <= 0: same "
        "as --lr. Applied as a ratio to --lr, so it follows the lr schedule; needs "
        "--optimizer grouped_adam (the SSM parameters never get weight decay there)",
    ),
    (
        "--ssm-kernel-cache-mb",
        float_range(0),
        "per-layer memory budget (MiB) for caching the SSM kernels in eval "
        "mode without autograd: on CPU in the time domain (each channel cut at "
        "its decay length, shortest kernels first; the rest are generated in "
        "every call), on a GPU as spectra, one per FFT size (least recently "
        "used out). Default: 30 on CPU, 512 on a GPU (a base layer's spectrum "
        "at 64K tokens); what they take: benchmarks/README.md. 0 disables",
    ),
    (
        "--ssm-kernel-tail-tol",
        float_range(0),
        "SSM kernel entries after every mode's term has decayed below this are "
        "zero instead of computed (cost O(l_max) not O(L) on long inputs); "
        "0 computes every entry like the reference",
    ),
    (
        "--ssm-kernel-recompute",
        bool_flag,
        "training: keep only what the SSM kernel's backward needs to recompute, not its "
        "temporaries (a fraction of the memory; the eager generator's backward is written "
        "out, one blocked product; --ssm-kernel-compile's reruns under a checkpoint)",
    ),
    (
        "--ssm-kernel-compile",
        bool_flag,
        "GPU (whole-tensor) path: generate the SSM kernels with the fused, "
        "torch.compile'd generator (ops.ssm.fused_circular_kernel; one compile per "
        "FFT size, four sizes per octave of length: ops.ssm.compiled_fft_len) instead of eagerly",
    ),
    (
        "--ssm-kernel-product",
        product_mode,
        "with --ssm-kernel-compile, training in --fp16/--bf16/--amp: the precision of the kernel "
        "generator's matrix product, fp32 (default), tf32 or bf16 (a GPU's matrix units; errors "
        "against the exact kernel bounded by ops.ssm.PRODUCT_BOUNDS); float32 training and inference "
        "always use fp32",
    ),
    ("--max-source-positions", POSITIVE_INT, "longest source the task feeds (the encoder itself has no limit)"),
    ("--max-target-positions", POSITIVE_INT, "longest target / generation length"),
]


def locost_arg_ranges() -> dict:
    """{argument name: its declared range} (:class:`lsg_text.argtypes.Range`), for values that do not
    come through argparse (the converter checks an HF config's values with them)."""
    return {flag[2:].replace("-", "_"): typ for flag, typ, _ in LOCOST_ARGS if hasattr(typ, "problem")}


def check_locost_args(args) -> None:
    """At build time, what no single flag's range can say (each range is checked where the value
    arrives: argparse for flags, the converter for an HF config); messages name the flags."""
    flags = {
        "d_state": "--d-state",
        "dt_min": "--ssm-dt-min",
        "dt_max": "--ssm-dt-max",
        "kernel_product": "--ssm-kernel-product",
        "kernel_compile": "--ssm-kernel-compile True",
    }
    product, compiled = getattr(args, "ssm_kernel_product", "fp32"), getattr(args, "ssm_kernel_compile", False)
    try:
        check_ssm_config(args.d_state, args.ssm_dt_min, args.ssm_dt_max, name=flags.get)
        check_kernel_product(product, bool_flag(compiled), name=flags.get)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # the decoder's buckets: half are exact offsets, the rest log-spaced from there to the distance,
    # log(distance / exact) their divisor (0 or negative: buckets out of range, an IndexError in the
    # first step with a target longer than the exact half)
    buckets, distance = args.relative_attention_num_buckets, args.relative_attention_max_distance
    if distance <= buckets // 2:
        raise ConfigError(
            f"--relative-attention-max-distance {distance} must exceed half of --relative-attention-num-buckets "
            f"{buckets} ({buckets // 2}: the exact offsets; the other buckets are log-spaced up to the distance)"
        )


class LOCOSTEncoder(FairseqEncoder):
    """Embedding (no positions) -> SSM blocks -> RMSNorm. Output: fairseq's dict-of-lists contract."""

    beam_size = 1  # hypotheses per source during beam search (LOCOSTModel.set_beam_size)

    def __init__(self, args, dictionary, embed_tokens, ssm_lr_scale: float = 1.0):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.embed_tokens = embed_tokens
        self.dropout = LeanDropout(args.dropout)
        self.max_source_positions = args.max_source_positions
        blocks = []
        for _ in range(args.encoder_layers):
            block = LOCOSTEncoderBlock(
                args.d_model,
                args.d_state,
                args.d_ff,
                args.dropout,
                args.layer_norm_eps,
                dt_min=args.ssm_dt_min,
                dt_max=args.ssm_dt_max,
                kernel_cache_mb=args.ssm_kernel_cache_mb,
                kernel_tail_tol=args.ssm_kernel_tail_tol,
                kernel_recompute=bool_flag(getattr(args, "ssm_kernel_recompute", True)),
                lr_scale=ssm_lr_scale,
                kernel_compile=bool_flag(getattr(args, "ssm_kernel_compile", False)),
                kernel_product=getattr(args, "ssm_kernel_product", "fp32"),
            )
            blocks.append(wrap_layer(block, args))
        self.block = nn.ModuleList(blocks)
        self.final_layer_norm = T5LayerNorm(args.d_model, args.layer_norm_eps)

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None):
        padding_mask = src_tokens.eq(self.padding_idx)  # (B L) True at pads
        emb = self.embed_tokens(src_tokens) if token_embeddings is None else token_embeddings  # (B L C)
        x = self.dropout(emb)
        # skip the masking multiply when nothing is padded (outputs are identical)
        mask = padding_mask if padding_mask.any() else None
        states = []
        for block in self.block:
            x = block(x, mask)
            if return_all_hiddens:
                states.append(x.transpose(0, 1))  # (L B C)
        x = self.dropout(self.final_layer_norm(x))
        if src_lengths is None:
            src_lengths = (~padding_mask).sum(1)
        return {
            "encoder_out": [x.transpose(0, 1)],  # (L B C)
            "encoder_padding_mask": [padding_mask],  # (B L)
            "encoder_embedding": [emb],  # (B L C)
            "encoder_states": states,
            "src_tokens": [],
            "src_lengths": [src_lengths.view(-1, 1)],  # (B 1)
        }

    def reorder_encoder_out(self, encoder_out, new_order):
        if self.beam_size > 1:
            # beamable cross-attention: the output stays one row per source
            return encoder_out

        def sel(items, dim):
            return [t.index_select(dim, new_order) for t in items]

        return {
            "encoder_out": sel(encoder_out["encoder_out"], 1),
            "encoder_padding_mask": sel(encoder_out["encoder_padding_mask"], 0),
            "encoder_embedding": sel(encoder_out["encoder_embedding"], 0),
            "encoder_states": sel(encoder_out["encoder_states"], 1),
            "src_tokens": sel(encoder_out["src_tokens"], 0),
            "src_lengths": sel(encoder_out["src_lengths"], 0),
        }

    def max_positions(self):
        return self.max_source_positions


class LOCOSTDecoder(FairseqIncrementalDecoder):
    """T5 v1.1 decoder with fairseq incremental decoding; start symbol handling in the docstring above."""

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        self.embed_tokens = embed_tokens
        self.start_index = dictionary.bos()
        self.eos_index = dictionary.eos()
        self.d_model = args.d_model
        self.dropout = LeanDropout(args.dropout)
        self.max_target_positions = args.max_target_positions
        blocks = []
        for i in range(args.decoder_layers):
            block = T5DecoderBlock(
                args.d_model,
                args.d_kv,
                args.decoder_attention_heads,
                args.d_ff,
                args.dropout,
                args.layer_norm_eps,
                has_relative_attention_bias=(i == 0),
                relative_attention_num_buckets=args.relative_attention_num_buckets,
                relative_attention_max_distance=args.relative_attention_max_distance,
            )
            blocks.append(wrap_layer(block, args))
        self.block = nn.ModuleList(blocks)
        self.final_layer_norm = T5LayerNorm(args.d_model, args.layer_norm_eps)
        self.output_projection = nn.Linear(args.d_model, len(dictionary), bias=False)
        self.output_projection.weight = embed_tokens.weight  # tied, as T5 (tie_word_embeddings)

    def _first_self_attention(self):
        # fairseq's checkpoint_wrapper patches forward in place, so the block keeps its submodules
        return self.block[0].layer[0].SelfAttention

    def forward(
        self,
        prev_output_tokens,
        encoder_out=None,
        incremental_state=None,
        features_only=False,
        full_context_alignment=False,
        alignment_layer=None,
        alignment_heads=None,
        src_lengths=None,
        return_all_hiddens=False,
    ):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        rel = self._first_self_attention()
        offset = rel.cached_length(incremental_state)  # decoder positions already processed
        tokens = prev_output_tokens
        if incremental_state is not None:
            tokens = tokens[:, offset:]  # (B T): the new positions only (fairseq passes the prefix)
        if offset == 0:
            # fairseq starts decoding with </s>; T5 starts from its own start embedding (see module doc)
            first = tokens[:, :1]
            tokens = torch.cat([first.masked_fill(first.eq(self.eos_index), self.start_index), tokens[:, 1:]], 1)
        x = self.dropout(self.embed_tokens(tokens))  # (B T C)
        T = x.size(1)
        S = offset + T
        pos_bias = rel.compute_bias(T, S, q_offset=offset, device=x.device).float()  # (1 heads T S)
        q_pos = torch.arange(offset, S, device=x.device)[:, None]  # (T 1)
        k_pos = torch.arange(S, device=x.device)[None, :]  # (1 S)
        neg = torch.finfo(torch.float32).min
        self_bias = pos_bias.masked_fill(k_pos > q_pos, neg)  # (1 heads T S): causal

        memory, cross_bias = None, None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            memory = encoder_out["encoder_out"][0].transpose(0, 1)  # (B S_enc C)
            enc_pad = encoder_out["encoder_padding_mask"]
            # the mask only at the first step: later steps' cross-attentions read the bias they
            # cached, and the check would read the device at every step
            if offset == 0 and len(enc_pad) > 0 and enc_pad[0].any():
                cross_bias = torch.zeros(enc_pad[0].shape, device=x.device, dtype=torch.float32)
                cross_bias = cross_bias.masked_fill(enc_pad[0], neg)[:, None, None, :]  # (B 1 1 S_enc)
        inner_states = [x]
        for block in self.block:
            x = block(x, memory, self_bias, cross_bias, incremental_state)
            inner_states.append(x)
        x = self.dropout(self.final_layer_norm(x))
        return x, {"attn": [None], "inner_states": inner_states}

    def output_layer(self, features):
        # tied projection with T5's rescaling (absent it, logits are ~d^0.5 too large)
        return self.output_projection(features * (self.d_model**-0.5))

    def max_positions(self):
        return self.max_target_positions


@register_model("locost")
class LOCOSTModel(VocabularyCheckedLoad, FairseqEncoderDecoderModel):
    """LOCOST encoder-decoder. See the module docstring for token conventions."""

    # The token convention, read by the summarization task: T5's, no <s> on the source or target.
    prepend_bos = False

    @staticmethod
    def add_args(parser):
        for flag, typ, help_text in LOCOST_ARGS:
            metavar = (
                "BOOL" if typ is bool_flag else "N" if str(getattr(typ, "__name__", "")).startswith("int") else "F"
            )
            parser.add_argument(flag, type=typ, metavar=metavar, help=help_text)
        parser.add_argument(
            "--checkpoint-activations",
            action="store_true",
            help="recompute each encoder / decoder block in the backward pass (saves memory)",
        )
        parser.add_argument(
            "--offload-activations",
            action="store_true",
            help="with --checkpoint-activations, keep checkpointed activations on the CPU",
        )

    @classmethod
    def build_model(cls, args, task):
        locost_base_architecture(args)
        check_locost_args(args)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        if src_dict != tgt_dict:
            raise ConfigError(
                "locost shares one embedding between encoder, decoder and output (T5's `shared`): source "
                "and target dictionaries must be identical (preprocess with --joined-dictionary or use "
                "the converter's dict.txt for both sides)"
            )
        embed_tokens = nn.Embedding(len(src_dict), args.d_model)  # no padding_idx: T5 trains every row
        nn.init.normal_(embed_tokens.weight, mean=0.0, std=1.0)  # T5 init of `shared`
        encoder = LOCOSTEncoder(args, src_dict, embed_tokens, ssm_lr_scale=cls._ssm_lr_scale(args))
        decoder = LOCOSTDecoder(args, tgt_dict, embed_tokens)
        model = cls(encoder, decoder)
        model._init_ffn_weights(args)
        return model

    def _init_ffn_weights(self, args):
        # T5's _init_weights for the gated FFN (factor 1): wi ~ N(0, d^-1/2), wo ~ N(0, d_ff^-1/2)
        for name, p in self.named_parameters():
            if ".DenseReluDense.wi_" in name:
                nn.init.normal_(p, std=args.d_model**-0.5)
            elif ".DenseReluDense.wo" in name:
                nn.init.normal_(p, std=args.d_ff**-0.5)

    # fairseq-hydra-train hands the model its own config group only, without the learning rate and
    # the optimizer fairseq-train's flat namespace holds: the config names them by interpolation
    HYDRA_SSM_LR = "lr: ${optimization.lr}", "optimizer: ${optimizer._name}"

    @classmethod
    def _ssm_lr_scale(cls, args) -> float:
        ssm_lr = float(getattr(args, "ssm_lr", 0.0) or 0.0)
        if ssm_lr > 0 and OmegaConf.is_config(args) and not ("lr" in args and "optimizer" in args):
            raise ConfigError(
                f"model.ssm_lr {ssm_lr}: the model config does not hold the learning rate and optimizer it is "
                f"set against under fairseq-hydra-train; add to it: {' and '.join(cls.HYDRA_SSM_LR)}"
            )
        optimizer = getattr(args, "optimizer", None)
        honours_tags = optimizer in (None, "grouped_adam", "composite")
        if ssm_lr > 0 and not honours_tags:
            raise ConfigError(
                f"--ssm-lr needs --optimizer grouped_adam (--optimizer {optimizer} puts every "
                "parameter in one group and would ignore it)"
            )
        if not honours_tags and float(getattr(args, "weight_decay", 0.0) or 0.0) > 0:
            logger.warning(
                f"--optimizer {optimizer} applies --weight-decay to the SSM parameters too; "
                "--optimizer grouped_adam exempts them (as the LOCOST/S4 authors intended)"
            )
        lr = getattr(args, "lr", None)
        base = float(lr[0] if isinstance(lr, (list, tuple)) or OmegaConf.is_list(lr) else lr) if lr is not None else 0.0
        if ssm_lr <= 0:
            return 1.0
        if base <= 0:
            raise ConfigError(f"--ssm-lr {ssm_lr} needs a positive --lr to scale against")
        return ssm_lr / base

    def max_positions(self):
        return (self.encoder.max_positions(), self.decoder.max_positions())

    def set_beam_size(self, beam: int) -> None:
        """Called by fairseq's SequenceGenerator for beam > 1: keep the encoder output (and the
        cross-attention keys / values each decoder layer caches from it) at one row per source
        instead of tiling it beam times; on long inputs those caches dominate generation memory.

        A plain attribute (``encoder.beam_size``), not an instance override of a method:
        ``set_beam_size(1)`` undoes it, and :class:`~lsg_fairseq.generation.LongInputSequenceGenerator`
        restores it after each call. Cross-attention itself decides from tensor shapes alone
        (query rows = beam x memory rows), so teacher-forced forwards never depend on it.
        """
        self.encoder.beam_size = beam


def _defaults(args, **values):
    for k, v in values.items():
        setattr(args, k, getattr(args, k, v))


@register_model_architecture("locost", "locost_base")
def locost_base_architecture(args):
    """The released LOCOST (flbbb/locost-gsg-pretrained): 12+12 layers, d 768, N 512."""
    _defaults(
        args,
        d_model=768,
        d_state=512,
        d_ff=2048,
        d_kv=64,
        encoder_layers=12,
        decoder_layers=12,
        decoder_attention_heads=12,
        **T5_DEFAULTS,  # layer_norm_eps, relative attention buckets and distance, dropout
        ssm_dt_min=DT_MIN,
        ssm_dt_max=DT_MAX,
        ssm_lr=0.0,
        ssm_kernel_cache_mb=None,
        ssm_kernel_tail_tol=KERNEL_TAIL_TOL,
        ssm_kernel_recompute=True,
        ssm_kernel_compile=False,
        ssm_kernel_product="fp32",
        max_source_positions=4096,
        max_target_positions=1024,
        checkpoint_activations=False,
        offload_activations=False,
    )


@register_model_architecture("locost", "locost_tiny")
def locost_tiny_architecture(args):
    """Tiny LOCOST for tests and demos (the conformance fixture's shape)."""
    _defaults(
        args, d_model=64, d_state=32, d_ff=128, d_kv=16, encoder_layers=2, decoder_layers=2, decoder_attention_heads=4
    )
    locost_base_architecture(args)
