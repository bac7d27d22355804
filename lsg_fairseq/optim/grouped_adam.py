"""``--optimizer grouped_adam``: fairseq's Adam(W) with per-parameter learning-rate / weight-decay tags.

fairseq's trainer hands the optimizer one flat list of parameters, and the stock ``adam`` puts them
all in one group, so per-parameter settings such as S4's SSM parameters without weight decay are
lost (the LOCOST reference tags them with ``_optim`` and has exactly that silent bug, spec
locost.md section 4). This optimizer reads the attributes
fairseq itself defines for parameter groups (``fairseq.optim.composite``, and which
``FP16Optimizer`` copies onto its fp32 copies with ``--fp16-no-flatten-grads``):

- ``p.param_group``: group name (untagged parameters form ``"default"``);
- ``p.optim_overrides = {"optimizer": {"lr_scale": s, "weight_decay_scale": w}}``: the group's
  learning rate is ``lr * s`` at every step (the scheduler's lr is scaled, so warm-up and decay apply
  to every group alike) and its weight decay ``--weight-decay * w``.

Untagged models behave exactly like ``--optimizer adam``. Flat parameters (one tensor holding
every parameter, which fairseq's ``--fp16`` builds by default) carry no tags, so this optimizer
refuses them (fairseq then names ``--fp16-no-flatten-grads``); the plugin's tasks pass that flag
for ``--fp16`` themselves (:mod:`lsg_fairseq.device_policy`).
"""

import logging
from collections import OrderedDict
from dataclasses import dataclass

from fairseq.optim import register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

logger = logging.getLogger(__name__)


@dataclass
class GroupedAdamConfig(FairseqAdamConfig):
    pass


def group_parameters(params, lr: float, weight_decay: float):
    """Flat tagged parameters -> torch param-group dicts (order of first appearance kept)."""
    groups = OrderedDict()
    for p in params:
        name = getattr(p, "param_group", "default")
        opt = (getattr(p, "optim_overrides", None) or {}).get("optimizer", {})
        scales = (float(opt.get("lr_scale", 1.0)), float(opt.get("weight_decay_scale", 1.0)))
        key = (name, scales)
        if key not in groups:
            groups[key] = {
                "params": [],
                "group_name": name,
                "lr_scale": scales[0],
                "weight_decay_scale": scales[1],
                "lr": lr * scales[0],
                "weight_decay": weight_decay * scales[1],
            }
        groups[key]["params"].append(p)
    return list(groups.values())


@register_optimizer("grouped_adam", dataclass=GroupedAdamConfig)
class GroupedAdam(FairseqAdam):
    """Adam(W) whose parameter groups follow ``param_group`` / ``optim_overrides`` tags."""

    def __init__(self, cfg: GroupedAdamConfig, params):
        params = list(params)
        if params and isinstance(params[0], dict):
            groups = params
        else:
            base = self._base(cfg)
            groups = group_parameters(params, base["lr"], base["weight_decay"])
        super().__init__(cfg, groups)
        for g in self.param_groups:
            logger.info(
                f"grouped_adam: group {g.get('group_name', 'default')}: {len(g['params'])} tensors, "
                f"lr x{g.get('lr_scale', 1.0)}, weight decay {g['weight_decay']}"
            )

    @property
    def supports_flat_params(self):
        return False  # one flat tensor has no group tags: every parameter would land in "default"

    @staticmethod
    def _base(cfg):
        lr = cfg.lr[0] if isinstance(cfg.lr, (list, tuple)) or hasattr(cfg.lr, "__getitem__") else cfg.lr
        return {"lr": float(lr), "weight_decay": float(cfg.weight_decay)}

    def _apply_scales(self, lr: float):
        wd = self.cfg.weight_decay
        for g in self.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
            g["weight_decay"] = wd * g.get("weight_decay_scale", 1.0)

    def get_lr(self):
        """The unscaled (scheduler) learning rate."""
        g = self.param_groups[0]
        return g["lr"] / g.get("lr_scale", 1.0) if g.get("lr_scale", 1.0) else g["lr"]

    def set_lr(self, lr):
        self._apply_scales(lr)

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        # torch gives every group the checkpoint's settings, its scales among them: the scales of
        # this run's flags (an --ssm-lr changed on resume) are put back, and fairseq's overrides
        # (one lr / weight decay for every group) scaled per group
        lr = self.get_lr()
        scales = [(g.get("lr_scale", 1.0), g.get("weight_decay_scale", 1.0)) for g in self.param_groups]
        super().load_state_dict(state_dict, optimizer_overrides)
        for g, (lr_scale, weight_decay_scale) in zip(self.param_groups, scales):
            g["lr_scale"], g["weight_decay_scale"] = lr_scale, weight_decay_scale
        if optimizer_overrides and "lr" in optimizer_overrides:
            lr = optimizer_overrides["lr"]
        self._apply_scales(lr)
