"""Real deployment on 127.0.0.1: a SuperLink and 2 SuperNodes with TLS and node authentication.

The module fixture starts everything once (about 15 s) and stops every process by pid when
the module ends, also after a failure. One DQ run of 2 rounds takes about a minute (each
message exchange costs seconds of polling). The nodes that bring their own files are the
same deployment's, restarted on those files (its last tests): one SuperLink for the module,
and the app that the first run installed, with the kernels it compiled, serves the second.
The whole module stays well under 3 minutes, so it runs in the default suite.
"""

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from dq_flower.deploy.certs import create_node_keys
from dq_flower.deploy.flower_cli import (
    compare_traffic,
    flwr_ls,
    format_config,
    list_nodes,
    superlink_command,
    supernode_command,
    write_connection,
)
from dq_flower.deploy.local import LocalDeployment
from dq_flower.deploy.supervisor import (
    DeploymentError,
    ProcessGroup,
    _start_time,
    managed_process,
)

APP_DIR = Path(__file__).resolve().parents[2]

#: Flower's envelope around each reply, as the SuperLink counts it: message metadata, the
#: object tree (a 64-hex-digit id per object) and every object's header (a DQ reply is 21
#: objects), plus the PullMessages/PushMessages requests. Measured: 4,367 B per reply,
#: the same for 1 KB and 9 KB payloads. The bound leaves about 40 % margin.
ENVELOPE_PER_REPLY = 6_000


# --- command lines, config, processes (fast) --------------------------------------------------


def test_superlink_command_defaults_to_tls_auth_and_no_installs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = superlink_command(port=1234, ca_cert="ca.crt", server_cert="s.crt", server_key="s.key")
    assert "--insecure" not in cmd
    assert cmd[cmd.index("--ssl-ca-certfile") + 1] == str(tmp_path / "ca.crt")  # absolute
    assert "--enable-supernode-auth" in cmd
    assert "--disable-runtime-dependency-installation" in cmd
    with pytest.raises(ValueError):
        superlink_command(port=1234)  # neither certificates nor insecure
    with pytest.raises(ValueError):
        superlink_command(port=1, insecure=True, ca_cert="a", server_cert="b", server_key="c")
    sim = superlink_command(port=1, insecure=True, simulation=True)
    assert "--simulation" in sim and "--enable-supernode-auth" not in sim


def test_supernode_command_carries_partition_and_data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = supernode_command(superlink="10.0.0.5:9093", partition_id=2, num_partitions=4,
                            data_dir="/data/my set", root_certificates="ca.crt",
                            private_key="node-2", runtime_port=9100)
    assert cmd[cmd.index("--node-config") + 1] == (
        'partition-id=2 num-partitions=4 data-dir="/data/my set"')
    assert cmd[cmd.index("--auth-supernode-private-key") + 1] == str(tmp_path / "node-2")
    assert cmd[cmd.index("--port") + 1] == "9100"
    with pytest.raises(ValueError):
        supernode_command(superlink="x:1", partition_id=4, num_partitions=4)


def test_supernode_command_carries_the_nodes_own_data_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = supernode_command(superlink="10.0.0.5:9093", data_file="dev a/local.npz",
                            root_certificates="ca.crt", private_key="node-0")
    assert cmd[cmd.index("--node-config") + 1] == (
        f'data-file="{tmp_path / "dev a" / "local.npz"}"')  # absolute, no partition
    cmd = supernode_command(superlink="x:1", partition_id=1, insecure=True,
                            node_config={"data-file": "local.npz", "num-threads": 2})
    assert cmd[cmd.index("--node-config") + 1] == (
        f'partition-id=1 data-file="{tmp_path / "local.npz"}" num-threads=2')
    with pytest.raises(ValueError, match="data-file"):
        supernode_command(superlink="x:1", partition_id=1)  # neither file nor partition count


def test_local_deployment_checks_its_data_files_before_starting(tmp_path):
    with pytest.raises(ValueError, match="one per node"):
        LocalDeployment(tmp_path, num_nodes=2, data_files=[tmp_path / "a.npz"])
    dep = LocalDeployment(tmp_path / "dep", num_nodes=1, data_files=[tmp_path / "none.npz"])
    with pytest.raises(FileNotFoundError, match="none.npz"), dep:
        pass
    assert dep.superlink is None and not dep.supernodes  # nothing was started


def test_the_deploy_package_exports_everything_it_lists():
    import dq_flower.deploy as deploy

    assert all(hasattr(deploy, name) for name in deploy.__all__)
    assert deploy.LocalDeployment is LocalDeployment
    assert deploy.DeploymentError is DeploymentError


def test_format_config_round_trips_through_flower_parser():
    from flwr.common.config import parse_config_args

    config = {"num-server-rounds": 2, "lr": 0.05, "resend": True, "results-path": "/tmp/a b",
              "win": "C:\\data"}
    assert parse_config_args([format_config(config)]) == config


def test_write_connection(tmp_path):
    import tomli

    env = {"FLWR_HOME": str(tmp_path)}
    write_connection("a", "127.0.0.1:1", root_certificates=tmp_path / "ca.crt", env=env)
    path = write_connection("b", "10.0.0.5:9093", insecure=True, env=env)
    cfg = tomli.loads(path.read_text())["superlink"]
    assert cfg["default"] == "a"
    assert cfg["a"] == {"address": "127.0.0.1:1", "root-certificates": str(tmp_path / "ca.crt")}
    assert cfg["b"] == {"address": "10.0.0.5:9093", "insecure": True}


CHILD_TREE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    # a grandchild in its own session that ignores SIGTERM, like a stubborn helper
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    open(sys.argv[1], "w").write(str(child.pid))
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_stop_reaches_descendants_in_other_sessions(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(CHILD_TREE)
    pidfile = tmp_path / "child.pid"
    with managed_process([sys.executable, str(script), str(pidfile)],
                         log_path=tmp_path / "tree.log",
                         ready=lambda p: p.wait_for_log("ready", 30),
                         stop_timeout=1.0) as proc:
        parent = proc.pid
        child = int(pidfile.read_text())
        assert _start_time(child) is not None
    assert proc.poll() is not None
    deadline = time.monotonic() + 30
    while _start_time(child) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _start_time(child) is None, "grandchild survived"
    assert _start_time(parent) is None


def test_process_group_stops_everything_on_error(tmp_path):
    procs = []
    with pytest.raises(RuntimeError), ProcessGroup() as group:
        for k in range(2):
            procs.append(group.start([sys.executable, "-c", "import time; time.sleep(600)"],
                                     log_path=tmp_path / f"p{k}.log"))
        raise RuntimeError("test failure")
    assert all(p.poll() is not None for p in procs)


def test_cli_dry_runs(capsys):
    from dq_flower.cli import main

    assert main(["deploy", "superlink", "--dry-run"]) == 2  # no certificates, no --insecure
    assert "TLS needs" in capsys.readouterr().err
    assert main(["deploy", "superlink", "--insecure", "--simulation", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "WARNING: --insecure" in captured.err and "trusted networks" in captured.err
    assert "--simulation" in captured.out
    assert main(["deploy", "supernode", "--superlink", "10.0.0.5:9093", "--partition-id", "1",
                 "--num-partitions", "3", "--root-certificates", "ca.crt", "--auth-key", "k",
                 "--data-dir", "/data", "--num-threads", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "partition-id=1 num-partitions=3 data-dir=\"/data\" num-threads=4" in out
    assert main(["deploy", "supernode", "--superlink", "10.0.0.5:9093", "--data-file",
                 "/device/local.npz", "--root-certificates", "ca.crt", "--dry-run"]) == 0
    assert 'data-file="/device/local.npz"' in capsys.readouterr().out
    assert main(["deploy", "supernode", "--superlink", "10.0.0.5:9093", "--insecure",
                 "--data-file", "/no/such/file.npz"]) == 2  # checked when it would start
    assert "no such data file" in capsys.readouterr().err
    assert main(["deploy", "supernode", "--superlink", "x:1", "--insecure", "--dry-run"]) == 2
    assert "--data-file PATH, or --partition-id" in capsys.readouterr().err
    assert main(["deploy", "local", "--app", str(APP_DIR), "--nodes", "3",
                 "--data-file", "a.npz"]) == 2
    assert "one per node" in capsys.readouterr().err


# --- the real deployment -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("deployment")
    with LocalDeployment(workdir, num_nodes=2, tls=True, supernode_auth=True) as dep:
        yield dep
    # leaving the block stopped the SuperLink, the SuperNodes and their helpers by pid
    assert dep.superlink is not None and dep.superlink.poll() is not None
    assert all(p.poll() is not None for p in dep.supernodes)


LOSS = re.compile(r"loss \d+\.\d+")


def _loss(line: str) -> float:
    """The loss a round line prints."""
    found = LOSS.search(line)
    assert found, line
    return float(found.group(0).split()[1])


def _round_lines(text: str) -> list[str]:
    """The ServerApp's per-round lines (accuracy, bytes, replies), without log prefixes."""
    return re.findall(r"\[dq\] round \d+/\d+: accuracy .*replies \d+", text)


def test_dq_over_tls_as_docs_deploy_md_shows_with_the_superlinks_traffic(deployment):
    """``dq-flower deploy run``, as docs/deploy.md step 6 shows it: the same round lines,
    and the bytes the strategy measured within what the SuperLink counted."""
    command = "num-server-rounds=3 budget=32"
    t0 = time.monotonic()
    done = subprocess.run(  # noqa: S603
        [str(Path(sys.executable).parent / "dq-flower"), "deploy", "run", "--app",
         str(APP_DIR), "--connection", deployment.connection, "--run-config", command],
        env=deployment.env, capture_output=True, text=True, timeout=300, check=False)
    print(f"\ndq-flower deploy run: {time.monotonic() - t0:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.rindex("{\n"):])
    # 2 nodes x 2 rounds, none rejected or failed (round 3 asks for nothing)
    assert report["status"] == "finished:completed" and report["replies"] == 4, report
    up, inbound = report["strategy_up_bytes"], report["superlink_inbound_bytes"]
    assert 0 < up <= inbound <= up + report["replies"] * ENVELOPE_PER_REPLY, report
    down, outbound = report["strategy_down_bytes"], report["superlink_outbound_bytes"]
    assert 0 < down <= outbound, report
    # the SuperLink saw exactly the 2 registered, authenticated nodes
    log = deployment.superlink.log_text()
    for node_id in deployment.node_ids:
        assert f"Activated node_id={node_id}" in log
    page = (APP_DIR / "docs" / "deploy.md").read_text()
    assert f'$ dq-flower deploy run --run-config "{command}"' in page
    documented = _round_lines(page[page.index(f'deploy run --run-config "{command}"'):])
    printed = _round_lines(done.stdout)
    assert len(printed) == len(documented[:4]), done.stdout[-3000:]
    for got, shown in zip(printed, documented, strict=False):
        # the loss's fourth decimal moves with PyTorch's thread count (its sums' order);
        # accuracy, bytes and replies are exact
        assert LOSS.sub("loss", got) == LOSS.sub("loss", shown), (got, shown)
        assert abs(_loss(got) - _loss(shown)) <= 2e-4, (got, shown)


def test_unregistered_node_is_refused(deployment):
    creds = deployment.credentials
    stranger = create_node_keys(creds.ca_cert.parent, "stranger", overwrite=True)
    proc = deployment.start_supernode(0, stranger, name="supernode-unregistered")
    try:
        status = proc.wait(timeout=60)
    except Exception:
        proc.stop()
        raise
    log = proc.log_text()
    assert status != 0, log
    assert "Failed to activate SuperNode" in log, log
    assert "No SuperNode found with the given public key" in deployment.superlink.log_text()
    # still only the two registered nodes, both online
    nodes = list_nodes(deployment.connection, env=deployment.env)
    assert sorted(int(n["node-id"]) for n in nodes) == sorted(deployment.node_ids)
    assert {n["status"] for n in nodes} == {"online"}
    runs = flwr_ls(deployment.connection, env=deployment.env)
    assert all(r["status"].startswith("finished") for r in runs)


def test_a_restarted_supernode_keeps_its_node_id(deployment):
    """What ``identity-binding = "node"`` relies on: the node id belongs to the key.

    Runs after the module's other tests of this deployment (it restarts node 1).
    """
    node = deployment.supernodes[1]
    node.stop()
    again = deployment.start_supernode(1, deployment.credentials.nodes[1],
                                       name="supernode-1-restarted")
    try:
        deadline = time.monotonic() + 90
        while not (found := re.search(r"SuperNode ID: (\d+)", again.log_text())):
            assert again.poll() is None, again.log_text()
            assert time.monotonic() < deadline, again.log_text()
            time.sleep(1.0)
        assert int(found.group(1)) == deployment.node_ids[1], again.log_text()
        assert re.search(rf"SuperNode ID: {deployment.node_ids[1]}\b", node.log_text())
        nodes = list_nodes(deployment.connection, env=deployment.env)
        assert sorted(int(n["node-id"]) for n in nodes) == sorted(deployment.node_ids)
    finally:
        again.stop()
    assert again.poll() is not None


def test_deployment_error_carries_the_log(tmp_path):
    with pytest.raises(DeploymentError, match="last lines"), \
            managed_process([sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
                            log_path=tmp_path / "x.log",
                            ready=lambda p: p.wait_for_log("never", 10)):
        pass


# --- nodes that bring their own data files; the server holds none -----------------------------

#: Samples each node uploads per round (DQ's budget) and rounds: node A (500 rows) never
#: runs out, node B (265 rows) does in the last round.
NODE_BUDGET = 160
ROUNDS = 2


def write_device_files(root: Path) -> tuple[list[Path], list[int]]:
    """Two devices' own ``.npz`` files from scikit-learn's digits, in folders of their own.

    Device A: 500 training rows, 150 test rows. Device B: 300 training rows and 150 test
    rows, less every row of class 9 (it never sees a 9). Values are pixels / 16, shape
    ``(n, 1, 8, 8)``.
    """
    from sklearn.datasets import load_digits

    from dq_flower.harness.tasks.data import save_node_data

    digits = load_digits()
    x = (digits.data.astype(np.float32) / 16).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    parts = {"a": (order[:500], order[800:950]), "b": (order[500:800], order[950:1100])}
    paths, sizes = [], []
    for name, (train, test) in parts.items():
        if name == "b":
            train, test = train[y[train] != 9], test[y[test] != 9]
        path = root / f"device-{name}" / "local.npz"
        path.parent.mkdir(parents=True)
        save_node_data(path, x[train], y[train], x[test], y[test])
        paths.append(path)
        sizes.append(len(train))
    return paths, sizes


#: Run-config keys a server without data needs; ``flwr run`` refuses overrides of keys that
#: the app's ``[tool.flwr.app.config]`` lacks.
NO_DATA_KEYS = {"input-shape": "", "num-classes": 0, "fraction-evaluate": 0.0}


def app_with_config_keys(folder: Path, keys: dict) -> Path:
    """The package's app, with ``keys`` added to ``[tool.flwr.app.config]`` where missing.

    ``APP_DIR`` itself when it has them all; else a copy in ``folder`` (its
    ``pyproject.toml`` and the ``dq_flower`` sources that the FAB ships).
    """
    import shutil

    import tomli
    import tomli_w

    project = tomli.loads((APP_DIR / "pyproject.toml").read_text())
    config = project["tool"]["flwr"]["app"]["config"]
    if all(key in config for key in keys):
        return APP_DIR
    for key, value in keys.items():
        config.setdefault(key, value)
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(tomli_w.dumps(project))
    shutil.copytree(APP_DIR / "dq_flower", folder / "dq_flower",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder


@pytest.fixture(scope="module")
def own_data_nodes(deployment, tmp_path_factory):
    """The module's deployment with its two registered nodes on their own files.

    Its partition SuperNodes are stopped by pid, and two started on the same keys (the same
    node ids), node ``k`` on ``files[k]``; they are stopped by pid when the module ends.
    The module's tests that use the partition nodes come before this one's.
    """
    files, sizes = write_device_files(tmp_path_factory.mktemp("devices"))
    for proc in deployment.supernodes:
        proc.stop()
    nodes = []
    try:
        for k, path in enumerate(files):
            nodes.append(deployment.start_supernode(k, deployment.credentials.nodes[k],
                                                    name=f"supernode-{k}-own-file",
                                                    data_file=path))
        found = [proc.wait_for_log(r"SuperNode ID: (\d+)", 60) for proc in nodes]
        assert [int(m.group(1)) for m in found] == deployment.node_ids
        yield nodes, files, sizes
    finally:
        for proc in nodes:
            proc.stop()
    assert all(p.poll() is not None for p in nodes)


def test_dq_on_the_nodes_own_files_with_a_server_that_holds_no_data(deployment, own_data_nodes):
    dep, (nodes, files, sizes) = deployment, own_data_nodes
    size_a, size_b = sizes
    assert (ROUNDS - 1) * NODE_BUDGET < size_b <= ROUNDS * NODE_BUDGET < size_a
    # only the SuperNodes are told where the files are
    for proc, path in zip(nodes, files, strict=True):
        assert f'data-file="{path}"' in proc.command
    assert not any(str(path.parent) in dep.superlink.command for path in files)

    results = dep.workdir / "results.json"
    rounds = ROUNDS
    run_config = {"method": "dq", "dataset": "none", "input-shape": "1,8,8", "num-classes": 10,
                  "fraction-evaluate": 1.0, "num-server-rounds": rounds,
                  "budget": NODE_BUDGET, "results-path": str(results),
                  "upload-schedule": "fixed"}
    t0 = time.monotonic()
    app = app_with_config_keys(dep.workdir / "app", NO_DATA_KEYS)
    outcome = dep.run(app, run_config, timeout=300)
    elapsed = time.monotonic() - t0
    saved = json.loads(results.read_text())
    history = saved["history"]
    acc = [r["accuracy"] for r in history]
    print(f"\nflwr run: {elapsed:.1f} s; node rows {sizes}; accuracy by round {acc}; "
          f"up bytes {[r['up_bytes'] for r in history]}; down bytes "
          f"{[r['down_bytes'] for r in history]}; selected "
          f"{[r.get('selected') for r in history]}; stored {history[-1]['stored']}")
    assert [r["round"] for r in history] == list(range(rounds + 1))

    # the server has no test set: round 0 is unmeasured, later rounds are the nodes' own
    # evaluation of the global model on their x_test/y_test
    assert acc[0] is None  # unmeasured: NaN, written as null (results.json is strict JSON)
    for row in history[1:]:
        assert row["accuracy"] == row["fed_eval_acc"]
    assert acc[-1] > 0.5 and acc[-1] > acc[1], acc

    # both nodes' replies arrive valid every round, the node without 9s included
    for row in history[1:]:
        assert (row["replies"], row["rejected"], row["failed"]) == (2, 0, 0), row
        assert row["up_bytes"] > 0
    # node A uploads its budget every round; node B its budget, then the rest of its rows
    selected = [r["selected"] for r in history[1:]]
    assert selected[:-1] == [2 * NODE_BUDGET] * (rounds - 1)
    assert selected[-1] == NODE_BUDGET + size_b - (rounds - 1) * NODE_BUDGET
    # the server stores what the nodes uploaded, not the files
    stored = history[-1]["stored"]
    assert stored == sum(selected) == rounds * NODE_BUDGET + size_b
    assert stored < size_a + size_b

    # uplink as the SuperLink counts it: the strategy's bytes plus Flower's envelopes of the
    # train and evaluate replies (2 of each per round)
    traffic = compare_traffic(history, outcome)
    print(f"traffic: {traffic}")
    up, inbound = traffic["strategy_up_bytes"], traffic["superlink_inbound_bytes"]
    assert up <= inbound <= up + 2 * traffic["replies"] * ENVELOPE_PER_REPLY, traffic

    # the server never learned where the data is: not in the run config or history it wrote,
    # nor in what the SuperLink, its ServerApp or the flwr CLI logged
    texts = {"results.json": results.read_text(),
             "superlink.log": dep.superlink.log_text(),
             "flwr-run.log": (dep.logs / "flwr-run.log").read_text()}
    for path in files:
        for name, text in texts.items():
            assert str(path.parent) not in text, name
            assert "local.npz" not in text, name
    assert "data-file" not in saved["config"]
