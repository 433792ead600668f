"""Compressed-gradient baselines: strategy, client function and their config."""
