"""Pieces every strategy of this package shares: seeded node sampling, server optimizers."""

from __future__ import annotations

from logging import INFO, WARNING

import numpy as np
import torch
from flwr.common.logger import log
from flwr.serverapp import Grid

__all__ = ["sample_node_ids", "make_optimizer", "log_rejected"]


def sample_node_ids(
    grid: Grid, fraction: float, min_nodes: int, rng: np.random.Generator
) -> list[int]:
    """Seeded sample of ``ceil(fraction * available)`` connected nodes (at least one)."""
    nodes = sorted(int(n) for n in grid.get_node_ids())
    if not nodes:
        return []
    k = min(len(nodes), max(min_nodes, int(np.ceil(fraction * len(nodes))), 1))
    if k == len(nodes):
        return nodes
    return sorted(int(n) for n in rng.choice(nodes, size=k, replace=False))


def make_optimizer(
    name: str, params, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """SGD with momentum and weight decay, or Adam."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer must be sgd or adam, got {name!r}")


def log_rejected(node_id: int, reason: str) -> None:
    """Log a rejected reply with its reason."""
    log(WARNING, "rejected reply from node %d: %s", node_id, reason)


def log_round(name: str, server_round: int, text: str) -> None:
    """One progress line per round."""
    log(INFO, "[%s] round %d: %s", name, server_round, text)
