"""The package's ``ServerApp``: builds the method's strategy from the run config and runs it.

Every message is measured (:class:`~dq_flower.accounting.MeasuredGrid`), the global model is
evaluated on the held-out test set after every round, and the server's state can be
checkpointed every few rounds so that a killed run resumes where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from logging import INFO
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from .accounting import Ledger, MeasuredGrid
from .checkpoint import load_latest, save_atomic
from .config import TaskConfig, from_mapping
from .history import RunResult
from .methods import get_method
from .runtime import build_model, state_arrays, task_info
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


def _row(rnd: int, mark: dict[str, float], ledger: Ledger, metrics) -> dict[str, Any]:
    row: dict[str, Any] = {"round": rnd, **mark}
    row["up_bytes"] = ledger.round_bytes("up", rnd)
    row["down_bytes"] = ledger.round_bytes("down", rnd)
    row["cum_up_bytes"] = ledger.total_bytes("up", rnd)
    row["cum_down_bytes"] = ledger.total_bytes("down", rnd)
    for key, value in (metrics or {}).items():
        row.setdefault(key.replace("-", "_"), value)
    return row


def run_server(
    grid: Grid,
    run_config: Mapping[str, Any],
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Run one method to completion on ``grid`` and return its measured history.

    The loop is Flower's ``Strategy.start`` (configure, send and receive, aggregate,
    evaluate centrally) with two additions: the server's state is checkpointed every
    ``checkpoint-every`` rounds into ``checkpoint-dir`` (a run finding a checkpoint there
    resumes after its round), and ``on_round(row)`` is called with each history row.
    """
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
    arrays = state_arrays(model)
    history: list[dict[str, Any]] = []
    start_round, elapsed = 0, 0.0

    checkpoint = load_latest(task.checkpoint_dir) if task.checkpoint_dir else None
    if checkpoint is not None:
        start_round, elapsed = checkpoint["round"], checkpoint["elapsed"]
        arrays = ArrayRecord(checkpoint["arrays"])
        ledger = Ledger.from_state(checkpoint["ledger"])
        measured.ledger = ledger
        history = checkpoint["history"]
        if hasattr(strategy, "load_state_dict"):
            strategy.load_state_dict(checkpoint["strategy"])
        log(INFO, "[%s] resuming after round %d from %s", method.name, start_round,
            task.checkpoint_dir)

    t_start = time.perf_counter() - elapsed

    def evaluate_round(rnd: int, metrics) -> None:
        eval_model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = evaluate(eval_model, data.test_x, data.test_y)
        row = _row(rnd, {"accuracy": acc, "loss": loss,
                         "wall_s": time.perf_counter() - t_start}, ledger, metrics)
        history.append(row)
        log(INFO, "[%s] round %d/%d: test accuracy %.4f, loss %.4f, up %d B, down %d B",
            method.name, rnd, task.num_server_rounds, acc, loss, row["up_bytes"],
            row["down_bytes"])
        if on_round is not None:
            on_round(row)

    if start_round == 0:
        evaluate_round(0, None)
    for rnd in range(start_round + 1, task.num_server_rounds + 1):
        messages = strategy.configure_train(rnd, arrays, ConfigRecord(dict(train_config)),
                                            measured)
        replies = measured.send_and_receive(messages, timeout=task.round_timeout)
        new_arrays, metrics = strategy.aggregate_train(rnd, replies)
        if new_arrays is not None:
            arrays = new_arrays
        evaluate_round(rnd, metrics)
        if task.checkpoint_dir and (rnd % task.checkpoint_every == 0
                                    or rnd == task.num_server_rounds):
            save_atomic(task.checkpoint_dir, {
                "round": rnd, "elapsed": time.perf_counter() - t_start,
                "arrays": arrays.to_torch_state_dict(), "ledger": ledger.state(),
                "history": history,
                "strategy": strategy.state_dict() if hasattr(strategy, "state_dict") else None,
            })
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
