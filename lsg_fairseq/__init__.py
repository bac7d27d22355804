"""lsg-fairseq: long-input sequence-to-sequence models (LSG-BART, LOCOST, LED) as a fairseq plugin.

Use with ``fairseq-train --user-dir $(lsg-fairseq-user-dir) ...`` or ``import lsg_fairseq`` before
loading a checkpoint. Importing registers every model, architecture and task, and allowlists what
fairseq checkpoints contain so that ``torch.load`` works under torch >= 2.6.
"""
import os

from lsg_fairseq.serialization import register_safe_globals

register_safe_globals()

from lsg_fairseq._autoimport import import_all  # noqa: E402

# The registrations: every module of models/, tasks/ and optim/ registers itself with fairseq when
# imported (fairseq's --user-dir import does the same for models/ and tasks/).
for _sub in ("models", "tasks", "optim"):
    import_all(f"{__name__}.{_sub}", os.path.join(os.path.dirname(__file__), _sub))
from lsg_fairseq import bf16, checkpoint_io  # noqa: E402,F401  (patch fairseq: atomic checkpoints, clear load errors, bf16 off TPUs)
from lsg_fairseq.errors import install_fairseq_hook  # noqa: E402

install_fairseq_hook()  # fairseq-train / fairseq-interactive: our refusals as one line, exit 2

__version__ = "0.1.0"


def user_dir() -> str:
    """The path to pass as ``--user-dir`` (fairseq wants a path, not a module name)."""
    return os.path.dirname(os.path.abspath(__file__))
