"""An app that needs ``dq-flower`` from a package index: what ``deploy run`` says, and the app
``deploy`` runs without ``--app``.

No deployment: ``flwr run`` and ``flwr ls`` are replaced by fakes that replay the output of
a real ``flwr run examples/quickstart-dq`` whose SuperLink had to install the app's
dependencies before ``[tool.uv]`` listed them (Flower 1.42, exit code 608).
"""

from __future__ import annotations

from pathlib import Path

from dq_flower.cli import main
from dq_flower.deploy import cli as commands
from dq_flower.deploy import flower_cli
from dq_flower.extras import NOT_ON_INDEX
from dq_flower.harness.app_folder import app_folder, default_app

ROOT = Path(__file__).resolve().parents[2]

#: ``flwr run --stream`` of the example with dq-flower in its dependencies and no [tool.uv]
FAILED_INSTALL = """\
Successfully started run 6418621568189055902
INFO :      Starting logstream for run_id `6418621568189055902`
Successfully installed quickstart-dq to /tmp/e1/home/apps/dq-flower.quickstart-dq.1.0.0.bfae1a33.
WARNING :   Skipping `flwr` dependency from app requirements to avoid replacing the running Flower installation.
INFO :      Installing application dependencies...
ERROR :     Simulation raised an exception
flwr.supercore.superexec.dependency_installer.RuntimeDependencyInstallationError: uv sync failed: exit code 1: error: No solution found when resolving dependencies
  cause: Because dq-flower was not found in the package registry and your project depends on dq-flower, we can conclude that your project's requirements are unsatisfiable.
ERROR :     Exit Code: 608

Runtime installation of app dependencies failed. Check the logs for details.
"""  # noqa: E501


class _FakeRun:
    def __init__(self, lines: list[str]) -> None:
        self.stdout = iter(lines)
        self.returncode = 0  # flwr run exits 0 after a failed run

    def __enter__(self) -> _FakeRun:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_deploy_run_says_how_to_give_the_superlink_the_package(monkeypatch, capsys, tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        (ROOT / "examples" / "quickstart-dq" / "pyproject.toml").read_text())
    lines = FAILED_INSTALL.splitlines(keepends=True)
    assert NOT_ON_INDEX in FAILED_INSTALL  # the words uv uses, as the hint looks for them
    monkeypatch.setattr(commands.subprocess, "Popen", lambda *a, **k: _FakeRun(lines))
    monkeypatch.setattr(flower_cli, "flwr_ls", lambda *a, **k: [
        {"status": "finished:failed", "network-traffic": {}}])
    monkeypatch.setattr(commands, "flower_executable", lambda name: name)

    assert main(["deploy", "run", "--app", str(tmp_path)]) == commands.EXIT_FAILED
    err = capsys.readouterr().err
    assert "[tool.uv] exclude-dependencies" in err and "UV_FIND_LINKS=" in err, err
    assert "keeps its environment until you stop it" in err


def test_without_app_deploy_runs_this_folder_or_else_the_package_app(tmp_path):
    assert default_app(ROOT) == ROOT  # a checkout, or a Flower app of your own
    assert default_app(tmp_path) == app_folder()  # elsewhere: the package's own app
    assert (app_folder() / "pyproject.toml").is_file()
    assert "serverapp = \"dq_flower.harness.server_app:app\"" in (
        app_folder() / "pyproject.toml").read_text()
