"""Real deployments: credentials, SuperLink and SuperNode processes, and the ``deploy`` CLI.

DQ uploads quantized raw samples: deploy it on trusted networks only. TLS and SuperNode
authentication are the defaults; insecure mode is an explicit flag with a warning.
"""

from dq_flower.deploy.certs import Credentials, NodeKeys, create_credentials, load_credentials
from dq_flower.deploy.processes import (
    TRUST_MODEL,
    DeploymentError,
    LocalDeployment,
    ManagedProcess,
    ProcessGroup,
    RunOutcome,
    compare_traffic,
    flwr_run,
    managed_process,
    register_node,
    write_connection,
)

__all__ = [
    "TRUST_MODEL",
    "Credentials",
    "DeploymentError",
    "LocalDeployment",
    "ManagedProcess",
    "NodeKeys",
    "ProcessGroup",
    "RunOutcome",
    "compare_traffic",
    "create_credentials",
    "flwr_run",
    "load_credentials",
    "managed_process",
    "register_node",
    "write_connection",
]
