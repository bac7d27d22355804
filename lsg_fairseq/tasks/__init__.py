"""fairseq tasks: each module registers its task when imported (``lsg_fairseq``'s ``__init__``
imports them all)."""
