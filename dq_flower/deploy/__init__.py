"""Real deployments: credentials, SuperLink and SuperNode processes, and the ``deploy`` CLI.

DQ uploads quantized raw samples: deploy it on trusted networks only. TLS and SuperNode
authentication are the defaults; insecure mode is an explicit flag with a warning.
"""

from dq_flower.deploy.certs import Credentials, NodeKeys, create_credentials, load_credentials
from dq_flower.deploy.flower_cli import (
    RunOutcome,
    compare_traffic,
    flwr_run,
    register_node,
    write_connection,
)
from dq_flower.deploy.local import LocalDeployment
from dq_flower.deploy.supervisor import (
    DeploymentError,
    ManagedProcess,
    ProcessGroup,
    managed_process,
)

#: Printed by the CLI and the docs: what leaves a device under DQ.
TRUST_MODEL = (
    "Trust model: DQ uploads quantized raw training samples (not weights or gradients) to "
    "the server. Deploy it only on trusted networks (one organisation's devices, a data "
    "centre, a hospital's own machines). It is not a privacy mechanism; TLS protects the "
    "link, not the data from the server."
)

__all__ = ["TRUST_MODEL", "Credentials", "DeploymentError", "LocalDeployment", "ManagedProcess",
           "NodeKeys", "ProcessGroup", "RunOutcome", "compare_traffic", "create_credentials",
           "flwr_run", "load_credentials", "managed_process", "register_node",
           "write_connection"]
