"""Held-out rows chosen under a server-side secret that no client can compute."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dq_flower import DQStrategy
from dq_flower.dq.server.holdout import choose_holdout
from dq_flower.dq.server.strategy import SECRET_ENV, holdout_key

SEED, NODE = 7, 3


def _nothing_stored(node: int, strata: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(len(strata), dtype=np.int64), np.zeros(len(strata), dtype=np.int64)


def _held(key: int, ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return choose_holdout(labels, ids, NODE, 0.2, key, _nothing_stored)


def test_without_a_secret_a_client_that_knows_the_seed_predicts_its_held_out_rows(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    rng = np.random.default_rng(0)
    ids, labels = np.arange(2000), rng.integers(0, 10, 2000)
    server = _held(holdout_key(SEED, None), ids, labels)
    client_guess = _held(SEED, ids, labels)  # the public seed: what a client can compute
    assert server.sum() == 400 and np.array_equal(server, client_guess)


def test_with_a_secret_the_clients_guess_is_no_better_than_chance(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    rng = np.random.default_rng(0)
    ids, labels = np.arange(2000), rng.integers(0, 10, 2000)
    server = _held(holdout_key(SEED, "s3cret"), ids, labels)
    guess = _held(SEED, ids, labels)
    assert server.sum() == guess.sum() == 400
    # by chance a guess of 400 of 2000 rows hits 80 held-out rows on average (sd about 8)
    hits = int((server & guess).sum())
    assert 50 <= hits <= 110, hits
    assert np.array_equal(server, _held(holdout_key(SEED, "s3cret"), ids, labels))  # seeded


def test_the_secret_comes_from_the_servers_environment_where_not_given(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "from-env")
    assert holdout_key(SEED, None) == holdout_key(SEED, "from-env") != SEED
    monkeypatch.setenv(SECRET_ENV, "")
    assert holdout_key(SEED, None) == SEED


def test_the_run_config_cannot_carry_the_secret():
    with pytest.raises(ValueError, match="holdout-secret.*clients read the run config"):
        DQStrategy.from_run_config(torch.nn.Linear(4, 2), {"holdout-secret": "x"})


def test_a_resume_under_another_secret_is_refused(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    state = DQStrategy(torch.nn.Linear(4, 2), holdout_secret="a").state_dict()
    DQStrategy(torch.nn.Linear(4, 2), holdout_secret="a").load_state_dict(state)
    with pytest.raises(ValueError, match="holdout_secret: the checkpoint was written under"):
        DQStrategy(torch.nn.Linear(4, 2), holdout_secret="b").load_state_dict(state)
    with pytest.raises(ValueError, match="holdout_secret"):
        DQStrategy(torch.nn.Linear(4, 2)).load_state_dict(state)


def test_a_resume_under_another_seed_names_the_seed_not_a_secret(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    state = DQStrategy(torch.nn.Linear(4, 2), seed=1).state_dict()
    with pytest.raises(ValueError, match="^seed: .* seed 1.* seed 2") as refused:
        DQStrategy(torch.nn.Linear(4, 2), seed=2).load_state_dict(state)
    assert "secret" not in str(refused.value)
    # under a secret as well: the seed is what changed
    state = DQStrategy(torch.nn.Linear(4, 2), seed=1, holdout_secret="a").state_dict()
    with pytest.raises(ValueError, match="^seed: "):
        DQStrategy(torch.nn.Linear(4, 2), seed=2, holdout_secret="a").load_state_dict(state)
