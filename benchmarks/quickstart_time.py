"""The README's one-file quickstart, in-process: DQ's server training per round.

Runs the ``dq_app.py`` the README shows (its model, data, central evaluation and client
code, unchanged) on four in-process nodes, and prints each round's server training (seconds
and optimizer steps) with the final accuracy and bytes. Medians over ``--repeats``.
To set two commits side by side, run it from each checkout (``PYTHONPATH=<checkout>``)
on the same machine in one sitting.

The process keeps PyTorch's own thread count (one per core, as a user's ServerApp under
``flwr run`` has) unless ``--threads`` sets it; the server's phases use ``server-threads``.

Usage: python benchmarks/quickstart_time.py [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="flwr-home-"))

import torch  # noqa: E402
from flwr.app import ArrayRecord  # noqa: E402

import dq_flower  # noqa: E402
from dq_flower.dq.server import training  # noqa: E402
from dq_flower.harness.inprocess import InProcessGrid  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"


def app_namespace() -> dict:
    """The README's ``dq_app.py`` executed up to its ``__main__`` guard."""
    text = README.read_text(encoding="utf-8")
    found = re.search(r"```python\n(# dq_app\.py.*?)```", text, re.S)
    if found is None:
        raise SystemExit(f"{README}: no dq_app.py block")
    code = found.group(1).split('if __name__ == "__main__":')[0]
    namespace: dict = {}
    exec(compile(code, "dq_app.py", "exec"), namespace)  # the README's own code
    return namespace


def one_run(app: dict) -> tuple[list[tuple[float, int]], float, int, int]:
    """Per data round (server seconds, steps); final accuracy, up and down bytes."""
    phases: list[tuple[float, int]] = []
    original = training.ServerTrainer.train_round

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        steps = self.last_phase.steps if self.last_phase is not None else 0
        phases.append((time.perf_counter() - start, steps))
        return out

    training.ServerTrainer.train_round = timed
    try:
        torch.manual_seed(0)
        model = app["Net"]()
        strategy = dq_flower.DQStrategy(model, seed=0)
        grid = dq_flower.MeasuredGrid(InProcessGrid(app["train"], 4))
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                                num_rounds=app["ROUNDS"], evaluate_fn=app["central_eval"])
    finally:
        training.ServerTrainer.train_round = original
    accuracy = float(result.evaluate_metrics_serverapp[app["ROUNDS"]]["accuracy"])
    return [p for p in phases if p[1] > 0], accuracy, grid.up_bytes, grid.down_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help=(
        "PyTorch threads of this process (default 0: PyTorch's own setting, as in a user's "
        "ServerApp)"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"PyTorch threads of this process: {torch.get_num_threads()}")
    app = app_namespace()
    runs = [one_run(app) for _ in range(args.repeats)]
    rounds = min(len(r[0]) for r in runs)
    print(f"dq_flower from {Path(dq_flower.__file__).parent}")
    for i in range(rounds):
        seconds = statistics.median(r[0][i][0] for r in runs)
        steps = int(statistics.median(r[0][i][1] for r in runs))
        print(f"data round {i + 1}: server training {seconds:.2f} s, {steps} steps")
    total = statistics.median(sum(s for s, _ in r[0]) for r in runs)
    accuracy, up, down = runs[0][1:]
    print(f"server training in all {total:.2f} s; accuracy {accuracy:.3f}, up {up} B, "
          f"down {down} B")


if __name__ == "__main__":
    main()
