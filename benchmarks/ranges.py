"""Side information of the quantizer's range layouts on tabular data, measured.

Standardized breast-cancer features (30 per sample, 4 devices, 2-bit codes, budget 32,
8 rounds, everything uploaded by the end), DQ through the in-process grid: the uplink bytes
the messages carry and the final test accuracy with per-feature ranges (each device sends
its 2 x 30 float32 ranges once) against per-sample ranges (2 float32 per sample).
Run: ``.venv/bin/python benchmarks/ranges.py``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch
from flwr.app import ArrayRecord

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.plugin import user_app  # noqa: E402  (the user's app of the plugin tests)


def run(ranges: str) -> tuple[int, float]:
    def client(msg, context):
        data = user_app.load_local_data(int(context.node_config["partition-id"]))
        return dq_flower.client.dq_train(msg, context, data)

    model = user_app.Net()
    strategy = dq_flower.DQStrategy(model, bits=2, budget=32, server_steps=20, lr=0.05,
                                    ranges=ranges)
    grid = dq_flower.MeasuredGrid(InProcessGrid(client, user_app.NUM_NODES))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=8, evaluate_fn=user_app.central_eval)
    return grid.up_bytes, float(result.evaluate_metrics_serverapp[8]["accuracy"])


def main() -> None:
    logging.getLogger("flwr").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    rows = {mode: run(mode) for mode in ("feature", "sample")}
    print("ranges   uplink bytes   final accuracy")
    for mode, (up, acc) in rows.items():
        print(f"{mode:8} {up:12,d}   {acc:.3f}")
    print(f"per-sample / per-feature uplink: {rows['sample'][0] / rows['feature'][0]:.2f}x")


if __name__ == "__main__":
    main()
