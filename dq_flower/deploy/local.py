"""The local deployment: a whole TLS deployment on this machine (``dq-flower deploy local``)."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from dq_flower.deploy.certs import Credentials, NodeKeys, create_credentials
from dq_flower.deploy.checks import run_errors
from dq_flower.deploy.flower_cli import (
    RunOutcome,
    flower_env,
    flwr_run,
    register_node,
    superlink_command,
    supernode_command,
    write_connection,
)
from dq_flower.deploy.supervisor import (
    DeploymentError,
    ManagedProcess,
    ProcessGroup,
    free_port,
    wait_for_port,
)

__all__ = ["LocalDeployment"]

_NODE_ONLINE = re.compile(r"SuperNode ID: (\d+)")


@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on this machine, with TLS and node authentication.

    Entering creates credentials in ``workdir/certs`` (unless given), starts the SuperLink
    on a free port, writes the ``flwr`` connection in ``workdir/flwr-home``, registers and
    starts ``num_nodes`` SuperNodes (node ``k``: partition ``k``, or its own file
    ``data_files[k]``) and waits until all are online; leaving stops every process by pid,
    also after an error. Logs go to ``workdir/logs``. ``node_env[k]`` adds environment
    variables to node ``k``. ``simulation=True`` runs Flower's simulation engine instead
    and starts no SuperNodes.
    """

    workdir: Path
    num_nodes: int = 2
    tls: bool = True
    supernode_auth: bool = True
    simulation: bool = False
    host: str = "127.0.0.1"
    connection: str = "dq-flower-local"
    data_dir: str | None = None
    data_files: Sequence[str | Path] = ()
    node_config: Mapping[str, Any] = field(default_factory=dict)
    node_env: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    credentials: Credentials | None = None
    startup_timeout: float = 60.0
    env: dict[str, str] = field(init=False, default_factory=dict)
    port: int = field(init=False, default=0)
    superlink: ManagedProcess | None = field(init=False, default=None)
    supernodes: list[ManagedProcess] = field(init=False, default_factory=list)
    node_ids: list[int] = field(init=False, default_factory=list)
    group: ProcessGroup = field(init=False, default_factory=ProcessGroup)
    _ray_tmp: Path | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.data_files = tuple(Path(f).expanduser().resolve() for f in self.data_files)
        if self.data_files and self.simulation:
            raise ValueError("data_files: a simulation SuperLink starts no SuperNodes")
        if self.data_files and len(self.data_files) != self.num_nodes:
            raise ValueError(f"data_files: {len(self.data_files)} files for "
                             f"{self.num_nodes} nodes; give one per node")

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
        missing = [str(f) for f in self.data_files if not Path(f).is_file()]
        if missing:
            raise FileNotFoundError(f"no such data file: {', '.join(missing)}")
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
        tls: dict[str, Any] = ({"ca_cert": creds.ca_cert, "server_cert": creds.server_cert,
                                "server_key": creds.server_key} if creds else {})
        cmd = superlink_command(host=self.host, port=self.port, insecure=not self.tls,
                                supernode_auth=self.supernode_auth,
                                simulation=self.simulation, **tls)
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
                        max_retries: int | None = None,
                        data_file: str | Path | None = None) -> ManagedProcess:
        """Start a SuperNode on ``data_file``, ``data_files[partition_id]`` or that partition."""
        creds = self.credentials if self.tls else None
        if data_file is None and partition_id < len(self.data_files):
            data_file = self.data_files[partition_id]
        cmd = supernode_command(
            superlink=self.address, partition_id=partition_id,
            num_partitions=num_partitions or max(self.num_nodes, partition_id + 1),
            data_file=data_file, data_dir=self.data_dir,
            root_certificates=creds.ca_cert if creds else None,
            private_key=keys.private_key if keys is not None else None,
            insecure=not self.tls, runtime_port=free_port(self.host),
            node_config=self.node_config, max_retries=max_retries)
        label = name or f"supernode-{partition_id}"
        env = {**self.env, **self.node_env.get(partition_id, {})}
        return self.group.start(cmd, log_path=self.logs / f"{label}.log", env=env,
                                cwd=self.workdir, name=label)

    def run(self, app_dir: str | Path, run_config: Mapping[str, Any] | None = None, *,
            timeout: float = 600.0) -> RunOutcome:
        """``flwr run`` the app in ``app_dir`` on this deployment and wait for its end.

        A run that fails raises :class:`DeploymentError` with ``flwr``'s output and the
        SuperLink's own error lines of the run (``Invalid run configuration`` says why
        only there).
        """
        seen = 0
        if self.superlink is not None:
            self.superlink.remember_descendants()
            seen = len(self.superlink.log_text().splitlines())
        try:
            return flwr_run(app_dir, self.connection, run_config=run_config, env=self.env,
                            timeout=timeout, log_path=self.logs / "flwr-run.log")
        except DeploymentError as exc:
            lines = self.superlink.log_text().splitlines()[seen:] if self.superlink else []
            errors = run_errors(lines)
            if not errors:
                raise
            raise DeploymentError(f"{exc}\nthe SuperLink's log ({self.logs / 'superlink.log'})"
                                  ":\n" + "\n".join(errors)) from None
