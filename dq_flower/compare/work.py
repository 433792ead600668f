"""What each round computes, in model passes, and its time on a compute profile.

Per family, the samples each client trains (forward + backward) and forwards only, and
the server's:

- ``fedavg``, ``compressed`` (and ``gradient`` with ``local-epochs``): ``local-epochs``
  epochs over the client's rows; ``gradient``: ``local-steps * batch-size``; no server work.
- ``dq``: a client forwards its candidates where a model scores them, trains twice on its
  chosen rows where it sends a compensation, and ``gradient-batch-size`` rows in a gradient
  round; the server trains ``server_steps * server-batch-size`` samples and forwards its
  held-out rows at every plateau check.

A client's rows are the largest partition's (an upper bound for unequal partitions).
Quantizing and coding are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dq_flower.compare.devices import ComputeProfile, ModelFlops

__all__ = ["Workload", "RoundWork", "MODEL_SCORERS", "round_work", "profiled_history",
           "workload_of"]

#: Scorers that run the model over the candidates.
MODEL_SCORERS = frozenset({"loss", "gradnorm", "entropy", "margin"})


@dataclass(frozen=True)
class Workload:
    """The model's FLOPs per sample and the training rows of each partition."""

    flops: ModelFlops
    rows_per_client: tuple[int, ...]

    @property
    def max_rows(self) -> int:
        """The largest partition's rows."""
        return max(self.rows_per_client, default=0)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"flops": self.flops.to_json(), "rows_per_client": list(self.rows_per_client)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Workload:
        """Inverse of :meth:`to_json`."""
        return cls(ModelFlops.from_json(data["flops"]),
                   tuple(int(r) for r in data["rows_per_client"]))


@dataclass(frozen=True)
class RoundWork:
    """Samples trained (forward + backward) and forwarded in one round, per client and server."""

    client_train: float = 0.0
    client_forward: float = 0.0
    server_train: float = 0.0
    server_forward: float = 0.0

    def client_flops(self, flops: ModelFlops) -> float:
        """One client's FLOPs in the round."""
        return self.client_train * flops.train + self.client_forward * flops.forward

    def server_flops(self, flops: ModelFlops) -> float:
        """The server's FLOPs in the round."""
        return self.server_train * flops.train + self.server_forward * flops.forward


def _num(config: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = config.get(key)
    return float(value) if isinstance(value, (int, float)) and value else default


def round_work(record: Mapping[str, Any], row: Mapping[str, Any],
               previous: Mapping[str, Any] | None, rows: int,
               num_params: int = 0) -> RoundWork:
    """The model passes of history ``row`` (after ``previous``) of run ``record``.

    ``rows`` per client; ``num_params``: a DQ client with ``auto`` scoring scored where its
    downlink carried at least one byte per parameter.
    """
    if int(row.get("round", 0)) == 0:
        return RoundWork()
    family = str(record.get("family"))
    cfg = record.get("config") or {}
    if family in ("fedavg", "compressed") or (family == "gradient"
                                              and _num(cfg, "local-epochs") > 0):
        return RoundWork(client_train=_num(cfg, "local-epochs", 1.0) * rows)
    if family == "gradient":
        return RoundWork(client_train=_num(cfg, "local-steps", 1.0)
                         * _num(cfg, "batch-size", 32.0))
    if family != "dq":
        raise ValueError(f"unknown method family {family!r}")
    return _dq_work(cfg, row, previous, rows, num_params)


def _dq_work(cfg: Mapping[str, Any], row: Mapping[str, Any],
             previous: Mapping[str, Any] | None, rows: int, num_params: int) -> RoundWork:
    steps = float(row.get("server_steps", _num(cfg, "server-steps")) or 0.0)
    every = _num(cfg, "plateau-eval-every")
    checks = math.floor(steps / every) if every else 0
    server_train = steps * _num(cfg, "server-batch-size", 64.0)
    server_forward = checks * float(row.get("holdout_rows", 0) or 0)
    clients = row.get("clients") or []
    replies = len(clients) or int(row.get("replies", 0) or 0)
    if replies == 0:
        return RoundWork(server_train=server_train, server_forward=server_forward)
    if row.get("gradient_round") == 1:
        return RoundWork(client_train=min(_num(cfg, "gradient-batch-size", 32.0), rows),
                         server_train=server_train, server_forward=server_forward)
    chosen = math.ceil(float(row.get("selected", 0) or 0) / replies)
    scorer = str(cfg.get("scorer", "uniform"))
    got_model = bool(clients) and num_params > 0 and all(
        float(c[1]) >= num_params for c in clients)
    forward = 0.0
    if scorer in MODEL_SCORERS or (scorer == "auto" and got_model):
        held = float((previous or {}).get("stored", 0) or 0)
        forward = max(rows - held / max(_num(cfg, "num-partitions", 1.0), 1.0), 0.0)
    train = 2.0 * chosen if str(cfg.get("compensation", "none")) != "none" else 0.0
    return RoundWork(client_train=train, client_forward=forward, server_train=server_train,
                     server_forward=server_forward)


def profiled_history(record: Mapping[str, Any], workload: Workload, device: ComputeProfile,
                     server: ComputeProfile) -> list[dict[str, Any]] | None:
    """``record``'s history with each round's compute times from the profiles.

    A ``measured`` profile keeps the measured times; ``None`` where ``device`` cannot
    train and a round asks it to.
    """
    out: list[dict[str, Any]] = []
    previous: Mapping[str, Any] | None = None
    num_params = int(record.get("num_params") or 0)
    for row in record.get("history") or []:
        new = dict(row)
        if int(row.get("round", 0)) >= 1 and row.get("clients") is not None:
            work = round_work(record, row, previous, workload.max_rows, num_params)
            if work.client_train > 0 and row["clients"] and not device.can_train:
                return None
            if not device.measured:
                seconds = device.seconds(work.client_flops(workload.flops))
                new["clients"] = [[seconds, d, u] for _, d, u in row["clients"]]
            if not server.measured:
                new["server_compute_s"] = server.seconds(work.server_flops(workload.flops))
        out.append(new)
        previous = row
    return out


def workload_of(preset: Mapping[str, Any], data_dir: str | None = None,
                train_rows: int = 0) -> Workload:
    """The workload of ``results["preset"]``: its model and partitions, as the runs drew them."""
    # PyTorch and the data sets: loaded only where a task's workload is counted
    from dq_flower.compare.devices import model_flops
    from dq_flower.harness.tasks import make_model, partition_indices
    from dq_flower.harness.tasks.data import load_task_dataset

    ds = load_task_dataset(str(preset["dataset"]), data_dir or preset.get("data_dir") or None,
                           int(preset.get("seed", 0)), 0.0, train_rows)
    model = make_model(str(preset["model"]), ds.input_shape, ds.num_classes)
    parts = partition_indices(ds.train_y, int(preset["num_clients"]),
                              str(preset.get("partition", "iid")),
                              alpha=float(preset.get("dirichlet_alpha", 0.5)),
                              seed=int(preset.get("seed", 0)))
    return Workload(model_flops(model, ds.input_shape), tuple(len(p) for p in parts))
