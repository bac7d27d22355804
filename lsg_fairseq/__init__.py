"""lsg-fairseq: long-input sequence-to-sequence models (LSG-BART, LOCOST, LED) as a fairseq plugin.

Use with ``fairseq-train --user-dir $(lsg-fairseq-user-dir) ...`` or ``import lsg_fairseq`` before
loading a checkpoint. This is the plugin's one entry point: importing it registers every model,
architecture, task and optimizer (each module of ``models/``, ``tasks/`` and ``optim/`` registers
itself when imported, as fairseq's ``--user-dir`` import does for ``models/`` and ``tasks/``), and
installs the fixes to fairseq/torch internals in :mod:`lsg_fairseq.fairseq_fixes` (the only
package that patches anything; it also allowlists what fairseq checkpoints contain so that
``torch.load`` works under torch >= 2.6).
"""

import os

from lsg_fairseq._autoimport import import_all
from lsg_fairseq._fairseq_logs import quiet_import

with quiet_import():  # the first import of fairseq here: without its import-time INFO lines
    from lsg_fairseq import fairseq_fixes

    for _sub in ("models", "tasks", "optim"):
        import_all(f"{__name__}.{_sub}", os.path.join(os.path.dirname(__file__), _sub))
fairseq_fixes.install()

__version__ = "0.1.0"


def user_dir() -> str:
    """The path to pass as ``--user-dir`` (fairseq wants a path, not a module name)."""
    return os.path.dirname(os.path.abspath(__file__))
