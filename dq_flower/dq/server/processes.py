"""A DQ round's server training on several processes (the ``server-processes`` knob).

With N above 1 a round's training (store steps, or an adaptive phase) runs in N spawned
workers joined by ``torch.distributed`` (``gloo`` on CPU, ``nccl`` on CUDA, one GPU each;
not run on a GPU). Each worker draws every minibatch from its own copy of the round's
generator, computes the gradient of rows ``rank::N`` weighted by their share of the whole
minibatch, and ``all_reduce`` sums the parts: the one-process step up to the order of the
float sums. Held-out chunk ``i`` is scored by process ``i % N`` and gathered, so every
process takes the same plateau decisions; process 0 sends the model, optimizer and
generator back. A worker killed by a signal has the round's training started again once.

The store travels as its checkpoint arrays (a ``numpy.memmap`` by file name, other large
arrays through shared memory); the model, loss and ``augment`` are pickled
(:func:`check_portable`). Batch normalisation normalises over each process's rows (as DDP
without ``SyncBatchNorm``); state a user's ``augment`` keeps advances in the workers only.
"""

from __future__ import annotations

import copy
import faulthandler
import mmap
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from logging import WARNING
from typing import Any, Literal, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from flwr.common.logger import log

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.optimizer_choice import Continuation
from dq_flower.dq.server.plateau import HeldOutScores, PhaseResult
from dq_flower.dq.server.store import SampleStore
from dq_flower.model_ops import LossFn, weighted_loss_grad

__all__ = ["Trainer", "ShardGradient", "check_portable", "sharded_steps", "sharded_phase",
           "portable", "restore"]


class Trainer(Protocol):
    """What the workers use of the server's trainer (:class:`~.training.ServerTrainer`)."""

    cfg: DQConfig
    data: FederationData
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batch_gradient: Callable[[torch.nn.Module, np.ndarray, np.ndarray, np.ndarray,
                              LossFn | None], tuple[float, np.ndarray]]

    def store_steps(self, server_round: int, steps: int,  # noqa: D102
                    rng: np.random.Generator | None = None,
                    augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    sharded: bool = True) -> list[float]: ...

    def run_phase(self, train_rows: int, rng: np.random.Generator,  # noqa: D102
                  queued: list[tuple[float, np.ndarray]],
                  evaluate: Callable[[], HeldOutScores] | None = None,
                  resume: Continuation | None = None) -> PhaseResult: ...

    def score_holdout(self, everyone: bool = False) -> HeldOutScores: ...  # noqa: D102


#: Arrays smaller than this travel by copy, larger ones through shared memory or a file.
SHARED_BYTES = 1 << 16
#: Starts of a round's workers when one is killed by a signal (the first and one more).
MAX_STARTS = 2
_RESULT = "result.pkl"


def check_portable(model: torch.nn.Module, loss_fn: LossFn | None,
                   augment: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
    """Raise ``ValueError`` naming ``server-processes`` unless each of them pickles."""
    for name, value in (("model", model), ("loss_fn", loss_fn), ("augment", augment)):
        try:
            pickle.dumps(value)
        except Exception as exc:  # any pickling failure: a lambda, a local class, a lock
            raise ValueError(f"server-processes: training in worker processes needs a "
                             f"{name} that pickles ({exc})") from None


# ---------------------------------------------------------------------- in the workers
@dataclass(frozen=True)
class ShardGradient:
    """Rows ``rank::world`` of each minibatch (``w`` normalised over the whole minibatch)."""

    rank: int
    world: int
    device: torch.device

    def __call__(self, model: torch.nn.Module, x: np.ndarray, y: np.ndarray, w: np.ndarray,
                 loss_fn: LossFn | None) -> tuple[float, np.ndarray]:
        """The loss and gradient of rows ``rank::world``, summed over the processes."""
        part = slice(self.rank, None, self.world)
        if len(w[part]):
            loss, grad = weighted_loss_grad(model, x[part], y[part], w[part], loss_fn)
        else:  # fewer rows than processes: this one adds nothing
            loss = 0.0
            grad = np.zeros(sum(p.numel() for p in model.parameters()), dtype=np.float32)
        total = torch.from_numpy(grad).to(self.device)
        dist.all_reduce(total)
        summed = torch.tensor([loss], dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return float(summed.item()), total.cpu().numpy()


class _ShardStore(SampleStore):
    """The store as one worker reads it: its own chunks of the held-out rows only."""

    def __init__(self, dequantize: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
                 rank: int, world: int) -> None:
        super().__init__(dequantize)
        self.rank, self.world, self.chunk = rank, world, 1024

    def holdout_batches(self, batch_size: int = 1024) -> Iterator[Any]:
        """Chunk ``i`` of the held-out rows where ``i % world == rank``."""
        self.chunk = batch_size
        for i, chunk in enumerate(super().holdout_batches(batch_size)):
            if i % self.world == self.rank:
                yield chunk

    def gathered(self, mine: HeldOutScores) -> HeldOutScores:
        """Every process's scores of its chunks, put back in store order."""
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, mine)
        total = int(self.holdout_mask.sum())
        if total == 0:
            return mine
        used = [0] * self.world
        ordered = []
        for i, start in enumerate(range(0, total, self.chunk)):
            n, r = min(self.chunk, total - start), i % self.world
            part, at = parts[r], used[r]
            ordered.append(HeldOutScores(
                part.loss[at:at + n],
                None if part.correct is None else part.correct[at:at + n],
                part.nodes[at:at + n], None if part.floor is None else part.floor[at:at + n],
                None if part.scale is None else part.scale[at:at + n]))
            used[r] += n
        return HeldOutScores.concat(ordered)


@dataclass(frozen=True)
class _Mapped:
    """A memory-mapped array, reopened read-only from its file in each worker."""

    filename: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    order: Literal["C", "F"]

    def open(self) -> np.ndarray:
        return np.memmap(self.filename, dtype=np.dtype(self.dtype), mode="r",
                         shape=self.shape, offset=self.offset, order=self.order)


def portable(value: Any) -> Any:
    """``value`` as it travels to the workers (see :func:`restore`).

    A file-backed ``numpy.memmap`` by its file name; another array of at least
    :data:`SHARED_BYTES` as a tensor (moved once to shared memory); anything else as is.
    """
    if not isinstance(value, np.ndarray) or value.nbytes < SHARED_BYTES:
        return value
    if (isinstance(value, np.memmap) and value.filename and isinstance(value.base, mmap.mmap)
            and (value.flags.c_contiguous or value.flags.f_contiguous)):
        return _Mapped(str(value.filename), value.dtype.str, tuple(value.shape),
                       int(value.offset), "C" if value.flags.c_contiguous else "F")
    return torch.from_numpy(np.ascontiguousarray(value))


def restore(value: Any) -> Any:
    """Inverse of :func:`portable`: the array again (a memory map stays one)."""
    if isinstance(value, _Mapped):
        return value.open()
    if isinstance(value, torch.Tensor):
        return value.numpy()
    return value


@dataclass(frozen=True)
class _Task:
    """One round's training: ``steps`` store steps, or a phase on ``train_rows`` rows."""

    trainer: Trainer
    rng: np.random.Generator
    steps: int = 0
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None
    train_rows: int | None = None
    queued: tuple[tuple[float, np.ndarray], ...] = ()
    resume: Continuation | None = None

    def run(self, store: _ShardStore) -> Any:
        t = self.trainer
        if self.train_rows is None:
            return t.store_steps(0, self.steps, self.rng, self.augment)
        return t.run_phase(self.train_rows, self.rng, list(self.queued),
                           lambda: store.gathered(t.score_holdout()), self.resume)


def _worker(rank: int, world: int, job: bytes, state: dict[str, Any],
            ranges: dict[int, tuple[np.ndarray, ...]], folder: str,
            threads: int) -> None:
    """Process ``rank`` of ``world``: run the pickled task on the store's arrays."""
    faulthandler.enable()  # a worker that aborts in C++ still shows where
    torch.set_num_threads(threads)
    task: _Task = pickle.loads(job)
    trainer = task.trainer
    device = next((p.device for p in trainer.model.parameters()), torch.device("cpu"))
    if device.type == "cuda":  # one GPU per process
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        trainer.model.to(device)
        trainer.optimizer.load_state_dict(trainer.optimizer.state_dict())  # state follows
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"file://{os.path.join(folder, 'rendezvous')}",
                            rank=rank, world_size=world)
    try:
        layout = trainer.data.layout
        assert layout is not None  # a store exists only once the data spec is adopted
        store = _ShardStore(layout.dequantize, rank, world)
        store.load_state({k: restore(v) for k, v in state.items()})
        store.ranges.update(ranges)
        trainer.data = replace(trainer.data, store=store)
        trainer.batch_gradient = ShardGradient(rank, world, device)
        out = task.run(store)
        if rank == 0:
            result = {"model": {k: v.detach().cpu()
                                for k, v in trainer.model.state_dict().items()},
                      "optimizer": trainer.optimizer.state_dict(),
                      "rng": task.rng.bit_generator.state, "out": out}
            with open(os.path.join(folder, _RESULT + ".tmp"), "wb") as f:
                pickle.dump(result, f)
            os.replace(os.path.join(folder, _RESULT + ".tmp"), os.path.join(folder, _RESULT))
        dist.barrier()  # no process leaves while another still talks to it
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # the work is done and the result written: leave without the interpreter's teardown,
    # where the process group's C++ threads have been seen to abort (SIGABRT, SIGSEGV)
    os._exit(0)


# ---------------------------------------------------------------------- in the server
def _on_processes(trainer: Trainer, task: _Task) -> Any:
    """Run ``task`` on ``server-processes`` workers; take process 0's model back.

    A worker killed by a signal (a native crash) is started again once with the others,
    from the same job; a second death, or a worker that raised, is an error.
    """
    world = trainer.cfg.server_processes
    store = trainer.data.store
    assert store is not None
    job = copy.copy(trainer)
    job.cfg = replace(trainer.cfg, server_processes=1)  # each worker trains as one process
    job.data = replace(trainer.data, store=None)  # the store travels as arrays
    payload = pickle.dumps(replace(task, trainer=job))
    state = {k: portable(v) for k, v in store.state().items()}
    args = (world, payload, state, dict(store.ranges))
    threads = max(1, torch.get_num_threads() // world)
    for attempt in range(1, MAX_STARTS + 1):
        folder = tempfile.mkdtemp(prefix="dq-ddp-")
        try:
            mp.spawn(_worker, args=(*args, folder, threads), nprocs=world, join=True)
            with open(os.path.join(folder, _RESULT), "rb") as f:
                result = pickle.load(f)
            break
        except mp.ProcessExitedException as exc:
            if exc.signal_name is None or attempt == MAX_STARTS:
                raise
            log(WARNING, "server-processes: worker %d died by %s; its training starts "
                "again from the same state", exc.error_index, exc.signal_name)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    trainer.model.load_state_dict(result["model"])
    trainer.optimizer.load_state_dict(result["optimizer"])
    task.rng.bit_generator.state = result["rng"]
    return result["out"]


def sharded_steps(trainer: Trainer, steps: int, rng: np.random.Generator,
                  augment: Callable[[torch.Tensor], torch.Tensor] | None) -> list[float]:
    """``steps`` store steps on the worker processes; their losses (as one process's)."""
    return list(_on_processes(trainer, _Task(trainer, rng, steps=steps, augment=augment)))


def sharded_phase(trainer: Trainer, train_rows: int, rng: np.random.Generator,
                  queued: list[tuple[float, np.ndarray]],
                  resume: Continuation | None = None) -> PhaseResult:
    """A training phase on the workers (``queued`` gradients stepped with first)."""
    result = _on_processes(trainer, _Task(trainer, rng, train_rows=train_rows,
                                          queued=tuple(queued), resume=resume))
    queued.clear()
    assert isinstance(result, PhaseResult)
    return result
