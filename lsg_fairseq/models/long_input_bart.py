"""The BART model the long-input models subclass (LSG-BART, LED, ``plain_bart``): its hub loads long
inputs without truncating them, its from-scratch weights follow ``--weight-init``
(:mod:`~lsg_fairseq.models.weight_init`) and its decoder cross-attends to long sources
(:mod:`~lsg_fairseq.models.long_source_decoder`). The encoder each subclass builds is a
:class:`~lsg_fairseq.models.custom_encoder.LongInputEncoder`."""

from fairseq import utils
from fairseq.models.bart import BARTModel
from fairseq.models.transformer import TransformerConfig

from lsg_fairseq.models import hub
from lsg_fairseq.models.long_source_decoder import LongSourceDecoder
from lsg_fairseq.models.vocabulary_fit import VocabularyCheckedLoad
from lsg_fairseq.models.weight_init import add_weight_init_arg, init_weights
from lsg_text.argtypes import POSITIVE_INT, PROBABILITY
from lsg_text.errors import ConfigError


def check_bart_args(args, task) -> None:
    """Refuse, naming the flags, what fairseq's BART would refuse only with a traceback at build time
    (a ValueError or assert) or not at all (a dropout of 1.5 fails in the first forward, -0.5 turns
    dropout off without a word). The LSG and LED flags are checked by their own models."""
    # relu_dropout: fairseq's older name of activation_dropout; layerdrop 1.5 trained without a word
    for flag in (
        "dropout",
        "attention_dropout",
        "activation_dropout",
        "relu_dropout",
        "encoder_layerdrop",
        "decoder_layerdrop",
    ):
        value = float(getattr(args, flag, None) or 0.0)
        problem = PROBABILITY.problem(value)  # the range of LOCOST's --dropout
        if problem:
            raise ConfigError(f"--{flag.replace('_', '-')} {value}: {problem}")
    for side in ("encoder", "decoder"):
        for size in ("embed_dim", "ffn_embed_dim"):  # 0: a ZeroDivisionError in the weights' init
            value = getattr(args, f"{side}_{size}", None)
            problem = None if value is None else POSITIVE_INT.problem(value)
            if problem:
                raise ConfigError(f"--{side}-{size.replace('_', '-')} {value}: {problem}")
        dim, heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
        if heads < 1 or dim % heads:
            raise ConfigError(
                f"--{side}-attention-heads {heads} must divide --{side}-embed-dim {dim} (each head takes dim/heads)"
            )
    cutoff = getattr(args, "adaptive_softmax_cutoff", None)
    if cutoff:
        cutoff = ",".join(map(str, cutoff)) if isinstance(cutoff, (list, tuple)) else cutoff
        # trains only with --criterion adaptive_loss and --ddp-backend legacy_ddp, and then does not
        # load back: fairseq's decoder adds the output projection to the state it reads ("Unexpected
        # key(s)"); HF's BART classes have no adaptive softmax either (the exporter refuses it)
        raise ConfigError(
            f"--adaptive-softmax-cutoff {cutoff}: not supported by "
            f"{getattr(args, 'arch', 'this model')} (fairseq cannot load the checkpoint it would train back for "
            "generation, nor does HF's BART hold one); drop it, the output layer is the shared embedding"
        )
    for flag in ("adaptive_input", "tie_adaptive_weights", "tie_adaptive_proj"):
        if getattr(args, flag, False):  # parsed from the transformer's flags, read by none of BART's modules
            raise ConfigError(
                f"--{flag.replace('_', '-')}: {getattr(args, 'arch', 'this model')} has no adaptive input or "
                "softmax (fairseq's are a language model's; BART's embedding is one table, shared with its output "
                "layer), so the flag would change nothing; drop it"
            )
    noise = float(getattr(args, "quant_noise_scalar", 0) or 0)
    if noise > 0:  # fairseq swaps modules by exact class: KeyError on LearnedPositionalEmbedding, model built
        raise ConfigError(
            f"--quant-noise-scalar {noise:g}: fairseq's scalar quantization noise has no int8 form of BART's learned "
            "positional embeddings and fails on them; not supported (for int8 inference of a trained model: "
            "lsg-fairseq-summarize --quantize int8)"
        )
    out_dim = getattr(args, "decoder_output_dim", None)
    if out_dim is not None and out_dim != args.decoder_embed_dim:  # the first forward's shape RuntimeError
        raise ConfigError(
            f"--decoder-output-dim {out_dim} differs from --decoder-embed-dim {args.decoder_embed_dim}: "
            f"{getattr(args, 'arch', 'the model')}'s output layer is its embedding, {args.decoder_embed_dim} wide"
        )
    for side in ("encoder", "decoder"):  # fairseq's pruning: "'list' object has no attribute 'split'"
        if getattr(args, f"{side}_layers_to_keep", None):
            raise ConfigError(
                f"--{side}-layers-to-keep: fairseq 0.12's layer pruning fails on this model's arguments (its "
                "parser gives a list where the pruning splits a string); not supported"
            )
    if not getattr(args, "share_all_embeddings", False):
        return
    if args.encoder_embed_dim != args.decoder_embed_dim:
        raise ConfigError(
            f"--decoder-embed-dim {args.decoder_embed_dim} differs from --encoder-embed-dim {args.encoder_embed_dim}: "
            f"{getattr(args, 'arch', 'the model')} shares one embedding between encoder, decoder and output, so they "
            "must be equal"
        )
    if task.source_dictionary != task.target_dictionary:
        cfg = task.cfg
        data = utils.split_paths(cfg.data)[0] if getattr(cfg, "data", None) else "the data folder"
        src, tgt = getattr(cfg, "source_lang", None) or "SRC", getattr(cfg, "target_lang", None) or "TGT"
        raise ConfigError(
            f"{data}: dict.{src}.txt ({len(task.source_dictionary)} symbols) and dict.{tgt}.txt "
            f"({len(task.target_dictionary)}) differ, but {getattr(args, 'arch', 'the model')} shares one "
            "embedding between encoder, decoder and output: binarize with fairseq-preprocess --joined-dictionary, or "
            "scripts/preprocess.sh --dict DICT (one dict.txt for both sides)"
        )


class LongInputBARTModel(VocabularyCheckedLoad, BARTModel):
    """BART subclass whose hub loads long-input models without truncating them, whose
    from-scratch weights follow ``--weight-init``, whose decoder cross-attends to long sources
    without materialising the attention probabilities (``long_source_decoder``), and which refuses
    a checkpoint of another vocabulary in one line (``vocabulary_fit``)."""

    long_source_decoder = True

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        if not cls.long_source_decoder:
            return super().build_decoder(args, tgt_dict, embed_tokens)
        cfg = TransformerConfig.from_namespace(args)
        return LongSourceDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    @staticmethod
    def add_args(parser):
        BARTModel.add_args(parser)
        add_weight_init_arg(parser)

    @classmethod
    def build_model(cls, args, task):
        check_bart_args(args, task)
        model = super().build_model(args, task)
        init_weights(model, args)
        return model

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", bpe=None, **kwargs):
        """Load through :func:`lsg_fairseq.models.hub.from_pretrained` (no 1,024-token truncation).

        The dictionary and tokenizer files are read from the model folder itself (what
        ``lsg-fairseq-convert`` writes); ``bpe`` overrides the detected tokenizer.
        """
        if data_name_or_path not in (".", None):
            raise ValueError(f"{cls.__name__} hub models read dict.txt from the model folder itself")
        if bpe is not None:
            kwargs["bpe"] = bpe
        return hub.from_pretrained(model_name_or_path, checkpoint_file=checkpoint_file, **kwargs)
