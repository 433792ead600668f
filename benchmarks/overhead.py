"""DQ's server overhead beside Flower's own FedAvg, measured in the same run.

Runs DQ and FedAvg one after the other in Flower's simulation engine (Ray), with the same
clients, data and a trivial model (logistic regression), and prints:

- the median per-round wall time of each, and their ratio (target: DQ <= 1.2x FedAvg);
- the sample store's bytes against the packed payload bytes the server received
  (target: <= 1.2x), at the data dimension of the run.

Usage: python benchmarks/overhead.py [--rounds 8] [--clients 4] [--dataset digits]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="flwr-home-"))
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="ray-"))

import dq_flower  # noqa: E402


def _round_times(history):
    """Per-round wall times, without round 1 (it includes the simulation engine's start)."""
    walls = [row["wall_s"] for row in history]
    return [b - a for a, b in zip(walls[1:], walls[2:], strict=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per method")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--model", default="logreg")
    args = parser.parse_args()
    common = dict(dataset=args.dataset, model=args.model, num_clients=args.clients,
                  rounds=args.rounds, seed=0)
    times: dict[str, list[float]] = {"dq": [], "fedavg": []}
    dq = None
    for _ in range(args.repeats):  # alternate so that neither method runs on a colder machine
        for method in ("fedavg", "dq"):
            knobs = {"budget": 64, "bits": 2, "server_steps": 20} if method == "dq" else {}
            result = dq_flower.simulate(method=method, **common, **knobs)
            rounds = _round_times(result.history)
            times[method] += rounds
            print(f"{method}: round times (s) {[round(t, 3) for t in rounds]}", flush=True)
            dq = result if method == "dq" else dq
    assert dq is not None
    dq_round, fa_round = statistics.median(times["dq"]), statistics.median(times["fedavg"])
    received = sum(row["up_payload_bits"] for row in dq.history[1:]) // 8
    packed = sum(row["up_packed_bytes"] for row in dq.history[1:])
    store = dq.history[-1]["store_bytes"]
    print(f"data set {args.dataset}, model {args.model} (D={dq.num_params}, d={dq.data_dim}), "
          f"{args.clients} clients, {args.rounds} rounds, {args.repeats} runs per method; "
          f"medians over rounds 2..{args.rounds}")
    print()
    print("| measure | DQ | FedAvg | ratio | target |")
    print("|---|---|---|---|---|")
    ratio = dq_round / fa_round
    print(f"| median round wall time (s) | {dq_round:.3f} | {fa_round:.3f} | {ratio:.2f}x "
          f"| <= 1.2x: {'met' if ratio <= 1.2 else 'MISSED'} |")
    mem = store / packed
    print(f"| store bytes / bit-packed payload bytes received | {store} / {packed} | - | "
          f"{mem:.2f}x | <= 1.2x: {'met' if mem <= 1.2 else 'MISSED'} |")
    print(f"| store bytes / payload bytes as sent (after zlib) | {store} / {received} | - | "
          f"{store / received:.2f}x | (the store keeps rows unpacked from zlib) |")


if __name__ == "__main__":
    main()
