"""A recommender's samples, ``(user id, item id)``, read by an embedding each.

Matrix factorisation registers its users' embedding first (a few rows: one a user) and its
items' after it (hundreds). The server named the first embedding's rows as the ids'
vocabulary, the nodes' item ids were past it, so they went as quantized values and every
reply was refused by the model check ("Expected tensor for argument #1 'indices' to have
one of the following scalar types: Long, Int"): the run ended at its start. The ids are
below the largest of the embeddings the model starts with.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.model_ops import embedding_vocab

USERS, ITEMS, RATED = 4, 120, 90


class Factorisation(nn.Module):
    """A rating as the users' and items' vectors' dot product plus their biases."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.user = nn.Embedding(USERS, 4)
        self.item = nn.Embedding(ITEMS, 4)
        self.item_bias = nn.Embedding(ITEMS, 1)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dot = (self.user(x[:, 0]) * self.item(x[:, 1])).sum(1)
        return 3.0 + dot + self.item_bias(x[:, 1])[:, 0]


def ratings(user: int, test: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One user's ratings (1 to 5, seeded): an item's own bias, the user's taste, noise."""
    rng = np.random.default_rng(0)
    bias, taste = rng.normal(0, 0.8, ITEMS), rng.normal(0, 1, (ITEMS, USERS))
    items = np.random.default_rng(user + 1).permutation(ITEMS)
    items = items[RATED:] if test else items[:RATED]
    noise = np.random.default_rng(user + 100 * test).normal(0, 0.2, len(items))
    r = np.clip(3.0 + bias[items] + 0.3 * taste[items, user] + noise, 1, 5)
    return np.stack([np.full(len(items), user), items], 1), r.astype(np.float32)


def test_ids_are_below_the_largest_of_the_leading_embeddings():
    assert embedding_vocab(Factorisation()) == ITEMS
    later = nn.Sequential(nn.Embedding(5, 2), nn.Flatten(), nn.Linear(4, 2), nn.Embedding(90, 2))
    assert embedding_vocab(later) == 5  # an embedding after other layers reads no sample


def test_a_recommender_trains_through_dq_at_its_defaults():
    def train(msg: Message, context: Context) -> Message:
        return dq_flower.client.dq_train(
            msg, context, ratings(int(context.node_config["partition-id"])))

    test = [ratings(u, test=True) for u in range(USERS)]
    test_x, test_y = (torch.from_numpy(np.concatenate(a)) for a in zip(*test, strict=True))

    def rmse(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Factorisation()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            return MetricRecord({"rmse": float(((model(test_x) - test_y) ** 2).mean() ** 0.5)})

    model = Factorisation()
    strategy = dq_flower.DQStrategy(model, seed=0)
    result = strategy.start(grid=InProcessGrid(train, USERS),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=3,
                            evaluate_fn=rmse)
    assert all(strategy.round_figures(r)["rejected"] == 0 for r in (1, 2, 3))
    store = strategy.data.store
    x, _ = store._decode(store._rows)  # the ids as the nodes hold them, exactly
    assert x.dtype == np.int64 and len(x) == strategy.stored > 0
    assert set(np.unique(x[:, 0])) == set(range(USERS)) and x[:, 1].max() >= USERS
    scores = {r: m["rmse"] for r, m in result.evaluate_metrics_serverapp.items()}
    assert scores[3] < 0.9 * scores[0], scores
