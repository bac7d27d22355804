"""``--store-ema`` from a checkpoint that holds no EMA: the EMA starts from its weights, as fairseq
means to (no upstream issue found).

``Trainer.load_checkpoint`` loads ``state["model"]`` into the model, deletes it ("save memory for
later steps"), and, when ``--store-ema`` is on and the checkpoint has no ``extra_state["ema"]``,
logs "EMA is re-initialized from checkpoint" and reads ``state["model"]`` again: ``KeyError:
'model'``, after the data and the model are loaded. So every fine-tuning with an EMA from a
checkpoint trained without one failed: a converted pretrained model (lsg-fairseq-convert writes no
EMA), ``--finetune-from-model``, or a resume that adds ``--store-ema``.

The fix hands fairseq the checkpoint's weights as its EMA before it reads them
(``extra_state["ema"]`` names the same tensors, no copy), so that its other branch, "Loading EMA
from checkpoint", starts the EMA from them, fp32 copies included with ``--ema-fp32``: what the
re-initialisation meant. It applies only inside ``Trainer.load_checkpoint`` of a run with
``--store-ema`` (a context variable set there), to a checkpoint with weights and no EMA.
"""

import contextvars
import logging

from fairseq import checkpoint_utils
from fairseq.trainer import Trainer

from lsg_fairseq.fairseq_fixes._wrap import wrap

logger = logging.getLogger(__name__)

_STORE_EMA = contextvars.ContextVar("lsg_fairseq_store_ema", default=False)


def _remember_store_ema(original):
    def load_checkpoint(self, *args, **kwargs):
        token = _STORE_EMA.set(bool(getattr(getattr(self.cfg, "ema", None), "store_ema", False)))
        try:
            return original(self, *args, **kwargs)
        finally:
            _STORE_EMA.reset(token)

    return load_checkpoint


def _weights_as_ema(original):
    def load_checkpoint_to_cpu(*args, **kwargs):
        state = original(*args, **kwargs)
        extra = state.get("extra_state") if isinstance(state, dict) else None
        if _STORE_EMA.get() and isinstance(extra, dict) and "ema" not in extra and "model" in state:
            logger.info("--store-ema: the checkpoint holds no EMA; the EMA starts from its weights")
            extra["ema"] = state["model"]
        return state

    return load_checkpoint_to_cpu


def install() -> None:
    wrap(Trainer, "load_checkpoint", _remember_store_ema)
    wrap(checkpoint_utils, "load_checkpoint_to_cpu", _weights_as_ema)
