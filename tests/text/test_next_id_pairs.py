"""A small causal language model fed ``(x, y)`` pairs, ``y`` the next ids, through DQ.

The way a user writes a GPT-like model: token and position embeddings, a causal transformer
(its mask ``nn.Transformer.generate_square_subsequent_mask`` kept as a buffer, ``-inf``
above the diagonal), next-id logits ``(n, length, vocab)`` at every position, and a
``Dataset`` of ``(block[:-1], block[1:])`` pairs. Three things broke it at DQ's defaults:
the server named no id vocabulary to a model that reads windows (the nodes quantized their
ids as values and every reply failed the model check), the mask's ``-inf`` read as a
diverged model (every round's steps rolled back), and the default loss shifted the given
next ids once more (the model learned the id after next).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from torch import nn

import dq_flower
from dq_flower.codecs import PayloadError
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.losses import TargetLoss, element_loss, next_token_loss
from dq_flower.model_ops import finite_since
from dq_flower.wire.dq_batch import DataSpec
from dq_flower.wire.model_buffers import buffers_record, read_buffers

VOCAB, LENGTH, NODES, ROWS = 12, 8, 3, 200


class TinyGPT(nn.Module):
    """Token and position embeddings, one causal transformer layer, next-id logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = nn.Embedding(VOCAB, 16), nn.Embedding(LENGTH, 16)
        self.block = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LENGTH))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]  # a shorter window: the mask's corner
        h = self.tok(ids) + self.pos(torch.arange(t))
        return self.head(self.block(h, src_mask=self.mask[:t, :t], is_causal=True))


def pairs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Counting blocks: a random start, then each id one more than the last, mod VOCAB."""
    rng = np.random.default_rng(seed)
    block = (rng.integers(0, VOCAB, (n, 1)) + np.arange(LENGTH + 1)) % VOCAB
    return block[:, :-1].astype(np.int64), block[:, 1:].astype(np.int64)


def _train(msg: Message, context: Context) -> Message:
    x, y = pairs(ROWS, int(context.node_config["partition-id"]))
    return dq_flower.client.dq_train(msg, context, torch.utils.data.TensorDataset(
        torch.from_numpy(x), torch.from_numpy(y)))


def test_a_constant_minus_inf_buffer_is_no_divergence():
    model = TinyGPT()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert finite_since(model, before)
    with torch.no_grad():
        model.head.bias[0] = float("nan")
    assert not finite_since(model, before)
    model.load_state_dict(before)
    model.mask[0, 0] = float("inf")  # a buffer newly non-finite: divergence
    assert not finite_since(model, before)


def test_next_ids_given_apart_are_labels_of_each_position():
    logits = torch.randn(4, LENGTH, VOCAB)
    x, y = (torch.from_numpy(a) for a in pairs(4, 0))
    loss = TargetLoss()
    loss.follow(DataSpec((LENGTH,), "class", LENGTH, VOCAB, target_shape=(LENGTH,)))
    per_position = nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none")
    assert torch.allclose(loss(logits, y), per_position.mean(1))
    assert torch.allclose(element_loss(logits, y), per_position.mean(1))
    loss.follow(DataSpec((LENGTH + 1,), "tokens", VOCAB))  # windows: their own targets
    assert torch.allclose(loss(logits, x), next_token_loss(logits, x))


def test_a_causal_model_on_next_id_pairs_trains_through_dq_at_its_defaults():
    test_x, test_y = pairs(300, 99)

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = TinyGPT()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            hit = (model(torch.from_numpy(test_x)).argmax(-1).numpy() == test_y).mean()
        return MetricRecord({"accuracy": float(hit)})

    model = TinyGPT()
    strategy = dq_flower.DQStrategy(model, seed=0)
    result = strategy.start(grid=InProcessGrid(_train, NODES), num_rounds=2,
                            initial_arrays=ArrayRecord(model.state_dict()), evaluate_fn=central)
    assert all(strategy.round_figures(r)["rejected"] == 0 for r in (1, 2))
    assert strategy.data.spec is not None and strategy.data.spec.vocab == VOCAB
    assert all(not strategy.round_figures(r)["rolled-back"] for r in (1, 2))
    accuracy = result.evaluate_metrics_serverapp[2]["accuracy"]
    assert accuracy > 0.9, accuracy  # the id after next scores about 0


def _train_scoring(msg: Message, context: Context) -> Message:
    rng = np.random.default_rng(int(context.node_config["partition-id"]))
    x = rng.integers(0, VOCAB, (ROWS, LENGTH))  # each id's label: the id after it
    return dq_flower.client.dq_train(msg, context, (x, (x + 1) % VOCAB), model=TinyGPT())


def test_nodes_given_the_model_read_its_mask_among_the_servers_buffers():
    own = {"mask": TinyGPT().mask.numpy()}
    record = buffers_record(own)
    with pytest.raises(PayloadError, match="not finite"):  # a reader that holds no such mask
        read_buffers(record, {"mask": own["mask"].shape})
    assert np.array_equal(read_buffers(record, {"mask": own["mask"].shape}, own)["mask"],
                          own["mask"])
    model = TinyGPT()
    strategy = dq_flower.DQStrategy(model, seed=0)
    strategy.start(grid=InProcessGrid(_train_scoring, NODES), num_rounds=2,
                   initial_arrays=ArrayRecord(model.state_dict()))
    assert strategy.round_figures(2)["failed"] == 0  # the round the nodes score by the model
    assert strategy.round_figures(2)["selected"] > 0
