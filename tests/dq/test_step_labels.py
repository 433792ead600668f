"""A label a time step of a float sensor window: integer targets ``(n, length)``, float samples.

Such targets have the shape of a language model's token windows, and the server's steps
took the samples beside them for ids: they reached the model as int64, a convolution's float
weights refused them ("Input type (long int) and bias type (float) should be the same") and
every reply of every round was refused. The samples are ids only for a model holding an
embedding.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.losses import element_loss
from dq_flower.model_ops import WeightedSteps, per_sample_results, weighted_loss_grad

NODES, WINDOWS, STEPS = 3, 60, 48


def windows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of 2 axes (in g) whose motion (rest, walk, run) changes every 8 to 24 steps."""
    rng = np.random.default_rng(seed)
    y = np.repeat(rng.integers(0, 3, (n, STEPS // 8)), 8, axis=1)
    amp = np.array([0.02, 0.5, 1.5])[y]
    t = np.arange(STEPS)
    x = amp[:, None] * np.sin(0.4 * t + rng.uniform(0, 6, (n, 2, 1)))
    x = x + 1.0 + rng.normal(0, 0.05, x.shape)
    return x.astype(np.float32), y.astype(np.int64)


class Labeller(nn.Module):
    """A fully convolutional net: 3 classes' logits at every step, ``(n, 3, length)``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv1d(2, 8, 7, padding=3), nn.ReLU(), nn.Conv1d(8, 3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_float_windows_beside_step_labels_reach_the_model_as_floats():
    x, y = windows(5, 0)
    model = Labeller()
    loss, grad = weighted_loss_grad(model, x, y, np.full(5, 0.2, np.float32), element_loss)
    assert np.isfinite(loss) and grad.shape == (sum(p.numel() for p in model.parameters()),)
    step = WeightedSteps(model, torch.optim.SGD(model.parameters(), lr=0.1), element_loss)
    assert np.isfinite(step.step(x, y, np.full(5, 0.2, np.float32)))
    losses, hits = per_sample_results(model, x, y, element_loss)
    assert losses.shape == (5,) and hits is None  # a label a step: no row right or wrong


def test_a_step_labeller_trains_through_dq_at_its_defaults():
    def train(msg: Message, context: Context) -> Message:
        return dq_flower.client.dq_train(
            msg, context, windows(WINDOWS, int(context.node_config["partition-id"])))

    test_x, test_y = windows(200, 99)

    def accuracy(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Labeller()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            hit = (model(torch.from_numpy(test_x)).argmax(1).numpy() == test_y).mean()
        return MetricRecord({"accuracy": float(hit)})

    model = Labeller()
    strategy = dq_flower.DQStrategy(model, seed=0)
    result = strategy.start(grid=InProcessGrid(train, NODES),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2,
                            evaluate_fn=accuracy)
    assert all(strategy.round_figures(r)["rejected"] == 0 for r in (1, 2))
    assert strategy.stored > 0
    scores = {r: m["accuracy"] for r, m in result.evaluate_metrics_serverapp.items()}
    assert scores[2] > 0.7 > 0.4 > scores[0], scores  # chance: a third
