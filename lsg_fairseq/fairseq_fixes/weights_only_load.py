"""Make fairseq checkpoints loadable under torch >= 2.6 without turning the safety check off
(fairseq#5603, #5610).

torch 2.6 switched ``torch.load`` to ``weights_only=True``. fairseq's ``load_checkpoint_to_cpu``
does not pass ``weights_only=False``, so loading any checkpoint whose ``cfg`` holds an
``argparse.Namespace`` (every legacy-arch checkpoint, BART included) fails with
``UnpicklingError: ... GLOBAL argparse.Namespace``. Instead of ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``
we allowlist exactly the types fairseq checkpoints contain (torch's own global list, the one
thing here that is not a fairseq function).

Our own code logs plain Python floats, so numpy scalars never reach a checkpoint; the numpy
globals are still allowed because checkpoints written by stock fairseq tasks (``--eval-bleu``)
carry them and users resume from those.
"""

import argparse
import collections

import torch

SAFE_GLOBALS = [argparse.Namespace, collections.OrderedDict, collections.defaultdict]


def _numpy_globals():
    import numpy as np

    found = [np.ndarray, np.dtype]
    # numpy moved ``_reconstruct`` / ``scalar`` between core modules across versions.
    for modname in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            mod = __import__(modname, fromlist=["_reconstruct", "scalar"])
        except ImportError:
            continue
        found += [getattr(mod, n) for n in ("_reconstruct", "scalar") if hasattr(mod, n)]
        break
    # numpy 2 pickles dtypes as instances of their per-type classes (e.g. Float64DType).
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        found += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType")]
    return found


def install() -> None:
    """Allowlist what fairseq checkpoints pickle (adding a global twice is harmless)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # torch < 2.4 has no weights_only default to worry about
        return
    add(SAFE_GLOBALS + _numpy_globals())
