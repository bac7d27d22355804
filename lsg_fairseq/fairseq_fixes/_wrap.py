"""Replace a function of a fairseq module once, keeping the original reachable."""

import functools
import inspect

_ORIGINAL = "__lsg_fairseq_original__"
_MAKERS = "__lsg_fairseq_makers__"


def wrap(owner, name: str, make) -> None:
    """``owner.name = make(current)``, unless ``make`` already wrapped it (so ``install()`` is
    idempotent); two fixes may wrap the same function, the one installed last outermost.

    A staticmethod (``PathManager.copy``) stays a staticmethod, a classmethod a classmethod (``make``
    then wraps the plain function, ``cls`` its first argument). The replacement keeps the
    original's name and docstring and remembers the unwrapped original for :func:`original`.
    """
    kind, func = _function(owner, name)
    makers = getattr(func, _MAKERS, ())
    if make in makers:
        return
    replacement = functools.update_wrapper(make(func), func)
    setattr(replacement, _ORIGINAL, getattr(func, _ORIGINAL, func))
    setattr(replacement, _MAKERS, makers + (make,))
    setattr(owner, name, kind(replacement) if kind else replacement)


def original(owner, name: str):
    """What ``owner.name`` was before :func:`wrap` (itself when not wrapped): tests run it to
    show the upstream bug each fix exists for. A classmethod's comes back bound to ``owner``."""
    func = getattr(owner, name)
    found = getattr(func, _ORIGINAL, func)
    if isinstance(inspect.getattr_static(owner, name), classmethod) and found is not func:
        return found.__get__(owner)
    return found


def _function(owner, name: str):
    """(staticmethod, classmethod or None; the plain function) of ``owner.name``."""
    raw = inspect.getattr_static(owner, name)
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    return kind, raw.__func__ if kind else raw


def wrapped_by(owner, name: str, make) -> bool:
    """Whether :func:`wrap` has wrapped ``owner.name`` with ``make`` already."""
    return make in getattr(_function(owner, name)[1], _MAKERS, ())
