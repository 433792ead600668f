"""Flower's command-line tools: command lines, ``flwr`` calls and ``config.toml`` connections."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli
import tomli_w

from dq_flower.deploy.supervisor import DeploymentError

__all__ = ["RunOutcome", "compare_traffic", "rounds_from_log", "flower_env", "flower_executable",
           "flwr_home", "flwr_ls", "flwr_run", "format_config", "list_nodes", "register_node",
           "superlink_command", "supernode_command", "write_connection", "RUN_STARTED"]

RUN_STARTED = re.compile(r"Successfully started run (\d+)")


def flower_executable(name: str) -> str:
    """Path of a Flower console script: the one next to the interpreter, else on ``PATH``."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder) / name
        if folder and candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError(f"{name!r} not found; install flwr (pip install 'flwr[simulation]')")


def flower_env(*, flwr_home: str | Path | None = None, ray_tmpdir: str | Path | None = None,
               base: Mapping[str, str] | None = None,
               extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower subprocesses."""
    env = dict(os.environ if base is None else base)
    # the interpreter's bin first on PATH: flower-superexec is started by name
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")]).rstrip(os.pathsep)
    env.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", PYTHONUNBUFFERED="1")
    env.update({key: str(value) for key, value in (("FLWR_HOME", flwr_home),
                                                   ("RAY_TMPDIR", ray_tmpdir))
                if value is not None})
    env.update(extra or {})
    return env


def flwr_home(env: Mapping[str, str] | None = None) -> Path:
    """``$FLWR_HOME`` (default ``~/.flwr``): where ``flwr`` keeps ``config.toml``."""
    home = (os.environ if env is None else env).get("FLWR_HOME")
    return Path(home).expanduser() if home else Path.home() / ".flwr"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if '"' not in text and "\\" not in text and "\n" not in text:
        return f'"{text}"'
    if "'" not in text and "\n" not in text:
        return f"'{text}'"
    raise ValueError(f"value {text!r} cannot be passed on Flower's command line")


def format_config(config: Mapping[str, Any]) -> str:
    """``{"a": 1, "b": "x y"}`` -> ``"a=1 b='x y'"`` (``--run-config`` / ``--node-config``)."""
    parts = []
    for key, value in config.items():
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", key):
            raise ValueError(f"invalid config key {key!r}")
        parts.append(f"{key}={_toml_value(value)}")
    return " ".join(parts)


def _abs(path: str | Path | None) -> str:
    """Absolute path (Flower's helper processes may run in another folder)."""
    return str(Path(str(path)).expanduser().resolve())


def _flag(flag: str, value: Any, convert: Callable[[Any], str] = str) -> list[str]:
    """``[flag, convert(value)]``, or nothing for ``None``."""
    return [] if value is None else [flag, convert(value)]


def superlink_command(*, host: str = "127.0.0.1", port: int = 9093,
                      ca_cert: str | Path | None = None, server_cert: str | Path | None = None,
                      server_key: str | Path | None = None, insecure: bool = False,
                      supernode_auth: bool = True, simulation: bool = False,
                      database: str | Path | None = None, dependency_installation: bool = False,
                      log_file: str | Path | None = None) -> list[str]:
    """The ``flower-superlink`` command line.

    TLS needs ``ca_cert``, ``server_cert`` and ``server_key``, or ``insecure=True``;
    ``supernode_auth`` is not used with ``simulation``; runtime dependency installation
    (``uv sync``) is off unless ``dependency_installation``.
    """
    tls = (ca_cert, server_cert, server_key)
    if insecure and any(t is not None for t in tls):
        raise ValueError("insecure=True contradicts the TLS certificate paths")
    if not insecure and any(t is None for t in tls):
        raise ValueError("TLS needs ca_cert, server_cert and server_key (or insecure=True)")
    cmd = [flower_executable("flower-superlink"), "--host", host, "--port", str(port)]
    if insecure:
        cmd.append("--insecure")
    else:
        cmd += ["--ssl-ca-certfile", _abs(ca_cert), "--ssl-certfile", _abs(server_cert),
                "--ssl-keyfile", _abs(server_key)]
    if simulation:
        cmd.append("--simulation")
    elif supernode_auth:
        cmd.append("--enable-supernode-auth")
    if not dependency_installation:
        cmd.append("--disable-runtime-dependency-installation")
    return cmd + _flag("--database", database, _abs) + _flag("--log-file", log_file, _abs)


def supernode_command(*, superlink: str, partition_id: int | None = None,
                      num_partitions: int | None = None, data_file: str | Path | None = None,
                      data_dir: str | Path | None = None,
                      root_certificates: str | Path | None = None,
                      private_key: str | Path | None = None, insecure: bool = False,
                      runtime_port: int = 9094, runtime_host: str = "127.0.0.1",
                      node_config: Mapping[str, Any] | None = None,
                      max_retries: int | None = None,
                      max_wait_time: float | None = None) -> list[str]:
    """The ``flower-supernode`` command line of one node, with its data in ``--node-config``.

    The node trains on ``data_file`` (its own ``.npz``, made absolute) or else on partition
    ``partition_id`` of ``num_partitions`` of the run's data set (in ``data_dir``). Two
    SuperNodes on one machine need two ``runtime_port``.
    """
    if insecure and root_certificates is not None:
        raise ValueError("insecure=True contradicts root_certificates")
    # the node config: its data (file or partition) and the extra pairs
    if partition_id is not None and num_partitions is not None \
            and not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    pairs = (("partition-id", partition_id), ("num-partitions", num_partitions))
    config: dict[str, Any] = {k: v for k, v in pairs if v is not None}
    config.update({k: _abs(v) for k, v in (("data-file", data_file), ("data-dir", data_dir))
                   if v is not None})
    config.update(node_config or {})
    if config.get("data-file"):
        config["data-file"] = _abs(config["data-file"])
    elif "partition-id" not in config or "num-partitions" not in config:
        raise ValueError("a SuperNode needs its own data file (data-file) or a partition "
                         "(partition-id and num-partitions)")
    cmd = [flower_executable("flower-supernode"), "--superlink", superlink,
           "--host", runtime_host, "--port", str(runtime_port)]
    if insecure:
        cmd.append("--insecure")
    else:
        cmd += _flag("--root-certificates", root_certificates, _abs)
    return [*cmd, *_flag("--auth-supernode-private-key", private_key, _abs),
            *_flag("--max-retries", max_retries), *_flag("--max-wait-time", max_wait_time),
            "--node-config", format_config(config)]


def write_connection(name: str, address: str, *, root_certificates: str | Path | None = None,
                     insecure: bool = False, make_default: bool = False,
                     env: Mapping[str, str] | None = None) -> Path:
    """Add or replace ``[superlink.<name>]`` in ``$FLWR_HOME/config.toml``; return its path."""
    if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
        raise ValueError(f"invalid connection name {name!r}")
    if insecure and root_certificates is not None:
        raise ValueError("insecure=True contradicts root_certificates")
    path = flwr_home(env) / "config.toml"
    config: dict[str, Any] = tomli.loads(path.read_text()) if path.is_file() else {}
    links = config.setdefault("superlink", {})
    entry: dict[str, Any] = {"address": address}
    if root_certificates is not None:
        entry["root-certificates"] = str(Path(root_certificates).expanduser().resolve())
    if insecure:
        entry["insecure"] = True
    links[name] = entry
    if make_default or "default" not in links:
        links["default"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(config))
    return path


def _flwr(args: Sequence[str], *, env: Mapping[str, str] | None, timeout: float,
          cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [flower_executable("flwr"), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,  # noqa: S603
                              cwd=cwd, env=dict(env) if env is not None else None, check=False)
    except subprocess.TimeoutExpired as exc:
        raise DeploymentError(f"{shlex.join(cmd)} timed out after {timeout:g} s") from exc
    if done.returncode != 0:
        raise DeploymentError(f"{shlex.join(cmd)} failed ({done.returncode}):\n"
                              f"{done.stdout}\n{done.stderr}")
    return done


def _flwr_json(args: Sequence[str], *, env: Mapping[str, str] | None,
               timeout: float) -> dict[str, Any]:
    """The JSON ``flwr args`` prints."""
    text = _flwr(args, env=env, timeout=timeout).stdout
    start = text.find("{")
    if start < 0:
        raise DeploymentError(f"no JSON in flwr output:\n{text}")
    return dict(json.loads(text[start:]))


def register_node(public_key: str | Path, connection: str, *,
                  env: Mapping[str, str] | None = None, timeout: float = 60.0) -> int:
    """``flwr supernode register KEY.pub <connection>``; return the new node id."""
    out = _flwr_json(["supernode", "register", str(public_key), connection, "--format", "json"],
                     env=env, timeout=timeout)
    if not out.get("success"):
        raise DeploymentError(f"registration failed: {out}")
    return int(out["node-id"])


def flwr_ls(connection: str, run_id: int | None = None, *,
            env: Mapping[str, str] | None = None, timeout: float = 60.0) -> list[dict[str, Any]]:
    """``flwr ls <connection> [--run-id ID] --format json``: the runs (status, traffic, ...)."""
    args = ["ls", connection, "--format", "json"]
    if run_id is not None:
        args += ["--run-id", str(run_id)]
    return list(_flwr_json(args, env=env, timeout=timeout).get("runs", []))


def list_nodes(connection: str, *, env: Mapping[str, str] | None = None,
               timeout: float = 60.0) -> list[dict[str, Any]]:
    """``flwr supernode ls <connection> --format json``: registered nodes and their status."""
    out = _flwr_json(["supernode", "ls", connection, "--format", "json"], env=env,
                     timeout=timeout)
    return list(out.get("nodes", []))


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`flwr_run` returns: the run id, its ``flwr ls`` row and the CLI output."""

    run_id: int
    info: dict[str, Any]
    output: str

    @property
    def status(self) -> str:
        """E.g. ``finished:completed``."""
        return str(self.info.get("status", ""))

    @property
    def inbound_bytes(self) -> int:
        """Bytes the SuperLink received from SuperNodes for this run."""
        return int(self.info.get("network-traffic", {}).get("inbound-bytes", 0))

    @property
    def outbound_bytes(self) -> int:
        """Bytes the SuperLink sent to SuperNodes for this run."""
        return int(self.info.get("network-traffic", {}).get("outbound-bytes", 0))


def finished_run(connection: str, run_id: int, *, env: Mapping[str, str] | None = None,
                 timeout: float = 30.0) -> dict[str, Any]:
    """The ``flwr ls`` row of run ``run_id`` once finished; ``DeploymentError`` at timeout."""
    deadline = time.monotonic() + timeout
    while True:
        rows = flwr_ls(connection, run_id, env=env)
        info = rows[0] if rows else {}
        if str(info.get("status", "")).startswith("finished"):
            return info
        if time.monotonic() > deadline:
            raise DeploymentError(f"run {run_id} not finished after {timeout:g} s: {info}")
        time.sleep(1.0)


def flwr_run(app_dir: str | Path, connection: str, *, run_config: Mapping[str, Any] | None = None,
             env: Mapping[str, str] | None = None, timeout: float = 600.0,
             log_path: str | Path | None = None) -> RunOutcome:
    """``flwr run APP CONNECTION --run-config ... --stream``; wait for the end of the run.

    Raises :class:`DeploymentError` if the run cannot start, does not finish within
    ``timeout`` seconds, or ends in any status but ``finished:completed``.
    """
    args = ["run", str(Path(app_dir).resolve()), connection, "--stream"]
    if run_config:
        args += ["--run-config", format_config(run_config)]
    deadline = time.monotonic() + timeout
    done = _flwr(args, env=env, timeout=timeout, cwd=app_dir)
    output = done.stdout + done.stderr
    if log_path is not None:
        Path(log_path).write_text(output)
    match = RUN_STARTED.search(output)
    if not match:
        raise DeploymentError(f"flwr run did not start a run:\n{output}")
    run_id = int(match.group(1))
    info = finished_run(connection, run_id, env=env,
                        timeout=max(deadline - time.monotonic(), 0.0))
    outcome = RunOutcome(run_id, info, output)
    if outcome.status != "finished:completed":
        raise DeploymentError(f"run {run_id} ended as {outcome.status}:\n{output[-4000:]}")
    return outcome


#: The per-round log line of the package's own ServerApp (``dq_flower.harness.server_app``).
_ROUND_LINE = re.compile(r"\[[^\]\s]+\] round (\d+)/\d+: .*?up (\d+) B, down (\d+) B"
                         r"(?:, replies (\d+))?")


def rounds_from_log(output: str) -> list[dict[str, int]]:
    """Per-round ``up_bytes``, ``down_bytes``, ``replies`` of our ServerApp's log lines."""
    rows: dict[int, dict[str, int]] = {}
    for m in _ROUND_LINE.finditer(output):
        rows[int(m[1])] = {"round": int(m[1]), "up_bytes": int(m[2]),
                           "down_bytes": int(m[3]), "replies": int(m[4] or 0)}
    return [rows[k] for k in sorted(rows)]


def compare_traffic(history: Sequence[Mapping[str, Any]], outcome: RunOutcome) -> dict[str, Any]:
    """Strategy-measured and SuperLink bytes and their difference (in total and per reply)."""
    up = int(sum(int(r.get("up_bytes", 0)) for r in history))
    down = int(sum(int(r.get("down_bytes", 0)) for r in history))
    replies = int(sum(int(float(r.get("replies", 0) or 0)) for r in history))
    result: dict[str, Any] = {
        "strategy_up_bytes": up, "strategy_down_bytes": down,
        "superlink_inbound_bytes": outcome.inbound_bytes,
        "superlink_outbound_bytes": outcome.outbound_bytes,
        "up_overhead_bytes": outcome.inbound_bytes - up,
        "down_overhead_bytes": outcome.outbound_bytes - down, "replies": replies}
    if replies:
        result["up_overhead_per_reply"] = (outcome.inbound_bytes - up) / replies
        result["down_overhead_per_message"] = (outcome.outbound_bytes - down) / replies
    return result
