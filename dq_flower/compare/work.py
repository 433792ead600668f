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
Quantizing and coding are not counted. The summary's "Time on devices and links" gives the
time to the target per (device, link) pair; it needs ``workload``, ``devices``,
``server_device`` and ``links`` in ``results.json`` (:func:`attach_devices` adds the first
three).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dq_flower.compare.devices import MEASURED, ComputeProfile, ModelFlops
from dq_flower.compare.fmt import fmt_seconds, is_failed, pct, time_cell
from dq_flower.compare.links import LinkProfile, cumulative_times, links_of, time_to_target

__all__ = ["Workload", "RoundWork", "MODEL_SCORERS", "round_work", "profiled_history",
           "workload_of", "PairTime", "pair_times", "device_link_table", "device_section",
           "device_verdict", "attach_devices"]

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
                              seed=int(preset.get("seed", 0)), groups=ds.train_groups)
    return Workload(model_flops(model, ds.input_shape), tuple(len(p) for p in parts))


@dataclass(frozen=True)
class PairTime:
    """One method's simulated seconds on one (device, link) pair (``None``: unknown)."""

    label: str
    to_target: float | None  # None: not reached
    total: float | None  # the whole run
    runs: bool = True  # whether the device can run the method at all


def pair_times(results: Mapping[str, Any], workload: Workload, device: ComputeProfile,
               server: ComputeProfile, link: LinkProfile) -> list[PairTime]:
    """Every successful run's time on ``device`` and ``link``, the server on ``server``."""
    target = float(results["target_accuracy"])
    out = []
    for rec in results["runs"]:
        if is_failed(rec) or not rec.get("history"):
            continue
        hist = profiled_history(rec, workload, device, server)
        if hist is None:
            out.append(PairTime(str(rec["label"]), None, None, runs=False))
            continue
        times = cumulative_times(hist, link)
        out.append(PairTime(str(rec["label"]), time_to_target(hist, link, target),
                            times[-1] if times else None))
    return out


def _fastest(times: Sequence[PairTime]) -> tuple[float, str] | None:
    """``(seconds, label)`` of the first run to reach the target (``None``: none did)."""
    return min(((t.to_target, t.label) for t in times if t.to_target is not None), default=None)


def _mflop(flops: float) -> str:
    mflop = flops / 1e6  # 22.9, 1,112.3; three significant digits below one (0.0192)
    return f"{mflop:,.1f}" if mflop >= 1 else f"{mflop:.3g}"


def device_link_table(results: Mapping[str, Any], workload: Workload,
                      devices: Sequence[ComputeProfile], server: ComputeProfile,
                      links: Sequence[LinkProfile]) -> list[str]:
    """The markdown table: a row per (device, link) pair, a column per method, the fastest."""
    target = pct(float(results["target_accuracy"]))
    labels = [str(r["label"]) for r in results["runs"]
              if not is_failed(r) and r.get("history")]
    if not labels:
        return []
    lines = [
        "## Time on devices and links", "",
        f"Simulated time to reach {target} with every client on the device and link of the "
        f"row and the server on {server.describe()}: each round's compute is the model's "
        f"FLOPs ({_mflop(workload.flops.forward)} MFLOP forward, "
        f"{_mflop(workload.flops.train)} MFLOP forward and backward per sample, "
        "counted with torch.utils.flop_counter) times the samples each side passes through "
        "the model, over the profile's FLOP/s; the bytes are the measured ones over the "
        "link. \"cannot train\": the device cannot run a backward pass, and the method's "
        "clients train; \"not reached\" gives the time of the whole run.", "",
        "| device | link | " + " | ".join(labels) + " | fastest |",
        "|---|---|" + "---:|" * len(labels) + "---|"]
    for device in devices:
        for link in links:
            times = pair_times(results, workload, device, server, link)
            by_label = {t.label: t for t in times}
            fastest = _fastest(times)
            lines.append(f"| {device.name} | {link.name} | "
                         + " | ".join(time_cell(by_label[x].to_target, by_label[x].total)
                                      if by_label[x].runs else "cannot train" for x in labels)
                         + f" | {fastest[1] if fastest else 'none reached'} |")
    lines += ["", "Profiles and their sources:", ""]
    lines += [f"- {profile.describe()}: {profile.source}."
              for profile in [*devices, *([server] if server not in devices else [])]]
    lines += [f"- {link.describe()}" + (f": {link.source}." if link.source else ".")
              for link in links]
    return lines + [""]


def device_section(results: Mapping[str, Any]) -> list[str]:
    """:func:`device_link_table` from ``results``' own fields (``[]`` without them)."""
    profiles = _profiles(results)
    return device_link_table(results, *profiles) if profiles and profiles[3] else []


def _profiles(results: Mapping[str, Any]
              ) -> tuple[Workload, list[ComputeProfile], ComputeProfile, list[LinkProfile]] | None:
    if not results.get("workload") or not results.get("devices"):
        return None
    workload = Workload.from_json(results["workload"])
    devices = [ComputeProfile.from_json(d) for d in results["devices"]]
    server_data = results.get("server_device")
    server = ComputeProfile.from_json(server_data) if server_data else MEASURED
    return workload, devices, server, links_of(results)


def device_verdict(results: Mapping[str, Any]) -> list[str]:
    """Verdict lines: per device profile, the fastest method to the target on each link."""
    profiles = _profiles(results)
    if profiles is None:
        return []
    workload, devices, server, links = profiles
    target = pct(float(results["target_accuracy"]))
    out = []
    for device in devices:
        parts = []
        for link in links:
            fastest = _fastest(pair_times(results, workload, device, server, link))
            parts.append(f"{link.name} {fastest[1]} ({fmt_seconds(fastest[0])})"
                         if fastest else f"{link.name} none")
        if parts:
            out.append(f"- Fastest to {target} with every client on {device.name} (server "
                       f"on {server.name}): " + "; ".join(parts) + ".")
    return out


def _train_rows(results: Mapping[str, Any]) -> int:
    """The ``train-rows`` subset the runs trained on (0: all rows)."""
    for run in results.get("runs") or []:
        value = (run.get("config") or {}).get("train-rows")
        if isinstance(value, int) and value > 0:
            return value
    value = (results.get("preset") or {}).get("knobs", {}).get("train-rows", 0)
    return int(value) if isinstance(value, int) else 0


def attach_devices(results: dict[str, Any], devices: Sequence[ComputeProfile],
                   server: ComputeProfile, train_rows: int | None = None) -> None:
    """Give ``results`` the workload (of its preset, on ``train_rows``) and profiles."""
    rows = _train_rows(results) if train_rows is None else train_rows
    workload = workload_of(results["preset"], None, rows)
    results["workload"] = workload.to_json()
    results["devices"] = [d.to_json() for d in devices]
    results["server_device"] = server.to_json()
