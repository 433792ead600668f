"""A loss given class weights judges the held-out rows, not accuracy.

``nn.CrossEntropyLoss(weight=...)`` says what a right row of each class is worth to the
user. The server's phases kept the snapshot of best held-out *accuracy*, which on a table of
4% positives favours the snapshots that call fewer rows positive: DQ trained with the user's
loss, then kept what its weights were there to avoid. Such a loss now scores the held-out
rows itself (:func:`dq_flower.losses.weighs_classes`; the probe and the plateau compare
losses).
"""

from __future__ import annotations

import types

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dq_flower.losses import TargetLoss, weighs_classes
from tests.apps.runner import run_app


def test_unequal_class_weights_are_told_apart_from_none_or_equal_ones():
    assert weighs_classes(nn.CrossEntropyLoss(weight=torch.tensor([1.0, 9.0])))
    assert weighs_classes(TargetLoss(nn.NLLLoss(weight=torch.tensor([2.0, 1.0, 1.0]))))
    assert not weighs_classes(nn.CrossEntropyLoss(weight=torch.tensor([3.0, 3.0])))
    assert not weighs_classes(TargetLoss(nn.CrossEntropyLoss()))
    assert not weighs_classes(TargetLoss(None))
    assert not weighs_classes(lambda out, y: (out - y) ** 2)


def _rare_positives_app(weighted: bool) -> types.ModuleType:
    """4 nodes of a table with about 4% positives, two outputs, the user's weighted CE."""
    rng = np.random.default_rng(1)
    n = 6000
    x = rng.normal(size=(n, 10)).astype(np.float32)
    logit = x @ rng.normal(size=10) * 0.6 - 4.0
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    app = types.ModuleType("rare")
    app.NAME, app.NUM_NODES, app.ROUNDS, app.METRIC = "rare", 4, 4, "balanced-accuracy"

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))

        def forward(self, t):
            return self.body(t)

    def load_local_data(pid):
        idx = np.arange(pid, 5000, app.NUM_NODES)
        return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))

    def score(model, xs, ys):
        with torch.no_grad():
            p = model(torch.as_tensor(xs)).argmax(1).numpy()
        return float(np.mean([np.mean(p[ys == c] == c) for c in (0, 1)]))

    share = float(y[:5000].mean())
    app.Net, app.load_local_data, app.score = Net, load_local_data, score
    app.test_set = lambda: (x[5000:], y[5000:])
    app.local_train = None
    app.DQ_LOSS_FN = lambda: nn.CrossEntropyLoss(
        weight=torch.tensor([1.0, (1 - share) / share if weighted else 1.0]))
    return app


def test_a_class_weighted_loss_keeps_the_snapshot_its_weights_prefer():
    run = run_app(_rare_positives_app(True), "dq")
    assert run.up_bytes > 0 and len(run.scores) == 5
    # measured (balanced accuracy after rounds 1-4): 0.627, 0.671, 0.647, 0.666 while held-out
    # accuracy chose the snapshots; 0.701, 0.719, 0.695, 0.797 by the user's loss
    assert run.final > 0.74 and np.mean(run.scores[1:]) > 0.68, run.scores


def test_a_rare_class_under_the_default_loss_is_said_once(caplog):
    import logging

    app = _rare_positives_app(False)
    del app.DQ_LOSS_FN  # DQ's default loss: it weighs no class
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_app(app, "dq")
    said = [r.getMessage() for r in caplog.records if "weighs none" in r.getMessage()]
    assert len(said) == 1 and "class 1 is" in said[0] and "loss_fn" in said[0], said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_app(_rare_positives_app(True), "dq")  # the user's weighted loss: nothing to say
    assert not [r for r in caplog.records if "weighs none" in r.getMessage()]
