"""Token windows scored by the model on devices that hold it (``scorer="auto"``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn

import dq_flower
from dq_flower.dq.client.scoring import score_windows
from dq_flower.dq.client.selection import inclusion_probabilities
from dq_flower.dq.client.tokens import token_upload
from dq_flower.dq.config import DQConfig
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.model import MODEL_KEY
from dq_flower.wire.node_errors import NodeConfigError
from dq_flower.wire.token_batch import decode_token_batch
from tests.text import text_app

VOCAB, LENGTH = 8, 12


class Peaked(nn.Module):
    """Next-token logits sure of id 0 after a 0, flat after any other id."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, VOCAB)
        with torch.no_grad():
            self.embed.weight.zero_()
            self.embed.weight[0, 0] = 8.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x.round().long())


def _windows(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    easy = np.zeros((20, LENGTH), np.int64)  # all zeros: the model is sure and right
    hard = rng.integers(1, VOCAB, (20, LENGTH))  # the model is unsure and wrong
    return np.concatenate([easy, hard])


@pytest.mark.parametrize("scorer", ["entropy", "loss"])
def test_hard_windows_score_higher_and_are_drawn_more_often_weighted_1_over_n_p(scorer):
    windows = _windows()
    scores = score_windows(scorer, Peaked(), windows)
    assert scores.shape == (40,) and scores[20:].min() > 5 * scores[:20].max()
    cfg = DQConfig(budget=10, selection_rule="sample")
    candidates = np.arange(40)
    pi = inclusion_probabilities(scores, 10)
    drawn = np.zeros(40)
    for seed in range(200):
        content, _, metrics = token_upload(windows, VOCAB, cfg, candidates,
                                           np.random.default_rng(seed), scores,
                                           can_score=True)
        batch = decode_token_batch(content, VOCAB, LENGTH, 10)
        drawn[batch.ids] += 1
        # each window stands for 1/pi of the candidates: weight 1/(n p) times n
        np.testing.assert_allclose(batch.weights, 1.0 / pi[batch.ids], rtol=1e-3)
        assert metrics["can-score"] == 1 and metrics["selected"] == 10
    assert drawn[20:].sum() > 10 * drawn[:20].sum()
    np.testing.assert_allclose(drawn / 200, pi, atol=0.12)  # inclusion as planned


def test_the_loss_score_is_the_windows_next_token_loss():
    windows = _windows(1)
    model = Peaked()
    with torch.no_grad():
        logits = model(torch.as_tensor(windows, dtype=torch.float32))
    expected = dq_flower.model_ops.next_token_loss(logits, torch.as_tensor(windows))
    np.testing.assert_allclose(score_windows("loss", model, windows), expected.numpy(),
                               rtol=1e-6)


def _message(scorer: str, model: nn.Module | None = None) -> tuple[Message, Context]:
    """A round-2 train message as the server would send it, and a node's context."""
    config = ConfigRecord({"server-round": 2, "round-seed": 3, "budget": 4, "scorer": scorer})
    content = RecordDict({"config": config})
    if model is not None:
        content[MODEL_KEY] = ArrayRecord(model.state_dict())
    msg = Message(content=content, dst_node_id=5, message_type="train")
    ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})
    return msg, ctx


def test_a_token_device_refuses_what_it_cannot_score_naming_it(monkeypatch):
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", SUPERLINK_NODE_ID)):
        monkeypatch.setattr(TaskIdentity, name, value)
    text = ["It is a truth universally acknowledged " * 8]
    msg, ctx = _message("gradnorm", text_app.CharRNN())
    with pytest.raises(NodeConfigError, match="scorer='gradnorm' is not supported"):
        dq_flower.client.dq_train(msg, ctx, text, window=16, model=text_app.CharRNN())
    msg, ctx = _message("loss")
    with pytest.raises(NodeConfigError, match="scorer='loss' needs the model"):
        dq_flower.client.dq_train(msg, ctx, text, window=16)


def test_devices_holding_the_model_score_from_the_second_round_on():
    replies: list[tuple[int, Message, Message]] = []

    def train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        model = text_app.CharRNN() if k != 2 else None  # device 2 holds no model
        reply = dq_flower.client.dq_train(msg, context, text_app.device_text(k),
                                          window=text_app.WINDOW,
                                          tokenizer=text_app.CharTokenizer(), model=model)
        replies.append((k, msg, reply))
        return reply

    model = text_app.CharRNN()
    strategy = dq_flower.DQStrategy(model, seed=0, max_server_steps=20, budget=8)
    grid = dq_flower.MeasuredGrid(InProcessGrid(train, 3))
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2)
    first = [(k, m, r) for k, m, r in replies if m.content["config"]["server-round"] == 1]
    second = [(k, m, r) for k, m, r in replies if m.content["config"]["server-round"] == 2]
    assert {k for k, _, _ in first} == {0, 1, 2} and second
    for _, msg, _ in first:  # uniform, no model sent; a device says what it holds
        assert msg.content["config"]["scorer"] == "uniform"
        assert MODEL_KEY not in msg.content.array_records
    assert {k: r.content["metrics"]["can-score"] for k, _, r in first} == {0: 1, 1: 1, 2: 0}
    for k, msg, reply in second:
        config = msg.content["config"]
        holds = k != 2
        assert config["scorer"] == ("entropy" if holds else "uniform")
        assert config["selection-rule"] == ("sample" if holds else "topk")
        assert (MODEL_KEY in msg.content.array_records) == holds  # the downlink it costs
        batch = decode_token_batch(reply.content, 101, text_app.WINDOW, 1 << 16)
        assert len(np.unique(batch.weights)) > (1 if holds else 0)  # 1/pi differ by score
