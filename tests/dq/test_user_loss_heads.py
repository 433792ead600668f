"""A user's loss that reads outputs of its own width: DQ trains on it, as FedAvg does.

A mean and a log-variance for one float target (Gaussian NLL), quantile heads, ordinal
(cumulative) logits one fewer than the ranks, labels counted from 1: the server's model
check required one output per float target or per class and refused every reply, every
round, so the run ended at the initial model while FedAvg learned (a user's app: a
Gaussian NLL head at MAE 1.985 throughout against FedAvg's 0.912).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord
from sklearn.datasets import load_digits
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.model_ops import per_sample_results

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)


def _run(model, loss_fn, rows, rounds=3):
    """Rounds of DQ at its defaults over 4 nodes holding ``rows(partition)``."""
    def train(msg, context):
        return dq_flower.client.dq_train(msg, context, rows(int(context.node_config[
            "partition-id"])), loss_fn=loss_fn)

    strategy = dq_flower.DQStrategy(model, seed=0, loss_fn=loss_fn)
    result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=rounds,
                            initial_arrays=ArrayRecord(model.state_dict()))
    metrics = [result.evaluate_metrics_serverapp[r] for r in range(1, rounds + 1)]
    model.load_state_dict(result.arrays.to_torch_state_dict())
    return metrics


def gaussian_nll(out, y):
    mean, log_var = out[:, 0], out[:, 1]
    return 0.5 * (log_var + (y - mean) ** 2 / log_var.exp())


def test_a_mean_and_variance_head_for_one_float_target_is_trained():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(800, 5)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0, 1.5]) + 0.3 * rng.normal(size=800)).astype(
        np.float32)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2))
    before = float(np.abs(model(torch.from_numpy(x[600:]))[:, 0].detach().numpy()
                          - y[600:]).mean())
    metrics = _run(model, gaussian_nll, lambda k: (x[k:600:4], y[k:600:4]))
    assert all(m["rejected"] == 0 for m in metrics) and metrics[-1]["stored"] > 0
    after = float(np.abs(model(torch.from_numpy(x[600:]))[:, 0].detach().numpy()
                         - y[600:]).mean())
    assert after < 0.5 * before, (before, after)  # was refused: the initial model's error


def test_labels_counted_from_one_are_trained_and_scored_by_the_loss():
    def shifted(out, y):
        return nn.functional.cross_entropy(out, y - 1, reduction="none")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    metrics = _run(model, shifted, lambda k: (X[k:1400:4], Y[k:1400:4] + 1))
    assert all(m["rejected"] == 0 for m in metrics) and metrics[-1]["stored"] > 0
    pred = model(torch.from_numpy(X[1400:])).argmax(1).numpy()
    assert (pred == Y[1400:]).mean() > 0.85
    # the outputs do not score labels 1..10 by their argmax: held-out rows by the loss alone
    _, hits = per_sample_results(model, X[1400:], Y[1400:] + 1, shifted)
    assert hits is None
