"""Draw docs/figures/bytes_per_round.png: uplink bytes per round of DQ and three baselines.

    .venv/bin/python docs/figures/bytes_per_round.py                 # 20 rounds, the figure
    .venv/bin/python docs/figures/bytes_per_round.py --rounds 3 --out /tmp/b.png

The scenario of ``make demo`` (scikit-learn's digits, the MLP, 4 IID clients, seed 0, every
knob at its default), run on the in-process grid (the same strategies and client code as
in Flower's simulation engine, without Ray). Bytes are the measured serialized messages.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dq_flower.harness.client_app import app  # noqa: E402
from dq_flower.harness.inprocess import InProcessGrid  # noqa: E402
from dq_flower.harness.server_app import run_server  # noqa: E402
from dq_flower.harness.simulate import build_run_config  # noqa: E402

METHODS = ("dq", "fedavg", "qsgd", "signsgd")
HERE = Path(__file__).resolve().parent


def uplink_per_round(method: str, rounds: int) -> list[int]:
    """Measured uplink bytes of rounds 1..rounds (4 clients together)."""
    result = run_server(InProcessGrid(app, 4),
                        build_run_config(method, num_clients=4, rounds=rounds, seed=0))
    return [int(row["up_bytes"]) for row in result.history[1:]]


def main() -> None:
    """Run the methods and draw the figure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=HERE / "bytes_per_round.png")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    fig, (ax, cum) = plt.subplots(1, 2, figsize=(10, 4))
    for method in METHODS:
        up = uplink_per_round(method, args.rounds)
        print(method, up, flush=True)
        style = ({"color": "black", "linewidth": 2} if method == "dq" else {"linewidth": 1})
        rounds = range(1, len(up) + 1)
        ax.plot(rounds, up, marker="o", markersize=3, label=method, **style)
        cum.plot(rounds, np.cumsum(up), label=method, **style)
    ax.set_yscale("symlog", linthresh=1000)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("uplink bytes in the round")
    cum.set_yscale("log")
    cum.set_ylabel("cumulative uplink bytes")
    for a in (ax, cum):
        a.set_xlabel("server round")
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.suptitle("digits, MLP (D = 9,610, d = 64), 4 IID clients: measured uplink")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110, metadata={"Software": None})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
