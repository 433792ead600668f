"""Start and stop a Flower SuperLink and SuperNodes as subprocesses, and drive the ``flwr`` CLI.

Every process is started with its output in a log file and is stopped by its pid: SIGTERM,
then SIGKILL after a grace period. Flower's SuperLink and SuperNode start helper processes
of their own (``flower-superexec``, ``flwr-serverapp``, ``flwr-clientapp``), some in a new
session; :meth:`ManagedProcess.stop` snapshots the descendants (from ``/proc`` on Linux)
before it signals the parent, and stops the ones still alive afterwards, each by pid (with
its start time checked, so a recycled pid is never hit).

:class:`ProcessGroup` and :class:`LocalDeployment` are context managers: leaving the
``with`` block, normally or by an exception, stops every process they started.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from dq_flower.deploy.certs import Credentials, NodeKeys, create_credentials

__all__ = [
    "DeploymentError",
    "LocalDeployment",
    "ManagedProcess",
    "ProcessGroup",
    "RunOutcome",
    "TRUST_MODEL",
    "compare_traffic",
    "flower_env",
    "flower_executable",
    "flwr_home",
    "flwr_ls",
    "flwr_run",
    "format_config",
    "free_port",
    "list_nodes",
    "managed_process",
    "register_node",
    "start_process",
    "superlink_command",
    "supernode_command",
    "wait_for_port",
    "write_connection",
]

#: Printed by the CLI and the docs: what leaves a device under DQ.
TRUST_MODEL = (
    "Trust model: DQ uploads quantized raw training samples (not weights or gradients) to "
    "the server. Deploy it only on trusted networks (one organisation's devices, a data "
    "centre, a hospital's own machines). It is not a privacy mechanism; TLS protects the "
    "link, not the data from the server."
)

_NODE_ONLINE = re.compile(r"SuperNode ID: (\d+)")
_RUN_STARTED = re.compile(r"Successfully started run (\d+)")


class DeploymentError(RuntimeError):
    """A Flower process or CLI call failed; the message carries the tail of its log."""


# --- environment and helpers ------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it by binding port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def flower_executable(name: str) -> str:
    """Path of a Flower console script (``flwr``, ``flower-superlink``, ...).

    The one next to the running Python interpreter wins (a virtual environment need not be
    activated); otherwise ``PATH`` is searched.
    """
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder) / name
        if folder and candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError(f"{name!r} not found; install flwr (pip install 'flwr[simulation]')")


def flower_env(
    *,
    flwr_home: str | Path | None = None,
    ray_tmpdir: str | Path | None = None,
    base: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for Flower subprocesses.

    Puts the interpreter's ``bin`` folder first on ``PATH`` (the SuperLink and SuperNode
    start ``flower-superexec`` by name), turns telemetry and the update check off, makes
    Python output unbuffered (logs appear as they happen) and sets ``FLWR_HOME`` and
    ``RAY_TMPDIR`` when given.
    """
    env = dict(os.environ if base is None else base)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")]).rstrip(os.pathsep)
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if flwr_home is not None:
        env["FLWR_HOME"] = str(flwr_home)
    if ray_tmpdir is not None:
        env["RAY_TMPDIR"] = str(ray_tmpdir)
    if extra:
        env.update(extra)
    return env


def flwr_home(env: Mapping[str, str] | None = None) -> Path:
    """``$FLWR_HOME`` (default ``~/.flwr``): where ``flwr`` keeps ``config.toml``."""
    env = os.environ if env is None else env
    home = env.get("FLWR_HOME")
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


def wait_for_port(host: str, port: int, timeout: float,
                  process: ManagedProcess | None = None) -> None:
    """Wait until ``host:port`` accepts TCP connections (and ``process``, if given, lives)."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise DeploymentError(
                f"{process.name} exited with {process.poll()} before listening on "
                f"{host}:{port}\n{process.log_tail()}")
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                tail = process.log_tail() if process is not None else ""
                raise DeploymentError(f"nothing listens on {host}:{port} after {timeout:g} s\n"
                                      f"{tail}") from None
            time.sleep(0.2)


# --- processes --------------------------------------------------------------------------------


def _start_time(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks since boot) or ``None`` if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _descendants(pid: int) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every live descendant of ``pid`` (Linux ``/proc``; else [])."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: list[tuple[int, int]] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        start = _start_time(child)
        if start is not None:
            found.append((child, start))
        stack.extend(children.get(child, []))
    return found


def _signal_if_same(pid: int, start: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process that started at ``start``."""
    if _start_time(pid) != start:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


@dataclass
class ManagedProcess:
    """A subprocess with its log file; stopped by pid (SIGTERM, then SIGKILL)."""

    name: str
    args: list[str]
    log_path: Path | None
    popen: subprocess.Popen[bytes]
    _known: dict[int, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """Process id."""
        return int(self.popen.pid)

    @property
    def command(self) -> str:
        """The command line, shell-quoted."""
        return shlex.join(self.args)

    def poll(self) -> int | None:
        """Exit status, or ``None`` while running."""
        return self.popen.poll()

    def log_text(self) -> str:
        """The whole log so far ("" when output goes to the terminal)."""
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log, labelled."""
        tail = "\n".join(self.log_text().splitlines()[-lines:])
        return f"--- last lines of {self.log_path} ---\n{tail}"

    def remember_descendants(self) -> None:
        """Record the live descendants now (stopped later even if re-parented meanwhile)."""
        if self.poll() is None:
            self._known.update(dict(_descendants(self.pid)))

    def wait_for_log(self, pattern: str | re.Pattern[str], timeout: float, *,
                     allow_exit: bool = False) -> re.Match[str]:
        """Wait until the log matches ``pattern``; return the match.

        Raises :class:`DeploymentError` on timeout, or when the process exits first (unless
        ``allow_exit``: then its final log is still searched).
        """
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            exited = self.poll() is not None
            match = regex.search(self.log_text())
            if match:
                self.remember_descendants()
                return match
            if exited and not allow_exit:
                raise DeploymentError(f"{self.name} exited with {self.poll()} before logging "
                                      f"{regex.pattern!r}\n{self.log_tail()}")
            if exited or time.monotonic() > deadline:
                raise DeploymentError(f"{self.name}: no {regex.pattern!r} in its log after "
                                      f"{timeout:g} s\n{self.log_tail()}")
            time.sleep(0.2)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit; return its status."""
        return int(self.popen.wait(timeout=timeout))

    def stop(self, timeout: float = 10.0, grace: float = 3.0) -> int | None:
        """Stop the process and its descendants by pid; return the exit status.

        SIGTERM first; SIGKILL after ``timeout`` seconds. Descendants get ``grace`` seconds
        to exit with their parent (Flower's helpers watch their parent's pid), then SIGTERM,
        then SIGKILL.
        """
        self.remember_descendants()
        if self.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout)
        _stop_pids(self._known, grace=grace, timeout=timeout)
        self._known.clear()
        return self.poll()


def _stop_pids(pids: Mapping[int, int], *, grace: float, timeout: float) -> None:
    """Stop the processes ``{pid: start time}`` still alive: wait, SIGTERM, SIGKILL."""

    def alive() -> list[tuple[int, int]]:
        return [(p, s) for p, s in pids.items() if _start_time(p) == s]

    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
        left = alive()
        if not left:
            return
        for pid, start in left:
            _signal_if_same(pid, start, sig)
        deadline = time.monotonic() + wait_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)


def start_process(
    args: Sequence[str],
    *,
    log_path: str | Path | None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    name: str | None = None,
) -> ManagedProcess:
    """Start ``args`` with stdout and stderr appended to ``log_path`` (``None``: inherited).

    The process gets a session of its own, so a terminal's Ctrl-C reaches only the parent
    (which then stops it by pid) and children stop in order.
    """
    log = Path(log_path) if log_path is not None else None
    with ExitStack() as stack:
        out: IO[bytes] | None = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(log.open("ab"))
        popen = subprocess.Popen(  # noqa: S603  (fixed argument list, no shell)
            list(args), stdout=out, stderr=subprocess.STDOUT if out is not None else None,
            stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None, cwd=cwd,
            start_new_session=True,
        )
    return ManagedProcess(name or Path(args[0]).name, list(args), log, popen)


@contextmanager
def managed_process(
    args: Sequence[str],
    *,
    log_path: str | Path,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    name: str | None = None,
    ready: Callable[[ManagedProcess], object] | None = None,
    stop_timeout: float = 10.0,
) -> Iterator[ManagedProcess]:
    """Start a process, wait for ``ready(proc)``, yield it, and always stop it by pid.

    ``stop_timeout`` is the SIGTERM-to-SIGKILL wait (see :meth:`ManagedProcess.stop`).
    """
    proc = start_process(args, log_path=log_path, env=env, cwd=cwd, name=name)
    try:
        if ready is not None:
            ready(proc)
        yield proc
    finally:
        proc.stop(timeout=stop_timeout, grace=min(3.0, stop_timeout))


class ProcessGroup:
    """Processes started together and stopped together, in reverse order, on exit."""

    def __init__(self) -> None:
        self.processes: list[ManagedProcess] = []

    def start(self, args: Sequence[str], *, log_path: str | Path,
              env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
              name: str | None = None) -> ManagedProcess:
        """Start a process that this group will stop."""
        proc = start_process(args, log_path=log_path, env=env, cwd=cwd, name=name)
        self.processes.append(proc)
        return proc

    def stop_all(self) -> None:
        """Stop every process, newest first; errors in one never skip the others."""
        errors: list[BaseException] = []
        while self.processes:
            proc = self.processes.pop()
            try:
                proc.stop()
            except BaseException as exc:  # noqa: BLE001  (keep stopping the others)
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()


# --- command lines ----------------------------------------------------------------------------


def _abs(path: str | Path | None) -> str:
    """Absolute path (Flower's helper processes may run in another folder)."""
    return str(Path(str(path)).expanduser().resolve())


def superlink_command(
    *,
    host: str = "127.0.0.1",
    port: int = 9093,
    ca_cert: str | Path | None = None,
    server_cert: str | Path | None = None,
    server_key: str | Path | None = None,
    insecure: bool = False,
    supernode_auth: bool = True,
    simulation: bool = False,
    database: str | Path | None = None,
    dependency_installation: bool = False,
    log_file: str | Path | None = None,
) -> list[str]:
    """The ``flower-superlink`` command line.

    TLS needs all of ``ca_cert``, ``server_cert`` and ``server_key``, or ``insecure=True``.
    ``supernode_auth`` adds ``--enable-supernode-auth`` (not used with ``simulation``).
    Runtime dependency installation (``uv sync`` of the app's dependencies, which needs the
    network) is off unless ``dependency_installation``.
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
    if database is not None:
        cmd += ["--database", _abs(database)]
    if log_file is not None:
        cmd += ["--log-file", _abs(log_file)]
    return cmd


def supernode_command(
    *,
    superlink: str,
    partition_id: int,
    num_partitions: int,
    data_dir: str | Path | None = None,
    root_certificates: str | Path | None = None,
    private_key: str | Path | None = None,
    insecure: bool = False,
    runtime_port: int = 9094,
    runtime_host: str = "127.0.0.1",
    node_config: Mapping[str, Any] | None = None,
    max_retries: int | None = None,
    max_wait_time: float | None = None,
) -> list[str]:
    """The ``flower-supernode`` command line for the node holding partition ``partition_id``.

    ``runtime_port`` is the node's local Runtime API port (its ``flwr-clientapp`` talks to
    it); two SuperNodes on one machine need two ports.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    if insecure and root_certificates is not None:
        raise ValueError("insecure=True contradicts root_certificates")
    config: dict[str, Any] = {"partition-id": partition_id, "num-partitions": num_partitions}
    if data_dir is not None:
        config["data-dir"] = _abs(data_dir)
    config.update(node_config or {})
    cmd = [flower_executable("flower-supernode"), "--superlink", superlink,
           "--host", runtime_host, "--port", str(runtime_port)]
    if insecure:
        cmd.append("--insecure")
    elif root_certificates is not None:
        cmd += ["--root-certificates", _abs(root_certificates)]
    if private_key is not None:
        cmd += ["--auth-supernode-private-key", _abs(private_key)]
    if max_retries is not None:
        cmd += ["--max-retries", str(max_retries)]
    if max_wait_time is not None:
        cmd += ["--max-wait-time", str(max_wait_time)]
    cmd += ["--node-config", format_config(config)]
    return cmd


# --- the flwr CLI -----------------------------------------------------------------------------


def write_connection(
    name: str,
    address: str,
    *,
    root_certificates: str | Path | None = None,
    insecure: bool = False,
    make_default: bool = False,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Add or replace ``[superlink.<name>]`` in ``$FLWR_HOME/config.toml``; return its path."""
    import tomli
    import tomli_w

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
        done = subprocess.run(  # noqa: S603
            cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
            env=dict(env) if env is not None else None, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise DeploymentError(f"{shlex.join(cmd)} timed out after {timeout:g} s") from exc
    if done.returncode != 0:
        raise DeploymentError(f"{shlex.join(cmd)} failed ({done.returncode}):\n"
                              f"{done.stdout}\n{done.stderr}")
    return done


def _json_out(text: str) -> dict[str, Any]:
    start = text.find("{")
    if start < 0:
        raise DeploymentError(f"no JSON in flwr output:\n{text}")
    return dict(json.loads(text[start:]))


def register_node(public_key: str | Path, connection: str, *,
                  env: Mapping[str, str] | None = None, timeout: float = 60.0) -> int:
    """``flwr supernode register KEY.pub <connection>``; return the new node id."""
    done = _flwr(["supernode", "register", str(public_key), connection, "--format", "json"],
                 env=env, timeout=timeout)
    out = _json_out(done.stdout)
    if not out.get("success"):
        raise DeploymentError(f"registration failed: {out}")
    return int(out["node-id"])


def flwr_ls(connection: str, run_id: int | None = None, *,
            env: Mapping[str, str] | None = None, timeout: float = 60.0) -> list[dict[str, Any]]:
    """``flwr ls <connection> [--run-id ID] --format json``: the runs (status, traffic, ...)."""
    args = ["ls", connection, "--format", "json"]
    if run_id is not None:
        args += ["--run-id", str(run_id)]
    out = _json_out(_flwr(args, env=env, timeout=timeout).stdout)
    return list(out.get("runs", []))


def list_nodes(connection: str, *, env: Mapping[str, str] | None = None,
               timeout: float = 60.0) -> list[dict[str, Any]]:
    """``flwr supernode ls <connection> --format json``: registered nodes and their status."""
    out = _json_out(_flwr(["supernode", "ls", connection, "--format", "json"], env=env,
                          timeout=timeout).stdout)
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
        """Bytes the SuperLink received from SuperNodes for this run (its Fleet API)."""
        return int(self.info.get("network-traffic", {}).get("inbound-bytes", 0))

    @property
    def outbound_bytes(self) -> int:
        """Bytes the SuperLink sent to SuperNodes for this run."""
        return int(self.info.get("network-traffic", {}).get("outbound-bytes", 0))


def flwr_run(
    app_dir: str | Path,
    connection: str,
    *,
    run_config: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    log_path: str | Path | None = None,
) -> RunOutcome:
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
    match = _RUN_STARTED.search(output)
    if not match:
        raise DeploymentError(f"flwr run did not start a run:\n{output}")
    run_id = int(match.group(1))
    while True:  # the stream ends with the run; its status may lag by a moment
        rows = flwr_ls(connection, run_id, env=env)
        info = rows[0] if rows else {}
        if str(info.get("status", "")).startswith("finished"):
            break
        if time.monotonic() > deadline:
            raise DeploymentError(f"run {run_id} not finished after {timeout:g} s: {info}")
        time.sleep(1.0)
    outcome = RunOutcome(run_id, info, output)
    if outcome.status != "finished:completed":
        raise DeploymentError(f"run {run_id} ended as {outcome.status}:\n{output[-4000:]}")
    return outcome


def compare_traffic(history: Sequence[Mapping[str, Any]], outcome: RunOutcome) -> dict[str, Any]:
    """Compare the bytes the strategy measured with the SuperLink's own figures.

    Returns up and down totals from the history (message content as Flower serialises
    it), the SuperLink's inbound and outbound bytes, and the envelope overhead: the
    difference, in total and per reply (``replies`` from the history, else one per node and
    round is not assumed and the per-reply figure is omitted).
    """
    up = int(sum(int(r.get("up_bytes", 0)) for r in history))
    down = int(sum(int(r.get("down_bytes", 0)) for r in history))
    replies = int(sum(int(float(r.get("replies", 0) or 0)) for r in history))
    result: dict[str, Any] = {
        "strategy_up_bytes": up,
        "strategy_down_bytes": down,
        "superlink_inbound_bytes": outcome.inbound_bytes,
        "superlink_outbound_bytes": outcome.outbound_bytes,
        "up_overhead_bytes": outcome.inbound_bytes - up,
        "down_overhead_bytes": outcome.outbound_bytes - down,
        "replies": replies,
    }
    if replies:
        result["up_overhead_per_reply"] = (outcome.inbound_bytes - up) / replies
        result["down_overhead_per_message"] = (outcome.outbound_bytes - down) / replies
    return result


# --- a whole deployment on one machine ----------------------------------------------------------


@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on this machine, with TLS and node authentication.

    Entering creates credentials under ``workdir/certs`` (unless ``credentials`` is given),
    starts the SuperLink on a free port, writes the ``flwr`` connection ``connection`` in
    ``workdir/flwr-home/config.toml``, registers and starts ``num_nodes`` SuperNodes (node
    ``k`` holds partition ``k`` of ``num_nodes``) and waits until all are online. Leaving
    stops every process by pid, also after an error. Logs go to ``workdir/logs``.

    With ``simulation=True`` the SuperLink runs Flower's simulation engine instead and no
    SuperNodes are started (``num_nodes`` is ignored).
    """

    workdir: Path
    num_nodes: int = 2
    tls: bool = True
    supernode_auth: bool = True
    simulation: bool = False
    host: str = "127.0.0.1"
    connection: str = "dq-flower-local"
    data_dir: str | None = None
    node_config: Mapping[str, Any] = field(default_factory=dict)
    credentials: Credentials | None = None
    startup_timeout: float = 60.0
    env: dict[str, str] = field(init=False, default_factory=dict)
    port: int = field(init=False, default=0)
    superlink: ManagedProcess | None = field(init=False, default=None)
    supernodes: list[ManagedProcess] = field(init=False, default_factory=list)
    node_ids: list[int] = field(init=False, default_factory=list)
    group: ProcessGroup = field(init=False, default_factory=ProcessGroup)
    _ray_tmp: Path | None = field(init=False, default=None, repr=False)

    @property
    def address(self) -> str:
        """``host:port`` of the SuperLink (Fleet, Control and Runtime APIs share it)."""
        return f"{self.host}:{self.port}"

    @property
    def logs(self) -> Path:
        """Folder of the log files."""
        return self.workdir / "logs"

    def __enter__(self) -> LocalDeployment:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()

    def _stop(self) -> None:
        try:
            self.group.stop_all()
        finally:
            if self._ray_tmp is not None:
                shutil.rmtree(self._ray_tmp, ignore_errors=True)

    def _start(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        for sub in ("flwr-home", "logs"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        # Ray's AF_UNIX socket paths must stay under 108 bytes: a short folder of its own
        self._ray_tmp = Path(tempfile.mkdtemp(prefix="dq-ray-"))
        self.env = flower_env(flwr_home=self.workdir / "flwr-home", ray_tmpdir=self._ray_tmp)
        if self.tls and self.credentials is None:
            self.credentials = create_credentials(
                self.workdir / "certs", num_nodes=0 if self.simulation else self.num_nodes,
                hosts=(self.host, "localhost"), overwrite=True)
        creds = self.credentials if self.tls else None
        self.port = free_port(self.host)
        cmd = superlink_command(
            host=self.host, port=self.port,
            ca_cert=creds.ca_cert if creds else None,
            server_cert=creds.server_cert if creds else None,
            server_key=creds.server_key if creds else None,
            insecure=not self.tls, supernode_auth=self.supernode_auth,
            simulation=self.simulation)
        self.superlink = self.group.start(cmd, log_path=self.logs / "superlink.log",
                                          env=self.env, cwd=self.workdir, name="superlink")
        wait_for_port(self.host, self.port, self.startup_timeout, self.superlink)
        self.superlink.wait_for_log(r"Starting Flower SuperExec", self.startup_timeout)
        write_connection(self.connection, self.address,
                         root_certificates=creds.ca_cert if creds else None,
                         insecure=not self.tls, make_default=True, env=self.env)
        if self.simulation:
            return
        for k in range(self.num_nodes):
            keys = self._node_keys(k)
            if keys is not None:
                self.node_ids.append(self.register(keys.public_key))
            self.supernodes.append(self.start_supernode(k, keys))
        for proc in self.supernodes:
            proc.wait_for_log(_NODE_ONLINE, self.startup_timeout)
        self.superlink.remember_descendants()

    def _node_keys(self, k: int) -> NodeKeys | None:
        if not (self.tls and self.supernode_auth) or self.credentials is None:
            return None
        if k >= len(self.credentials.nodes):
            raise ValueError(f"credentials hold {len(self.credentials.nodes)} node keys, "
                             f"need {self.num_nodes}")
        return self.credentials.nodes[k]

    def register(self, public_key: str | Path) -> int:
        """Register a SuperNode's public key with the SuperLink; return its node id."""
        return register_node(public_key, self.connection, env=self.env)

    def start_supernode(self, partition_id: int, keys: NodeKeys | None, *,
                        num_partitions: int | None = None, name: str | None = None,
                        max_retries: int | None = None) -> ManagedProcess:
        """Start one SuperNode (not waited for); it is stopped when the deployment ends."""
        creds = self.credentials if self.tls else None
        cmd = supernode_command(
            superlink=self.address, partition_id=partition_id,
            num_partitions=num_partitions or max(self.num_nodes, partition_id + 1),
            data_dir=self.data_dir,
            root_certificates=creds.ca_cert if creds else None,
            private_key=keys.private_key if keys is not None else None,
            insecure=not self.tls, runtime_port=free_port(self.host),
            node_config=self.node_config, max_retries=max_retries)
        label = name or f"supernode-{partition_id}"
        return self.group.start(cmd, log_path=self.logs / f"{label}.log", env=self.env,
                                cwd=self.workdir, name=label)

    def run(self, app_dir: str | Path, run_config: Mapping[str, Any] | None = None, *,
            timeout: float = 600.0) -> RunOutcome:
        """``flwr run`` the app in ``app_dir`` on this deployment and wait for its end."""
        if self.superlink is not None:
            self.superlink.remember_descendants()
        return flwr_run(app_dir, self.connection, run_config=run_config, env=self.env,
                        timeout=timeout, log_path=self.logs / "flwr-run.log")
