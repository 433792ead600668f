"""``simulate`` samples from every client, and the many-clients benchmark runs at tiny size."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import flwr.simulation
import pytest
from flwr.app import Context, RecordDict

import dq_flower.harness.server_app as server_app_module
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.simulate import _apps

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "many_clients_simulation.py"


class _RegisteringGrid:
    """A grid whose nodes register a few at a time, as Flower's simulation engine does."""

    def __init__(self, total: int) -> None:
        self.total, self.calls = total, 0

    def get_node_ids(self) -> list[int]:
        self.calls += 1
        return list(range(1, min(self.total, 2 * self.calls) + 1))


def test_the_server_app_waits_until_every_node_registered(monkeypatch):
    seen: list[int] = []

    def fake_run_server(grid, run_config, on_round=None, model_factory=None):
        seen.append(len(list(grid.get_node_ids())))
        return "done"

    monkeypatch.setattr(server_app_module, "run_server", fake_run_server)
    server_app, _, holder = _apps("dq", "digits", "mlp", 5, 1, 0, {}, None)
    grid = _RegisteringGrid(5)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    server_app._main(grid, context)
    assert seen == [5]  # run_server (and so round 1's sampling) saw all five nodes
    assert holder["result"] == "done"


def _run_simulation_inprocess(server_app, client_app, num_supernodes, **_ignored):
    """Flower's run_simulation without Ray: the ServerApp on the in-process grid."""
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    server_app(InProcessGrid(client_app, num_supernodes), context)


def test_many_clients_benchmark_run_and_report_at_tiny_size(monkeypatch, capsys):
    """The benchmark's run and report on 200 clients, one round, without Ray (seconds)."""
    spec = importlib.util.spec_from_file_location("many_clients_simulation", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(flwr.simulation, "run_simulation", _run_simulation_inprocess)
    run = bench.run_one("dq", 200, 1000, 10, 1, None, "digits")
    assert [r["round"] for r in run["rounds"]] == [1]
    assert run["rounds"][0]["replies"] == 10
    assert run["rounds"][0]["selected"] > 0  # the round stored samples
    assert run["rounds"][0]["store_bytes"] > 0
    assert run["peak_mb"] >= run["ready_mb"] > 0
    bench.report([run, {**run, "clients": 400, "peak_mb": run["peak_mb"] + 1.0}])
    out = capsys.readouterr().out
    assert "| dq | 200 |" in out and "| 1/1 |" in out
    # 1 MB more over 200 more clients: 5.1 kB (1024 * 1024 / 200 / 1024) per client
    assert "grows by 5.1 kB per registered client" in out


@pytest.mark.slow
def test_many_clients_simulation_benchmark_in_flowers_engine():
    """200 clients, one round, in Flower's simulation engine (Ray): about 40 s here."""
    tmp = tempfile.mkdtemp(dir="/tmp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_TMPDIR": os.path.join(tmp, "r"),
           "FLWR_HOME": os.path.join(tmp, "f"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(BENCH),
         "--clients", "200", "--sampled", "10", "--rounds", "1", "--rows", "1000",
         "--dataset", "digits", "--methods", "dq"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert "Sampled 10 nodes (out of 200)" in out
    row = next(line for line in out.splitlines() if line.startswith("| dq | 200 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == "1/1"  # the one round stored samples
    assert int(cells[4]) > 0
