"""DQ against federated LoRA fine-tuning on devices' text, every byte from the messages.

Each method runs in this process (:class:`dq_flower.harness.inprocess.InProcessGrid`, one
``Context`` per device) under :class:`dq_flower.MeasuredGrid`, which counts the serialized
size of every message both ways; the methods:

- ``lora-fedavg``: Flower's ``FedAvg`` on LoRA adapters (``peft``), as FlowerTune runs it:
  each device trains the adapters on its text and uploads them alone, float32;
- ``lora-fedavg-qsgd2``: the same, its uploads coded by ``CompressedUpdates`` with 2-bit
  QSGD (``compression_mod`` on the devices);
- ``upload-all``: each device uploads all its text once (DQ's ``upload_schedule="all"``,
  lossless token windows), the server fine-tunes the whole model on it to a plateau;
- ``dq``: ``DQStrategy`` at its defaults on the devices' token windows (the devices hold
  no model: they draw their windows uniformly);
- ``dq-scored``: the same, each device given the model (``dq_train(model=...)``): under
  ``scorer="auto"`` the server sends it the model each round after the first and it
  draws its windows by the model's predictive entropy.

All start from the same pretrained base. A round's record holds the held-out perplexity
(overall and per device) after the round, its uplink and downlink bytes and each device's
training FLOPs (what its reply reports; DQ's and ``upload-all``'s devices train nothing).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, Context, Message
from torch import nn

from dq_flower import CompressedUpdates, DQStrategy, compression_mod
from dq_flower.accounting import MeasuredGrid, round_of
from dq_flower.client import dq_train
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.lora.adapters import LoraSettings, adapter_bytes, with_adapters
from dq_flower.harness.lora.client import LocalTraining, lora_train
from dq_flower.harness.lora.server import (
    HeldOutText,
    adapters_evaluate_fn,
    initial_adapters,
    lora_fedavg,
    weights_evaluate_fn,
)
from dq_flower.node import node_key

__all__ = ["TextTask", "LORA_METHODS", "DATA_METHODS", "METHODS", "run_method"]

LORA_METHODS = ("lora-fedavg", "lora-fedavg-qsgd2")
DATA_METHODS = ("upload-all", "dq", "dq-scored")
METHODS = LORA_METHODS + DATA_METHODS


@dataclass(frozen=True)
class TextTask:
    """Devices' training data (in order), their held-out windows and the window length.

    ``train``: each device's text (UTF-8 bytes as tokens), or its windows of token ids
    ``(n, window)`` cut by the app's tokenizer, with ``vocab`` its vocabulary size.
    """

    names: tuple[str, ...]
    train: tuple[Any, ...]
    held: HeldOutText
    window: int = 128
    vocab: int | None = None

    @property
    def num_devices(self) -> int:
        """Number of devices."""
        return len(self.names)


@dataclass
class _Replies:
    """What the devices' replies report, per round and device: training FLOPs."""

    flops: dict[int, dict[str, float]] = field(default_factory=dict)

    def note(self, msg: Message, reply: Message, name: str) -> None:
        rnd = round_of(msg) or 0
        flops = 0.0
        if not reply.has_error():
            for record in reply.content.metric_records.values():
                value = record.get("train-flops", 0.0)
                flops += float(value) if isinstance(value, (int, float)) else 0.0
        self.flops.setdefault(rnd, {})[name] = flops


def _client(task: TextTask, method: str, base: nn.Module, lora: LoraSettings,
            replies: _Replies) -> Callable[[Message, Context], Message]:
    """The devices' ``@app.train()``, one model per device where it trains one."""
    models: dict[int, nn.Module] = {}

    def train(msg: Message, context: Context) -> Message:
        k = node_key(context)  # the partition id
        if method in LORA_METHODS:
            if k not in models:
                models[k] = with_adapters(base, lora)
            reply = lora_train(msg, context, task.train[k], model=models[k], window=task.window)
        else:
            if method == "dq-scored" and k not in models:
                models[k] = copy.deepcopy(base)
            reply = dq_train(msg, context, task.train[k], window=task.window,
                             model=models.get(k), vocab=task.vocab)
        replies.note(msg, reply, task.names[k])
        return reply

    if method != "lora-fedavg-qsgd2":
        return train
    return lambda msg, context: compression_mod(msg, context, train)


def _strategy(method: str, task: TextTask, base: nn.Module, lora: LoraSettings,
              seed: int, dq_knobs: dict[str, Any]) -> tuple[Any, ArrayRecord, Any]:
    """The strategy, its initial arrays and its ``evaluate_fn``."""
    if method in LORA_METHODS:
        strategy: Any = lora_fedavg(task.num_devices)
        if method == "lora-fedavg-qsgd2":
            strategy = CompressedUpdates(strategy, codec="qsgd", codec_params={"levels": 1},
                                         seed=seed)
        return (strategy, initial_adapters(base, lora),
                adapters_evaluate_fn(base, lora, task.held))
    model = copy.deepcopy(base)
    knobs = {**({"upload_schedule": "all"} if method == "upload-all" else {}), **dq_knobs}
    strategy = DQStrategy(model, seed=seed, **knobs)
    return (strategy, ArrayRecord(model.state_dict()),
            weights_evaluate_fn(copy.deepcopy(base), task.held))


def run_method(method: str, task: TextTask, base: nn.Module, *, rounds: int,
               lora: LoraSettings | None = None, local: LocalTraining | None = None,
               seed: int = 0, dq_knobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``method`` for ``rounds`` rounds from ``base``; its history, JSON-ready.

    ``history`` lists round 0 (the base, no bytes) and each round: ``perplexity``, the
    per-device ``perplexity-<name>``, ``up_bytes`` and ``down_bytes`` of the round,
    ``device_flops`` (device name -> the training FLOPs its reply reported), and for DQ's
    methods ``server_steps`` and ``windows`` (the windows the server received in the round);
    a DQ method's ``received`` maps each device's index to the ids of the windows the server
    received from it (which windows, not only how many).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    lora = lora or LoraSettings(seed=seed)
    local = local or LocalTraining(num_rounds=rounds, seed=seed)
    replies = _Replies()
    grid = MeasuredGrid(InProcessGrid(_client(task, method, base, lora, replies),
                                      task.num_devices))
    strategy, initial, evaluate = _strategy(method, task, base, lora, seed, dq_knobs or {})
    t0 = time.perf_counter()
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds,
                            train_config=local.config() if method in LORA_METHODS else None,
                            evaluate_fn=evaluate)
    seconds = time.perf_counter() - t0
    up, down = grid.per_round("up"), grid.per_round("down")
    history = []
    for rnd, metrics in sorted(result.evaluate_metrics_serverapp.items()):
        history.append({
            "round": int(rnd),
            **{k: float(v) for k, v in metrics.items()
               if k.startswith("perplexity")},
            "up_bytes": int(up.get(rnd, 0)), "down_bytes": int(down.get(rnd, 0)),
            "device_flops": replies.flops.get(rnd, {name: 0.0 for name in task.names}
                                              if rnd else {}),
            # DQ's server reports the steps it trained (its round metrics join these)
            "server_steps": int(metrics.get("server-steps", 0)),
            # and the windows it received in the round (0 for the LoRA methods)
            "windows": int(metrics.get("selected", 0))})
    out: dict[str, Any] = {"method": method, "rounds": rounds, "seconds": seconds,
                           "history": history, "seed": seed}
    if method in LORA_METHODS:
        out["adapter_bytes"] = adapter_bytes(initial)
        out["lora"] = {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets)}
        out["local"] = {k: v for k, v in local.config().items()}
    else:
        if dq_knobs:
            out["knobs"] = dict(dq_knobs)
        store = strategy.store  # which windows of each device the server received
        out["received"] = {} if store is None else {
            str(node): store.received(node).tolist() for node in store.clients}
    return out
