"""Every baseline trains the MLP on digits, measured like DQ; one real Ray simulation.

Runs go through the in-process grid (no Ray), seeded, 4 clients; the whole file is sized
for CI (about 15 s on 2 cores, Ray smoke test included).
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

import dq_flower
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config

#: method -> (rounds, accuracy it must exceed). Seed 0 reaches about 0.92 for the
#: unbiased codecs, 0.93 signsgd, 0.89 bingrad, 0.83 ef-signsgd, 0.77 topk and 0.89 fedavg
#: (10 rounds); the bars leave room for other CPUs' float rounding.
EXPECTED = {
    "sgd": (40, 0.87),
    "fp16": (40, 0.87),
    "qsgd": (40, 0.87),
    "terngrad": (40, 0.87),
    "orq": (40, 0.87),
    "powersgd": (40, 0.87),
    "signsgd": (40, 0.87),
    "bingrad": (40, 0.85),
    "ef-signsgd": (40, 0.78),
    "topk": (40, 0.72),
    "fedavg": (10, 0.84),
}

_RESULTS: dict[str, dq_flower.harness.history.RunResult] = {}


def run(method: str):
    if method not in _RESULTS:
        rounds, _ = EXPECTED[method]
        run_config = build_run_config(method, num_clients=4, rounds=rounds, seed=0)
        _RESULTS[method] = run_server(InProcessGrid(client_app, 4), run_config)
    return _RESULTS[method]


@pytest.mark.parametrize("method", list(EXPECTED))
def test_each_baseline_trains_the_mlp_on_digits(method):
    # Execute
    result = run(method)
    # Assert
    rounds, bar = EXPECTED[method]
    rows = result.history
    assert len(rows) == rounds + 1
    assert rows[0]["accuracy"] < 0.2
    assert result.final_accuracy > bar, (method, result.final_accuracy)


@pytest.mark.parametrize("method", [m for m in EXPECTED if m != "fedavg"])
def test_measured_bytes_cover_the_payload_bits_and_compression_pays(method):
    # Execute
    rows = run(method).history
    sgd_up = run("sgd").history[1]["up_bytes"]
    # Assert: wire bytes hold the payload, overhead is bounded
    for row in rows[1:]:
        assert row["replies"] == 4 and row["rejected"] == 0 and row["failed"] == 0
        assert 8 * row["up_bytes"] >= row["up_payload_bits"]
        assert row["up_bytes"] - row["up_payload_bits"] / 8 < 4 * 2048
    if method != "sgd":
        assert rows[1]["up_bytes"] < 0.55 * sgd_up


def test_every_baseline_uploads_less_than_fedavg_except_sgd():
    fedavg_up = run("fedavg").history[1]["up_bytes"]
    ups = {m: run(m).history[1]["up_bytes"] for m in EXPECTED if m != "fedavg"}
    assert ups["sgd"] < fedavg_up  # raw float32 vector: no np.save headers
    assert max(v for m, v in ups.items() if m != "sgd") < fedavg_up / 1.8


# ---------------------------------------------------------------------------- Ray
@pytest.fixture
def flower_env(tmp_path, monkeypatch):
    """Flower and Ray in temporary folders, no telemetry, no update check.

    Ray's socket paths must stay under 107 bytes, so its folder is a short one in /tmp
    rather than pytest's deep ``tmp_path``.
    """
    ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    monkeypatch.setenv("RAY_TMPDIR", ray_dir)
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    yield tmp_path
    shutil.rmtree(ray_dir, ignore_errors=True)


def test_qsgd_runs_in_flowers_simulation_engine(flower_env):
    # Execute
    result = dq_flower.simulate(method="qsgd", num_clients=2, rounds=2, seed=0)
    # Assert
    rows = result.history
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(r["replies"] == 2 and r["rejected"] == 0 for r in rows[1:])
    assert 8 * rows[1]["up_bytes"] >= rows[1]["up_payload_bits"] > 0
    assert rows[2]["cum_up_bytes"] == rows[1]["up_bytes"] + rows[2]["up_bytes"]
    assert rows[2]["accuracy"] > rows[0]["accuracy"]
