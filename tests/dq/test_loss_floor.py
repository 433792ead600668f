"""A loss with an offset (PyTorch's Poisson loss, below zero): figures read above its floor."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
from torch import nn

from dq_flower.dq.server.loss_floor import LossFloors
from dq_flower.dq.server.schedule import paired_gain
from dq_flower.losses import per_sample
from tests.apps import count_visits
from tests.apps.runner import run_app
from tests.dq.helpers import LogLines


def _counts(n: int = 600) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(0)
    rate = np.exp(rng.normal(1.0, 0.8, n))
    return torch.tensor(np.log(rate), dtype=torch.float32), torch.tensor(
        rng.poisson(rate), dtype=torch.float32)


def _half_deviance(log_rate: torch.Tensor, y: torch.Tensor) -> float:
    y, rate = y.double(), log_rate.double().exp()
    return float((torch.xlogy(y, y / rate) - (y - rate)).mean())


def test_the_gain_of_a_poisson_loss_is_its_deviances_fall():
    """``exp(o) - y o`` has no floor at zero: the held-out mean loss of a good model is
    below zero, and a gain read against it was 6e10. Read above each row's floor (the
    loss at ``o = log y``), it is the fall of the deviance."""
    truth, y = _counts()
    loss = per_sample(nn.PoissonNLLLoss())
    before, after = torch.full_like(truth, float(np.log(y.mean()))), truth
    floors, nodes = LossFloors(), np.zeros(len(y), dtype=np.uint64)
    scores = []
    for out in (before, after):
        rows = loss(out, y).double().numpy()
        floors.add(loss, out, y, rows)
        scores.append(floors.scores(rows, None, nodes))
    assert scores[1].loss.mean() < 0 < scores[0].excess.mean()
    gain = paired_gain(*scores)
    d0, d1 = _half_deviance(before, y), _half_deviance(after, y)
    assert gain.gain == pytest.approx((d0 - d1) / d0, abs=1e-3)
    assert gain.error_before == pytest.approx(d0, rel=1e-3)
    assert all(v >= 0 for v in scores[1].node_loss().values())


@pytest.mark.parametrize("loss_fn", [nn.MSELoss(), nn.L1Loss(), nn.HuberLoss(delta=2.0)])
def test_a_loss_whose_floor_is_zero_keeps_no_floors(loss_fn):
    truth, y = _counts(100)
    loss = per_sample(loss_fn)
    floors = LossFloors()
    rows = loss(truth, y).double().numpy()
    floors.add(loss, truth, y, rows)
    assert floors.offset is False and floors.scores(rows, None, np.zeros(100)).floor is None


@pytest.mark.skipif(not count_visits.available(), reason="needs pandas")
def test_a_count_app_logs_gains_of_its_deviance():
    """The user's count app at DQ's defaults: every upload's gain and the optimizer's lead
    are shares of the loss above its floor (they were 6e10 and 7e12%), and DQ ends within
    a tenth of FedAvg's deviance."""
    handler, logger = LogLines(), logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        dq = run_app(count_visits, "dq")
    finally:
        logger.removeHandler(handler)
    gains = [float(g) for line in handler.lines for g in re.findall(r"gain ([-+]\d\S*);", line)]
    leads = [float(p) for line in handler.lines for p in re.findall(r"lower by ([\d.]+)%", line)]
    assert gains and all(abs(g) < 0.5 for g in gains), gains
    assert all(p < 100 for p in leads), leads
    assert dq.final < 0.75 * count_visits.chance_score()
