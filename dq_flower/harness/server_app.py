"""The package's ``ServerApp``: the method's public strategy, built from the run config.

Every message is measured (:class:`~dq_flower.MeasuredGrid`), the model is evaluated after
every round (centrally, or by the clients with ``fraction-evaluate``) and the server's state
is checkpointed every few rounds, so that a killed run resumes where it stopped. Each
history row carries the round's time (:func:`round_timing`), which
:mod:`dq_flower.compare.links` turns into the time a round takes on a given link.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from logging import INFO
from typing import Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from dq_flower.accounting import Ledger, MeasuredGrid
from dq_flower.config import write
from dq_flower.harness.checkpoint import (
    CHECKPOINT_NAME,
    PREVIOUS_NAME,
    UNREADABLE_NAME,
    read_checkpoint,
    save_atomic,
)
from dq_flower.harness.history import RunResult
from dq_flower.harness.methods import get_method, validate_run_config
from dq_flower.harness.runtime import ModelFactory, TaskInfo, build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_task_dataset
from dq_flower.model_ops import evaluate, inference, num_params, state_arrays
from dq_flower.server.base import DrivenStrategy
from dq_flower.server.pipeline import FailureWatch, ServerFigures

__all__ = ["app", "run_server", "validate_run_config", "prepare_model", "CLIENT_TIME_KEY",
           "reply_compute_s", "round_timing"]

#: Metric every client handler of this package puts in its reply.
CLIENT_TIME_KEY = "client-time-s"
#: What a checkpoint of :func:`run_server` holds.
CHECKPOINT_KEYS = ("round", "elapsed", "arrays", "ledger", "history", "strategy")
#: Task keys a checkpoint must share with the run that resumes it (and the method): they
#: decide the data, each node's rows and the model its state was learned on.
RUN_KEYS = ("dataset", "model", "num-partitions", "partition", "dirichlet-alpha", "seed",
            "input-shape", "num-classes", "validation-fraction", "train-rows", "test-rows")


def prepare_model(task: TaskConfig, info: TaskInfo,
                  model_factory: ModelFactory | None = None) -> torch.nn.Module:
    """Build the server's model and check it takes the task's samples, before any round.

    Raises ``ValueError`` for an unknown model name, a factory that does not return an
    ``nn.Module``, or a model that rejects the sample shape or has the wrong output width.
    """
    if model_factory is None:
        torch.manual_seed(task.seed)
        model = build_model(task, info)
    else:
        model = model_factory()
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model factory returned {type(model).__name__}, not an nn.Module")
    dev = next(model.parameters()).device
    try:
        with inference(model):
            out = model(torch.zeros((2, *info.input_shape), device=dev))
    except Exception as exc:  # noqa: BLE001  (any error: the model cannot take the samples)
        raise ValueError(f"model: it does not accept samples of shape {info.input_shape}: "
                         f"{type(exc).__name__}: {exc}") from None
    width = math.prod(out.shape[1:])
    if out.shape[0] != 2 or width != info.outputs:
        raise ValueError(f"model: output of shape {tuple(out.shape)} for 2 samples; the task "
                         f"needs {info.outputs} outputs per sample")
    return model


def run_server(grid: Grid, run_config: Mapping[str, Any],
               on_round: Callable[[dict[str, Any]], None] | None = None,
               model_factory: ModelFactory | None = None) -> RunResult:
    """Run one method to completion on ``grid`` and return its measured history.

    Flower's ``Strategy.start`` loop, plus: the state is checkpointed every
    ``checkpoint-every`` rounds into ``checkpoint-dir`` (a run finding a checkpoint there
    resumes after its round) and ``on_round(row)`` gets each history row, which also carries
    the round's timing (:func:`round_timing`). Raises
    :class:`~dq_flower.server.common.ClientFailureError` when every sampled client fails
    ``max-failed-rounds`` rounds in a row.
    """
    method = get_method(str(run_config.get("method", "dq")))
    task, knobs = validate_run_config(run_config)
    info = task_info(task)
    model = prepare_model(task, info, model_factory)
    run = _ServerRun(task, method.name, grid, prepare_model(task, info, model_factory),
                     on_round)
    strategy, run.train_config = method.build(task, run_config, model, info)
    run.strategy = (cast(DrivenStrategy, strategy) if isinstance(strategy, ServerFigures)
                    else FlowerStrategy(strategy))
    run.strategy.num_rounds = task.num_server_rounds
    run.arrays = state_arrays(model)
    start_round = run.restore()
    if start_round == 0:
        run.evaluate_round(0, None, None)
    # a resumed run that had ended early has no round left
    ended_before = bool(run.history and run.history[-1].get("ended_early"))
    last_round = start_round if ended_before else task.num_server_rounds
    for rnd in range(start_round + 1, last_round + 1):
        ended = run.train_round(rnd)
        run.checkpoint(rnd, ended)
        if ended:
            break
    return RunResult(method.name, {**run_config, **write(knobs)}, run.history, num_params(model),
                     info.dim)


def reply_compute_s(msg: Message) -> float | None:
    """A reply's ``client-time-s`` (``None`` if missing, not finite or negative)."""
    if msg.has_error():
        return None
    for record in msg.content.metric_records.values():
        value = record.get(CLIENT_TIME_KEY)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and value >= 0:
            return float(value)
    return None


def round_timing(replies: Iterable[Message], ledger: Ledger, server_round: int,
                 server_compute_s: float, exchange_s: float = math.inf) -> dict[str, Any]:
    """The timing fields of one round's history row.

    ``client_time_s`` (the slowest reply's ``client-time-s``, as each client measured its
    handler, at most ``exchange_s``, the wall time of the exchange that carried it: a node
    cannot have computed longer, so one that says 1e30 s sets no round's time; 0 without
    replies), ``server_compute_s`` (``configure_train`` plus
    ``aggregate_train``, measured by the harness for every method)
    and ``clients`` (``[client_time_s, down_bytes, up_bytes]`` per
    replying node, by node id, bytes read from ``ledger``; no metric counts 0 s).
    """
    down = ledger.down.get(server_round, {})
    up = ledger.up.get(server_round, {})
    clients = [[min(reply_compute_s(msg) or 0.0, float(exchange_s)),
                int(down.get(msg.metadata.src_node_id, 0)),
                int(up.get(msg.metadata.src_node_id, 0))]
               for msg in sorted((m for m in replies if not m.has_error()),
                                 key=lambda m: m.metadata.src_node_id)]
    return {"client_time_s": max((c[0] for c in clients), default=0.0),
            "server_compute_s": float(server_compute_s), "clients": clients}


class _ServerRun:
    """The state of one :func:`run_server` run and its steps (round, evaluation, save)."""

    def __init__(self, task: TaskConfig, name: str, grid: Grid, eval_model: torch.nn.Module,
                 on_round: Callable[[dict[str, Any]], None] | None) -> None:
        self.task, self.name, self.eval_model, self.on_round = task, name, eval_model, on_round
        # with validation-fraction the "test" rows are rows held out of the training set
        self.data = (load_task_dataset(task.dataset, task.data_dir or None, task.seed,
                                       task.validation_fraction, task.train_rows,
                                       task.test_rows)
                     if task.dataset != "none" else None)
        self.ledger = Ledger()
        self.measured = MeasuredGrid(grid, self.ledger)
        self.failures = FailureWatch(task.max_failed_rounds, name, announce=False)
        self.history: list[dict[str, Any]] = []
        self.strategy: DrivenStrategy = FlowerStrategy(None)
        self.train_config: ConfigRecord = ConfigRecord()
        self.arrays = ArrayRecord()
        self.t_start = time.perf_counter()
        self.run_keys = {"method": name, **write(task, keys=RUN_KEYS)}
        if task.dataset.lower().startswith("npz:"):  # simulate's arrays: a new temporary file a run
            self.run_keys["dataset"] = "npz"
        self.keep_as = PREVIOUS_NAME  # what the next save renames the newest checkpoint to

    def restore(self) -> int:
        """Load the latest checkpoint of ``checkpoint-dir`` if any; the round it holds.

        ``ValueError`` naming the file for a checkpoint of another method or run (a key of
        :data:`RUN_KEYS`) or one the strategy refuses; nothing is written then.
        """
        task = self.task
        found = (read_checkpoint(task.checkpoint_dir, CHECKPOINT_KEYS) if task.checkpoint_dir
                 else None)
        if found is None:
            self.t_start = time.perf_counter()
            return 0
        checkpoint, path = found
        for key, saved in checkpoint.get("run", {}).items():
            if self.run_keys.get(key) != saved:
                raise ValueError(f"{key}: the checkpoint {path} was written with {key} "
                                 f"{saved!r}, this run has {key} {self.run_keys.get(key)!r}: "
                                 f"resume with {key} = {saved!r}, or start afresh with "
                                 "another checkpoint-dir")
        try:
            self.strategy.load_state_dict(checkpoint["strategy"] or {})
        except ValueError as exc:
            raise ValueError(f"{exc} (checkpoint {path})") from None
        if path.name != CHECKPOINT_NAME:  # the newest is unreadable: kept aside, not lost
            self.keep_as = UNREADABLE_NAME
        self.t_start = time.perf_counter() - checkpoint["elapsed"]
        self.arrays = ArrayRecord(checkpoint["arrays"])
        self.ledger = Ledger.from_state(checkpoint["ledger"])
        self.measured.ledger = self.ledger
        self.history = checkpoint["history"]
        log(INFO, "[%s] resuming after round %d from %s", self.name, checkpoint["round"], path)
        return int(checkpoint["round"])

    def train_round(self, rnd: int) -> bool:
        """One round: train, federated evaluation, central evaluation; whether it ended."""
        task, strategy = self.task, self.strategy
        t_server = time.process_time()
        messages = strategy.configure_train(rnd, self.arrays,
                                            ConfigRecord(dict(self.train_config)),
                                            self.measured)
        server_s = time.process_time() - t_server
        t_exchange = time.perf_counter()
        replies = list(self.measured.send_and_receive(messages, timeout=task.round_timeout))
        exchange_s = time.perf_counter() - t_exchange
        if not strategy.watches_failures:
            self.failures.observe(replies)
        t_server = time.process_time()
        new_arrays, train_metrics = strategy.aggregate_train(rnd, replies)
        server_s += time.process_time() - t_server
        metrics = ({**strategy.round_figures(rnd), **dict((train_metrics or {}).items())}
                   or train_metrics)
        if new_arrays is not None:
            self.arrays = new_arrays
        fed = None
        if task.fraction_evaluate > 0:
            requests = strategy.configure_evaluate(rnd, self.arrays,
                                                   ConfigRecord(dict(self.train_config)),
                                                   self.measured)
            answers = self.measured.send_and_receive(requests, timeout=task.round_timeout)
            fed = strategy.aggregate_evaluate(rnd, answers)
        ended = strategy.finished
        self.evaluate_round(rnd, metrics, fed,
                            round_timing(replies, self.ledger, rnd, server_s, exchange_s),
                            ended)
        return ended

    def evaluate_round(self, rnd: int, metrics, fed: Mapping[str, Any] | None,
                       timing: Mapping[str, Any] | None = None, last: bool = False) -> None:
        """Score the model, append the round's history row and report it."""
        task, data, fed = self.task, self.data, fed or {}
        mark: dict[str, Any] = {"wall_s": 0.0, **(timing or {})}
        skipped = rnd % task.eval_every != 0 and rnd != task.num_server_rounds and not last
        if data is not None and skipped:  # eval-every: not this round
            mark.update(accuracy=float("nan"), loss=float("nan"))
        elif data is not None:
            self.eval_model.load_state_dict(self.arrays.to_torch_state_dict())
            loss, acc = evaluate(self.eval_model, data.test_x, data.test_y)
            mark.update(accuracy=acc, loss=loss)
        else:
            mark.update(accuracy=float(fed.get("eval-acc", float("nan"))),
                        loss=float(fed.get("eval-loss", float("nan"))))
        mark.update({"fed_" + key.replace("-", "_"): value for key, value in fed.items()})
        mark["wall_s"] = time.perf_counter() - self.t_start
        ledger = self.ledger
        row: dict[str, Any] = {
            "round": rnd, **mark, "up_bytes": ledger.round_bytes("up", rnd),
            "down_bytes": ledger.round_bytes("down", rnd),
            "cum_up_bytes": ledger.total_bytes("up", rnd),
            "cum_down_bytes": ledger.total_bytes("down", rnd)}
        for key, value in (metrics or {}).items():
            row.setdefault(key.replace("-", "_"), value)
        self.history.append(row)
        replies = float(row.get("replies") or 0)
        # `dq-flower deploy run` reads the bytes and replies of this line from the stream
        log(INFO, "[%s] round %d/%d: accuracy %.4f, loss %.4f, up %d B, down %d B, replies %d",
            self.name, rnd, task.num_server_rounds, row["accuracy"], row["loss"],
            row["up_bytes"], row["down_bytes"], int(replies) if math.isfinite(replies) else 0)
        if last and rnd < task.num_server_rounds:
            row["ended_early"] = True
            log(INFO, "[%s] ended early after round %d: %s", self.name, rnd,
                "the adaptive upload schedule stopped asking and the server's training "
                "reached its plateau")
        if self.on_round is not None:
            self.on_round(row)

    def checkpoint(self, rnd: int, ended: bool) -> None:
        """Save the server's state after ``rnd`` when ``checkpoint-every`` says so."""
        task = self.task
        if not task.checkpoint_dir or not (rnd % task.checkpoint_every == 0 or ended
                                           or rnd == task.num_server_rounds):
            return
        save_atomic(task.checkpoint_dir, {
            "round": rnd, "elapsed": time.perf_counter() - self.t_start,
            "arrays": self.arrays.to_torch_state_dict(), "ledger": self.ledger.state(),
            "history": self.history, "run": self.run_keys,
            "strategy": self.strategy.state_dict(),
        }, keep_as=self.keep_as)
        self.keep_as = PREVIOUS_NAME


class FlowerStrategy(ServerFigures):
    """One of Flower's own strategies (``FedAvg``), driven as the package's are.

    Stateless for a resumed run, never finished early; the harness watches its failures.
    """

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def configure_train(self, *args: Any) -> Iterable[Message]:
        """The inner strategy's train messages."""
        return self.strategy.configure_train(*args)

    def aggregate_round(self, *args: Any):
        """The inner strategy's aggregate."""
        return self.strategy.aggregate_train(*args)

    def configure_evaluate(self, *args: Any) -> Iterable[Message]:
        """The inner strategy's evaluate messages."""
        return self.strategy.configure_evaluate(*args)

    def aggregate_evaluate(self, *args: Any):
        """The inner strategy's evaluation aggregate."""
        return self.strategy.aggregate_evaluate(*args)


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
