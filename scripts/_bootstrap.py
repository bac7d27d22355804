"""Imported first by the data scripts: makes ``lsg_fairseq.data`` importable, and cheap.

1. Puts the repository root on ``sys.path``, so the scripts run from a checkout without
   ``pip install -e .``.
2. Registers ``lsg_fairseq`` as a bare package (its real ``__path__``, without running its
   ``__init__``). The real ``__init__`` imports fairseq and registers every model and task, which
   costs several seconds per call and is useless for data preparation; the ``lsg_fairseq.data``
   modules depend on none of it. Done only when a script of this folder is the program being
   run (never in a process that merely imports a script, such as pytest: a bare package there
   would leave the models unregistered for everything else), and only if the package is not
   imported yet.
"""

import os
import sys
import types

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

_program = sys.argv[0] if sys.argv and sys.argv[0] else ""
_running_a_script = os.path.dirname(os.path.abspath(_program)) == os.path.dirname(os.path.abspath(__file__))
if _program and _running_a_script and "lsg_fairseq" not in sys.modules:
    _package = types.ModuleType(
        "lsg_fairseq", "lsg_fairseq without its plugin registration (scripts/_bootstrap.py)"
    )
    _package.__path__ = [os.path.join(REPO_ROOT, "lsg_fairseq")]
    sys.modules["lsg_fairseq"] = _package
