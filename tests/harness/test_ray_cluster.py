"""Flower's simulation engine joined to a Ray cluster started with ``ray start``.

What a user types on each machine (see docs/scaling-ray.md), here on 127.0.0.1: a head
(``ray start --head``) and worker nodes (``ray start --address``), each holding 1 CPU, then
``simulate(..., ray_address=...)``, or ``flwr run`` against a simulation SuperLink started
with ``RAY_ADDRESS``. The cluster's actor table (kept by its GCS, dead actors included)
shows on which nodes the simulated clients ran. Every ``ray start --block`` is stopped by
its pid with its descendants (raylet, GCS, workers); afterwards no process may still hold
a file of the cluster's temporary folder. About 45 s with a head only and 1 round; 65 s
with a worker node and 2 rounds; 100 s through ``flwr run``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dq_flower.cli import main
from dq_flower.cli_common import EXIT_USAGE
from dq_flower.deploy.flower_cli import flower_env, flower_executable
from dq_flower.deploy.supervisor import ManagedProcess, free_port, start_process, wait_for_port
from dq_flower.harness.ray_backend import RAY_ADDRESS_ENV, check_ray_address, ray_backend_config
from dq_flower.harness.simulate import simulate

RAY = Path(sys.executable).parent / "ray"
APP_DIR = Path(__file__).resolve().parents[2]  # the package's own Flower app
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's minimum is 75 MiB; the runs need little

needs_ray_cli = pytest.mark.skipif(not os.access(RAY, os.X_OK),
                                   reason=f"the ray CLI is not installed ({RAY} missing)")


def test_backend_config_joins_the_given_cluster_without_a_cpu_count(monkeypatch):
    monkeypatch.delenv(RAY_ADDRESS_ENV, raising=False)
    local = ray_backend_config(1.0, 0.0)
    assert local["init_args"] == {"include_dashboard": False,
                                  "num_cpus": max(1, os.cpu_count() or 1)}
    # Ray refuses num_cpus when it joins a cluster: the nodes declare their own
    joined = ray_backend_config(0.5, 0.25, "10.0.0.5:6379")
    assert joined == {"client_resources": {"num_cpus": 0.5, "num_gpus": 0.25},
                      "init_args": {"include_dashboard": False, "address": "10.0.0.5:6379"}}
    monkeypatch.setenv(RAY_ADDRESS_ENV, "ray://head:10001")
    assert ray_backend_config(1.0, 0.0)["init_args"]["address"] == "ray://head:10001"
    assert ray_backend_config(1.0, 0.0, "auto")["init_args"]["address"] == "auto"


@pytest.mark.parametrize("address", ["127.0.0.1", "head:port", ":6379", "head:70000", ""])
def test_a_malformed_ray_address_fails_before_any_run(address, tmp_path, capsys):
    with pytest.raises(ValueError, match="ray-address"):
        check_ray_address(address)
    with pytest.raises(ValueError, match="ray-address"):
        simulate("dq", "digits", "mlp", num_clients=2, rounds=1, ray_address=address)
    out = tmp_path / "out"
    assert main(["compare", "--methods", "dq", "--out", str(out),
                 "--ray-address", address]) == EXIT_USAGE
    assert "ray-address" in capsys.readouterr().err
    assert not out.exists()


def test_ray_address_needs_the_simulation_engine(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", "--engine", "inprocess", "--out", str(out),
                 "--ray-address", "127.0.0.1:6379"]) == EXIT_USAGE
    assert "ray-address: joins a Ray cluster with the simulation engine" in (
        capsys.readouterr().err)
    assert not out.exists()


@dataclass
class Cluster:
    """A running cluster's address and, once stopped, what was still alive after it."""

    address: str
    tmpdir: Path
    running_pids: list[int] = field(default_factory=list)
    stray_pids: list[int] = field(default_factory=list)


def _ray_start(args: list[str], tmpdir: Path, name: str) -> ManagedProcess:
    """``ray start ARGS --block`` with one CPU, waited for until its node runs."""
    process = start_process(
        [str(RAY), "start", *args, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
         "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats", "--block"],
        log_path=tmpdir / f"{name}.log", env=flower_env(ray_tmpdir=tmpdir / "ray"),
        name=name)
    process.wait_for_log("Ray runtime started", 120)
    return process


def _holds_files_under(pid: int, folder: str) -> bool:
    """Whether ``pid``'s command line, environment or an open file names ``folder``."""
    proc = Path(f"/proc/{pid}")
    try:
        text = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        if folder.encode() in text:
            return True
        return any(os.readlink(fd).startswith(folder) for fd in (proc / "fd").iterdir())
    except OSError:  # gone meanwhile, or another user's
        return False


def _processes_of(folder: Path) -> list[int]:
    """Live processes (other than this one) that belong to the cluster kept in ``folder``."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    return [pid for pid in pids if _holds_files_under(pid, str(folder))]


@contextmanager
def ray_cluster(workers: int) -> Iterator[Cluster]:
    """A head and ``workers`` worker nodes on 127.0.0.1; all stopped by pid on exit."""
    # Ray's socket paths must stay under 108 bytes: a short folder, not pytest's tmp_path
    tmpdir = Path(tempfile.mkdtemp(prefix="dqr-", dir="/tmp"))
    port = free_port()
    cluster = Cluster(address=f"127.0.0.1:{port}", tmpdir=tmpdir)
    with ExitStack() as stack:
        try:
            head = _ray_start(["--head", "--port", str(port), "--include-dashboard=false"],
                              tmpdir, "head")
            stack.callback(head.stop, timeout=30)
            for i in range(workers):
                worker = _ray_start(["--address", cluster.address], tmpdir, f"worker{i}")
                stack.callback(worker.stop, timeout=30)  # stopped before the head
            cluster.running_pids = _processes_of(tmpdir)
            yield cluster
        finally:
            stack.close()
            # anything still alive is a leak: record it for the test, then stop it by pid
            cluster.stray_pids = _processes_of(tmpdir)
            for pid in cluster.stray_pids:
                os.kill(pid, 9)
            shutil.rmtree(tmpdir, ignore_errors=True)


def _cluster_view(address: str) -> tuple[set[str], list[dict]]:
    """Alive node ids and every actor the cluster has seen (GCS tables, dead ones too)."""
    import ray  # deferred: Ray loads only in the tests that use a cluster
    from ray._private import state

    ray.init(address=address, include_dashboard=False, logging_level="ERROR")
    try:
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        actors = list(state.actors().values())
    finally:
        ray.shutdown()
    return nodes, actors


def _run_on_cluster(workers: int, clients: int, rounds: int
                    ) -> tuple[Cluster, set[str], list[dict], list]:
    with ray_cluster(workers) as cluster:
        result = simulate("dq", "digits", "mlp", num_clients=clients, rounds=rounds, seed=0,
                          ray_address=cluster.address, budget=32)
        nodes, actors = _cluster_view(cluster.address)
    return cluster, nodes, actors, result.history


def _client_actors(actors: list[dict]) -> list[dict]:
    return [a for a in actors if a["ActorClassName"] == "ClientAppActor"]


@needs_ray_cli
def test_simulation_on_a_one_node_cluster():
    cluster, nodes, actors, history = _run_on_cluster(workers=0, clients=2, rounds=1)

    assert [r["round"] for r in history] == [0, 1]
    assert history[1]["up_bytes"] > 0
    clients = _client_actors(actors)
    # 1 CPU, 1 CPU per client: the pool is one actor, created by the cluster's head
    assert len(clients) == 1 and {a["Address"]["NodeID"] for a in clients} == nodes
    # the leak check sees a running cluster (ray start, GCS, raylet, ...), and none after
    assert len(cluster.running_pids) >= 3
    assert cluster.stray_pids == []


@needs_ray_cli
@pytest.mark.slow
def test_simulation_spreads_clients_over_two_nodes():
    cluster, nodes, actors, history = _run_on_cluster(workers=1, clients=4, rounds=2)

    assert [r["round"] for r in history] == [0, 1, 2]
    assert history[2]["accuracy"] > history[0]["accuracy"]
    assert history[1]["up_bytes"] > 0
    clients = _client_actors(actors)
    # 2 nodes with 1 CPU each: one client actor on each, the worker node's included
    assert len(nodes) == 2
    assert len(clients) == 2 and {a["Address"]["NodeID"] for a in clients} == nodes
    assert cluster.stray_pids == []


@needs_ray_cli
@pytest.mark.slow
def test_flwr_run_joins_the_cluster_named_by_ray_address(tmp_path):
    flwr_home = tmp_path / "flwr-home"
    flwr_home.mkdir()
    port = free_port()
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n")
    results = tmp_path / "results.json"
    with ray_cluster(workers=1) as cluster:
        env = flower_env(flwr_home=flwr_home, ray_tmpdir=cluster.tmpdir / "ray",
                         extra={"RAY_ADDRESS": cluster.address})
        superlink = start_process(
            [flower_executable("flower-superlink"), "--simulation", "--insecure",
             "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
             "--port", str(port)],
            log_path=tmp_path / "superlink.log", env=env, cwd=tmp_path, name="superlink")
        try:
            wait_for_port("127.0.0.1", port, 60, superlink)
            done = subprocess.run(
                [flower_executable("flwr"), "run", ".", "sim", "--run-config",
                 f"num-server-rounds=2 results-path='{results}'", "--federation-config",
                 "num-supernodes=4 client-resources-num-cpus=1", "--stream"],
                cwd=APP_DIR, env=env, capture_output=True, text=True, timeout=300,
                check=False)
        finally:
            superlink.stop()
        nodes, actors = _cluster_view(cluster.address)

    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    history = json.loads(results.read_text())["history"]
    assert [r["round"] for r in history] == [0, 1, 2]
    assert history[1]["up_bytes"] > 0 and history[1]["replies"] == 4
    clients = _client_actors(actors)
    assert len(nodes) == 2
    assert len(clients) == 2 and {a["Address"]["NodeID"] for a in clients} == nodes
    assert cluster.stray_pids == []
