"""An autoencoder's data, ``(x, x)``: the samples are their own targets.

Anomaly detection on machines' spectra (a scratch app: an MLP autoencoder on 64 values, 6
nodes, 5 rounds): DQ sent every row's targets beside its samples, as float32 (64 of them,
the sample itself), 960,407 uplink bytes against FedAvg's 644,100; a convolutional
autoencoder's image targets ``(n, 1, 28, 28)`` were refused on the device ("float targets
must be (n,) or (n, k)"). A node whose targets are its samples now says so in its spec
(``inputs``) and sends none: the server takes the rows as decoded for targets (38,555
bytes, test MSE 0.036 against FedAvg's 0.162). The server shifts an image autoencoder's
targets with its inputs where it augments them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch import nn

import dq_flower
from dq_flower.codecs import PayloadError, make
from dq_flower.data_input import as_arrays
from dq_flower.dq.client.sent import spec_of
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.dq_batch import DataSpec, decode_batch
from dq_flower.wire.dq_upload import encode_batch


def _spectra(n: int, seed: int) -> np.ndarray:
    """``n`` vibration spectra of 64 values: three peaks each, a little noise."""
    rng = np.random.default_rng(seed)
    f = np.linspace(0, 1, 64)
    peaks, amps = rng.uniform(0.1, 0.9, (n, 3)), rng.uniform(0.5, 2, (n, 3))
    x = (amps[:, :, None] * np.exp(-((f - peaks[:, :, None]) / 0.03) ** 2)).sum(1)
    return (x + rng.normal(0, 0.05, (n, 64))).astype(np.float32)


class AutoEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 12), nn.ReLU(),
                                 nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_node_whose_targets_are_its_samples_says_so():
    x = _spectra(20, 0)
    assert spec_of(x, x.copy()) == DataSpec((64,), "inputs", 64)
    assert spec_of(x, x + 1).target == "float"  # other targets of the same shape
    images = np.random.default_rng(0).random((5, 1, 8, 8), dtype=np.float32)
    xs, ys = as_arrays((images, images.copy()))  # (n, 1, 8, 8) targets: the samples
    assert spec_of(xs, ys) == DataSpec((1, 8, 8), "inputs", 64)
    with pytest.raises(ValueError, match=r"\(n,\) or \(n, k\)"):
        as_arrays((images, images + 1))  # image-shaped targets that are not the samples


def test_no_targets_travel_and_a_reply_that_sends_some_is_refused():
    x = _spectra(8, 1)
    samples = make("uniform", bits=2).encode(x, np.random.default_rng(0))
    ids, weights = np.arange(8), np.ones(8, np.float32)
    content, bits = encode_batch(samples, None, ids, weights, 0, 8)
    assert "targets" not in content.array_records["sample-info"]
    batch = decode_batch(content, None, 64, 2, 8, 8, 64, True, own_targets=True)
    assert len(batch) == 8 and batch.info_nbits == bits - samples.nbits
    with_targets, _ = encode_batch(samples, x, ids, weights, 0, 8)
    with pytest.raises(PayloadError, match="their own targets"):
        decode_batch(with_targets, None, 64, 2, 8, 8, 64, True, own_targets=True)


def _run(targets_of) -> tuple[float, int]:
    """DQ on 4 nodes' spectra, 3 rounds: the test MSE and the uplink bytes."""
    parts = [_spectra(400, seed) for seed in range(4)]
    xt = _spectra(500, 9)
    up = []

    def train(msg, context):
        x = parts[int(context.node_config["partition-id"])]
        reply = dq_flower.client.dq_train(msg, context, (x, targets_of(x)))
        up.append(sum(len(a.data) for r in reply.content.array_records.values()
                      for a in r.values()))
        return reply

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = AutoEncoder()
        net.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            return MetricRecord({"mse": float(((net(torch.from_numpy(xt)) - torch.from_numpy(
                xt)) ** 2).mean())})

    model = AutoEncoder()
    result = dq_flower.DQStrategy(model, seed=0).start(
        grid=InProcessGrid(train, 4), num_rounds=3, evaluate_fn=evaluate,
        initial_arrays=ArrayRecord(model.state_dict()))
    return float(result.evaluate_metrics_serverapp[3]["mse"]), sum(up)


def test_dq_trains_an_autoencoder_on_the_rows_without_their_targets():
    own_mse, own_bytes = _run(lambda x: x)
    sent_mse, sent_bytes = _run(lambda x: x + np.float32(1e-3))  # float targets, sent
    assert own_bytes * 4 < sent_bytes  # 64 float targets a row weigh more than its codes
    assert own_mse < 0.1 and own_mse < 1.5 * sent_mse  # start: about 0.45


def test_float_targets_ask_one_stratum_whatever_the_models_outputs():
    given = dq_flower.DQStrategy(AutoEncoder(), seed=0,
                                 data_spec=DataSpec((64,), "inputs", 64))
    # 10 held-out rows over 0.1, one stratum (the floor of two): 200 in all, 50 a node
    assert given.asks.first_ask(4) == 64  # the budget; 64 "classes" asked 1,600 a node


class ConvAutoEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1), nn.ReLU(),
                                 nn.ConvTranspose2d(4, 1, 4, 2, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_an_image_autoencoders_targets_are_shifted_with_its_inputs(monkeypatch):
    """The default augmentation shifts images of 14 pixels a side and more; it shifted an
    autoencoder's inputs and not its targets (the rows as stored), so the server taught the
    model to undo the shifts: a convolutional one on Fashion-MNIST ended at a test MSE of
    0.0232 where it reaches 0.0062 now (0.0063 without augmentation; a scratch app)."""
    from dq_flower.model_ops import WeightedSteps

    rng = np.random.default_rng(0)
    images = np.zeros((120, 1, 16, 16), np.float32)
    for i, (r, c) in enumerate(rng.integers(2, 10, (120, 2))):
        images[i, 0, r:r + 5, c:c + 5] = 1.0  # a square somewhere: a shift moves it
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    step = WeightedSteps.step

    def watched(self, x, y, w):
        seen.append((np.array(x, copy=True), np.array(y, copy=True)))
        return step(self, x, y, w)

    monkeypatch.setattr(WeightedSteps, "step", watched)

    def train(msg, context):
        x = images[int(context.node_config["partition-id"])::2]
        return dq_flower.client.dq_train(msg, context, (x, x))

    model = ConvAutoEncoder()
    strategy = dq_flower.DQStrategy(model, seed=0, max_server_steps=40)
    strategy.start(grid=InProcessGrid(train, 2), num_rounds=1,
                   initial_arrays=ArrayRecord(model.state_dict()))
    assert seen
    stored = {row.tobytes() for row in images.reshape(120, -1)}
    shifted = 0
    for x, y in seen:
        assert np.array_equal(y.reshape(x.shape), x)  # the target is the input it was given
        shifted += sum(row.tobytes() not in stored for row in x.reshape(len(x), -1))
    assert shifted > 0  # the augmentation ran: the inputs are not the stored rows
