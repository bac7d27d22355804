"""argparse ``type=`` functions with declared ranges, so a bad value is refused at parse time.

``--block-size 0`` then fails where fairseq (or our own command) parses it, with argparse's one
line ``prog: error: argument --block-size: must be an integer >= 1, got '0'``, instead of deep in a
model build. Every numeric flag of the plugin uses one of these.
"""
import argparse
import math
from typing import Optional


def _bounds(lo, hi, lo_open=False) -> str:
    if hi is None:
        return f"{'>' if lo_open else '>='} {lo}"
    return f"in {'(' if lo_open else '['}{lo}, {hi}]"


def int_range(lo: int, hi: Optional[int] = None):
    """An int ``lo <= x (<= hi)``."""

    def parse(text):
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be an integer {_bounds(lo, hi)}, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be an integer {_bounds(lo, hi)}, got {text!r}")
        return value

    parse.__name__ = f"int {_bounds(lo, hi)}"  # argparse names the type in some messages
    return parse


def float_range(lo: float, hi: Optional[float] = None, lo_open: bool = False):
    """A finite float ``lo <= x (<= hi)`` (``lo < x`` with ``lo_open``)."""

    def parse(text):
        try:
            value = float(text)
        except (TypeError, ValueError):
            value = math.nan
        below = value <= lo if lo_open else value < lo
        if not math.isfinite(value) or below or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be a number {_bounds(lo, hi, lo_open)}, got {text!r}")
        return value

    parse.__name__ = f"float {_bounds(lo, hi, lo_open)}"
    return parse


def finite_float(text):
    """Any finite float (e.g. a length penalty)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


POSITIVE_INT = int_range(1)
NON_NEGATIVE_INT = int_range(0)


def bool_flag(value) -> bool:
    """true/false, yes/no, on/off, 1/0 (any case) or a bool; anything else is an argparse error."""
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {value!r}")
