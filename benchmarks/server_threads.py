"""A server step on one PyTorch thread against PyTorch's own thread count, side by side.

For each model, the server's step (SGD 0.05, momentum 0.9, minibatches of 64 random rows,
seeded), with the store's draw between steps as in a phase (a numpy gather), timed on one
thread and on ``torch.get_num_threads()`` at start (one per core unless ``OMP_NUM_THREADS``
says otherwise), interleaved, and printed as median step times and their ratio. What the
ratio is depends on what else runs on the machine: run it once with nothing else and once
beside other work (``--busy N`` starts N spinning processes for the duration and stops
them by process id).

Usage: python benchmarks/server_threads.py [--model mlp --model wide-cnn] [--steps 40]
       [--repeats 3] [--busy 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np
import torch

from dq_flower.harness.tasks import make_model

SHAPES = {"mlp": (64,), "wide-cnn": (1, 28, 28), "cnn": (1, 28, 28), "resnet18": (1, 28, 28)}
BATCH = 64


def _spin() -> None:  # pragma: no cover - a busy neighbour process
    while True:
        pass


def step_times(name: str, threads: int, steps: int, seed: int) -> list[float]:
    """Seconds of each of ``steps`` server steps on ``threads`` threads."""
    torch.set_num_threads(threads)
    rng = np.random.default_rng(seed)
    pool_x = rng.normal(size=(2048, *SHAPES[name])).astype(np.float32)
    pool_y = rng.integers(0, 10, 2048)
    model = make_model(name, SHAPES[name], 10, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        rows = rng.integers(0, len(pool_y), BATCH)  # the store's draw
        x, y = torch.from_numpy(pool_x[rows]), torch.from_numpy(pool_y[rows])
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times[2:]  # the first steps allocate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0,
                        help="spinning processes beside the benchmark (default 0)")
    args = parser.parse_args()
    many = torch.get_num_threads()
    busy = [mp.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    try:
        print(f"cores {os.cpu_count()}, PyTorch's threads {many}, busy processes {args.busy}, "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'model':<10} {'1 thread ms':>12} {f'{many} threads ms':>13} "
              f"{'ratio':>7}")
        for name in args.model or ["mlp", "wide-cnn"]:
            one, own = [], []
            for r in range(args.repeats):  # interleaved
                one += step_times(name, 1, args.steps, r)
                own += step_times(name, many, args.steps, r)
            a, b = statistics.median(one) * 1e3, statistics.median(own) * 1e3
            print(f"{name:<10} {a:>12.2f} {b:>13.2f} {b / a:>7.2f}   "
                  f"({many} threads / 1 thread, median step time)")
    finally:
        for p in busy:
            p.terminate()
            p.join()
        torch.set_num_threads(many)


if __name__ == "__main__":
    main()
