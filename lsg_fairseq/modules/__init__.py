"""Old import path of :mod:`lsg_layers.modules` (the torch.nn layers moved to the fairseq-free
package): ``lsg_fairseq.modules.<name>`` is the module ``lsg_layers.modules.<name>``, and
``lsg_fairseq.modules.cross_attention`` (it subclasses fairseq's attention) is
:mod:`lsg_fairseq.models.cross_attention`. New code imports the new homes."""

from lsg_fairseq._aliases import alias_package

alias_package(__name__, "lsg_layers.modules", {"cross_attention": "lsg_fairseq.models.cross_attention"})
