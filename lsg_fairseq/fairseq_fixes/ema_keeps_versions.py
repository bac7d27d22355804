"""``--store-ema`` with pre-LN layers: the EMA keeps its final LayerNorms (no upstream issue found).

fairseq's ``EMA._step_internal`` leaves every key holding "version" out of the state dict it
averages ("Do not decay a model.version pytorch param"), then loads that dict into its model
(``EMA.restore``, ``load_state_dict(strict=False)``). fairseq's ``load_state_dict`` first upgrades the
dict, and ``TransformerEncoderBase``/``TransformerDecoderBase.upgrade_state_dict_named`` read a
missing ``encoder.version``/``decoder.version`` as version 1, a checkpoint older than the final
LayerNorm of a pre-LN stack: they set ``layer_norm = None`` on the EMA's encoder and decoder. So from
its first step on, with ``--encoder-normalize-before`` or ``--decoder-normalize-before``, the EMA
computes without the final LayerNorms, and the ``extra_state["ema"]`` each checkpoint saves holds
neither their weights nor a version above 1 (post-LN layers, BART's, have no final LayerNorm and
lose nothing).

The fix hands ``EMA.restore`` the EMA model's own version buffers for the keys its state dict
lacks, so the upgrade sees the version the model was built with. A state dict that carries its
versions (a checkpoint's EMA) loads as before, except one saved with the bug (a lower version, and
weights of the EMA model missing): loading it would drop the LayerNorms again, so the EMA keeps the
weights it was built from (on a resume, the checkpoint's) and a warning says so.
"""

import logging

from fairseq.models.ema.ema import EMA

from lsg_fairseq.fairseq_fixes._wrap import wrap

logger = logging.getLogger(__name__)


def _saved_with_the_bug(state_dict, own, versions) -> bool:
    """A state dict of an EMA saved by fairseq's step: a version below the model's and weights lost."""
    lower = any(key in state_dict and float(state_dict[key].max()) < float(own[key].max()) for key in versions)
    return lower and any(key not in state_dict for key in own if key not in versions)


def _versions_kept(original):
    def restore(self, state_dict, build_fp32_params=False):
        own = self.model.state_dict()
        versions = [key for key in own if "version" in key]
        if _saved_with_the_bug(state_dict, own, versions):
            logger.warning(
                "the EMA in this checkpoint was saved without its final LayerNorms (fairseq's EMA with "
                "--encoder/decoder-normalize-before); the EMA starts again from the model's weights"
            )
            return None
        missing = {key: own[key] for key in versions if key not in state_dict}
        if missing:
            state_dict = {**state_dict, **missing}
        return original(self, state_dict, build_fp32_params=build_fp32_params)

    return restore


def install() -> None:
    wrap(EMA, "restore", _versions_kept)
