"""``dq-flower deploy run`` reports the envelope overhead per reply, as ``deploy local`` does.

No deployment: ``flwr run`` and ``flwr ls`` are replaced by fakes that replay a stream of
the package's own ServerApp, whose round lines come from a real in-process run.
"""

from __future__ import annotations

import io
import json
import logging

from flwr.common.logger import FLOWER_LOGGER

from dq_flower.cli import main
from dq_flower.deploy import cli as commands
from dq_flower.deploy import flower_cli
from dq_flower.deploy.flower_cli import rounds_from_log
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config

APP_DIR = str(commands.Path(__file__).resolve().parents[2])
TRAFFIC = {"inbound-bytes": 30_000, "outbound-bytes": 12_000, "total-bytes": 42_000}


def _server_log(rounds: int) -> tuple[str, list[dict]]:
    """The log lines and the history of a real in-process run of the package's ServerApp."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    FLOWER_LOGGER.addHandler(handler)
    try:
        result = run_server(InProcessGrid(client_app, 2),
                            build_run_config("dq", num_clients=2, rounds=rounds, seed=0,
                                             budget=16, min_holdout_rows=0))
    finally:
        FLOWER_LOGGER.removeHandler(handler)
    return stream.getvalue(), result.history


class _FakeRun:
    """``subprocess.Popen`` of ``flwr run --stream``: the given lines, exit status 0."""

    def __init__(self, lines: list[str]) -> None:
        self.stdout = iter(lines)
        self.returncode = 0

    def __enter__(self) -> _FakeRun:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_the_servers_round_lines_carry_its_bytes_and_replies():
    text, history = _server_log(rounds=2)
    rows = rounds_from_log(text)
    assert [r["round"] for r in rows] == [0, 1, 2]
    for row, real in zip(rows, history, strict=True):
        assert (row["up_bytes"], row["down_bytes"]) == (real["up_bytes"], real["down_bytes"])
    assert [r["replies"] for r in rows] == [0, 2, 2]  # two nodes answer each round


def test_deploy_run_reports_the_envelope_per_reply(monkeypatch, capsys):
    text, _ = _server_log(rounds=1)
    lines = ["Successfully started run 77\n", *text.splitlines(keepends=True)]
    monkeypatch.setattr(commands.subprocess, "Popen", lambda *a, **k: _FakeRun(lines))
    monkeypatch.setattr(flower_cli, "flwr_ls", lambda *a, **k: [
        {"status": "finished:completed", "network-traffic": TRAFFIC}])
    monkeypatch.setattr(commands, "flower_executable", lambda name: name)

    assert main(["deploy", "run", "--app", APP_DIR]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{\n"):])
    up = sum(r["up_bytes"] for r in rounds_from_log(text))
    assert report["run-id"] == 77 and report["replies"] == 2
    assert report["strategy_up_bytes"] == up and report["superlink_inbound_bytes"] == 30_000
    assert report["up_overhead_per_reply"] == (30_000 - up) / 2


def test_deploy_run_says_why_without_the_round_lines(monkeypatch, capsys):
    lines = ["Successfully started run 78\n", "INFO : a user's own app logs its own lines\n"]
    monkeypatch.setattr(commands.subprocess, "Popen", lambda *a, **k: _FakeRun(lines))
    monkeypatch.setattr(flower_cli, "flwr_ls", lambda *a, **k: [
        {"status": "finished:completed", "network-traffic": TRAFFIC}])
    monkeypatch.setattr(commands, "flower_executable", lambda name: name)

    assert main(["deploy", "run", "--app", APP_DIR]) == 0
    captured = capsys.readouterr()
    assert '"inbound-bytes": 30000' in captured.out
    assert "envelope overhead needs the bytes the strategy measured" in captured.err


def test_deploy_run_fails_where_the_serverapp_failed(monkeypatch, capsys):
    """``flwr run`` exits 0 after a failed ServerApp; ``deploy run`` reads the status."""
    text, _ = _server_log(rounds=1)
    lines = ["Successfully started run 79\n", *text.splitlines(keepends=True)]
    monkeypatch.setattr(commands.subprocess, "Popen", lambda *a, **k: _FakeRun(lines))
    monkeypatch.setattr(flower_cli, "flwr_ls", lambda *a, **k: [
        {"status": "finished:failed", "network-traffic": TRAFFIC}])
    monkeypatch.setattr(commands, "flower_executable", lambda name: name)

    assert main(["deploy", "run", "--app", APP_DIR]) == commands.EXIT_FAILED
    assert "run 79 ended as finished:failed" in capsys.readouterr().err
    # the ServerApp's own error, where the stream shows it, ends the output
    cause = ("dq_flower.server.common.ClientFailureError: [dq] every sampled client failed "
             "for 3 consecutive rounds; first client error, from node 7 (partition 1): "
             "ValueError: no rows\n")
    monkeypatch.setattr(commands.subprocess, "Popen", lambda *a, **k: _FakeRun(
        [*lines, "Traceback (most recent call last):\n", cause, "INFO :      Run finished\n"]))
    assert main(["deploy", "run", "--app", APP_DIR]) == commands.EXIT_FAILED
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("run 79 ended as finished:failed: the ServerApp failed: ClientFailureError: "
                    + cause.split("ClientFailureError: ", 1)[1].strip()), last
