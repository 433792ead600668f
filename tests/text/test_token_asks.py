"""A token federation's first ask is sized in windows, not in vocabulary entries."""

from __future__ import annotations

import torch
from torch import nn

import dq_flower
from dq_flower.harness.tasks.char_lm import CharTransformer
from dq_flower.model_ops import reads_windows
from dq_flower.wire.dq_batch import DataSpec
from tests.text import text_app


def _first_ask(model: nn.Module, clients: int = 6, **kw) -> int:
    strategy = dq_flower.DQStrategy(model, seed=0, **kw)
    return strategy.asks.first_ask(clients)


def test_a_language_models_first_ask_is_200_windows_shared_at_least_budget_each():
    # 10 held-out windows over 0.1 (one stratum, the floor of two): 200 windows in all,
    # at least budget (64) per device; the vocabulary's 256 "classes" would ask 4,267
    assert _first_ask(CharTransformer(256, 128)) == 64
    assert _first_ask(text_app.CharRNN(), clients=2) == 100
    assert _first_ask(text_app.CharRNN(), clients=2, budget=8, min_holdout_rows=20) == 200
    given = dq_flower.DQStrategy(text_app.CharRNN(), seed=0,
                                 data_spec=DataSpec((32,), "tokens", 101))
    assert given.asks.holds_windows() and given.asks.first_ask(1) == 200  # the spec says so


def test_image_and_table_models_keep_the_per_class_rule():
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    assert _first_ask(mlp, clients=4) == 250  # 10 per class over 0.1, 10 classes
    # an embedding that reads categorical columns, not windows: classes as before
    table = nn.Sequential(nn.Embedding(50, 4), nn.Flatten(), nn.Linear(12, 5))
    assert not reads_windows(table)
    assert _first_ask(table, clients=1) == 500


def test_the_probe_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = CharTransformer(101, 16, width=8, blocks=1, heads=2).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.random.get_rng_state()
    assert reads_windows(model)
    assert model.training and torch.equal(state, torch.random.get_rng_state())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
