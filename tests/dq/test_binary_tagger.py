"""A binary tagger's 0/1 labels of each position, ``(n, L)`` integers, under 2-class logits.

Integer 0/1 targets of several values a sample are read as several 0/1 labels (a
multi-label model's, one output each). A tagger that scores two classes at each position
(``(n, L, 2)`` logits, ``cross_entropy(out.transpose(1, 2), y)``) was refused every round:
"the model has 2L outputs per sample; the float targets have L". The model check now asks
the nodes for them as class labels of each element, as for labels typed otherwise.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.targets import model_targets

VOCAB, LENGTH, NODES = 10, 12, 3


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 8)
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.out = nn.Linear(16, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(self.emb(ids).transpose(1, 2))).transpose(1, 2)
        return self.out(h)  # (n, L, 2)


def tagged(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids and 0/1 tags: a position is tagged where its id follows a 0."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, VOCAB, (n, LENGTH))
    y = np.zeros_like(x)
    y[:, 1:] = x[:, :-1] == 0
    return x.astype(np.int64), y.astype(np.int64)


def _train(msg: Message, context: Context) -> Message:
    x, y = tagged(300, int(context.node_config["partition-id"]))
    return dq_flower.client.dq_train(msg, context, torch.utils.data.TensorDataset(
        torch.from_numpy(x), torch.from_numpy(y)))


def test_zero_one_labels_of_each_element_are_typed_for_the_models_classes():
    tags = np.array([[0, 1, 1], [1, 0, 0]], dtype=np.float32)
    assert model_targets(tags, 2).dtype == np.int64  # three elements, two classes each
    assert model_targets(tags, 3) is tags  # three outputs: three 0/1 labels, as they are
    pair = tags[:, :2]
    assert model_targets(pair, 2) is pair  # two labels, two outputs: multi-label
    assert model_targets(tags, 5) is tags  # five classes an element: not 0/1 labels alone
    assert model_targets(tags[:, :1], 2).dtype == np.int64  # one label a row: a class id


def test_a_binary_tagger_trains_through_dq_at_its_defaults():
    model = Tagger()
    strategy = dq_flower.DQStrategy(model, seed=0)
    strategy.start(grid=InProcessGrid(_train, NODES), num_rounds=3,
                   initial_arrays=ArrayRecord(model.state_dict()))
    assert strategy.round_figures(1)["rejected"] == NODES  # asked otherwise from round 2
    assert all(strategy.round_figures(r)["rejected"] == 0 for r in (2, 3))
    spec = strategy.data.spec
    assert spec is not None and spec.target == "class" and spec.target_shape == (LENGTH,)
    x, y = tagged(400, 99)
    with torch.no_grad():
        hits = strategy.trainer.model(torch.from_numpy(x)).argmax(-1).numpy() == y
    assert hits[y == 1].mean() > 0.9 and hits.mean() > 0.95, (hits[y == 1].mean(), hits.mean())
