"""The loss a user trains with, passed as it is: a reducing PyTorch loss module works.

``nn.BCEWithLogitsLoss(pos_weight=...)`` reduces to one number by default; DQ's server
needs one loss per row. Before, every reply was rejected, round after round ("loss_fn must
return one loss per sample ... got ()"); a loss module is now copied with
``reduction="none"`` (:func:`dq_flower.losses.per_sample`), and a per-element loss is
averaged over each row's outputs.
"""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dq_flower.losses import TargetLoss, per_row, per_sample, resolve_loss
from dq_flower.model_ops import weighted_loss_grad
from dq_flower.wire.dq_batch import DataSpec, spec_from_record, spec_record
from tests.apps.runner import run_app


def test_a_reducing_loss_module_gives_one_loss_per_row_and_stays_as_it_was():
    user = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(4.0))
    logits, y = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([1.0, 0.0, 1.0])
    rows = per_sample(user)(logits, y)
    expected = nn.functional.binary_cross_entropy_with_logits(
        logits, y, pos_weight=torch.tensor(4.0), reduction="none")
    assert rows.shape == (3,) and torch.allclose(rows, expected)
    assert user.reduction == "mean" and user(logits, y).ndim == 0  # the user's own, untouched
    weighted = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 9.0]))
    out, labels = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    assert torch.allclose(resolve_loss(weighted)(out, labels),
                          nn.functional.cross_entropy(out, labels, reduction="none")
                          * torch.tensor([1.0, 9.0]))

    def plain(o, t):  # a function is left alone
        return (o - t) ** 2

    assert per_sample(plain) is plain


def test_a_function_reducing_the_batch_is_applied_row_by_row():
    def pinball(out, target):  # a quantile regression's loss, as a user writes it
        gap = target - out.squeeze(-1)
        return torch.maximum(0.9 * gap, -0.1 * gap).mean()

    out, target = torch.randn(6, 1), torch.randn(6)
    rows = per_row(pinball, out, target)
    assert rows.shape == (6,)
    assert torch.allclose(rows, torch.stack([pinball(out[i:i + 1], target[i:i + 1])
                                             for i in range(6)]))

    def uses_item(o, t):  # cannot be mapped over rows: said, with what to do
        return ((o - t) ** 2).mean() * float(o.sum().item() > 0)

    with pytest.raises(ValueError, match="cannot be applied row by row.*reduction='none'"):
        per_row(uses_item, torch.randn(4), torch.randn(4))


def test_a_per_element_loss_is_averaged_over_each_rows_outputs():
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    y = (np.random.default_rng(1).random((5, 4)) > 0.5).astype(np.float32)
    w = np.full(5, 0.2, np.float32)
    per_element, _ = weighted_loss_grad(model, x, y, w, nn.BCEWithLogitsLoss(reduction="none"))
    with torch.no_grad():
        mean = float(nn.functional.binary_cross_entropy_with_logits(
            model(torch.from_numpy(x)), torch.from_numpy(y)))
    assert abs(per_element - mean) < 1e-6


def _fraud_app(weighted: bool) -> types.ModuleType:
    """5 nodes of a table with 3% positives; the user weighs them with ``pos_weight``."""
    rng = np.random.default_rng(0)
    n = 6000
    x = rng.normal(size=(n, 12)).astype(np.float32)
    logit = x @ rng.normal(size=12) * 0.9 - 4.5
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    app = types.ModuleType("fraud")
    app.NAME, app.NUM_NODES, app.ROUNDS, app.METRIC = "fraud", 4, 4, "balanced-accuracy"

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 1))

        def forward(self, t):
            return self.body(t).squeeze(-1)

    def load_local_data(pid):
        idx = np.arange(pid, 5000, app.NUM_NODES)
        return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))

    def score(model, xs, ys):
        with torch.no_grad():
            p = (model(torch.as_tensor(xs)) > 0).numpy()
        t = np.asarray(ys).astype(bool)
        return float(0.5 * (p[t].mean() + (~p[~t]).mean()))

    app.Net, app.load_local_data, app.score = Net, load_local_data, score
    app.test_set = lambda: (x[5000:], y[5000:])
    app.local_train = None
    if weighted:
        share = float(y[:5000].mean())
        app.DQ_LOSS_FN = lambda: nn.BCEWithLogitsLoss(
            pos_weight=torch.tensor((1 - share) / share))
    return app


def test_dq_trains_with_the_users_reducing_weighted_loss():
    plain = run_app(_fraud_app(False), "dq")
    weighted = run_app(_fraud_app(True), "dq")
    assert weighted.up_bytes > 0 and len(weighted.scores) == 5
    # measured: 0.912 against the unweighted default's 0.875 (balanced accuracy); before,
    # every reply was rejected and the model stayed at its start (about 0.5)
    assert weighted.final > plain.final + 0.02, (weighted.final, plain.final)
    assert weighted.final > 0.85


def test_a_function_reducing_the_batch_is_called_once_a_batch_after_the_first():
    calls = []

    def mean_squares(out, target):
        calls.append(out.ndim)
        return ((out - target) ** 2).mean()

    out, target = torch.randn(5), torch.randn(5)
    first = per_row(mean_squares, out, target)
    calls.clear()
    again = per_row(mean_squares, out, target)
    assert torch.allclose(first, again) and calls == [1]  # one mapped call, a row a batch of 1


def test_a_reducing_function_under_autograd_is_checked_without_a_warning():
    # the batch's loss was read with float() while it required grad: PyTorch warned
    # "Converting a tensor with requires_grad=True to a scalar" on the user's console
    out = torch.randn(6, requires_grad=True)

    def exp_nll(log_h, y):
        return (torch.exp(log_h) * y - log_h).mean()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = per_row(exp_nll, out, torch.rand(6))
    assert losses.shape == (6,) and losses.requires_grad


def test_a_function_whose_batch_loss_is_a_weighted_mean_is_refused_with_what_to_pass():
    """``cross_entropy(logits, y, weight=w)`` as a function: row by row a weighted mean is
    ``w l / w = l``, so its class weights cancelled, silently (the run matched one given no
    loss at all, to the byte). A mean, a sum or label smoothing are applied row by row."""
    weights = torch.tensor([2.0, 1.0, 1.0])
    outputs, targets = torch.randn(6, 3, generator=torch.Generator().manual_seed(0)), \
        torch.tensor([0, 1, 2, 0, 1, 2])
    plain = nn.functional.cross_entropy(outputs, targets, reduction="none")
    for same in (lambda o, t: nn.functional.cross_entropy(o, t),
                 lambda o, t: nn.functional.cross_entropy(o, t, reduction="sum")):
        assert torch.allclose(per_row(same, outputs, targets), plain, atol=1e-6)
    smoothed = per_row(lambda o, t: nn.functional.cross_entropy(o, t, label_smoothing=0.1),
                       outputs, targets)
    assert torch.allclose(smoothed, nn.functional.cross_entropy(
        outputs, targets, label_smoothing=0.1, reduction="none"), atol=1e-6)
    with pytest.raises(ValueError, match=r"nn.CrossEntropyLoss\(weight=w\)"):
        per_row(lambda o, t: nn.functional.cross_entropy(o, t, weight=weights), outputs, targets)
    module = per_sample(nn.CrossEntropyLoss(weight=weights))  # the module form: weighted rows
    assert torch.allclose(per_row(module, outputs, targets), plain * weights[targets])


def test_a_function_written_over_dim_1_reads_each_row_as_a_batch_of_one():
    """A soft-label loss ``-(y * log_softmax(logits, 1)).sum(1).mean()`` failed row by row
    ("Dimension out of range": ``vmap`` handed it 1-D rows) and every reply was refused."""
    outputs = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    soft = torch.softmax(torch.randn(6, 3, generator=torch.Generator().manual_seed(2)), 1)
    rows = per_row(lambda o, t: -(t * nn.functional.log_softmax(o, 1)).sum(1).mean(),
                   outputs, soft)
    assert torch.allclose(rows, -(soft * nn.functional.log_softmax(outputs, 1)).sum(1))


def test_targets_held_as_a_column_reach_the_users_loss_as_a_column():
    out = torch.tensor([[1.0], [2.0], [10.0]])  # a model's (n, 1)
    sent = torch.tensor([1.5, 2.0, 4.0])  # the targets as they travel, (n,)
    huber = TargetLoss(per_sample(nn.HuberLoss(delta=1.0)))
    huber.follow(DataSpec((5,), "float", 1, column=True))  # the nodes hold (n, 1)
    expected = nn.functional.huber_loss(out, sent[:, None], delta=1.0, reduction="none")
    assert torch.allclose(per_row(huber, out, sent), expected.reshape(3))  # was (n, n)'s
    bce = TargetLoss(per_sample(nn.BCEWithLogitsLoss(pos_weight=torch.tensor([3.0]))))
    bce.follow(DataSpec((5,), "binary", 1, column=True))
    assert per_row(bce, out, torch.tensor([1.0, 0.0, 1.0])).shape == (3,)  # refused before

    def pinball(o, t):  # written for (n,) targets: they stay so where the nodes hold them so
        gap = t - o.squeeze(-1)
        return torch.maximum(0.9 * gap, -0.1 * gap)

    flat = TargetLoss(pinball)
    flat.follow(DataSpec((5,), "float", 1))
    assert per_row(flat, out, sent).shape == (3,)
    assert DataSpec((5,), "float", 1, column=True) == DataSpec((5,), "float", 1)  # not compared
    record = spec_record(DataSpec((5,), "float", 1, column=True))
    assert spec_from_record(record).column and not spec_from_record(
        spec_record(DataSpec((5,), "class", 1))).column


def test_a_loss_over_a_tuples_heads_is_refused_saying_what_it_is_handed():
    from dq_flower.codecs import PayloadError
    from dq_flower.model_check import check_model

    class TwoHeads(nn.Module):  # a main head and an auxiliary one, as a user writes them
        def __init__(self) -> None:
            super().__init__()
            self.main, self.aux = nn.Linear(4, 3), nn.Linear(4, 3)

        def forward(self, x):
            return self.main(x), self.aux(x)

    def both(outputs, y):  # written for the tuple: DQ hands it outputs[0]
        main, aux = outputs
        return nn.functional.cross_entropy(main, y) + 0.3 * nn.functional.cross_entropy(aux, y)

    x, y = np.zeros((6, 4), np.float32), np.arange(6) % 3
    with pytest.raises(PayloadError, match=r"handed the model's first output, outputs\[0\] "
                                           "of its tuple"):
        check_model(TwoHeads(), DataSpec((4,), "class"), x, y, 3, both)
    assert check_model(TwoHeads(), DataSpec((4,), "class"), x, y, 3, None) == 3  # main head
