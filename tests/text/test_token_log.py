"""What the server logs of a token federation: what is true of windows, nothing of bits.

No quantizer applies to token windows: the server must not log a bit width or a value
bound for them (``bits auto: 2 per coordinate``, ``data values bounded by 960``), and ids
are names, not magnitudes, so no window is refused for an id ten times the median
upload's largest (ids are checked against the vocabulary instead).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.dq_batch import DataSpec
from tests.text import text_app

VOCAB, WINDOW = 128, 8


def _dq_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "[dq]" in r.getMessage()]


def test_a_token_federation_logs_its_windows_not_bits(caplog):
    torch.manual_seed(0)
    model = text_app.CharRNN()
    strategy = dq_flower.DQStrategy(model, seed=0, max_server_steps=1, max_server_epochs=0.01)
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy.start(grid=InProcessGrid(text_app.train, 2),
                       initial_arrays=ArrayRecord(model.state_dict()), num_rounds=1)
    lines = _dq_lines(caplog)
    assert not [s for s in lines if "bits auto" in s or "bounded" in s or "ranges" in s], lines
    assert any("data: token windows of 32 ids, vocabulary 101, coded losslessly (no "
               "quantizer: bits and value bounds do not apply)" in s for s in lines), lines
    assert strategy.value_bound is None


def _device(msg: Message, context: Context) -> Message:
    """A device whose text uses ids up to 9, or (partition 2) up to VOCAB - 1."""
    part = int(context.node_config["partition-id"])
    top = VOCAB if part == 2 else 10
    ids = np.random.default_rng(part).integers(0, top, size=40 * WINDOW)
    return dq_flower.client.dq_train(msg, context, ids, window=WINDOW, vocab=VOCAB)


class Bigram(torch.nn.Module):
    """Next-id logits from the id alone; reads ids stored as floats."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x.long()))


def test_no_window_is_refused_for_the_size_of_its_ids(caplog):
    torch.manual_seed(0)
    model = Bigram()
    strategy = dq_flower.DQStrategy(model, seed=0, max_server_steps=1, max_server_epochs=0.01)
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy.start(grid=InProcessGrid(_device, 3),
                       initial_arrays=ArrayRecord(model.state_dict()), num_rounds=1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], \
        [r.getMessage() for r in caplog.records]
    assert strategy.spec == DataSpec((WINDOW,), "tokens", VOCAB)
    assert strategy.stored == 3 * 40  # every device's windows, the third's too


def test_quantized_samples_still_log_their_automatic_bits(caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        dq_flower.DQStrategy(torch.nn.Linear(30, 2), seed=0,
                             data_spec=DataSpec((30,), "class", 2))
    lines = _dq_lines(caplog)
    assert any("bits auto: 4 per coordinate (flat samples of 30 features)" in s
               for s in lines), lines
    assert any("data: samples (30,), class targets" in s for s in lines), lines
