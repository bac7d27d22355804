"""Replace a function of a fairseq module once, keeping the original reachable."""

import functools
import inspect

_ORIGINAL = "__lsg_fairseq_original__"
_MAKERS = "__lsg_fairseq_makers__"


def wrap(owner, name: str, make) -> None:
    """``owner.name = make(current)``, unless ``make`` already wrapped it (so ``install()`` is
    idempotent); two fixes may wrap the same function, the one installed last outermost.

    A staticmethod (``PathManager.copy``) stays a staticmethod. The replacement keeps the
    original's name and docstring and remembers the unwrapped original for :func:`original`.
    """
    raw = inspect.getattr_static(owner, name)
    func = raw.__func__ if isinstance(raw, staticmethod) else raw
    makers = getattr(func, _MAKERS, ())
    if make in makers:
        return
    replacement = functools.update_wrapper(make(func), func)
    setattr(replacement, _ORIGINAL, getattr(func, _ORIGINAL, func))
    setattr(replacement, _MAKERS, makers + (make,))
    setattr(owner, name, staticmethod(replacement) if isinstance(raw, staticmethod) else replacement)


def original(owner, name: str):
    """What ``owner.name`` was before :func:`wrap` (itself when not wrapped): tests run it to
    show the upstream bug each fix exists for."""
    func = getattr(owner, name)
    return getattr(func, _ORIGINAL, func)
