"""Former home of the deployment helpers, kept so that old imports keep working.

The code now lives in :mod:`dq_flower.deploy.supervisor` (processes, ports, logs),
:mod:`dq_flower.deploy.flower_cli` (Flower command lines, ``flwr`` calls, connections) and
:mod:`dq_flower.deploy.local` (:class:`LocalDeployment`); import from there.
"""

from dq_flower.deploy import TRUST_MODEL
from dq_flower.deploy.flower_cli import (
    RunOutcome,
    compare_traffic,
    flower_env,
    flower_executable,
    flwr_home,
    flwr_ls,
    flwr_run,
    format_config,
    list_nodes,
    register_node,
    superlink_command,
    supernode_command,
    write_connection,
)
from dq_flower.deploy.local import LocalDeployment
from dq_flower.deploy.supervisor import (
    DeploymentError,
    ManagedProcess,
    ProcessGroup,
    free_port,
    managed_process,
    start_process,
    wait_for_port,
)

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
