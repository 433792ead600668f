"""A node whose float targets all happen to be 0 or 1 joins the others' float targets.

Shares in [0, 1] (clicks over impressions) are float targets; a site that logs single
impressions holds shares of one trial, all 0 or 1, and its data spec said ``binary``. The
server agreed on the others' ``float`` spec and refused that site's every reply ("its data
... is not the ... the round agreed on"): its rows, here the only ones of its region of the
feature space, never reached the store. Such a reply now reads as the federation's float
targets (:func:`dq_flower.wire.dq_batch.as_float_targets`).
"""

from __future__ import annotations

import logging
import types

import numpy as np
import torch
from torch import nn

from dq_flower.wire.dq_batch import DataSpec, as_float_targets
from tests.apps.runner import run_app


def test_binary_specs_read_as_float_beside_the_same_float_spec_only():
    f, b = DataSpec((3,), "float"), DataSpec((3,), "binary")
    assert as_float_targets([f, b, None]) == [f, f, None]
    assert as_float_targets([b, b]) == [b, b]  # no float spec beside them: binary stays
    assert as_float_targets([DataSpec((4,), "binary"), f])[0].target == "binary"


def _click_app() -> types.ModuleType:
    rng = np.random.default_rng(3)

    def rows(n, lo, hi, trials):
        x = np.column_stack([rng.uniform(lo, hi, n), rng.normal(0, 1, (n, 3))])
        p = 1 / (1 + np.exp(-(1.5 * x[:, 0] - 0.8 * x[:, 1])))
        return x.astype(np.float32), (rng.binomial(trials, p) / trials).astype(np.float32), p

    parts = [rows(600, -3, 0.5, 20)[:2] for _ in range(3)] + [rows(900, 0.5, 3, 1)[:2]]
    xa, _, pa = rows(500, -3, 0.5, 1)
    xb, _, pb = rows(500, 0.5, 3, 1)
    app = types.ModuleType("clicks")
    app.NAME, app.NUM_NODES, app.ROUNDS = "clicks", 4, 4
    app.METRIC, app.LOWER_IS_BETTER = "mse", True

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())

        def forward(self, t):
            return self.body(t).squeeze(-1)

    def score(model, xs, ps):
        with torch.no_grad():
            return float(((model(torch.from_numpy(xs)).numpy() - ps) ** 2).mean())

    app.Net, app.score, app.local_train = Net, score, None
    app.load_local_data = lambda k: parts[k]
    app.test_set = lambda: (np.concatenate([xa, xb]), np.concatenate([pa, pb]).astype(np.float32))
    return app


def test_a_site_of_single_trials_is_not_refused(caplog):
    with caplog.at_level(logging.WARNING):
        run = run_app(_click_app(), "dq")
    refused = [r.getMessage() for r in caplog.records if "rejected reply" in r.getMessage()]
    assert not refused, refused[:2]
    # measured (MSE against the true rates after rounds 1-4): 0.021, 0.016, 0.012, 0.011
    # with the single-trial site refused; 0.0028, 0.0033, 0.0010, 0.0006 with its rows
    assert run.final < 0.004, run.scores
