"""fairseq models: each module registers its model and architectures when imported (``lsg_fairseq``'s
``__init__`` imports them all)."""
