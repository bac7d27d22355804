"""Fixes for two fairseq generation bugs that every plugin entry point shares.

1. ``--no-repeat-ngram-size`` does nothing on CPU (fairseq#5206): the pure-PyTorch fallback of
   ``NGramRepeatBlock`` compares the *last* n-1 slots of the whole pad-filled token buffer instead
   of the n-1 tokens generated so far. :class:`NGramRepeatBlockFixed` checks
   ``tokens[:, step+2-n : step+1]`` and is vectorised (no per-hypothesis Python loop).
2. Beam size sticks after generation (fairseq#3893): ``SequenceGenerator.__init__`` calls
   ``model.set_beam_size(beam)``, which makes BART's cross-attention fold keys by beam and turns
   the encoder's ``reorder_encoder_out`` into a no-op. Later teacher-forced forwards then crash
   (odd batch) or silently attend to another example's encoder states (even batch).
   :func:`reset_beam_size` undoes both; :func:`beam_size_scope` applies a beam size for the
   duration of one generation call only.
"""
import contextlib
import math

import torch
from fairseq.modules import MultiheadAttention
from fairseq.ngram_repeat_block import NGramRepeatBlock


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


def fix_ngram_blocker(generator) -> None:
    """Swap a generator's n-gram blocker for the fixed one when the CUDA extension is not used."""
    blocker = getattr(generator, "repeat_ngram_blocker", None)
    if blocker is not None and not blocker.use_extension:
        generator.repeat_ngram_blocker = NGramRepeatBlockFixed(blocker.no_repeat_ngram_size)


def reset_beam_size(model: torch.nn.Module) -> None:
    """Undo ``set_beam_size``: plain cross-attention and the encoder's own ``reorder_encoder_out``."""
    for module in model.modules():
        if isinstance(module, MultiheadAttention):
            module.beam_size = 1
        # BARTModel.set_beam_size stores the no-op as an *instance* attribute, shadowing the method
        module.__dict__.pop("reorder_encoder_out", None)


@contextlib.contextmanager
def beam_size_scope(models, beam: int):
    """Beamable cross-attention for one generation call, restored afterwards even on error."""
    try:
        if beam > 1:
            for m in models:
                if hasattr(m, "set_beam_size"):
                    m.set_beam_size(beam)
        yield
    finally:
        for m in models:
            reset_beam_size(m)
