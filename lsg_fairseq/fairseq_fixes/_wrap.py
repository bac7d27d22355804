"""Replace a function of a fairseq module once, keeping the original reachable."""
import functools
import inspect

_ORIGINAL = "__lsg_fairseq_original__"


def wrap(owner, name: str, make) -> None:
    """``owner.name = make(original)``, unless already done (so ``install()`` is idempotent).

    A staticmethod (``PathManager.copy``) stays a staticmethod. The replacement keeps the
    original's name and docstring and remembers the original for :func:`original`.
    """
    raw = inspect.getattr_static(owner, name)
    func = raw.__func__ if isinstance(raw, staticmethod) else raw
    if hasattr(func, _ORIGINAL):
        return
    replacement = functools.update_wrapper(make(func), func)
    setattr(replacement, _ORIGINAL, func)
    setattr(owner, name, staticmethod(replacement) if isinstance(raw, staticmethod) else replacement)


def original(owner, name: str):
    """What ``owner.name`` was before :func:`wrap` (itself when not wrapped): tests run it to
    show the upstream bug each fix exists for."""
    func = getattr(owner, name)
    return getattr(func, _ORIGINAL, func)
