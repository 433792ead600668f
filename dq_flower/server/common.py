"""What every strategy of the package shares: node sampling, optimizers, logging, run errors."""

from __future__ import annotations

import difflib
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from dq_flower.codecs import PayloadError

__all__ = ["sample_node_ids", "wait_for_nodes", "make_optimizer", "log_rejected", "log_round",
           "ClientFailureError", "NodeConfigurationError", "REPLY_ERRORS", "FedAvgArgs",
           "largest_embedding"]

#: What a reply validator may raise for a malformed reply.
REPLY_ERRORS = (PayloadError, ValueError, KeyError, TypeError)


MetricsAggr = Callable[[list[RecordDict], str], MetricRecord]


@dataclass(frozen=True)
class FedAvgArgs:
    """Flower ``FedAvg``'s other arguments, which the package's strategies take as it does.

    ``min_train_nodes``: the least train sample. ``weighted_by_key``, ``arrayrecord_key``
    and ``configrecord_key``: the count federated evaluation's replies are weighted by and
    the keys of its messages (a train round's messages and replies are the method's own).
    ``train_metrics_aggr_fn`` and ``evaluate_metrics_aggr_fn``: ``fn(records, key)`` on the
    accepted replies' contents, as FedAvg calls them (the evaluation's in place of the
    package's trimmed mean, the train round's beside its own figures).
    """

    min_train_nodes: int = 1
    weighted_by_key: str = "num-examples"
    arrayrecord_key: str = "arrays"
    configrecord_key: str = "config"
    train_metrics_aggr_fn: MetricsAggr | None = None
    evaluate_metrics_aggr_fn: MetricsAggr | None = None

    def __post_init__(self) -> None:
        if isinstance(self.min_train_nodes, bool) or not isinstance(self.min_train_nodes, int) \
                or self.min_train_nodes < 0:
            raise ValueError(f"min_train_nodes must be an int >= 0, got {self.min_train_nodes!r}")
        for key in ("weighted_by_key", "arrayrecord_key", "configrecord_key"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(f"{key} must be a non-empty str, got {getattr(self, key)!r}")
        for key in ("train_metrics_aggr_fn", "evaluate_metrics_aggr_fn"):
            if getattr(self, key) is not None and not callable(getattr(self, key)):
                raise ValueError(f"{key} must be callable or None")

    @classmethod
    def pop(cls, kwargs: dict[str, Any], init: Callable[..., Any] | None = None) -> FedAvgArgs:
        """Take FedAvg's arguments out of a strategy's ``**knobs`` (a misspelt one: ValueError).

        ``init``: the strategy's ``__init__``, whose own arguments a misspelling may mean too.
        """
        names = list(cls.__dataclass_fields__)
        own = [] if init is None else [
            p.name for p in inspect.signature(init).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in ("self", "model")]
        for key in kwargs:
            near = difflib.get_close_matches(key, names + own, 1, 0.85)
            if key not in names and key not in own and near:
                raise ValueError(f"unknown argument {key!r} (did you mean {near[0]!r}" + (
                    ", as Flower's FedAvg takes it?)" if near[0] in names else "?)"))
        return cls(**{k: kwargs.pop(k) for k in list(kwargs) if k in names})

    def aggregate(self, fn: MetricsAggr | None, replies: Sequence[Message],
                  nodes: Sequence[int], what: str) -> MetricRecord | None:
        """``fn`` on the contents of the ``replies`` from ``nodes``.

        ``None`` where there is no ``fn`` or no such reply, or ``fn`` failed (logged).
        """
        accepted = set(nodes)
        records = [m.content for m in replies
                   if not m.has_error() and int(m.metadata.src_node_id) in accepted]
        if fn is None or not records:
            return None
        try:
            return fn(records, self.weighted_by_key)
        except Exception as exc:  # noqa: BLE001  (the user's function, whatever it raises)
            log(WARNING, "%s_metrics_aggr_fn failed on this round's %d replies (%s: %s); "
                "its metrics are left out", what, len(records), type(exc).__name__, exc)
            return None


#: Seconds of waiting for nodes after which the log says what may be wrong (once).
WAIT_HINT_S = 30.0


def wait_for_nodes(grid: Grid, min_nodes: int, timeout: float = 3600.0) -> list[int]:
    """Connected node ids, after waiting (up to ``timeout`` s) for ``min_nodes`` of them."""
    start, hinted = time.monotonic(), False
    while len(nodes := sorted(int(n) for n in grid.get_node_ids())) < min_nodes:
        waited = time.monotonic() - start
        if waited > timeout:
            raise RuntimeError(f"only {len(nodes)} nodes connected after {timeout:.0f} s; "
                               f"min-available-nodes is {min_nodes}")
        if waited > WAIT_HINT_S and not hinted:
            hinted = True
            log(WARNING, "%d of the %d nodes min-available-nodes asks for connected after %.0f "
                "s (the run waits up to %.0f s): in a local simulation the federation may hold "
                "fewer (options.num-supernodes); lower min-available-nodes or start more "
                "SuperNodes", len(nodes), min_nodes, waited, timeout)
        log(INFO, "waiting for nodes to connect: %d connected (minimum %d)", len(nodes),
            min_nodes)
        time.sleep(1.0)
    return nodes


def sample_node_ids(
    grid: Grid, fraction: float, min_nodes: int, rng: np.random.Generator,
    stage: str = "configure_train", *, min_sampled: int | None = None,
    prefer: Callable[[int], bool] | None = None,
) -> list[int]:
    """Seeded sample of ``ceil(fraction * connected)`` nodes, at least ``min_sampled``.

    Waits for ``min_nodes`` connected nodes (Flower's ``min_available_nodes``);
    ``min_sampled`` (default ``min_nodes``, as Flower's ``min_evaluate_nodes``) is the
    least sample. ``prefer(node)``: nodes it is true of are drawn first, the others only
    to fill the sample. Logs Flower's ``<stage>: Sampled k nodes`` line.
    """
    nodes = wait_for_nodes(grid, min_nodes)
    if not nodes:
        return []
    least = min_nodes if min_sampled is None else min_sampled
    k = min(len(nodes), max(least, int(np.ceil(fraction * len(nodes))), 1))
    wanted = nodes if prefer is None else [n for n in nodes if prefer(n)]
    if prefer is not None and len(wanted) < len(nodes):
        log(INFO, "%s: Sampled %s nodes (out of %s; %s of them still hold rows the server "
            "lacks)", stage, min(k, len(wanted)) if wanted else k, len(nodes), len(wanted))
        if len(wanted) >= k:
            return _draw(wanted, k, rng)
        if wanted:  # fewer than the sample: only those are worth asking
            return wanted
        return _draw(nodes, k, rng)
    log(INFO, "%s: Sampled %s nodes (out of %s)", stage, k, len(nodes))
    return _draw(nodes, k, rng)


def _draw(nodes: list[int], k: int, rng: np.random.Generator) -> list[int]:
    """``k`` of ``nodes`` drawn by ``rng`` without replacement, sorted (all: as given)."""
    if k >= len(nodes):
        return nodes
    # positions, not ids: numpy turns uint64 ids on both sides of 2**63 into float64
    return sorted(nodes[int(i)] for i in rng.choice(len(nodes), size=k, replace=False))


_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


def largest_embedding(model: torch.nn.Module) -> int:
    """The most rows (``num_embeddings``) of any of the model's embeddings; 0: none."""
    return max((int(m.num_embeddings) for m in model.modules() if isinstance(m, _EMBEDDINGS)),
               default=0)


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """The model's parameters as optimizer groups: its embeddings' rows without decay.

    Weight decay adds to every row's gradient at every step, so a word's row that few
    minibatches reach is pulled to zero faster than its words move it (a text classifier
    trained with Adam at 5e-4 decay lost 7 to 17 points this way). A model without
    embeddings: one group, the optimizer as over ``model.parameters()``. Parameters the user
    froze (``requires_grad=False``) are in no group: no step moves them.
    """
    tables = [m for m in model.modules() if isinstance(m, _EMBEDDINGS)]
    rows = {id(p) for m in tables for p in m.parameters(recurse=False)}
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in rows],
               "weight_decay": weight_decay},
              {"params": [p for p in trainable if id(p) in rows], "weight_decay": 0.0}]
    if any(m.sparse for m in tables):  # sparse gradients: PyTorch's fused step refuses them
        groups[1]["fused"] = False
    return [g for g in groups if g["params"]]


#: Devices with PyTorch's fused SGD and Adam kernels (CPU since PyTorch 2.4).
FUSED_DEVICES = (("cpu", "cuda") if tuple(int(v) for v in torch.__version__.split(".")[:2])
                 >= (2, 4) else ())


def make_optimizer(
    name: str, params, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """SGD with momentum and weight decay, or Adam (``params``: tensors or groups).

    PyTorch's fused step where every parameter allows it (floating point, on a device it
    has fused kernels for; a group may say ``fused: False``): one kernel for the whole
    update instead of a few per tensor, 1.2x to 1.5x less time per step on small models.
    """
    groups = list(params)
    fused = _fusable(groups)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay,
                               fused=fused)
    if name == "adam":
        return torch.optim.Adam(groups, lr=lr, weight_decay=weight_decay, fused=fused)
    raise ValueError(f"optimizer must be sgd or adam, got {name!r}")


def _fusable(groups: list) -> bool | None:
    """``True`` where PyTorch's fused optimizer step takes every parameter, else ``None``."""
    tensors = [p for g in groups for p in (g["params"] if isinstance(g, dict) else [g])]
    ok = all(p.is_floating_point() and p.device.type in FUSED_DEVICES for p in tensors)
    return True if ok and tensors else None


def log_rejected(node_id: int, reason: str) -> None:
    """Log a rejected reply with its reason."""
    log(WARNING, "rejected reply from node %d: %s", node_id, reason)


def log_round(name: str, server_round: int, text: str) -> None:
    """One progress line per round."""
    log(INFO, "[%s] round %d: %s", name, server_round, text)


class ClientFailureError(RuntimeError):
    """Every sampled client failed for several consecutive rounds."""


class NodeConfigurationError(ClientFailureError):
    """A node replied that it cannot answer the run as configured: the run stops at once."""
