"""``--weight-init``: how a model trained from scratch starts (loaded weights replace either)."""

import math

import torch.nn as nn

WEIGHT_INITS = ("bert", "fan_in")


def fan_in_init(module: nn.Module) -> None:
    """N(0, 1/fan_in) weights: Linear N(0, 1/sqrt(in_features)), Embedding N(0, 1/sqrt(dim)).

    BART's own init (``init_bert_params``) draws every weight from N(0, 0.02), a scale chosen for
    d = 768-1024. At d = 64 that is 6x below 1/sqrt(d), and cross-attention's signal passes
    through four such matrices (W_q W_k for where to look, W_v W_o for what to carry), so a small
    model trained from scratch sits for hundreds of updates on a plateau where the decoder has
    learned the summaries' template and ignores the encoder (examples/long_context/README.md).
    """
    if isinstance(module, nn.Linear):
        module.weight.data.normal_(0.0, 1.0 / math.sqrt(module.in_features))
        if module.bias is not None:
            module.bias.data.zero_()
    elif isinstance(module, nn.Embedding):
        module.weight.data.normal_(0.0, 1.0 / math.sqrt(module.embedding_dim))
        if module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()


def add_weight_init_arg(parser) -> None:
    parser.add_argument(
        "--weight-init",
        choices=WEIGHT_INITS,
        metavar="|".join(WEIGHT_INITS),
        help="initial weights of a model trained from scratch: bert = BART's N(0, 0.02), "
        "fan_in = N(0, 1/fan_in) (default for the *_tiny archs: 0.02 is too small at "
        "small widths and stalls learning to use the encoder). Loaded weights replace either.",
    )


def init_weights(model: nn.Module, args) -> None:
    """Apply ``args.weight_init`` (default bert) to a model fairseq has just built."""
    init = getattr(args, "weight_init", None) or "bert"
    if init not in WEIGHT_INITS:
        raise ValueError(f"--weight-init {init!r}: choose from {', '.join(WEIGHT_INITS)}")
    if init == "fan_in":  # BARTModel.__init__ has applied init_bert_params; draw again
        model.apply(fan_in_init)
