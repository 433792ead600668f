"""DQ's first server phase beside a plain PyTorch loop that reaches the same test accuracy.

For each scenario, one run of DQ at its defaults (in-process, one round) reports its round-1
server phase from its metrics: the optimizer steps, the seconds (its held-out scoring, the
store's draws and the losing optimizer probe included) and the test accuracy of the model
it ended with. Then a plain PyTorch loop trains the same model (same seed) on the rows DQ
trained on, as many of the same training set's rows in full precision (DQ's are its
clients' 2-bit codes), with DQ's step (SGD at lr 0.05, momentum 0.9, minibatches of 64),
scores the same test rows every 50 steps and stops at the first score at or above DQ's.
The loop's seconds leave its scoring out: an oracle that knows when the target is reached,
a lower bound on what any server phase needs. Printed side by side, with their ratios:

- steps, seconds and samples per second of each;
- DQ's seconds over the loop's (what the phase costs beyond the training the target
  needs: the losing optimizer probe, the plateau's extra steps, scoring, the store's
  draws). DQ's steps count the winning probe's (the phase goes on from it), not the
  loser's, whose time is in DQ's seconds.

Usage: python benchmarks/server_time.py [--scenario digits-mlp] [--scenario fmnist-wide-cnn]
       [--scenario fmnist-resnet18] [--repeats 3]

Scenarios: digits-mlp (4 clients, about 20 s), fmnist-wide-cnn (10 clients, minutes),
fmnist-resnet18 (5 clients on 5,000 rows, many minutes on a CPU). Medians over --repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="flwr-home-"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from dq_flower.harness.client_app import app as client_app  # noqa: E402
from dq_flower.harness.inprocess import InProcessGrid  # noqa: E402
from dq_flower.harness.server_app import run_server  # noqa: E402
from dq_flower.harness.simulate import build_run_config  # noqa: E402
from dq_flower.harness.tasks import make_model  # noqa: E402
from dq_flower.harness.tasks.data.loaders import load_task_dataset  # noqa: E402

#: name -> (data set, model, clients, training rows (0: all), extra knobs)
SCENARIOS: dict[str, tuple[str, str, int, int, dict]] = {
    "digits-mlp": ("digits", "mlp", 4, 0, {}),
    "fmnist-wide-cnn": ("fmnist", "wide-cnn", 10, 0, {}),
    "fmnist-resnet18": ("fmnist", "resnet18", 5, 5000, {"max-server-steps": 300}),
}
EVAL_EVERY = 50
BATCH = 64


@dataclass
class Phase:
    """One server phase: its steps, seconds and the test accuracy it ended at."""

    steps: int
    seconds: float
    accuracy: float

    @property
    def samples_per_s(self) -> float:
        return self.steps * BATCH / self.seconds if self.seconds > 0 else float("nan")


def dq_phase(name: str, seed: int) -> tuple[Phase, int]:
    """DQ's round-1 server phase and the rows it held after round 1."""
    dataset, model, clients, rows, knobs = SCENARIOS[name]
    extra = {k.replace("-", "_"): v for k, v in knobs.items()}
    if rows:
        extra["train_rows"] = rows
    cfg = build_run_config("dq", dataset=dataset, model=model, num_clients=clients, rounds=1,
                           seed=seed, **extra)
    row = run_server(InProcessGrid(client_app, clients), cfg).history[1]
    return Phase(int(row["server_steps"]), float(row["server_time_s"]),
                 float(row["accuracy"])), int(row["stored"])


def plain_phase(name: str, rows: int, target: float, seed: int, max_steps: int) -> Phase:
    """A plain PyTorch loop on ``rows`` rows to ``target`` test accuracy (or the cap)."""
    dataset, model_name, _, train_rows, _ = SCENARIOS[name]
    ds = load_task_dataset(dataset, None, seed, 0.0, train_rows, 0)
    rng = np.random.default_rng(seed)
    fit = rng.permutation(len(ds.train_y))[:rows - max(1, rows // 10)]  # DQ holds a tenth out
    x = torch.from_numpy(ds.train_x[fit].astype(np.float32).reshape(len(fit), *ds.input_shape))
    y = torch.from_numpy(ds.train_y[fit].astype(np.int64))
    test_x = torch.from_numpy(ds.test_x.astype(np.float32).reshape(-1, *ds.input_shape))
    test_y = torch.from_numpy(ds.test_y.astype(np.int64))
    model = make_model(model_name, ds.input_shape, ds.num_classes, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(seed)
    seconds, steps, accuracy = 0.0, 0, 0.0
    model.train()
    while steps < max_steps:
        t0 = time.perf_counter()
        for _ in range(EVAL_EVERY):
            batch = torch.randint(len(y), (BATCH,), generator=gen)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x[batch]), y[batch]).backward()
            optimizer.step()
        seconds += time.perf_counter() - t0
        steps += EVAL_EVERY
        model.eval()
        with torch.no_grad():  # the oracle's scoring: not counted
            right = sum(int((model(test_x[i:i + 1024]).argmax(1) == test_y[i:i + 1024]).sum())
                        for i in range(0, len(test_y), 1024))
        accuracy = right / len(test_y)
        model.train()
        if accuracy >= target:
            break
    return Phase(steps, seconds, accuracy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'scenario':<16} {'':>6} {'steps':>6} {'seconds':>8} {'samples/s':>10} "
          f"{'test acc':>8}")
    for name in args.scenario or ["digits-mlp"]:
        dq_runs, plain_runs = [], []
        for _ in range(args.repeats):
            dq, stored = dq_phase(name, args.seed)
            dq_runs.append(dq)
            plain_runs.append(plain_phase(name, stored, dq.accuracy, args.seed,
                                          max_steps=max(dq.steps, 1) * 4))
        for label, runs in (("dq", dq_runs), ("plain", plain_runs)):
            med = Phase(int(statistics.median(r.steps for r in runs)),
                        statistics.median(r.seconds for r in runs),
                        statistics.median(r.accuracy for r in runs))
            print(f"{name:<16} {label:>6} {med.steps:>6} {med.seconds:>8.2f} "
                  f"{med.samples_per_s:>10.0f} {med.accuracy:>8.4f}")
        ratio = statistics.median(d.seconds / p.seconds for d, p in zip(
            dq_runs, plain_runs, strict=True))
        steps = statistics.median(d.steps / max(p.steps, 1) for d, p in zip(
            dq_runs, plain_runs, strict=True))
        rate = statistics.median(d.samples_per_s / p.samples_per_s for d, p in zip(
            dq_runs, plain_runs, strict=True))
        print(f"{name:<16} {'ratio':>6} {steps:>6.2f} {ratio:>8.2f} {rate:>10.2f}   "
              "(dq / plain: steps, seconds, samples per second)")
        short = sum(p.accuracy < d.accuracy for d, p in zip(dq_runs, plain_runs, strict=True))
        if short:
            print(f"{name:<16} the loop stopped below dq's test accuracy at its cap (4x dq's "
                  f"steps) in {short} of {len(dq_runs)} runs: there the steps and seconds "
                  "ratios are upper bounds")


if __name__ == "__main__":
    main()
