"""A user's app: about 3% fraud, raw transaction columns, 0/1 labels a float (n, 1) column.

Synthetic, seeded: 16,000 transactions; columns as logged: amount ($, lognormal, ~5-5000),
hour (0-23), account age (days, 0-3650), transactions in the last 24h (0-40), distance from
home (km, 0-2000), card-present flag (0/1), merchant risk score (0-1). Labels are the
fraud flag as a float32 column of shape (n, 1) (df[["is_fraud"]].to_numpy()). 8 nodes
round robin over 13,000 rows; 3,000 test. The user's loss: BCEWithLogitsLoss(pos_weight=
negatives/positives). FedAvg: Adam lr 0.001, 1 epoch, batch 64. Metric: ROC AUC.

DQ sent the labels as ``(n,)``: the user's loss refused them against the model's ``(n, 1)``
logits, every reply of every round ("Target size ... must be the same as input size");
shaped as the outputs now (``dq_flower.losses.as_outputs``). ``tests/apps/
test_column_targets.py`` runs it (its AUC is not far enough above 0.5 for the zoo's floor).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "rare-fraud"
NUM_NODES = 8
ROUNDS = 8
METRIC = "roc-auc"
LOWER_IS_BETTER = False
_CACHE: dict = {}


def available() -> bool:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _arrays():
    if "a" not in _CACHE:
        rng = np.random.default_rng(1)
        n = 16000
        amount = np.exp(rng.normal(4.0, 1.2, n))
        hour = rng.integers(0, 24, n).astype(float)
        acct = rng.uniform(0, 3650, n)
        n24 = rng.poisson(3, n).astype(float)
        dist = np.abs(rng.normal(0, 300, n))
        present = (rng.random(n) < 0.6).astype(float)
        risk = rng.beta(2, 5, n)
        night = ((hour < 5) | (hour > 22)).astype(float)
        logit = (-4.2 + 0.6 * (np.log(amount) - 4) + 1.0 * night - 0.0006 * acct
                 + 0.15 * (n24 - 3) + 0.0025 * dist - 1.2 * present + 3.0 * risk)
        y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)[:, None]
        x = np.stack([amount, hour, acct, n24, dist, present, risk], 1).astype(np.float32)
        _CACHE["a"] = (x[:13000], y[:13000], x[13000:], y[13000:])
    return _CACHE["a"]


def positive_weight():
    y = _arrays()[1]
    return float((len(y) - y.sum()) / y.sum())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(7, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                  nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)          # (n, 1) logit, as the labels are (n, 1)


def user_loss():
    return nn.BCEWithLogitsLoss(pos_weight=torch.tensor([positive_weight()]))


DQ_LOSS_FN = user_loss


def load_local_data(pid):
    x, y, _, _ = _arrays()
    idx = np.arange(pid, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


def test_set():
    _, _, x, y = _arrays()
    return x, y


def score(model, x, y):
    from sklearn.metrics import roc_auc_score
    with torch.no_grad():
        s = model(torch.as_tensor(x)).reshape(-1).numpy()
    if not np.all(np.isfinite(s)):
        return 0.5
    return float(roc_auc_score(np.asarray(y).reshape(-1), s))


def local_train(model, data):
    opt = torch.optim.Adam(model.parameters(), lr=0.001)
    loss_fn = user_loss()
    model.train()
    for xb, yb in DataLoader(data, batch_size=64, shuffle=True,
                             generator=torch.Generator().manual_seed(0)):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    return len(data)
