"""lsg-fairseq: long-input sequence-to-sequence models (LSG-BART, LOCOST, LED) as a fairseq plugin.

Use with ``fairseq-train --user-dir $(lsg-fairseq-user-dir) ...`` or ``import lsg_fairseq`` before
loading a checkpoint. Importing registers every model, architecture and task, and installs the
fixes to fairseq/torch internals in :mod:`lsg_fairseq.fairseq_fixes` (the only module that
patches anything; it also allowlists what fairseq checkpoints contain so that ``torch.load``
works under torch >= 2.6).
"""
import os

from lsg_fairseq import fairseq_fixes, models, tasks  # noqa: F401  (models, tasks: registration)

fairseq_fixes.install()

__version__ = "0.1.0"


def user_dir() -> str:
    """The path to pass as ``--user-dir`` (fairseq wants a path, not a module name)."""
    return os.path.dirname(os.path.abspath(__file__))
