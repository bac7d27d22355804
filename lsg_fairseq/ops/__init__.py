"""Tiny pure functions for index arithmetic shared by LSG and LED (blocks, bands, padding)."""
