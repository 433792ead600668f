"""DQ's server training on 1 and 2 processes (``server-processes``): time per phase.

The wide CNN (``wide-cnn``, about 0.86M parameters) trains on a store of 2-bit 1x28x28
rows (random codes: the time does not depend on the values) with the fixed schedule's
store steps (minibatches of 64, random shifts), once in the server's own process and
once on 2 worker processes (``gloo``), interleaved, ``--reps`` times each. Every phase of
``--steps`` steps is timed whole (the workers' start included), and phases of twice as
many steps separate the per-step time from the fixed cost of a phase:
``per step = (t(2S) - t(S)) / S``, ``start = 2 t(S) - t(2S)``. One process uses the
process's PyTorch threads, each of N processes that number divided by N, so both use the
same cores.

Usage::

    python benchmarks/server_ddp.py                 # 100 and 200 steps, 3 repetitions
    python benchmarks/server_ddp.py --quick         # 10 and 20 steps, 1 repetition
    python benchmarks/server_ddp.py --steps 200 --reps 5 --processes 2 4
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time

import numpy as np
import torch

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.store import RowLayout, SampleStore, StoredRows
from dq_flower.dq.server.training import ServerTrainer
from dq_flower.harness.tasks.models import make_model
from dq_flower.wire.dq_batch import DataSpec

SHAPE = (1, 28, 28)
CLASSES = 10


def federation(rows: int, seed: int = 0) -> FederationData:
    """A store of ``rows`` random 2-bit rows from 10 nodes."""
    rng = np.random.default_rng(seed)
    dim = int(np.prod(SHAPE))
    layout = RowLayout(dim, 2, 1)
    store = SampleStore(layout.dequantize)
    store.add(StoredRows(
        codes=rng.integers(0, 256, (rows, layout.row_bytes), dtype=np.uint8),
        side=np.stack([np.zeros(rows), np.full(rows, 1 / 3)], axis=1).astype(np.float32),
        labels=rng.integers(0, CLASSES, rows), weights=np.ones(rows, np.float32),
        node=(np.arange(rows) % 10).astype(np.uint64), ids=np.arange(rows),
        dither=np.zeros((rows, 0), np.int64)))
    return FederationData(num_classes=CLASSES, spec=DataSpec(SHAPE), layout=layout,
                          store=store)


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its joined children (the workers)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def phase_seconds(processes: int, data: FederationData, steps: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``steps`` store steps of a fresh wide CNN on ``processes``."""
    cfg = DQConfig(server_processes=processes, upload_schedule="fixed")
    model = make_model("wide-cnn", SHAPE, CLASSES, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay)
    trainer = ServerTrainer(cfg, model, optimizer, data, None, loss_fn=None, seed=0)
    start, cpu = time.perf_counter(), _cpu_seconds()
    losses = trainer.store_steps(1, steps, np.random.default_rng(1))
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    assert len(losses) == steps and np.isfinite(losses).all()
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quick", action="store_true", help="10 and 20 steps, 1 repetition")
    args = parser.parse_args()
    steps, reps = (10, 1) if args.quick else (args.steps, args.reps)
    data = federation(args.rows)
    times: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for _ in range(reps):  # interleaved, so that other load hits every setting alike
        for n in args.processes:
            for s in (steps, 2 * steps):
                times.setdefault((n, s), []).append(phase_seconds(n, data, s))
    cpu = platform.processor() or platform.machine()
    print(f"wide-cnn, {args.rows} stored 2-bit rows, minibatch 64; {cpu}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.1f} at the "
          f"end; medians of {reps}")
    print(f"| processes | threads each | {steps} steps s | {2 * steps} steps s | per step ms "
          f"| start s | per step vs 1 process | CPU s per step |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    for n in args.processes:
        one, two = (statistics.median(t for t, _ in times[(n, s)]) for s in (steps, 2 * steps))
        cpu_one, cpu_two = (statistics.median(c for _, c in times[(n, s)])
                            for s in (steps, 2 * steps))
        per_step = (two - one) / steps
        base = base if base is not None else per_step
        threads = max(1, torch.get_num_threads() // n) if n > 1 else torch.get_num_threads()
        print(f"| {n} | {threads} | {one:.2f} | {two:.2f} | {1000 * per_step:.1f} | "
              f"{2 * one - two:.2f} | {base / per_step:.2f}x | "
              f"{(cpu_two - cpu_one) / steps:.3f} |")


if __name__ == "__main__":
    main()
