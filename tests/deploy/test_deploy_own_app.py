"""``dq-flower deploy local --app``: a user's own Flower app on a real local deployment.

Each test starts a SuperLink and SuperNodes through the command and checks that it stopped
every one of them by pid (the pids it prints). All are ``slow`` (a failing app about
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


def _user_app(root: Path, name: str, server: str, client: str) -> Path:
    """A Flower app of a user's own in ``root``: package ``name``, its two apps' code."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server_app.py").write_text(textwrap.dedent(server))
    (pkg / "client_app.py").write_text(textwrap.dedent(client))
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "{name}"
        version = "1.0.0"

        [tool.hatch.build.targets.wheel]
        packages = ["{name}"]

        [tool.flwr.app]
        publisher = "me"

        [tool.flwr.app.components]
        serverapp = "{name}.server_app:app"
        clientapp = "{name}.client_app:app"

        [tool.flwr.app.config]
        num-server-rounds = 3
        """))
    return root


def _failing_app(root: Path) -> Path:
    """A Flower app of a user's own whose ServerApp raises at once (no PyTorch needed)."""
    return _user_app(root, "failapp", """
        from flwr.serverapp import Grid, ServerApp
        from flwr.app import Context

        app = ServerApp()


        @app.main()
        def main(grid: Grid, context: Context) -> None:
            raise RuntimeError(f"no data for {context.run_config['num-server-rounds']} rounds")
        """, "from flwr.clientapp import ClientApp\n\napp = ClientApp()\n")


@pytest.mark.slow
def test_a_failing_app_shows_its_own_error_and_exits_non_zero(tmp_path, capsys):
    app = _failing_app(tmp_path / "app")
    status = main(["deploy", "local", "--app", str(app), "--nodes", "1", "--rounds", "2",
                   "--insecure", "--timeout", "120", "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert status == 1, err
    assert "RuntimeError: no data for 2 rounds" in err  # the run's own error, not a log path
    last = err.strip().splitlines()[-1]  # and it ends the output
    assert last == "dq-flower deploy: failed: RuntimeError: no data for 2 rounds", err[-3000:]
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


def _app_whose_clients_all_fail(root: Path) -> Path:
    """A user's DQ app whose every client hands dq_train 20 rows and 5 labels."""
    return _user_app(root, "failclients", """
        from flwr.app import ArrayRecord, Context
        from flwr.serverapp import Grid, ServerApp
        from torch import nn

        import dq_flower

        app = ServerApp()


        @app.main()
        def main(grid: Grid, context: Context) -> None:
            model = nn.Linear(8, 2)
            dq_flower.DQStrategy(model, seed=0).start(
                grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                num_rounds=int(context.run_config["num-server-rounds"]))
        """, """
        import numpy as np
        from flwr.app import Context, Message
        from flwr.clientapp import ClientApp

        import dq_flower

        app = ClientApp()


        @app.train()
        def train(msg: Message, context: Context) -> Message:
            rows = (np.zeros((20, 8), np.float32), np.zeros(5, np.int64))
            return dq_flower.client.dq_train(msg, context, rows)
        """)


@pytest.mark.slow
def test_an_app_whose_every_client_fails_ends_with_the_cause_in_its_last_line(tmp_path,
                                                                               capsys):
    app = _app_whose_clients_all_fail(tmp_path / "app")
    status = main(["deploy", "local", "--app", str(app), "--nodes", "2", "--rounds", "4",
                   "--insecure", "--timeout", "300", "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert status == 1, err
    assert re.search(r"^dq-flower deploy: failed: ClientFailureError: \[dq\] every sampled "
                     r"client failed for 3 consecutive rounds; first client error, from node "
                     r"\d+ \(partition [01]\): ValueError: data \(x, y\): x has 20 samples, y "
                     r"has 5$", last), err[-3000:]
    assert not [pid for pid in _pids(err) if _alive(pid)]
