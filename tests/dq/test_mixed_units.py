"""Samples whose coordinates are in other units: sensor windows of several kinds.

A machine's window of readings (24 steps of 16 sensors, raw: degrees beside hundredths
beside pressures in thousands) was quantized with one range a sample (DQ's ``auto`` for
samples that are not flat): at 2 bits a step was about 700 units, every sensor but the
largest few arrived as noise, and DQ's model tested at 22.5% on 4 states (chance), against
46.6% now. Each node measures whether one range a sample would lose coordinates
(:func:`~dq_flower.codecs.affine.mixed_scales`); the agreed spec says so and such samples
take feature ranges, as flat tables do. Images and accelerometer windows are unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from torch import nn

import dq_flower
from dq_flower.codecs import PayloadError
from dq_flower.codecs.affine import mixed_scales
from dq_flower.dq.client.sent import spec_of
from dq_flower.dq.server.federation import FederationData
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.dq_batch import (
    MIXED_UNITS_KEY,
    DataSpec,
    range_mode,
    spec_from_record,
    spec_record,
)

#: Each sensor's unit scale: hundredths beside thousands.
SCALES = np.array([60, 1000, 0.01, 5, 300, 1, 20, 0.5], np.float32)


def _windows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows (12 steps, 8 sensors) in raw units; the state shows in sensor 2 alone."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(0, 0.3, (n, 12, 8)).cumsum(1) * 0.2 + 1.0
    x[:, :, 2] += (y[:, None] - 1) * 0.8  # a level per state, in hundredths
    return (x * SCALES).astype(np.float32), y


class SensorNet(nn.Module):
    """The user's model: divides by the sensors' known scales, then an MLP."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("scale", torch.from_numpy(SCALES))
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(96, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x / self.scale - 1.0)


def test_mixed_scales_tells_units_apart_from_images_and_like_channels():
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    digits = load_digits().images.reshape(-1, 64)
    assert not mixed_scales(digits[:360], 2)  # faint edge pixels: a few, not a quarter
    rng = np.random.default_rng(0)
    like = rng.normal(0, 1, (400, 6 * 128))  # accelerometer and gyroscope: one scale
    assert not mixed_scales(like, 2)
    x, _ = _windows(400, 0)
    assert mixed_scales(x.reshape(400, -1), 2)
    assert not mixed_scales(x[:1].reshape(1, -1), 2)  # one row: nothing to measure
    assert not mixed_scales(np.ones((50, 8)), 2)  # constant: nothing varies


def test_the_spec_carries_mixed_units_only_for_samples_that_are_not_flat():
    x, y = _windows(200, 1)
    spec = spec_of(x, y)
    assert spec.mixed_units and range_mode("auto", spec.sample_shape, True) == "feature"
    assert spec_from_record(spec_record(spec)) == spec
    flat = spec_of(x.reshape(200, -1), y)  # flat rows take feature ranges anyway
    assert not flat.mixed_units and MIXED_UNITS_KEY not in spec_record(flat)
    assert not spec_of(x, y, mixed_units=False).mixed_units  # the server's pin wins
    assert range_mode("auto", (12, 8)) == "sample"
    assert range_mode("sample", (12, 8), True) == "sample"  # a knob set by hand is kept
    record = spec_record(spec)
    record[MIXED_UNITS_KEY] = "yes"
    with pytest.raises(PayloadError, match="mixed-units"):
        spec_from_record(ConfigRecord(dict(record.items())))


def test_a_node_measuring_other_units_is_told_the_specs_and_the_pin_survives_a_checkpoint():
    data = FederationData()
    data.spec = DataSpec((12, 8), "class", mixed_units=True)
    data.retype_if(DataSpec((12, 9), "class"), 3)  # another shape: no pin
    assert not data.pin_units
    data.retype_if(DataSpec((12, 8), "class"), 3)
    assert data.pin_units
    again = FederationData()
    again.load_state(data.state(), lambda spec: None)
    assert again.pin_units and not FederationData().pin_units


def _accuracy(arrays: ArrayRecord, x: np.ndarray, y: np.ndarray) -> float:
    model = SensorNet()
    model.load_state_dict(arrays.to_torch_state_dict())
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def test_dq_learns_a_state_shown_by_a_sensor_in_hundredths_beside_one_in_thousands():
    parts = [_windows(300, seed) for seed in range(4)]
    xt, yt = _windows(600, 10)

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        x, y = parts[node]
        if node == 3:  # its small sensors stuck: its rows alone measure one scale
            x = x.copy()
            x[:, :, [0, 2, 3, 5, 6, 7]] = x[0, 0, [0, 2, 3, 5, 6, 7]]
        return dq_flower.client.dq_train(msg, context, (x, y))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"accuracy": _accuracy(arrays, xt, yt)})

    model = SensorNet()
    strategy = dq_flower.DQStrategy(model, seed=0)
    result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=3, evaluate_fn=evaluate,
                            initial_arrays=ArrayRecord(model.state_dict()))
    rounds = [result.evaluate_metrics_serverapp[r] for r in (1, 2, 3)]
    assert strategy.data.spec.mixed_units and strategy.data.mode == "feature"
    # node 3 measured one scale in round 1 (refused by the spec the others agreed on), then
    # was told the spec's units and joined
    assert rounds[0]["rejected"] == 1 and [r["rejected"] for r in rounds[1:]] == [0, 0]
    assert strategy.data.pin_units and len(strategy.data.ranges) == 4
    # one range a sample (ranges="sample"): 0.747 in each round, the level mostly lost
    assert rounds[-1]["accuracy"] > 0.9
