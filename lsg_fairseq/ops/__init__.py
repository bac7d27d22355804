"""Old import path of :mod:`lsg_layers.ops` (the pure tensor functions moved to the fairseq-free
package): ``lsg_fairseq.ops.<name>`` is the module ``lsg_layers.ops.<name>``. New code imports
``lsg_layers.ops``."""

from lsg_fairseq._aliases import alias_package

alias_package(__name__, "lsg_layers.ops")
