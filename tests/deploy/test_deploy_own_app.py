"""``dq-flower deploy local --app``: a user's own Flower app on a real local deployment.

Each test starts a SuperLink and SuperNodes through the command and checks that it stopped
every one of them by pid (the pids it prints). Both are ``slow`` (the failing app about
30 s, the example's two DQ rounds 2-3 minutes on 2 cores); ``test_deploy_checks.py`` holds
their fast versions, with the deployment replaced by a fake.
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from dq_flower.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-dq"


def _pids(err: str) -> list[int]:
    """The SuperLink's and SuperNodes' pids that ``deploy local`` printed."""
    found = re.search(r"SuperLink \S+ \(pid (\d+)\), SuperNodes \[([\d, ]*)\]", err)
    assert found, err
    return [int(found.group(1)), *(int(p) for p in found.group(2).split(",") if p.strip())]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # a zombie is stopped, only not yet reaped
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _failing_app(root: Path) -> Path:
    """A Flower app of a user's own whose ServerApp raises at once (no PyTorch needed)."""
    pkg = root / "failapp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server_app.py").write_text(textwrap.dedent("""
        from flwr.serverapp import Grid, ServerApp
        from flwr.app import Context

        app = ServerApp()


        @app.main()
        def main(grid: Grid, context: Context) -> None:
            raise RuntimeError(f"no data for {context.run_config['num-server-rounds']} rounds")
        """))
    (pkg / "client_app.py").write_text("from flwr.clientapp import ClientApp\n\n"
                                       "app = ClientApp()\n")
    (root / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "failapp"
        version = "1.0.0"

        [tool.hatch.build.targets.wheel]
        packages = ["failapp"]

        [tool.flwr.app]
        publisher = "me"

        [tool.flwr.app.components]
        serverapp = "failapp.server_app:app"
        clientapp = "failapp.client_app:app"

        [tool.flwr.app.config]
        num-server-rounds = 3
        """))
    return root


@pytest.mark.slow
def test_a_failing_app_shows_its_own_error_and_exits_non_zero(tmp_path, capsys):
    app = _failing_app(tmp_path / "app")
    status = main(["deploy", "local", "--app", str(app), "--nodes", "1", "--rounds", "2",
                   "--insecure", "--timeout", "120", "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert status == 1, err
    assert "RuntimeError: no data for 2 rounds" in err  # the run's own error, not a log path
    assert not [pid for pid in _pids(err) if _alive(pid)]


@pytest.mark.slow
def test_the_quickstart_app_runs_on_a_tls_deployment(tmp_path, capsys):
    status = main(["deploy", "local", "--app", str(EXAMPLE), "--rounds", "2",
                   "--workdir", str(tmp_path / "w")])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert re.search(r"run \d+: finished:completed, SuperLink traffic \{\"inbound-bytes\": "
                     r"[1-9]\d*", captured.out), captured.out
    run_log = (tmp_path / "w" / "logs" / "flwr-run.log").read_text()
    assert "Final accuracy" in run_log
    assert not [pid for pid in _pids(captured.err) if _alive(pid)]
