"""Helpers shared by the DQ tests."""

import logging

from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config


def run_inprocess(num_clients=4, rounds=3, failing=None, **knobs):
    """Run a method through the in-process grid; return (RunResult, grid)."""
    knobs.setdefault("method", "dq")
    method = knobs.pop("method")
    run_config = build_run_config(method, num_clients=num_clients, rounds=rounds, **knobs)
    grid = InProcessGrid(client_app, num_clients, failing=failing)
    return run_server(grid, run_config), grid


class LogLines(logging.Handler):
    """The messages Flower's logger gives while attached."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
