"""Server strategies: DQ (the method) and compressed-gradient baselines."""

from .dq import DQStrategy

__all__ = ["DQStrategy"]
