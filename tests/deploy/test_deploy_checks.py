"""Every ``dq-flower deploy`` command checks its arguments and run config before it starts.

No process starts here: ``LocalDeployment`` and ``flwr`` are replaced by fakes that record
what would have started, so a refused command shows that nothing did.
"""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path

import pytest

from dq_flower.cli import main
from dq_flower.deploy import cli as commands
from dq_flower.deploy.flower_cli import RunOutcome
from dq_flower.deploy.local import LocalDeployment
from dq_flower.deploy.supervisor import DeploymentError

APP_DIR = str(Path(__file__).resolve().parents[2])
COMPLETED = {"status": "finished:completed",
             "network-traffic": {"inbound-bytes": 900, "outbound-bytes": 700}}


class _FakeDeployment:
    """Records what ``deploy local`` would start and run; starts nothing."""

    started: list[dict] = []

    def __init__(self, workdir: Path, **kwargs: object) -> None:
        self.kwargs, self.logs = kwargs, Path(workdir) / "logs"
        self.address, self.superlink, self.supernodes, self.node_ids = "x:1", None, [], []

    def __enter__(self) -> _FakeDeployment:
        _FakeDeployment.started.append({"kwargs": self.kwargs})
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, app_dir: Path, run_config: dict, *, timeout: float) -> RunOutcome:
        _FakeDeployment.started[-1]["run_config"] = dict(run_config)
        return RunOutcome(5, COMPLETED, "")


@pytest.fixture
def fake_deployment(monkeypatch):
    _FakeDeployment.started = []
    monkeypatch.setattr(commands, "LocalDeployment", _FakeDeployment)
    return _FakeDeployment.started


def _status(argv: list[str]) -> int:
    """Exit status of ``dq-flower argv`` (argparse's usage errors included)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(("argv", "said"), [
    (["--rounds", "-1"], "--rounds: must be an integer >= 1, got '-1'"),
    (["--nodes", "0"], "--nodes: must be an integer in 1..256, got '0'"),
    (["--timeout", "0"], "--timeout: must be a number > 0"),
    (["--run-config", "budget='abc'"], "budget: expected an integer, got 'abc'"),
    (["--run-config", "bits=2.5"], "bits: expected an integer, got 2.5"),
    (["--run-config", "max-rounds=3"],
     "'max-rounds' is not declared in .* \\(did you mean 'max-failed-rounds'"),
    (["--run-config", "min-available=3"], "min-available: 3 replies a round cannot come "
                                          "from 2 nodes"),
    (["--run-config", "server-processes=1000000000000000000"],
     "server-processes: must be in \\[1, 256\\]"),
])
def test_deploy_local_refuses_bad_input_before_starting_anything(argv, said, fake_deployment,
                                                                 capsys):
    start = time.monotonic()
    assert _status(["deploy", "local", "--app", APP_DIR, *argv]) == 2
    assert fake_deployment == []  # no certificate, SuperLink or SuperNode
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert re.search(said, err), err


@pytest.mark.parametrize("argv", [
    ["deploy", "certs", "--out", "x", "--nodes", "-1"],
    ["deploy", "certs", "--out", "x", "--days", "0"],
    ["deploy", "superlink", "--insecure", "--port", "0", "--dry-run"],
    ["deploy", "supernode", "--superlink", "h:1", "--insecure", "--partition-id", "-1",
     "--num-partitions", "2", "--dry-run"],
    ["deploy", "supernode", "--superlink", "h:1", "--insecure", "--partition-id", "0",
     "--num-partitions", "2", "--num-threads", "0", "--dry-run"],
])
def test_every_deploy_command_checks_its_numbers(argv, capsys):
    assert _status(argv) == 2
    assert "must be" in capsys.readouterr().err


def test_deploy_run_checks_the_run_config_before_flwr_run(monkeypatch, capsys):
    def no_flwr(name: str) -> str:
        raise AssertionError(f"{name} started")

    monkeypatch.setattr(commands, "flower_executable", no_flwr)
    assert _status(["deploy", "run", "--app", APP_DIR, "--run-config", "budget='abc'"]) == 2
    assert "budget: expected an integer" in capsys.readouterr().err


def _user_app(root: Path, config: str) -> Path:
    """A Flower app of a user's own: its pyproject.toml only (nothing of it is run here)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "myapp"
        version = "1.0.0"

        [tool.flwr.app]
        publisher = "me"

        [tool.flwr.app.components]
        serverapp = "myapp.server_app:app"
        clientapp = "myapp.client_app:app"

        [tool.flwr.app.config]
        """) + config)
    return root


def test_deploy_local_passes_a_users_app_only_the_keys_it_declares(tmp_path, fake_deployment,
                                                                   capsys):
    app = _user_app(tmp_path / "myapp", 'num-server-rounds = 3\nlearning-rate = 0.1\n')
    assert _status(["deploy", "local", "--app", str(app), "--rounds", "4", "--run-config",
                    "learning-rate=0.5", "--workdir", str(tmp_path / "w")]) == 0
    assert fake_deployment[0]["run_config"] == {"num-server-rounds": 4, "learning-rate": 0.5}
    assert "run 5: finished:completed" in capsys.readouterr().out
    # a key it does not declare: Flower's refusal, said before anything starts
    assert _status(["deploy", "local", "--app", str(app), "--run-config", "bits=2"]) == 2
    assert "'bits' is not declared in" in capsys.readouterr().err
    bare = _user_app(tmp_path / "bare", "lr = 0.1\n")
    assert _status(["deploy", "local", "--app", str(bare), "--rounds", "2"]) == 2
    assert "declares no num-server-rounds" in capsys.readouterr().err
    assert len(fake_deployment) == 1


# the tail of a failed run's flwr output: the ServerApp's traceback, then Flower's own lines
FAILED_RUN = (
    "run 5 ended as finished:failed:\nERROR :      ServerApp raised an exception\n"
    "Traceback (most recent call last):\n  File \"server_app.py\", line 9, in main\n"
    "dq_flower.server.common.ClientFailureError: [dq] every sampled client failed for 3 "
    "consecutive rounds; first client error, from node 7 (partition 1): ValueError: no rows\n"
    "INFO :      Run finished")


def test_a_failed_run_ends_the_output_with_its_cause(tmp_path, fake_deployment, monkeypatch,
                                                      capsys):
    def failing_run(self, app_dir, run_config, *, timeout):
        raise DeploymentError(FAILED_RUN)

    monkeypatch.setattr(_FakeDeployment, "run", failing_run)
    app = _user_app(tmp_path / "myapp", "num-server-rounds = 3\n")
    assert _status(["deploy", "local", "--app", str(app), "--workdir", str(tmp_path / "w")]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("dq-flower deploy: failed: ClientFailureError: [dq] every sampled client "
                    "failed for 3 consecutive rounds; first client error, from node 7 "
                    "(partition 1): ValueError: no rows"), last


class _LogOnly:
    """A SuperLink's log, grown by the run (what ``ManagedProcess.log_text`` returns)."""

    def __init__(self) -> None:
        self.text = "INFO : Starting Flower SuperExec\n"

    def log_text(self) -> str:
        return self.text

    def remember_descendants(self) -> None:
        return None


def test_a_failed_run_shows_the_superlinks_own_error(tmp_path, monkeypatch):
    from dq_flower.deploy import local

    dep = LocalDeployment(tmp_path)
    dep.superlink = _LogOnly()  # type: ignore[assignment]

    def failing_run(*args: object, **kwargs: object) -> RunOutcome:
        dep.superlink.text += ("\x1b[91mERROR \x1b[0m:     Could not start run: Key "  # type: ignore[union-attr]
                               "'results-path' is not present in the main dictionary\n"
                               "INFO : [Fleet.DeactivateNode] Deactivated node_id=1\n")
        raise DeploymentError("flwr run failed (1):\n[code: 15] Invalid run configuration.")

    monkeypatch.setattr(local, "flwr_run", failing_run)
    with pytest.raises(DeploymentError) as caught:
        dep.run(APP_DIR, {"results-path": "x"})
    text = str(caught.value)
    assert "Invalid run configuration" in text
    assert "ERROR :     Could not start run: Key 'results-path' is not present" in text
    assert "Deactivated" not in text and "Starting Flower SuperExec" not in text
