"""Pieces every strategy of this package shares: seeded node sampling, server optimizers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..codecs import PayloadError

__all__ = ["sample_node_ids", "make_optimizer", "log_rejected", "screen_replies"]

#: What a reply validator may raise for a malformed reply.
REPLY_ERRORS = (PayloadError, ValueError, KeyError, TypeError)


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


def screen_replies(
    replies: Iterable[Message], validate: Callable[[Message], Any]
) -> tuple[list[tuple[int, Any]], int, int]:
    """Validate every reply: ``([(node, validate(msg)), ...], rejected, failed)``.

    Replies carrying an error count as failed; a reply ``validate`` raises on is rejected,
    with its reason logged.
    """
    valid, rejected, failed = [], 0, 0
    for msg in replies:
        node = msg.metadata.src_node_id
        if msg.has_error():
            failed += 1
            continue
        try:
            valid.append((node, validate(msg)))
        except REPLY_ERRORS as exc:
            rejected += 1
            log_rejected(node, str(exc))
    return valid, rejected, failed


def log_round(name: str, server_round: int, text: str) -> None:
    """One progress line per round."""
    log(INFO, "[%s] round %d: %s", name, server_round, text)
