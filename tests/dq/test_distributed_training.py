"""The server's training on several processes (``server-processes``) equals one process's.

Two CPU processes (gloo) train on rows ``rank::2`` of every minibatch one process would
draw; the summed gradients differ from the one-process gradient only in the order of the
float sums, so after a few steps the parameters agree to :data:`TOL`.
"""

from __future__ import annotations

import copy
import math
import os
import signal

import numpy as np
import pytest
import torch

from dq_flower import DQStrategy
from dq_flower.dq.config import DQConfig
from dq_flower.dq.server import processes as distributed
from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.processes import portable, restore
from dq_flower.dq.server.store import RowLayout, SampleStore, StoredRows
from dq_flower.dq.server.training import ServerTrainer
from dq_flower.wire.dq_batch import DataSpec

from .helpers import run_inprocess

#: Largest absolute difference allowed between one and two processes' parameters.
TOL = 1e-5
DIM, CLASSES = 20, 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(DIM, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, CLASSES))


def _data(rows: int, held: int) -> FederationData:
    """A store of ``rows`` random 8-bit rows from two nodes, the last ``held`` held out."""
    rng = np.random.default_rng(1)
    layout = RowLayout(DIM, 8, 1)
    store = SampleStore(layout.dequantize)
    holdout = np.zeros(rows, dtype=bool)
    holdout[rows - held:] = True
    store.add(StoredRows(
        codes=rng.integers(0, 256, (rows, layout.row_bytes), dtype=np.uint8),
        side=np.stack([rng.normal(size=rows), rng.uniform(0.001, 0.01, rows)],
                      axis=1).astype(np.float32),
        labels=rng.integers(0, CLASSES, rows), weights=rng.uniform(1, 3, rows),
        node=np.where(np.arange(rows) % 3 == 0, 7, 9).astype(np.uint64),
        ids=np.arange(rows), dither=np.zeros((rows, 0), np.int64), holdout=holdout))
    return FederationData(num_classes=CLASSES, spec=DataSpec((DIM,)), layout=layout,
                          store=store)


def _trainer(processes: int, data: FederationData, **knobs) -> ServerTrainer:
    cfg = DQConfig(**{"server_processes": processes, "server_batch_size": 32,
                      "augmentation": "none", **knobs})
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9,
                                weight_decay=cfg.weight_decay)
    return ServerTrainer(cfg, model, optimizer, copy.deepcopy(data), None, loss_fn=None,
                         seed=3)


def _params(trainer: ServerTrainer) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])


def test_two_processes_take_the_steps_one_process_takes():
    data = _data(300, 0)
    one, two, again = (_trainer(n, data, upload_schedule="fixed") for n in (1, 2, 2))
    rngs = [np.random.default_rng(5) for _ in range(3)]
    losses = [t.store_steps(1, 6, rng) for t, rng in zip((one, two, again), rngs, strict=True)]
    assert len(losses[1]) == 6
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    diff = float((_params(two) - _params(one)).abs().max())
    assert float((_params(one) - _params(_trainer(1, data))).abs().max()) > 0  # it trained
    assert diff <= TOL
    # deterministic from the seed: a second two-process run is bit for bit the same
    assert torch.equal(_params(two), _params(again))
    # the generator and the optimizer come back as one process leaves them
    assert rngs[1].bit_generator.state == rngs[0].bit_generator.state
    mom = [two.optimizer.state[p]["momentum_buffer"] for p in two.model.parameters()]
    ref = [one.optimizer.state[p]["momentum_buffer"] for p in one.model.parameters()]
    assert all(torch.allclose(a, b, atol=TOL) for a, b in zip(mom, ref, strict=True))


def test_two_processes_run_the_adaptive_phase_one_process_runs():
    # 1,500 held-out rows: two 1,024-row chunks, one scored by each process
    data = _data(1900, 1500)
    knobs = {"plateau_eval_every": 4, "max_server_steps": 12, "max_server_epochs": 0.01,
             "store_weights": "importance"}
    one, two = (_trainer(n, data, **knobs) for n in (1, 2))
    phases = [t.run_phase(400, np.random.default_rng(5), []) for t in (one, two)]
    assert phases[1].steps == phases[0].steps == 12
    assert phases[1].evaluations == phases[0].evaluations == 4
    final = [p.final for p in phases]
    assert final[0] is not None and final[1] is not None
    assert final[1].loss.shape == (1500,)
    np.testing.assert_array_equal(final[1].nodes, final[0].nodes)
    np.testing.assert_allclose(final[1].loss, final[0].loss, rtol=1e-4, atol=TOL)
    assert float((_params(two) - _params(one)).abs().max()) <= TOL


class _CrashOnce(ServerTrainer):
    """A trainer whose process 1 dies by SIGSEGV the first time it trains (a marker file)."""

    marker = ""

    def store_steps(self, *args, **kwargs):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().store_steps(*args, **kwargs)


def test_a_worker_killed_by_a_signal_is_started_again_from_the_same_state(tmp_path, caplog):
    data = _data(300, 0)
    one = _trainer(1, data, upload_schedule="fixed")
    two = _trainer(2, data, upload_schedule="fixed")
    two.__class__ = _CrashOnce
    two.marker = str(tmp_path / "crashed")
    losses = [t.store_steps(1, 6, np.random.default_rng(5)) for t in (one, two)]
    assert os.path.exists(two.marker)  # process 1 did die once
    assert "worker 1 died by SIGSEGV" in caplog.text
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    assert float((_params(two) - _params(one)).abs().max()) <= TOL


def _image_data(rows: int) -> FederationData:
    """``_data``'s rows as 1x4x5 images (so the built-in shifts apply)."""
    data = _data(rows, 0)
    return FederationData(num_classes=CLASSES, spec=DataSpec((1, 4, 5)), layout=data.layout,
                          store=data.store)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [50, 2])  # 50 rows: 17, 17, 16; 2 rows: one idle process
def test_three_processes_with_shifted_images_take_the_one_process_steps(batch):
    data = _image_data(300)
    trainers = [_trainer(n, data, upload_schedule="fixed", augmentation="shift",
                         server_batch_size=batch, store_weights="node") for n in (1, 3)]
    losses = [t.store_steps(1, 10, np.random.default_rng(5)) for t in trainers]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=1e-7)
    assert float((_params(trainers[1]) - _params(trainers[0])).abs().max()) <= TOL


@pytest.mark.slow
def test_a_dq_run_on_two_server_processes_trains_as_one_process(monkeypatch):
    knobs = dict(budget=32, max_server_steps=100, plateau_eval_every=25, plateau_patience=2,
                 min_holdout_rows=0, max_server_epochs=1)
    phases = []
    on_processes = distributed._on_processes

    def counted(trainer, task):
        phases.append(trainer.cfg.server_processes)
        return on_processes(trainer, task)

    monkeypatch.setattr(distributed, "_on_processes", counted)
    runs = [run_inprocess(num_clients=2, rounds=2, server_processes=n, **knobs)[0]
            for n in (1, 2)]
    assert phases and set(phases) == {2}  # the two-process run's phases ran on workers
    first = [next(r for r in run.history if r["round"] == 1) for run in runs]
    for key in ("stored", "cum_up_bytes", "server_steps", "holdout_rows"):
        assert first[1][key] == first[0][key], key
    assert first[0]["server_steps"] > 0
    assert abs(first[1]["accuracy"] - first[0]["accuracy"]) <= 0.01
    assert math.isfinite(runs[1].history[-1]["accuracy"])


@pytest.mark.parametrize("value", [0, -1, 1.5, True, 10**18])
def test_a_bad_number_of_processes_fails_naming_the_knob(value):
    with pytest.raises(ValueError, match="^server-processes: (must be in|expected an integer)"):
        DQConfig(server_processes=value)
    with pytest.raises(ValueError, match="server-processes"):
        DQStrategy.from_run_config(_model(), {"server-processes": value})


def test_a_model_that_does_not_pickle_fails_naming_the_knob():
    with pytest.raises(ValueError, match="^server-processes: .*loss_fn that pickles"):
        ServerTrainer(DQConfig(server_processes=2), _model(), torch.optim.SGD(
            _model().parameters(), lr=0.1), _data(10, 0), None,
            loss_fn=lambda out, y: out.sum(), seed=0)


def test_a_memory_mapped_array_travels_by_its_file(tmp_path):
    path = tmp_path / "codes.npy"
    np.save(path, np.arange(100_000, dtype=np.uint32).reshape(250, 400))
    mapped = np.load(path, mmap_mode="r")
    sent = portable(mapped)
    assert not isinstance(sent, np.ndarray | torch.Tensor)  # a file reference, not the rows
    back = restore(sent)
    assert isinstance(back, np.memmap) and np.array_equal(back, mapped)
    big = np.arange(40_000, dtype=np.uint64)
    assert isinstance(portable(big), torch.Tensor)
    assert np.array_equal(restore(portable(big)), big)
    small = np.arange(3)
    assert portable(small) is small
