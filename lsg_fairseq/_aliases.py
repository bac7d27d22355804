"""Old import paths kept working after a package moved: ``lsg_fairseq.ops.blocks`` is the module
object ``lsg_layers.ops.blocks`` itself (not a copy), so an import, an attribute read and a test's
monkeypatch through either path all reach the same module."""

import importlib
import pkgutil
import sys
from typing import Dict, Optional


def alias_package(old: str, new: str, extra: Optional[Dict[str, str]] = None) -> None:
    """Make every module of package ``new`` importable as ``old.<name>`` as well (``old`` is the
    package whose ``__init__`` calls this); ``extra`` maps more names under ``old`` to modules that
    moved elsewhere."""
    package = sys.modules[old]
    targets = {info.name: f"{new}.{info.name}" for info in pkgutil.iter_modules(importlib.import_module(new).__path__)}
    targets.update(extra or {})
    for name, target in targets.items():
        module = importlib.import_module(target)
        sys.modules[f"{old}.{name}"] = module
        setattr(package, name, module)
