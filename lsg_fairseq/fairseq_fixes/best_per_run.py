"""Each training starts without a best validation score (no upstream issue found; fairseq#1302 is
the same score carried over on purpose, from a restored checkpoint, which this keeps).

fairseq keeps the best score so far on a function, ``checkpoint_utils.save_checkpoint.best``: the
first validation sets it, every later one is compared with it to decide whether
``checkpoint_best.pt`` (and each ``--keep-best-checkpoints`` file) is written, each checkpoint
saves it in its ``extra_state``, and a restore sets it again from there. Nothing clears it. So a
second training in the same Python process (a sweep calling ``fairseq_cli.train.main`` in a loop,
a notebook, a test suite) starts from the first one's best: its ``checkpoint_best.pt`` is not
written until it beats a score of another run, of another metric maybe, and its checkpoints carry
that score as their own. Found when a test's training wrote no ``checkpoint_best.pt`` after
another test's, in one pytest process.

Wraps ``fairseq.distributed.utils.call_main`` (fairseq-train, -hydra-train, -validate): the score
is cleared before ``main``, and a restored checkpoint's own is set by fairseq's load inside it.
"""

from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils

from lsg_fairseq.fairseq_fixes._wrap import wrap


def clear_best() -> None:
    """No best score on ``save_checkpoint`` (the wrapper, if any, on which fairseq's code sets it)."""
    checkpoint_utils.save_checkpoint.__dict__.pop("best", None)


def _best_cleared_first(original):
    def call_main(cfg, main, **kwargs):
        clear_best()
        return original(cfg, main, **kwargs)

    return call_main


def install() -> None:
    wrap(distributed_utils, "call_main", _best_cleared_first)
