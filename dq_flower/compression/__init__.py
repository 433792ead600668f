"""Compressed model updates for any Flower strategy: a strategy wrapper and its client mod."""
