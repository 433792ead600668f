"""``server-threads``: the PyTorch threads of the server's training, restored after.

At 0 (auto) a step under 100 MFLOP runs on one thread, a larger one on PyTorch's own count.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.step_compute import step_compute, torch_threads
from dq_flower.dq.server.store import RowLayout, SampleStore, StoredRows
from dq_flower.dq.server.training import ServerTrainer
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


def _threads_seen_by_a_round(process_threads: int, hidden: int = 8, **knobs
                             ) -> tuple[set[int], int]:
    """The threads the loss saw during one round's store steps, and the process's after."""
    seen: set[int] = set()

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.add(torch.get_num_threads())
        return torch.nn.functional.cross_entropy(outputs, targets, reduction="none")

    cfg = DQConfig(upload_schedule="fixed", server_steps=3, augmentation="none", **knobs)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = ServerTrainer(cfg, model, optimizer, _data(), None, loss_fn=loss_fn, seed=3)
    before = torch.get_num_threads()
    torch.set_num_threads(process_threads)
    try:
        trainer.train_gradient(1, None, [], [7])
        return seen, torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_a_small_step_trains_on_one_thread_by_default_and_the_process_gets_its_threads_back():
    seen, after = _threads_seen_by_a_round(3)  # 12-8-3: about 0.04 MFLOP a step
    assert seen == {1}
    assert after == 3


def test_a_large_step_trains_on_pytorchs_own_threads_by_default():
    # 12-20000-3 on minibatches of 64: 3 x 2 x 64 x 300,000 = 115 MFLOP a step
    seen, after = _threads_seen_by_a_round(3, hidden=20_000)
    assert seen == {3}
    assert after == 3
    just_below, _ = _threads_seen_by_a_round(3, hidden=17_000)  # 98 MFLOP
    assert just_below == {1}


@pytest.mark.parametrize(("knob", "hidden", "expected"), [(1, 20_000, 1), (2, 8, 2)])
def test_server_threads_n_sets_n_whatever_the_step(knob, hidden, expected):
    seen, after = _threads_seen_by_a_round(3, hidden=hidden, server_threads=knob)
    assert seen == {expected}
    assert after == 3


def test_a_model_that_cannot_be_counted_trains_on_one_thread():
    class Odd(torch.nn.Module):
        def forward(self, x):
            if not x.requires_grad and not torch.is_grad_enabled():
                raise RuntimeError("only trains")
            return x

    compute = step_compute(Odd(), np.zeros((2, DIM), np.float32), 64, 0, "auto")
    assert compute.threads == 1
    assert compute.autocast == "none"  # and in float32


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
