"""A setting left out whose default is another setting's value: that value, not a traceback
(fairseq#4064).

``--lr-scheduler polynomial_decay`` without ``--total-num-update`` ends every fairseq-train in
hydra's "ConfigCompositionException: Error merging override lr_scheduler.total_num_update=null", a
traceback before any work: the schedule BART's fine-tuning recipes use. Its dataclass declares
``total_num_update: float = II("optimization.max_update")`` (decay over the whole run), but the
argparse flag fairseq generates for it defaults to None, and ``convert_namespace_to_omegaconf``
(``_override_attr``) passes that None to hydra as ``null``, which a ``float`` field refuses.

The fix hands ``_override_attr`` the dataclass's own interpolation (``${optimization.max_update}``)
for each field whose default is one, whose type cannot be None, and whose flag was left at None:
what fairseq-hydra-train does with the same dataclass. A value given on the command line, and a
field that may be None, go through as before.
"""

import argparse
import dataclasses
import typing

from fairseq.dataclass import utils as dataclass_utils

from lsg_fairseq.fairseq_fixes._wrap import wrap


def _interpolation(field: dataclasses.Field):
    """The ``${...}`` default of a dataclass field whose type cannot be None, else None."""
    default = field.default
    if not (isinstance(default, str) and default.startswith("${")):
        return None
    may_be_none = type(None) in typing.get_args(field.type)  # Optional[X]
    return None if may_be_none else default


def _defaults_kept(original):
    def _override_attr(sub_node, data_class, args):
        fields = getattr(data_class, "__dataclass_fields__", {})
        left = {k: _interpolation(f) for k, f in fields.items() if getattr(args, k, False) is None}
        left = {k: v for k, v in left.items() if v is not None}
        if left:
            args = argparse.Namespace(**{**vars(args), **left})
        return original(sub_node, data_class, args)

    return _override_attr


def install() -> None:
    wrap(dataclass_utils, "_override_attr", _defaults_kept)
