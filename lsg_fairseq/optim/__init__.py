"""Optimizers that honour per-parameter tags (``param_group`` / ``optim_overrides``); each module
registers itself when imported (``lsg_fairseq``'s ``__init__`` imports them all)."""
