"""``server-threads``: the PyTorch threads of the server's training phases, restored after."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.store import RowLayout, SampleStore, StoredRows
from dq_flower.dq.server.training import ServerTrainer
from dq_flower.model_ops import torch_threads
from dq_flower.wire.dq_batch import DataSpec

DIM, CLASSES = 12, 3


def _data(rows: int = 120) -> FederationData:
    rng = np.random.default_rng(1)
    layout = RowLayout(DIM, 8, 1)
    store = SampleStore(layout.dequantize)
    store.add(StoredRows(
        codes=rng.integers(0, 256, (rows, layout.row_bytes), dtype=np.uint8),
        side=np.stack([rng.normal(size=rows), rng.uniform(0.001, 0.01, rows)],
                      axis=1).astype(np.float32),
        labels=rng.integers(0, CLASSES, rows), weights=np.ones(rows),
        node=np.full(rows, 7, dtype=np.uint64), ids=np.arange(rows),
        dither=np.zeros((rows, 0), np.int64), holdout=np.zeros(rows, dtype=bool)))
    return FederationData(num_classes=CLASSES, spec=DataSpec((DIM,)), layout=layout,
                          store=store)


def _threads_seen_by_a_round(process_threads: int, **knobs) -> tuple[set[int], int]:
    """The threads the loss saw during one round's store steps, and the process's after."""
    seen: set[int] = set()

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.add(torch.get_num_threads())
        return torch.nn.functional.cross_entropy(outputs, targets, reduction="none")

    cfg = DQConfig(upload_schedule="fixed", server_steps=3, augmentation="none", **knobs)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = ServerTrainer(cfg, model, optimizer, _data(), None, loss_fn=loss_fn, seed=3)
    before = torch.get_num_threads()
    torch.set_num_threads(process_threads)
    try:
        trainer.train_gradient(1, None, [], [7])
        return seen, torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_the_server_trains_on_one_thread_by_default_and_gives_the_process_its_threads_back():
    seen, after = _threads_seen_by_a_round(3)
    assert seen == {1}
    assert after == 3


@pytest.mark.parametrize(("knob", "expected"), [(0, 3), (2, 2)])
def test_server_threads_zero_keeps_pytorchs_setting_and_n_sets_n(knob, expected):
    seen, after = _threads_seen_by_a_round(3, server_threads=knob)
    assert seen == {expected}
    assert after == 3


def test_the_threads_come_back_when_the_steps_raise():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="boom"), torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value", [-1, 1025, 1.5])
def test_a_bad_thread_count_fails_naming_the_knob(value):
    with pytest.raises(ValueError, match="server-threads"):
        DQConfig(server_threads=value)
