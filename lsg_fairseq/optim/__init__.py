"""Optimizers that honour per-parameter tags (``param_group`` / ``optim_overrides``)."""
