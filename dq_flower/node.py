"""What a client function knows about the node it runs on."""

from __future__ import annotations

from flwr.app import Context

__all__ = ["node_key"]


def node_key(context: Context) -> int:
    """The node's stable key for seeds and ordering: ``partition-id`` if set, else its id.

    A SuperNode may set ``partition-id`` with ``--node-config``; simulation sets it.
    """
    pid = context.node_config.get("partition-id")
    if isinstance(pid, (int, float, str)) and str(pid).lstrip("-").isdigit():
        return int(pid)
    return int(context.node_id)
