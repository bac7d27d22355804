"""Datasets, truncation, sentence splitting, GSG selection, ROUGE helpers (architecture-agnostic)."""
