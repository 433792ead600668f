"""The example app in ``examples/quickstart-dq``: in-process, and with ``flwr run``.

The fast test imports the app's modules and calls its ``ServerApp`` on an in-process grid
whose nodes run its ``ClientApp`` (no Ray, 8 s on one core), at the app's defaults: what it
prints and the bytes of each round are what the example's README shows. The end-to-end test
is what the README tells a user to type: a simulation SuperLink (started and stopped here by
its pid) and ``flwr run examples/quickstart-dq`` with 4 simulated SuperNodes at the app's
defaults, whose last line must be the README's too (about 35 s, ``slow``:
``tests/test_install.py`` runs ``flwr run`` of a copy of this app from the installed wheel
in every run of the suite).
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from dq_flower.deploy.flower_cli import flower_env, flower_executable
from dq_flower.deploy.supervisor import free_port, start_process, wait_for_port
from dq_flower.harness.inprocess import InProcessGrid

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "quickstart-dq"
ROUNDS = 5  # the app's default, the run its README shows


def app_config() -> dict:
    """The run config of ``[tool.flwr.app.config]`` in the example's pyproject.toml."""
    with (APP_DIR / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])


@pytest.fixture
def example(monkeypatch):
    """The example's modules, importable as a user's ``flwr run`` would import them."""
    monkeypatch.syspath_prepend(str(APP_DIR))
    from quickstart_dq import client_app, server_app, task

    return task, client_app, server_app


def check_results(out: Path) -> dict:
    results = json.loads((out / "results.json").read_text())
    central = results["central"]
    assert sorted(central, key=int) == [str(r) for r in range(ROUNDS + 1)]
    assert central["0"]["accuracy"] < 0.3  # chance is 0.1
    assert central[str(ROUNDS)]["accuracy"] > 0.6, central
    assert central[str(ROUNDS)]["loss"] < central["0"]["loss"]
    assert sorted(results["federated"], key=int) == [str(r) for r in range(1, ROUNDS + 1)]
    # fraction-evaluate 1.0: the nodes' test rows together are the central test rows
    for rnd, fed in results["federated"].items():
        assert fed["eval-acc"] == pytest.approx(central[rnd]["accuracy"], abs=1e-6), results
    up = results["up_bytes"]
    assert sorted(up, key=int) == [str(r) for r in range(1, ROUNDS + 1)]
    # round 1 uploads samples; a later round sends nothing once the store holds every row
    # (the first ask covers 10 held-out rows per digit) but its federated evaluation
    assert up["1"] > 0 and results["down_bytes"]["1"] > 0
    assert all(v >= 0 for v in up.values()) and sum(results["down_bytes"].values()) > 0
    assert (out / "final_model.pt").stat().st_size > 0
    return results


def readme_output() -> str:
    """The output the README's "What you get" shows: its one fenced block there."""
    section = (APP_DIR / "README.md").read_text().split("## What you get", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"^```\w*\n(.*?)^```$", section, re.M | re.S)
    assert len(blocks) == 1, blocks
    return blocks[0].strip()


def readme_rounds() -> dict[str, list[str]]:
    """The README's round-by-round table: its row name -> the cells of rounds 0 to 5."""
    rows = {}
    for line in (APP_DIR / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in {"round", "central test accuracy", "uplink bytes", "downlink bytes"}:
            rows[cells[0]] = cells[1:]
    return rows


def check_readme(output: str, results: dict) -> None:
    """``output`` prints the README's line, ``results`` is the README's table."""
    final = [line.strip() for line in output.splitlines() if "Final accuracy" in line]
    assert final == [readme_output()], (
        f"examples/quickstart-dq/README.md shows {readme_output()!r}; the run printed {final}")
    rows = readme_rounds()
    assert rows["round"] == [str(r) for r in range(ROUNDS + 1)], rows
    accuracy = [f"{results['central'][str(r)]['accuracy']:.3f}" for r in range(ROUNDS + 1)]
    up = [""] + [f"{results['up_bytes'][str(r)]:,}" for r in range(1, ROUNDS + 1)]
    down = [""] + [f"{results['down_bytes'][str(r)]:,}" for r in range(1, ROUNDS + 1)]
    assert {"central test accuracy": accuracy, "uplink bytes": up,
            "downlink bytes": down} == {k: v for k, v in rows.items() if k != "round"}, rows
    up_total, down_total = sum(results["up_bytes"].values()), sum(
        results["down_bytes"].values())
    assert f"uplink {up_total} bytes, downlink {down_total} bytes" in final[0]
    # the prose's ratio of downlink to uplink
    readme = " ".join((APP_DIR / "README.md").read_text().split())
    assert f"The downlink is {round(down_total / up_total)} times the uplink" in readme


def test_pyproject_declares_the_app():
    with (APP_DIR / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)
    assert "dq-flower" in project["project"]["dependencies"]
    assert project["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "quickstart_dq.server_app:app",
        "clientapp": "quickstart_dq.client_app:app",
    }
    # a [tool.flwr.federations] table would make `flwr run` rewrite the file (migration)
    assert "federations" not in project["tool"]["flwr"]
    assert app_config()["num-server-rounds"] == 5


def test_load_data_partitions_digits_iid(example):
    task, _, _ = example
    trains, tests = zip(*(task.load_data(k, 4) for k in range(4)), strict=True)
    central = task.load_centralized_testset()
    x_all = np.concatenate([ds.tensors[0].numpy() for ds in tests])
    np.testing.assert_array_equal(x_all, central.tensors[0].numpy())
    sizes = [len(ds) for ds in trains]
    assert sum(sizes) + len(central) == 1797 and max(sizes) - min(sizes) <= 1
    for ds in trains:
        x, y = ds.tensors
        assert tuple(x.shape[1:]) == (1, 8, 8) and 0 <= float(x.min()) <= float(x.max()) <= 1
        assert len(set(y.tolist())) == 10  # IID: every class on every node
    assert task.Net()(trains[0].tensors[0][:5]).shape == (5, 10)


def test_server_and_client_apps_in_process(example, tmp_path, capsys):
    # the README's run: the app's defaults on 4 nodes; in-process gives the same numbers
    _, client_app, server_app = example
    config = {**app_config(), "output-dir": str(tmp_path)}
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                      run_config=config)
    server_app.app(InProcessGrid(client_app.app, 4), context)
    results = check_results(tmp_path)
    check_readme(capsys.readouterr().out, results)
    # the first ask: 10 held-out rows per digit at 10%, 1,000 samples of 64 pixels at 2
    # bits, about 23 kB; the whole run uploads each client's rows at most once (35 kB)
    assert results["up_bytes"]["1"] < 30_000, results["up_bytes"]
    assert sum(results["up_bytes"].values()) < 50_000, results["up_bytes"]


def readme_block(start: str) -> str:
    """The README's fenced block whose first line starts with ``start``."""
    blocks = re.findall(r"^```\w*\n(.*?)^```$", (APP_DIR / "README.md").read_text(),
                        re.M | re.S)
    found = [b for b in blocks if b.startswith(start)]
    assert len(found) == 1, start
    return found[0]


def test_the_readmes_run_config_example_runs(example, tmp_path):
    # the README's --run-config example, in-process (its output-dir moved to tmp_path)
    from flwr.common.config import parse_config_args

    block = readme_block('flwr run examples/quickstart-dq --federation-config "num-supernodes=4"'
                         ' --stream \\')
    override = parse_config_args([re.search(r'--run-config "([^"]+)"', block)[1]])
    assert set(override) <= set(app_config()), override
    _, client_app, server_app = example
    config = {**app_config(), **override, "output-dir": str(tmp_path)}
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                      run_config=config)
    server_app.app(InProcessGrid(client_app.app, 4), context)
    central = json.loads((tmp_path / "results.json").read_text())["central"]
    assert sorted(central, key=int)[-1] == str(override["num-server-rounds"])


def test_the_deploy_pages_run_of_this_app_ends_with_what_it_prints_in_process(example,
                                                                               capsys):
    # docs/deploy.md quotes the last line of `dq-flower deploy local --app
    # examples/quickstart-dq` (a TLS deployment, minutes); in-process gives the same numbers
    from tests.test_docs import ALL_BLOCKS

    shown = next(b.code for b in ALL_BLOCKS if b.path == "docs/deploy.md"
                 and "deploy local --app examples/quickstart-dq" in b.code)
    rounds = int(re.search(r"--app examples/quickstart-dq --rounds (\d+)", shown)[1])
    nodes = len(re.search(r"SuperNodes \[([^\]]+)\]", shown)[1].split(","))
    page = " ".join((APP_DIR.parents[1] / "docs" / "deploy.md").read_text().split())
    quoted = re.search(r"the run's own output ends with `(Final accuracy [^`]+)`", page)[1]
    _, client_app, server_app = example
    config = {**app_config(), "num-server-rounds": rounds}
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                      run_config=config)
    server_app.app(InProcessGrid(client_app.app, nodes), context)
    final = [line.strip() for line in capsys.readouterr().out.splitlines()
             if line.startswith("Final accuracy")]
    assert final == [quoted], (final, quoted)


def test_the_readmes_client_excerpt_is_the_client_app():
    excerpt = readme_block("@app.train()")
    assert excerpt in (APP_DIR / "quickstart_dq" / "client_app.py").read_text(), excerpt


@pytest.mark.slow  # 34 s; flwr run of this app unmarked: tests/test_install.py, from the wheel
def test_flwr_run_quickstart_dq_in_simulation(tmp_path):
    # Ray's socket paths must stay under 108 bytes: a short folder, not pytest's tmp_path
    ray_tmp = Path(tempfile.mkdtemp(prefix="dq-ray-"))
    env = flower_env(flwr_home=tmp_path / "flwr-home", ray_tmpdir=ray_tmp)
    port = free_port()
    (tmp_path / "flwr-home").mkdir()
    (tmp_path / "flwr-home" / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n")
    out = tmp_path / "out"
    pyproject_before = (APP_DIR / "pyproject.toml").read_bytes()

    superlink = start_process(
        [flower_executable("flower-superlink"), "--simulation", "--insecure",
         "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
         "--port", str(port)],
        log_path=tmp_path / "superlink.log", env=env, cwd=tmp_path, name="superlink")
    try:
        wait_for_port("127.0.0.1", port, 60, superlink)
        done = subprocess.run(
            [flower_executable("flwr"), "run", str(APP_DIR), "sim",
             "--federation-config", "num-supernodes=4",
             "--run-config", f"output-dir='{out}'", "--stream"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert "Successfully started run" in output, output
        ls = subprocess.run([flower_executable("flwr"), "ls", "sim", "--format", "json"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                            check=True)
        runs = json.loads(ls.stdout[ls.stdout.index("{"):])["runs"]
    finally:
        superlink.stop()
        sys.stdout.write(superlink.log_tail(10) + "\n")
        shutil.rmtree(ray_tmp, ignore_errors=True)

    assert superlink.poll() is not None
    assert [r["status"] for r in runs] == ["finished:completed"], output
    assert "4 simulated SuperNodes" in output, output
    results = check_results(out)
    check_readme(output, results)  # the command the README gives prints what it shows
    # the 4 simulated SuperNodes each uploaded samples in round 1 and evaluated in every
    # round (check_results: federated figures for every round, equal to the central ones)
    assert results["up_bytes"]["1"] > 4 * 1000, results["up_bytes"]
    # flwr run must not rewrite the example (legacy [tool.flwr.federations] migration)
    assert (APP_DIR / "pyproject.toml").read_bytes() == pyproject_before
