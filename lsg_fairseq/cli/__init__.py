"""Command-line entry points (summarize, convert, user-dir)."""
