"""Pure torch.nn layers (no fairseq registries): LSG / Longformer attention, S4D SSM, T5 pieces."""
