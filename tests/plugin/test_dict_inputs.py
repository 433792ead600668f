"""Dict samples of several arrays are several inputs of the model, in the dict's order.

``{"acc": (3, 128), "gyro": (3, 128), "activity": int}`` for ``forward(acc, gyro)`` failed
every round asking for ``keys=(input key, target key)``, and following that hint with
``keys=("acc", "activity")`` trained the two-input model on the accelerometer alone. The
arrays (no input's name among them) are now the inputs and the target is found by the
target rules (a target's name, else the one number beside them); ``keys=(("acc", "gyro"),
"activity")`` names them. A dict of one number a column still reads as one flat row.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

import dq_flower
from dq_flower import sample_keys
from dq_flower.data_input import as_arrays, as_inputs
from dq_flower.harness.inprocess import InProcessGrid
from tests.plugin.test_column_dicts import Told


def windows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, 6, 16)`` windows: the class shifts channel 4 (a gyroscope's) alone."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(0, 1, (n, 6, 16)).astype(np.float32)
    x[:, 4] += 2.0 * (2 * y[:, None] - 1)
    return x, y


class Windows(Dataset):
    """Items ``{"acc": tensor(3, 16), "gyro": tensor(3, 16), "activity": int, "t": int}``."""

    def __init__(self, n: int = 10, seed: int = 0, target: str = "activity") -> None:
        self.x, self.y = windows(n, seed)
        self.target = target

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        item = {"acc": torch.from_numpy(self.x[i, :3]), "gyro": torch.from_numpy(self.x[i, 3:]),
                self.target: int(self.y[i])}
        return item if self.target == "activity" else {**item, "t": i}  # a time stamp


def test_the_arrays_are_the_inputs_in_order_and_the_single_number_the_target(monkeypatch):
    monkeypatch.setattr(sample_keys, "_TOLD", set())
    data, told = Windows(), Told()
    logging.getLogger("flwr").addHandler(told)
    try:
        x, y, parts = as_inputs(data)
    finally:
        logging.getLogger("flwr").removeHandler(told)
    assert parts == ("f3x16", "f3x16") and y.tolist() == data.y.tolist()
    np.testing.assert_array_equal(x, data.x.reshape(10, -1))
    assert [line for line in told.lines if "several arrays" in line] == [
        "dict samples of several arrays: inputs acc, gyro in the model's order, target "
        "'activity'"]
    x, _, parts = as_inputs(data, keys=(("gyro", "acc"), "activity"))  # named, in that order
    np.testing.assert_array_equal(x[:, :48], data.x[:, 3:].reshape(10, -1))
    x, _, parts = as_inputs(data, keys=("acc", "activity"))  # one named: that one alone
    assert parts == () and x.shape == (10, 3, 16)
    labelled = Windows(target="label")  # a target's name; the time stamp left out
    x, y, parts = as_inputs(labelled)
    assert parts == ("f3x16", "f3x16") and y.tolist() == labelled.y.tolist()
    with pytest.raises(ValueError, match="samples of 2 inputs: these devices train on one"):
        as_arrays(data)  # the gradient baselines read one input


def test_a_target_that_cannot_be_told_is_asked_for_with_the_keys_form():
    x, _ = windows(4, 0)
    items = [{"acc": x[i, :3], "gyro": x[i, 3:], "person": 3, "activity": 1} for i in range(4)]
    with pytest.raises(ValueError, match=r"arrays 'acc', 'gyro' read as the model's inputs, "
                                         r"but no target .*keys=\(\('acc', 'gyro'\), 'person'\)"):
        as_inputs(items)
    x2, y, parts = as_inputs(items, keys=(("acc", "gyro"), "activity"))
    assert parts == ("f3x16", "f3x16") and y.tolist() == [1] * 4


class Stream(IterableDataset):
    def __iter__(self):
        yield from Windows(10)


def test_a_stream_of_such_dicts_and_a_server_asking_for_one_input():
    x, y, parts = as_inputs(DataLoader(Stream(), batch_size=4))
    assert parts == ("f3x16", "f3x16") and x.shape == (10, 96)
    with pytest.raises(ValueError, match=r"the server's model takes one input, the samples "
                                         r"hold 2 \(f3x16, f3x16\)"):
        as_inputs(Windows(), one_input=True)


class TwoBranches(nn.Module):
    """``forward(acc, gyro)``: a linear read of each sensor, summed."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.acc, self.gyro = nn.Linear(48, 2), nn.Linear(48, 2)

    def forward(self, acc: torch.Tensor, gyro: torch.Tensor) -> torch.Tensor:
        return self.acc(acc.flatten(1)) + self.gyro(gyro.flatten(1))


def test_dq_trains_a_two_input_model_on_dict_samples():
    xt, yt = windows(300, seed=9)
    acc, gyro = torch.from_numpy(xt[:, :3]), torch.from_numpy(xt[:, 3:])

    def accuracy(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = TwoBranches()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            pred = model(acc, gyro).argmax(1).numpy()
        return MetricRecord({"accuracy": float((pred == yt).mean())})

    def train(msg, context):
        part = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, Windows(150, seed=10 + part))

    first, last = two_rounds(TwoBranches(), train, accuracy)
    assert first["rejected"] == 0 and first["stored"] > 0  # every reply failed before
    assert last["accuracy"] > 0.9  # the gyroscope read


def two_rounds(model: nn.Module, train, evaluate_fn) -> tuple[MetricRecord, MetricRecord]:
    """DQ at its defaults on 2 nodes in-process: the metrics of its 2 rounds."""
    result = dq_flower.DQStrategy(model, seed=0).start(
        grid=InProcessGrid(train, 2), initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=2, evaluate_fn=evaluate_fn)
    return result.evaluate_metrics_serverapp[1], result.evaluate_metrics_serverapp[2]
