"""A family's config mapping, written once: rows of (HF config field, fairseq argument, default)
that serve both ways.

HF -> fairseq (:func:`values_from_hf`): each row's fairseq value from the HF config, the default
when the field is absent (:data:`REQUIRED`: refused by name; ``None``: left to the architecture
function, so ``--arch``'s default applies). fairseq -> HF (:func:`hf_fields`): each row's HF value
from the checkpoint's cfg, the same (HF) default when the cfg lacks it. A default that the model or its
layers also use is imported from its home (``modules``/``models``), never written again here.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

from lsg_fairseq.convert.checkpoint import Checkpoint
from lsg_fairseq.convert.common import ConversionError, ExportError

REQUIRED = object()  # the row's HF field must be present (a missing one is refused by name)


def _same(value):
    return value


@dataclass(frozen=True)
class Field:
    """One row: HF ``config.json`` field <-> fairseq model argument."""

    hf: str
    fairseq: str
    default: Any = REQUIRED  # when the HF config (or the checkpoint cfg) lacks it
    to_fairseq: Optional[Callable[[Any], Any]] = _same  # HF value -> fairseq (None: not read from HF)
    to_hf: Optional[Callable[[Any], Any]] = _same  # fairseq value -> HF (None: not written to HF)
    # the HF value's declared range (lsg_text.argtypes.Range: the fairseq flag's own), checked where it
    # arrives, before to_fairseq: a hand-edited "d_model": "abc" is refused by name, not deep in a build
    kind: Any = None


def values_from_hf(fields: Sequence[Field], config: dict, src: str) -> Dict[str, Any]:
    """{fairseq argument: value} of the rows read from an HF config (``src/config.json``)."""
    values = {}
    for f in fields:
        if f.to_fairseq is None:
            continue
        if f.hf not in config and f.default is REQUIRED:
            raise ConversionError(f"{src}/config.json: missing field {f.hf!r}")
        # null where the default is None: absent (the architecture's default), as before the check
        given = f.hf in config and not (config[f.hf] is None and f.default is None)
        problem = f.kind.problem(config[f.hf]) if f.kind is not None and given else None
        if problem:
            raise ConversionError(f"{src}/config.json: {f.hf} {problem}, got {config[f.hf]!r}")
        values[f.fairseq] = f.to_fairseq(config.get(f.hf, f.default))
    return values


def hf_fields(fields: Sequence[Field], checkpoint: Checkpoint) -> Dict[str, Any]:
    """{HF field: value} of the rows written to an HF config, from the checkpoint's model cfg."""
    out = {}
    for f in fields:
        if f.to_hf is None:
            continue
        value = checkpoint.get(f.fairseq)
        if value is None and f.default is REQUIRED:
            raise ExportError(f"{checkpoint.path}: the model cfg has no {f.fairseq}")
        if value is None:
            out[f.hf] = f.default
            continue
        # a cfg edited by hand, or written by other code: its value in the flag's range, and one the
        # HF type takes (int("abc"), float([1]) were tracebacks)
        problem = f.kind.problem(value) if f.kind is not None else None
        if problem is None:
            try:
                out[f.hf] = f.to_hf(value)
            except (TypeError, ValueError):
                problem = f"is not a valid {f.to_hf.__name__}"
        if problem:
            raise ExportError(f"{checkpoint.path}: the model cfg's {f.fairseq} {problem}, got {value!r}")
    return out
