"""The package's ``ServerApp``: builds the method's strategy from the run config and runs it.

Every message is measured (:class:`~dq_flower.accounting.MeasuredGrid`) and the global model
is evaluated on the held-out test set after every round.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from logging import INFO
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from .accounting import Ledger, MeasuredGrid
from .config import TaskConfig, from_mapping
from .history import RunResult
from .methods import get_method
from .runtime import build_model, task_info
from .tasks.data import load_dataset_cached
from .tasks.params import evaluate, num_params

__all__ = ["app", "run_server", "validate_run_config"]


def validate_run_config(run_config: Mapping[str, Any]) -> tuple[TaskConfig, Any]:
    """Parse and check the whole run config before any work starts.

    Returns the task config and the method's config; raises ``ValueError`` naming the key.
    """
    method = get_method(str(run_config.get("method", "dq")))
    merged = {**method.defaults, **run_config}
    task = from_mapping(TaskConfig, merged)
    knobs = from_mapping(method.config_cls, merged)
    return task, knobs


def run_server(grid: Grid, run_config: Mapping[str, Any]) -> RunResult:
    """Run one method to completion on ``grid`` and return its measured history."""
    method = get_method(str(run_config.get("method", "dq")))
    run_config = {**method.defaults, **run_config}
    task, _ = validate_run_config(run_config)
    torch.manual_seed(task.seed)
    info = task_info(task)
    data = load_dataset_cached(task.dataset, task.data_dir or None, task.seed)
    model = build_model(task, info)
    eval_model = build_model(task, info)
    ledger = Ledger()
    measured = MeasuredGrid(grid, ledger)
    strategy, train_config = _build(method, task, run_config, model, info)

    marks: dict[int, dict[str, float]] = {}
    t_start = time.perf_counter()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        eval_model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = evaluate(eval_model, data.test_x, data.test_y)
        marks[server_round] = {"accuracy": acc, "loss": loss,
                               "wall_s": time.perf_counter() - t_start}
        log(INFO, "[%s] round %d/%d: test accuracy %.4f, loss %.4f, up %d B, down %d B",
            method.name, server_round, task.num_server_rounds, acc, loss,
            ledger.round_bytes("up", server_round), ledger.round_bytes("down", server_round))
        return MetricRecord({"accuracy": acc, "loss": loss})

    result = strategy.start(
        grid=measured,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=task.num_server_rounds,
        timeout=task.round_timeout,
        train_config=train_config,
        evaluate_fn=evaluate_fn,
    )
    history = []
    for rnd in sorted(marks):
        row: dict[str, Any] = {"round": rnd, **marks[rnd]}
        row["up_bytes"] = ledger.round_bytes("up", rnd)
        row["down_bytes"] = ledger.round_bytes("down", rnd)
        row["cum_up_bytes"] = ledger.total_bytes("up", rnd)
        row["cum_down_bytes"] = ledger.total_bytes("down", rnd)
        train_metrics = result.train_metrics_clientapp.get(rnd)
        if train_metrics is not None:
            for key, value in train_metrics.items():
                row.setdefault(key.replace("-", "_"), value)
        history.append(row)
    return RunResult(method.name, dict(run_config), history, num_params(model), info.dim)


def _build(method, task, run_config, model, info):
    built = method.build(task, run_config, model, info)
    strategy, train_config = built if isinstance(built, tuple) else (built, None)
    cfg = ConfigRecord({"method": method.name})
    if train_config is not None:
        for key, value in train_config.items():
            cfg[key] = value
    return strategy, cfg


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point for ``flwr run``: reads ``[tool.flwr.app.config]``."""
    run_config = dict(context.run_config)
    result = run_server(grid, run_config)
    out = str(run_config.get("results-path", ""))
    if out:
        result.save(out)
        log(INFO, "history written to %s", out)
