"""The server's store step and phase: a plain PyTorch step, and the probe's winner going on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dq_flower.dq.server import training
from dq_flower.model_ops import WeightedSteps, apply_flat_grad, evaluate, weighted_loss_grad

from .test_optimizer_choice import _run_wine


class _WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.body = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        self.unused = nn.Linear(2, 2)  # no loss reaches it: a zero gradient, as the flat path

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=5e-4),
    lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-4)])
def test_the_plain_step_moves_the_model_exactly_as_the_flat_gradient_step(make):
    rng = np.random.default_rng(0)
    flat_model, plain_model = _WithUnused(), _WithUnused()
    flat_opt, plain_opt = make(flat_model.parameters()), make(plain_model.parameters())
    plain = WeightedSteps(plain_model, plain_opt)
    for _ in range(5):
        x = rng.normal(size=(16, 6)).astype(np.float32)
        y = rng.integers(0, 3, 16)
        w = rng.uniform(0.5, 2.0, 16).astype(np.float32)
        w /= w.sum()
        loss_flat, grad = weighted_loss_grad(flat_model, x, y, w)
        apply_flat_grad(flat_model, flat_opt, grad)
        assert plain.step(x, y, w) == loss_flat
        assert plain_model.unused.weight.grad is not None  # zero, as the flat path's
    for a, b in zip(flat_model.state_dict().values(), plain_model.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)
    plain.close()
    assert all(p.grad is None for p in plain_model.parameters())


def test_the_optimizer_probes_winner_goes_on_into_the_phase(monkeypatch):
    pytest.importorskip("sklearn")
    seen = []
    choose = training.ServerTrainer.choose_optimizer

    def recording(self, server_round, rng):
        out = choose(self, server_round, rng)
        if out is not None:  # the probe's steps and losses as it handed them over
            seen.append((out, out.start.result.steps, list(out.start.result.losses)))
        return out

    monkeypatch.setattr(training.ServerTrainer, "choose_optimizer", recording)
    _, strategy = _run_wine()
    assert len(seen) == 1  # the first phase probes; later ones keep the choice
    probe, probe_steps, probe_losses = seen[0]
    # round 2's phase replaced last_phase: round 1's phase is the probe's result, gone on
    assert probe.start.result.steps > probe_steps > 0
    assert probe.start.result.losses[:probe_steps] == probe_losses
    assert strategy.trainer.choice is not None and strategy.trainer.choice.source == "held-out"



@pytest.mark.parametrize("count,max_bytes", [(7, 200), (40, 10_000)])
@pytest.mark.parametrize("weights", ["importance", "node"])
def test_minibatches_drawn_together_are_those_drawn_one_by_one(weights, count, max_bytes):
    """7 minibatches of 5 rows: decoded in groups; 40 (200 rows): the 65 rows decoded once."""
    from dq_flower.dq.server.store import SampleStore

    from .test_store import _dequantize, _rows

    store = SampleStore(_dequantize)
    store.add(_rows(np.arange(40) * 10, node=7, weights=np.linspace(1, 2, 40)))
    store.add(_rows(1000 + np.arange(25), node=9, weights=np.linspace(3, 5, 25)))
    one, many = np.random.default_rng(5), np.random.default_rng(5)
    # 12 bytes a decoded row here: groups of 1, then 3 minibatches of 5 rows (200 bytes)
    together = list(store.draw_batches(count, 5, many, weights, max_bytes=max_bytes))
    assert len(together) == count
    for x, y, w in together:
        x1, y1, w1 = store.draw(5, one, weights)
        np.testing.assert_array_equal(x, x1)
        np.testing.assert_array_equal(y, y1)
        np.testing.assert_array_equal(w, w1)
    assert one.bit_generator.state == many.bit_generator.state  # the same draws, no more


def test_probes_that_all_go_non_finite_leave_the_phase_its_starting_weights(monkeypatch):
    pytest.importorskip("sklearn")
    from dq_flower.dq.server import optimizer_choice

    real_phase, seen = optimizer_choice.train_phase, []

    def ruined(model, *args, **kwargs):  # every probe ends with NaN weights
        result = real_phase(model, *args, **kwargs)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        return result

    real_probe = optimizer_choice.probe

    def recording(trainer, server_round, rng):
        start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        out = real_probe(trainer, server_round, rng)
        seen.append((out, all(torch.equal(start[k], v)
                              for k, v in trainer.model.state_dict().items())))
        return out

    monkeypatch.setattr(optimizer_choice, "train_phase", ruined)
    monkeypatch.setattr(training, "probe", recording)
    _run_wine()
    assert seen == [(None, True)]


class _Output:
    """An output object holding ``logits``, as ``transformers`` classifiers return."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class _ObjectOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> _Output:
        return _Output(self.fc(x))


def test_a_model_returning_an_output_object_trains_and_evaluates_as_its_logits():
    torch.manual_seed(0)
    model = _ObjectOut()
    plain = nn.Sequential()  # the same weights, returning the tensor itself
    plain.append(nn.Linear(4, 3))
    plain[0].load_state_dict(model.fc.state_dict())
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 3, 8)
    w = np.full(8, 1 / 8, np.float32)
    loss, grad = weighted_loss_grad(model, x, y, w)
    loss_plain, grad_plain = weighted_loss_grad(plain, x, y, w)
    assert loss == pytest.approx(loss_plain) and np.allclose(grad, grad_plain)
    assert evaluate(model, x, y) == pytest.approx(evaluate(plain, x, y))
