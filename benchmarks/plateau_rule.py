"""DQ's server steps under the plateau rule beside the rule before, over the user apps.

Runs each app of ``tests/apps`` (in-process, DQ at its defaults, the app's own size and
seed 0) twice in one process: with the plateau rule as it is (after a learning-rate drop
the patience is halved, rounded up) and with the rule before (the same patience after a
drop, :func:`rule_before`). Prints, per app, each rule's server optimizer steps (every
phase's, the optimizer probe's winner included), server seconds, final metric and uplink
bytes, then the median of the step ratios (now / before).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/plateau_rule.py [--apps digits_skew_mlp wine_raw ...]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="flwr-home-"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dq_flower.dq.server import training  # noqa: E402
from dq_flower.dq.server.plateau import PlateauRule  # noqa: E402
from tests.apps.runner import run_app  # noqa: E402

APPS = ("digits_skew_mlp", "tabular_mlp", "wine_raw", "cancer_raw", "diabetes_regression",
        "tiny_nodes", "cancer_binary", "tab_embeddings", "load_forecast", "giant_node",
        "many_small", "diabetes_raw", "digits_frozen", "cancer_large_node",
        "imbalanced_weighted", "two_inputs")


@contextmanager
def rule_before() -> Iterator[None]:
    """The plateau rule before: the full patience after a learning-rate drop too."""
    now = PlateauRule.patience_now
    PlateauRule.patience_now = lambda self, drops: self.patience  # type: ignore[method-assign]
    try:
        yield
    finally:
        PlateauRule.patience_now = now  # type: ignore[method-assign]


@contextmanager
def counted(tally: dict[str, float]) -> Iterator[None]:
    """Add every server phase's steps and seconds to ``tally``."""
    original = training.ServerTrainer.train_round

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        tally["seconds"] += time.perf_counter() - start
        tally["steps"] += self.last_phase.steps if self.last_phase is not None else 0
        return out

    training.ServerTrainer.train_round = timed  # type: ignore[method-assign]
    try:
        yield
    finally:
        training.ServerTrainer.train_round = original  # type: ignore[method-assign]


def one(app, before: bool) -> tuple[dict[str, float], float, int]:
    """Steps and seconds of DQ's server phases, the final metric and the uplink bytes."""
    tally = {"steps": 0.0, "seconds": 0.0}
    with counted(tally), (rule_before() if before else nullcontext()):
        run = run_app(app, "dq")
    return tally, run.final, run.up_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", nargs="+", default=list(APPS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'app':<22} {'steps before':>12} {'now':>6} {'ratio':>6} {'s before':>9} "
          f"{'now':>6} {'metric before':>14} {'now':>8} {'bytes before':>12} {'now':>8}")
    ratios = []
    for name in args.apps:
        app = importlib.import_module(f"tests.apps.{name}")
        if hasattr(app, "available") and not app.available():
            print(f"{name:<22} skipped: its data is not on this machine")
            continue
        (old, old_metric, old_bytes), (new, new_metric, new_bytes) = (
            one(app, True), one(app, False))
        ratio = new["steps"] / max(old["steps"], 1)
        ratios.append(ratio)
        print(f"{name:<22} {old['steps']:>12.0f} {new['steps']:>6.0f} {ratio:>6.2f} "
              f"{old['seconds']:>9.2f} {new['seconds']:>6.2f} {old_metric:>14.4f} "
              f"{new_metric:>8.4f} {old_bytes:>12,} {new_bytes:>8,}", flush=True)
    if ratios:
        print(f"median steps ratio (now / before) over {len(ratios)} apps: "
              f"{statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
