"""Real deployment on 127.0.0.1: a SuperLink and 2 SuperNodes with TLS and node authentication.

The module fixture starts everything once (about 15 s) and stops every process by pid when
the module ends, also after a failure. One DQ run of 2 rounds takes about a minute (each
message exchange costs seconds of polling); the whole module stays well under 3 minutes,
so it runs in the default suite.
"""

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dq_flower.deploy.certs import create_node_keys
from dq_flower.deploy.processes import (
    DeploymentError,
    LocalDeployment,
    ProcessGroup,
    _start_time,
    compare_traffic,
    flwr_ls,
    format_config,
    list_nodes,
    managed_process,
    superlink_command,
    supernode_command,
    write_connection,
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


# --- the real deployment -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("deployment")
    with LocalDeployment(workdir, num_nodes=2, tls=True, supernode_auth=True) as dep:
        yield dep
    # leaving the block stopped the SuperLink, the SuperNodes and their helpers by pid
    assert dep.superlink is not None and dep.superlink.poll() is not None
    assert all(p.poll() is not None for p in dep.supernodes)


def test_dq_two_rounds_over_tls_and_traffic_matches_superlink(deployment):
    results = deployment.workdir / "results.json"
    t0 = time.monotonic()
    outcome = deployment.run(APP_DIR, {"num-server-rounds": 2, "results-path": str(results)},
                             timeout=240)
    elapsed = time.monotonic() - t0
    history = json.loads(results.read_text())["history"]
    assert [r["round"] for r in history] == [0, 1, 2]
    assert history[2]["accuracy"] > history[0]["accuracy"] + 0.2, history
    assert history[2]["accuracy"] >= history[1]["accuracy"] - 0.05, history

    traffic = compare_traffic(history, outcome)
    print(f"\nflwr run: {elapsed:.1f} s; traffic: {traffic}")
    assert traffic["replies"] == 4  # 2 nodes x 2 rounds, none rejected or failed
    up, inbound = traffic["strategy_up_bytes"], traffic["superlink_inbound_bytes"]
    assert up > 0
    assert up <= inbound <= up + traffic["replies"] * ENVELOPE_PER_REPLY, traffic
    down, outbound = traffic["strategy_down_bytes"], traffic["superlink_outbound_bytes"]
    assert 0 < down <= outbound, traffic

    # the SuperLink saw exactly the 2 registered, authenticated nodes
    log = deployment.superlink.log_text()
    for node_id in deployment.node_ids:
        assert f"Activated node_id={node_id}" in log


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


def test_deployment_error_carries_the_log(tmp_path):
    with pytest.raises(DeploymentError, match="last lines"), \
            managed_process([sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
                            log_path=tmp_path / "x.log",
                            ready=lambda p: p.wait_for_log("never", 10)):
        pass
