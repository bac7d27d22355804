"""The one generator this plugin's tasks build: beam state owned by the generator, n-gram blocking fixed.

1. Beam size sticks after generation (fairseq#3893): ``SequenceGenerator.__init__`` calls
   ``model.set_beam_size(beam)``, which makes BART's cross-attention fold keys by beam and turns
   the encoder's ``reorder_encoder_out`` into a no-op (an instance attribute). Later
   teacher-forced forwards then crash (odd batch) or silently attend to another example's encoder
   states (even batch). :class:`LongInputSequenceGenerator` leaves every model as it found it:
   its constructor undoes what ``SequenceGenerator.__init__`` set, and each generation call sets
   the beam size on the models and restores their previous state in a ``try/finally``. No other
   module touches beam state.
2. ``--no-repeat-ngram-size`` does nothing on CPU (fairseq#5206): the pure-PyTorch fallback of
   ``NGramRepeatBlock`` compares the *last* n-1 slots of the whole pad-filled token buffer instead
   of the n-1 tokens generated so far. :class:`NGramRepeatBlockFixed` checks
   ``tokens[:, step+2-n : step+1]`` and is vectorised (no per-hypothesis Python loop); the
   generator uses it wherever fairseq's CUDA kernel is not used.

The tasks' ``build_generator`` passes this class to fairseq's, so ``fairseq-generate``,
``--eval-rouge``, the hub and ``lsg-fairseq-summarize`` all generate through it.
"""

import math

import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator

from lsg_text.errors import ConfigError


class NGramRepeatBlockFixed(NGramRepeatBlock):
    """``NGramRepeatBlock`` whose CPU path bans repeated n-grams of the tokens generated so far."""

    def _no_repeat_ngram(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        n = self.no_repeat_ngram_size
        if step + 2 - n <= 0:  # no complete earlier n-gram yet: nothing can repeat
            return lprobs
        history = tokens[:, : step + 1]  # (BB, step+1): start symbol + generated tokens
        windows = history.unfold(1, n, 1)  # (BB, W, n), W = step + 2 - n
        prefix = history[:, step + 2 - n :]  # (BB, n-1): the n-1 most recent tokens
        matched = (windows[:, :, :-1] == prefix.unsqueeze(1)).all(dim=-1)  # (BB, W)
        banned = torch.zeros(lprobs.shape, dtype=torch.long, device=lprobs.device)
        # scatter_add (not scatter) because one token may be banned by several windows
        banned.scatter_add_(1, windows[:, :, -1], matched.long())
        return lprobs.masked_fill_(banned > 0, -math.inf)


# What set_beam_size changes, per module: MultiheadAttention.beam_size (BART, LSG, LED),
# LOCOSTEncoder.beam_size, and BART's instance-level no-op encoder.reorder_encoder_out.
_BEAM_ATTRIBUTES = ("beam_size", "reorder_encoder_out")
_ABSENT = object()


def _beam_state(models):
    """The instance values of the beam attributes of every module of ``models``."""
    return [
        (module, name, module.__dict__.get(name, _ABSENT))
        for model in models
        for module in model.modules()
        for name in _BEAM_ATTRIBUTES
    ]


def _restore(state) -> None:
    # Written to __dict__ directly: these are plain attributes (never parameters or submodules),
    # and an attribute that was absent must be removed, not set, so the class's method shows again.
    for module, name, value in state:
        if value is _ABSENT:
            module.__dict__.pop(name, None)
        else:
            module.__dict__[name] = value


class LongInputSequenceGenerator(SequenceGenerator):
    """fairseq's ``SequenceGenerator`` that sets the beam size on the models for the duration of
    each generation call only (fairseq#3893), with the fixed CPU n-gram blocker (fairseq#5206)."""

    def __init__(self, models, tgt_dict, **kwargs):
        members = models.models if isinstance(models, EnsembleModel) else models
        before = _beam_state(members)
        try:
            super().__init__(models, tgt_dict, **kwargs)  # calls set_beam_size(beam) on every model
        finally:
            _restore(before)
        blocker = self.repeat_ngram_blocker
        if blocker is not None and not blocker.use_extension:
            self.repeat_ngram_blocker = NGramRepeatBlockFixed(blocker.no_repeat_ngram_size)
        # fairseq asserts it in every call, against the decoder's positions as well as --max-len-b
        if self.min_len > self.max_len - 1:
            raise ConfigError(
                f"--min-len {self.min_len} (or --eval-rouge-args' min_len): the model writes at most "
                f"{self.max_len - 1} target tokens (its target positions)"
            )

    def _generate(self, sample, *args, **kwargs):
        # generate() and forward() both end here
        if self.match_source_len:  # fairseq's IndexError past the decoder's positions (a long source's length)
            longest = int(sample["net_input"]["src_lengths"].max())
            if longest > self.max_len - 1:
                raise ConfigError(
                    f"--match-source-len: a source of {longest} tokens asks for as many target tokens; the model "
                    f"writes at most {self.max_len - 1} (drop the flag)"
                )
        before = _beam_state(self.model.models)
        try:
            # the generator's own beam: SequenceGenerator caps it at the vocabulary size - 1, and a
            # larger set_beam_size would fold cross-attention keys by a beam that never exists
            self.model.set_decoder_beam_size(self.beam_size)
            return super()._generate(sample, *args, **kwargs)
        finally:
            _restore(before)
