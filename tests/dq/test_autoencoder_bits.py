"""Bits auto for an autoencoder: the share of the codes' error the model passes on.

A convolutional autoencoder of machines' vibration windows ``(1, 256)``, trained on normal
windows and scored by the ROC AUC of its relative reconstruction error over faulty ones (5
machines of 400 to 800 windows, 6 rounds, in-process): DQ at its defaults kept 2 bits and
ended at 0.700 with 116,308 uplink bytes against FedAvg's 0.759 with 1,677,720. Trained on
2-bit codes the model learns to give back what it is given, the codes' error included: its
loss on raw rows is lower than a model's trained on them raw, so the raw-rows check saw
nothing (and skipped rows that are their own targets), while it reconstructs faults as
well as the rest. The server now measures the share of the codes' error the model passes
on (on the reference rows, or a node given the model on its own rows), raises the bits
where it is clearly over half, and asks again for the rows stored at the old width: 0.794
with 484,806 bytes.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

import dq_flower
from dq_flower.dq.client.fidelity import round_fit
from dq_flower.dq.client.reference import reference_rows
from dq_flower.dq.config import DQConfig
from dq_flower.dq.raw_gap import gained, row_gains
from dq_flower.dq.server.bit_width import _figures
from dq_flower.dq.server.reference_rows import ReferenceRows
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.dq_batch import DataSpec
from dq_flower.wire.raw_fit import RAW_LOSS_KEY, raw_fit
from dq_flower.wire.reference_rows import read_reference
from tests.dq.helpers import LogLines

SPEC = DataSpec((1, 64), "inputs", 64)


def _windows(n: int, seed: int) -> np.ndarray:
    """``n`` windows ``(1, 64)``: a tone of its own amplitude, frequency and phase."""
    rng = np.random.default_rng(seed)
    t = np.arange(64) / 64
    x = rng.uniform(0.5, 3, (n, 1)) * np.sin(
        2 * np.pi * (rng.uniform(2, 5, (n, 1)) * t + rng.uniform(0, 1, (n, 1))))
    return (x + rng.normal(0, 0.02, (n, 64)))[:, None, :].astype(np.float32)


class Scale(nn.Module):
    """``x`` times a weight: 1 gives back all it is given, 0 nothing."""

    def __init__(self, weight: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(float(weight)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def _coded(x: np.ndarray, bits: int = 2) -> np.ndarray:
    q = DQConfig(bits=bits).sample_quantizer("sample", 1)
    return q.decode(q.encode(x, np.random.default_rng(0))).astype(np.float32)


def test_a_model_that_gives_back_the_codes_passes_on_their_error():
    x = _windows(32, 0).reshape(32, -1)
    coded = _coded(x)
    passed = gained(row_gains(Scale(1.0), x, coded, (1, 64)))
    assert passed.clear and abs(passed.gain - 1) < 1e-5 and passed.rows == 32
    assert not gained(row_gains(Scale(0.2), x, coded, (1, 64))).clear  # 4% passed on


def _strategy(model: nn.Module) -> SimpleNamespace:
    data = SimpleNamespace(spec=SPEC, mode="sample", num_classes=None)
    return SimpleNamespace(data=data, cfg=DQConfig(bits=2), seed=0, model=model,
                           trainer=SimpleNamespace(loss_fn=None))


def test_nodes_without_the_model_send_reference_rows_of_an_autoencoder_and_the_server_reads_them():
    x = _windows(40, 1).reshape(40, -1)
    config = {"reference-rows": 16, "server-round": 2, "round-seed": 3}
    records = reference_rows(DQConfig(bits=2), SPEC, x, x, config, 7, 0)
    assert records  # none were sent for rows that are their own targets
    rows, _ = read_reference(RecordDict(records), SPEC, None, 0)
    assert rows.shape == (16, 64)
    refs = ReferenceRows(rows={0: (rows, np.zeros(16, np.float32)),
                               1: (x[:16], np.zeros(16, np.float32))})
    assert ReferenceRows.comparable(_strategy(Scale(1.0)))
    said = refs.said(_strategy(Scale(1.0)), 3, 2)
    assert said is not None and "passes on 100% of the 2-bit codes' error" in said
    assert refs.said(_strategy(Scale(0.2)), 3, 2) is None


def test_a_node_given_the_model_reports_the_share_it_passes_on():
    x = _windows(80, 2).reshape(80, -1)
    config = {"server-round": 2, "round-seed": 0}
    report = round_fit(Scale(1.0), DQConfig(bits=2), SPEC, x, x, config, 1, None)
    fit = raw_fit(report)
    assert fit is not None and fit.raw > 0.99 and fit.rows == 64
    assert "passes on 100% of the nodes' 2-bit codes' error" in _figures([fit], 2, True)
    assert RAW_LOSS_KEY not in round_fit(Scale(0.2), DQConfig(bits=2), SPEC, x, x, config,
                                         1, None)


class Copier(nn.Module):
    """A convolutional autoencoder without a bottleneck: it learns to give back its input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv1d(1, 32, 9, padding=4), nn.ReLU(),
                                 nn.Conv1d(32, 1, 9, padding=4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_the_server_raises_the_bits_and_asks_again_for_the_rows_at_the_old_width():
    parts = [_windows(120, seed) for seed in range(4)]

    def train(msg, context):
        x = parts[int(context.node_config["partition-id"])]
        return dq_flower.client.dq_train(msg, context, (x, x))

    handler, logger = LogLines(), logging.getLogger("flwr")
    logger.addHandler(handler)
    model = Copier()
    strategy = dq_flower.DQStrategy(model, seed=0, max_server_steps=300)
    try:
        strategy.start(grid=InProcessGrid(train, 4), num_rounds=3,
                       initial_arrays=ArrayRecord(model.state_dict()))
    finally:
        logger.removeHandler(handler)
    raised = [line for line in handler.lines if "bits 2 -> 4 from round 3" in line]
    assert raised and "passes on" in raised[0] and "dropped and asked for again" in raised[0]
    assert strategy.cfg.bits >= 4 and strategy.data.layout.bits == strategy.cfg.bits
    assert "the 480 rows stored at 2 bits" in raised[0]  # every row: all were sent by then
    # the nodes sent them all again in round 3, at 4 bits (the round's replies' width)
    assert len(strategy.data.store) == 480 and any(
        "round 3: 480 new samples, store 480" in line for line in handler.lines)
