"""One hostile node among honest ones on the README's digits MLP, replies through the wire.

The README quickstart's server and clients (its MLP, scikit-learn's digits scaled to
``[0, 1]``, rows split by index over the nodes), run by Flower's ``Strategy.start`` over the
in-process grid. Every reply is serialized as Flower does (protobuf) and parsed back; the
hostile node's (partition 0: its reply is the first the server reads) is edited by an
attack between the two. A control run is the same run with the hostile node honest.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from sklearn.datasets import load_digits
from torch import nn

import dq_flower
from dq_flower.codecs.bitpack import pack, unpack
from dq_flower.harness.inprocess import InProcessGrid

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)
X_TEST, Y_TEST = X[1500:], Y[1500:]
NODES = 5  # 4 honest nodes and the hostile one
HOSTILE = 0  # its partition id: the first node, so its reply is read first

#: ``attack(msg, context, local) -> content``: the hostile node's reply content to the train
#: message ``msg``, given the node's own rows ``local = (x, y)``.
Attack = Callable[[Message, Context, tuple[np.ndarray, np.ndarray]], RecordDict]


class Net(nn.Module):
    """The README's MLP: no flattening, so it accepts a wrong sample shape silently."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.body(x)


def wire(content: RecordDict) -> RecordDict:
    """``content`` after a round trip through Flower's protobuf serialization."""
    return recorddict_from_proto(recorddict_to_proto(content))


def raw(values: np.ndarray) -> Array:
    flat = np.ascontiguousarray(values).reshape(-1)
    return Array(dtype=str(flat.dtype), shape=(flat.size,), stype="raw", data=flat.tobytes())


def buffer(content: RecordDict, record: str, name: str) -> np.ndarray:
    arr = content[record][name]
    return np.frombuffer(arr.data, dtype=arr.dtype).copy()


def set_metrics(content: RecordDict, **values: Any) -> None:
    metrics = dict(content["metrics"].items())
    metrics.update({k.replace("_", "-"): v for k, v in values.items()})
    content["metrics"] = MetricRecord(metrics)


def set_shape(content: RecordDict, shape: list[int]) -> None:
    spec = dict(content["data-spec"].items())
    spec["sample-shape"] = shape
    content["data-spec"] = ConfigRecord(spec)


def flip_labels(content: RecordDict) -> None:
    counts = buffer(content, "sample-info", "counts")
    n, width = int(counts[0]), int(counts[1])
    labels = unpack(buffer(content, "sample-info", "labels"), width, n)
    content["sample-info"]["labels"] = raw(pack(9 - labels.astype(np.int64), width))


def claim(content: RecordDict, examples: int) -> None:
    """Claim ``examples`` examples, all of them candidates, with weights to match."""
    n = int(buffer(content, "sample-info", "counts")[0])
    if n:
        content["sample-info"]["weights"] = raw(np.full(1, examples / n, dtype=np.float32))
    set_metrics(content, num_examples=examples, candidates=examples)


def honest(msg: Message, context: Context, local: tuple[np.ndarray, np.ndarray]) -> RecordDict:
    """The package's client on the node's own rows, its reply as it leaves the node."""
    return wire(dq_flower.client.dq_train(msg, context, local).content)


def edits(editor: Callable[[RecordDict, int], None]) -> Attack:
    """The attack that edits an honest reply: ``editor(content, server_round)``."""

    def attack(msg: Message, context: Context, local) -> RecordDict:
        content = honest(msg, context, local)
        editor(content, int(msg.content["config"]["server-round"]))
        return content

    attack.__name__ = editor.__name__
    attack.__doc__ = editor.__doc__
    return attack


def _client(attack: Attack | None, nodes: int):
    def app(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        local = (X[k:1500:nodes], Y[k:1500:nodes])
        hostile = attack is not None and k == HOSTILE
        content = (attack if hostile else honest)(msg, context, local)  # type: ignore[operator]
        return Message(wire(content), reply_to=msg)

    return app


def _accuracy(model: nn.Module) -> float:
    with torch.no_grad():
        pred = model(torch.from_numpy(X_TEST)).argmax(1).numpy()
    return float((pred == Y_TEST).mean())


def run(attack: Attack | None = None, rounds: int = 3, nodes: int = NODES, seed: int = 0,
        **knobs: Any) -> tuple[float, dq_flower.DQStrategy, list[dict]]:
    """Final test accuracy, the strategy and each round's metrics of one run.

    ``seed`` seeds the model's initial weights and the strategy.
    """
    torch.manual_seed(seed)
    model = Net()
    strategy = dq_flower.DQStrategy(model, seed=seed, **knobs)
    grid = InProcessGrid(_client(attack, nodes), nodes)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=rounds)
    trained = Net()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    metrics = [dict(result.evaluate_metrics_serverapp[r]) for r in range(1, rounds + 1)]
    return _accuracy(trained), strategy, metrics


@lru_cache(maxsize=8)
def control(rounds: int = 3, seed: int = 0, **knobs: Any) -> float:
    """Accuracy of the same run with every node honest."""
    return run(None, rounds, seed=seed, **knobs)[0]
