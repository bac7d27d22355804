"""Declared ranges of the plugin's settings, each checked in one place: where the value arrives.

A :class:`Range` is both argparse's ``type=`` (so ``--block-size 0`` fails where fairseq or our
own command parses it, with argparse's one line ``prog: error: argument --block-size: must be an
integer >= 1, got '0'``, instead of deep in a model build) and, through :meth:`Range.problem`, the
check of a value that arrives already typed: a JSON option (``--eval-rouge-args``) or a
checkpoint's cfg. Every numeric flag of the plugin uses one of these.
"""

import argparse
import ast
import math
from typing import Optional


class Range:
    """Numbers ``lo <= x <= hi`` (either bound may be open or absent); ints only with ``integer``."""

    def __init__(self, integer: bool, lo=None, hi=None, lo_open: bool = False, hi_open: bool = False):
        self.integer, self.lo, self.hi, self.lo_open, self.hi_open = integer, lo, hi, lo_open, hi_open
        self.kind = "an integer" if integer else "a number"
        if lo is None and hi is None:
            bounds = ""
        elif hi is None:
            bounds = f" {'>' if lo_open else '>='} {lo}"
        elif lo is None:
            bounds = f" {'<' if hi_open else '<='} {hi}"
        else:
            bounds = f" in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        self.expected = self.kind + bounds  # "an integer >= 1", "a number in [0, 1)"
        self.__name__ = ("int" if integer else "float") + bounds  # argparse names the type in some messages

    def problem(self, value) -> Optional[str]:
        """What is wrong with an already typed ``value`` (``"must be an integer >= 1"``), or None."""
        if self.integer:
            typed = isinstance(value, int) and not isinstance(value, bool)
        else:
            typed = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not typed:
            return f"must be {self.kind}"
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return f"must be {self.expected}"
        if self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi):
            return f"must be {self.expected}"
        return None

    def __call__(self, text):
        """argparse ``type=``: text -> number, or argparse's refusal naming the range."""
        try:
            value = int(text) if self.integer else float(text)
        except (TypeError, ValueError):
            value = None
        if value is None or self.problem(value):
            raise argparse.ArgumentTypeError(f"must be {self.expected}, got {text!r}")
        return value


def int_range(lo: Optional[int] = None, hi: Optional[int] = None) -> Range:
    """An int ``lo <= x (<= hi)``."""
    return Range(True, lo, hi)


def float_range(
    lo: Optional[float] = None, hi: Optional[float] = None, lo_open: bool = False, hi_open: bool = False
) -> Range:
    """A finite float ``lo <= x (<= hi)`` (``lo < x`` with ``lo_open``, ``x < hi`` with ``hi_open``)."""
    return Range(False, lo, hi, lo_open, hi_open)


POSITIVE_INT = int_range(1)
NON_NEGATIVE_INT = int_range(0)
# sentencepiece takes its counts as C ints and its seed as an unsigned one, torch a seed as a signed
# 64-bit int: beyond these, their own errors name no flag (or a traceback)
C_INT_MAX = 2**31 - 1
SPM_SEED = int_range(0, 2**32 - 1)
TORCH_SEED = int_range(0, 2**63 - 1)
FINITE_FLOAT = float_range()  # any finite number (e.g. a learning rate where <= 0 means "same as --lr")
PROBABILITY = float_range(0, 1, hi_open=True)  # dropout: 1 would zero everything


def bool_flag(value) -> bool:
    """true/false, yes/no, on/off, 1/0 (any case) or a bool; anything else is an argparse error."""
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {value!r}")


class _Boolean:
    """A JSON true/false (a :class:`Range`-like check for :data:`GENERATION_SETTINGS`)."""

    __name__ = "bool"

    @staticmethod
    def problem(value) -> Optional[str]:
        return None if isinstance(value, bool) else "must be true or false"


class _BoolFlag:
    """What :func:`bool_flag` accepts (a :class:`Range`-like check for a value that does not come
    through argparse: a converted config's boolean field)."""

    __name__ = "bool"

    @staticmethod
    def problem(value) -> Optional[str]:
        try:
            bool_flag(value)
        except argparse.ArgumentTypeError:
            return "must be true or false"
        return None


BOOL_FLAG = _BoolFlag()


class OneOf:
    """One of ``values`` (a :class:`Range`-like check of a choice that does not come through argparse)."""

    __name__ = "choice"

    def __init__(self, values):
        self.values = tuple(values)

    def problem(self, value) -> Optional[str]:
        return None if value in self.values else f"must be one of {', '.join(map(str, self.values))}"


# fairseq's generation settings that our commands take (``--eval-rouge-args`` keys of the tasks,
# lsg-fairseq-summarize's flags), each with its range. fairseq divides scores by length ** lenpen:
# beyond ~100 a float overflows, hence [-10, 10]. -1 means "off" for the sampling and diversity ones.
GENERATION_SETTINGS = {
    "beam": POSITIVE_INT,
    "lenpen": float_range(-10, 10),
    "unkpen": FINITE_FLOAT,
    "max_len_a": float_range(0),
    "max_len_b": POSITIVE_INT,
    "min_len": NON_NEGATIVE_INT,
    "no_repeat_ngram_size": NON_NEGATIVE_INT,
    "temperature": float_range(0, lo_open=True),
    "sampling": _Boolean(),
    "sampling_topk": int_range(-1),
    "sampling_topp": float_range(-1, 1),
    "match_source_len": _Boolean(),
    "unnormalized": _Boolean(),
    "diverse_beam_groups": int_range(-1),
    "diverse_beam_strength": FINITE_FLOAT,
    "diversity_rate": float_range(-1),
}


def min_len_out_of_reach(min_len, max_len_a, max_len_b) -> bool:
    """The one rule across GENERATION_SETTINGS: with ``max_len_a`` 0 no summary is longer than
    ``max_len_b`` tokens, so a ``min_len`` above it cannot be met (fairseq's search then ends every
    hypothesis at its length limit, whatever the model says). None: not set, nothing to compare."""
    return min_len is not None and max_len_b is not None and not max_len_a and min_len > max_len_b


# fairseq's own settings of a run that out of range fail late or not at all, as (config group, field):
# range, checked by the plugin's tasks before any work (lsg_fairseq.tasks.run_settings). Late: a
# traceback after data and model are loaded (--update-freq 0, --log-interval 0, --seed -1,
# --warmup-updates -10, --nbest 0; --save-interval 0 at the end of an epoch). Not at all: a run that
# trains nothing, or wrongly, without a word (--lr -1 stops at once, --max-epoch -1 trains no epoch,
# --weight-decay -1 grows the weights, --label-smoothing 2). 0 keeps fairseq's meaning where it has
# one (no limit, no clipping, no periodic save). --lr and --update-freq are lists: each value.
RUN_SETTINGS = {  # fairseq-train, -generate, -interactive and -validate
    ("common", "seed"): int_range(0, 2**32 - 1),
    ("dataset", "max_tokens"): POSITIVE_INT,
    ("dataset", "batch_size"): POSITIVE_INT,
    ("dataset", "num_workers"): NON_NEGATIVE_INT,
    ("dataset", "required_seq_len_multiple"): POSITIVE_INT,  # 0: a ZeroDivisionError in the first batch
}
TRAINING_SETTINGS = {
    **RUN_SETTINGS,
    ("optimization", "lr"): float_range(0),
    ("optimization", "update_freq"): POSITIVE_INT,
    ("optimization", "max_update"): NON_NEGATIVE_INT,
    ("optimization", "max_epoch"): NON_NEGATIVE_INT,
    ("optimization", "clip_norm"): float_range(0),
    ("dataset", "batch_size_valid"): POSITIVE_INT,
    ("dataset", "max_tokens_valid"): POSITIVE_INT,
    ("dataset", "validate_interval"): POSITIVE_INT,
    ("dataset", "validate_interval_updates"): NON_NEGATIVE_INT,
    ("checkpoint", "save_interval"): POSITIVE_INT,
    ("checkpoint", "save_interval_updates"): NON_NEGATIVE_INT,
    # -1 is fairseq's "off" (keep every checkpoint, never stop early); below it read the same, silently
    ("checkpoint", "keep_interval_updates"): int_range(-1),
    ("checkpoint", "keep_last_epochs"): int_range(-1),
    ("checkpoint", "keep_best_checkpoints"): int_range(-1),
    ("checkpoint", "patience"): int_range(-1),
    ("common", "log_interval"): POSITIVE_INT,
    ("optimizer", "weight_decay"): float_range(0),
    ("optimizer", "adam_eps"): float_range(0, lo_open=True),
    ("optimizer", "momentum"): float_range(0, 1, hi_open=True),  # sgd's and nag's: 1 or more diverges, exit 0
    ("lr_scheduler", "warmup_updates"): NON_NEGATIVE_INT,
    # the learning rate a schedule decays to (polynomial_decay; cosine's and step's floor) and
    # polynomial_decay's exponent: below 0 the rate turns negative (gradient ascent) or grows as
    # the schedule ends, and the run diverges with exit 0
    ("lr_scheduler", "end_learning_rate"): float_range(0),
    ("lr_scheduler", "min_lr"): float_range(0),
    ("lr_scheduler", "power"): float_range(0, lo_open=True),
    ("criterion", "label_smoothing"): PROBABILITY,
    ("ema", "ema_decay"): float_range(0, 1),  # 1.5: the EMA diverges from the weights, exit 0
}
GENERATE_SETTINGS = {  # beside GENERATION_SETTINGS (the search's own)
    **RUN_SETTINGS,
    ("generation", "nbest"): POSITIVE_INT,
    ("dataset", "num_shards"): POSITIVE_INT,
    ("dataset", "shard_id"): NON_NEGATIVE_INT,
}


def python_literal(text: str):
    """``text`` read as a Python literal (what fairseq ``eval``s from a flag), or None if it is not one."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # literal_eval's own
        return None


def adam_betas_problem(text) -> Optional[str]:
    """What is wrong with fairseq's ``--adam-betas`` (a Python tuple as text, which fairseq
    ``eval``s when it builds the optimizer; a list once in the config), or None: two numbers in [0, 1)."""
    if isinstance(text, str):
        betas = python_literal(text)
    else:  # a sequence once in the config; a bare number is no pair
        try:
            betas = list(text)
        except TypeError:
            betas = None
    if not isinstance(betas, (tuple, list)) or len(betas) != 2 or any(PROBABILITY.problem(b) for b in betas):
        return "must be two numbers in [0, 1), e.g. '(0.9, 0.98)'"
    return None


# Their defaults where our commands set them, the one home of these values: the tasks'
# ``--eval-rouge-args`` (validation summaries) and lsg-fairseq-summarize's flags, so that a summary
# is made as validation makes it. min_len 1 (fairseq's own default): never an empty summary.
GENERATION_DEFAULTS = {"beam": 4, "lenpen": 1.0, "max_len_b": 256, "min_len": 1, "no_repeat_ngram_size": 3}
