"""Sensor windows ``(C, L)`` are coded with one range per channel by default.

One range a window put an accelerometer's gravity (4,096 counts a g, raw int16) and a
gyroscope's turns in one scale: at 2 bits the quiet channels fell into one step. A user's
HAPT app on raw counts ended at 63.0% against FedAvg's 69.8%; with a range per channel
82.1% (scratch app, in-process). ``ranges = "channel"`` also left such windows at one
range a sample without a word (it read only images ``(C, H, W)``). Nodes no longer tell
"mixed units" apart for windows, which refused some honest nodes' first replies.

Windows ``(L, C)``, channels last (point clouds ``(128, 3)``, time-major sensor windows), are
coded as their transpose ``(C, L)`` with a range per channel and decoded back.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from torch import nn

import dq_flower
from dq_flower.codecs import PayloadError
from dq_flower.dq.client.sent import spec_of
from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.bit_width import relaid
from dq_flower.dq.server.nan_rows import NanRowLayout
from dq_flower.dq.server.store import RowLayout
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.dq_batch import DataSpec, channels_last, payload_quantizer, range_mode

LENGTH, NODES = 64, 4


def test_auto_reads_windows_by_channel_and_other_layouts_as_before():
    assert range_mode("auto", (6, 128)) == "channel"
    assert range_mode("auto", (3, 1000)) == "channel"
    assert range_mode("auto", (28, 28)) == "sample"  # an image without a channel axis
    assert range_mode("auto", (128, 6)) == "channel"  # time-major: channels last
    assert range_mode("auto", (128, 6), mixed_units=True) == "channel"
    assert range_mode("auto", (128, 40)) == "sample"  # not a few channels
    assert range_mode("auto", (1, 1000)) == "sample"
    assert range_mode("channel", (6, 128)) == "channel"
    assert range_mode("auto", (3, 32, 32)) == "sample"


def _windows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw counts: a class's gait small beside gravity on three channels, turns on three."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    t = np.arange(LENGTH)
    x = rng.normal(0, 20, (n, 6, LENGTH))
    gravity = rng.normal(size=(n, 3))  # the phone held at any angle: 4,096 counts a g
    x[:, :3] += (4096 * gravity / np.linalg.norm(gravity, axis=1, keepdims=True))[:, :, None]
    x[:, :3] += 60 * np.sin(2 * np.pi * (y[:, None, None] + 1) * t / LENGTH
                            + rng.uniform(0, 2 * np.pi, (n, 1, 1)))  # the gait on top
    x[:, 3:] += rng.uniform(-2000, 2000, (n, 3, 1))  # a gyroscope's steady turns
    return x.astype(np.int16), y.astype(np.int64)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv1d(6, 16, 5), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
                                  nn.Flatten(), nn.Linear(16, 4))

    def forward(self, x):
        x = x.float()
        return self.body((x - x.mean(dim=2, keepdim=True)) / 100.0)


class _LastNet(_Net):
    def forward(self, x):
        return super().forward(x.transpose(1, 2))


def _last(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The windows time-major ``(L, C)``."""
    x, y = _windows(n, seed)
    return np.ascontiguousarray(x.transpose(0, 2, 1)), y


def _accuracy(windows=_windows, net=_Net, **knobs) -> float:
    data = [windows(150, k) for k in range(NODES)]

    def train(msg, context):
        return dq_flower.client.dq_train(msg, context, data[int(context.node_config[
            "partition-id"])])

    model = net()
    strategy = dq_flower.DQStrategy(model, seed=0, upload_schedule="fixed", budget=150,
                                    server_steps=300, **knobs)
    result = strategy.start(grid=InProcessGrid(train, NODES), num_rounds=1,
                            initial_arrays=ArrayRecord(model.state_dict()))
    assert result.evaluate_metrics_serverapp[1]["rejected"] == 0
    model.load_state_dict(result.arrays.to_torch_state_dict())
    x, y = windows(400, 99)
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def test_raw_sensor_counts_keep_their_quiet_channels():
    one_range = _accuracy(ranges="sample")
    by_channel = _accuracy()  # the default
    assert by_channel > 0.9 and by_channel > one_range + 0.3, (one_range, by_channel)


def test_windows_carry_no_mixed_units_flag_nodes_could_disagree_on():
    x, y = _windows(50, 0)
    assert not spec_of(x.astype(np.float32), y).mixed_units
    quiet = x.astype(np.float32)
    quiet[:, :3] = 0  # a node at rest: what it measured as mixed, the others not
    assert spec_of(quiet, y) == spec_of(x.astype(np.float32), y)


def test_channels_last_windows_are_coded_by_channel_and_decoded_back():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(20, 128, 3)) * [0.01, 1.0, 100.0]).astype(np.float32)  # axes apart
    spec = DataSpec((128, 3))
    assert spec.channels == 3 and channels_last((128, 3)) and not channels_last((3, 128))
    coder = DQConfig(bits=2).sample_quantizer("channel", spec.channels, dither_seed=5,
                                              sample_shape=spec.sample_shape)
    p = coder.encode(x.reshape(20, -1), rng)
    assert p.meta["per_channel"] == 3 and p.meta["channels_last"] and p.buffers["mins"].size == 60
    steps = p.buffers["scales"].reshape(20, 3)  # a range per axis of each cloud
    assert (steps[:, 0] < 0.05).all() and (steps[:, 2] > 50).all()
    decoded = payload_quantizer(p, 2, 3, False, True).decode(p).reshape(20, 128, 3)
    assert (np.abs(decoded - x) <= steps[:, None, :] * 1.001).all()  # within each axis' step
    layout = RowLayout(384, 2, 3, False, True)  # the store's rows decode to the same values
    codes, side, dither = layout.rows(p)
    np.testing.assert_array_equal(layout.dequantize(codes, side, dither), decoded.reshape(20, -1))
    holes = rng.random((20, 384)) < 0.1  # NaN where the node's rows held it, in (L, C) order
    with_nan = NanRowLayout(384, 2, 3, False, True)
    out = with_nan.dequantize(with_nan.with_holes(codes, holes), side, dither)
    np.testing.assert_array_equal(np.isnan(out), holes)
    np.testing.assert_array_equal(out[~holes], decoded.reshape(20, -1)[~holes])
    wide = RowLayout(384, 4, 3, False, True)  # the bit raise re-lays them (c 2^b + c)
    side[:, 3:] /= np.float32(5)
    np.testing.assert_allclose(wide.dequantize(relaid(codes, layout, wide), side, dither),
                               decoded.reshape(20, -1), rtol=1e-5, atol=1e-4)
    wide_nan = NanRowLayout(384, 4, 3, False, True)  # NaN where they were, after the raise
    out = wide_nan.dequantize(relaid(with_nan.with_holes(codes, holes), with_nan, wide_nan),
                              side, dither)
    np.testing.assert_array_equal(np.isnan(out), holes)
    np.testing.assert_allclose(out[~holes], decoded.reshape(20, -1)[~holes], rtol=1e-5,
                               atol=1e-4)
    with pytest.raises(PayloadError, match="channels_last"):  # a decoder reading (C, L) refuses
        payload_quantizer(p, 2, 3).decode(p)


def test_time_major_windows_keep_their_quiet_channels():
    one_range = _accuracy(_last, _LastNet, ranges="sample")
    by_channel = _accuracy(_last, _LastNet)  # the default
    assert by_channel > 0.9 and by_channel > one_range + 0.3, (one_range, by_channel)
