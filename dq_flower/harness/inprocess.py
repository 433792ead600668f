"""An in-process ``Grid`` that calls a ``ClientApp`` directly: fast tests, no Ray."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import cast

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from dq_flower.accounting import round_of

__all__ = ["InProcessGrid", "NODE_ID_BASE"]

#: Id of the first node (the SuperLink itself is node 1).
NODE_ID_BASE = 101


class InProcessGrid(Grid):
    """Deliver messages to ``client_app`` in this process, one ``Context`` per node.

    Each node's ``Context.state`` persists across rounds, as in a SuperNode, and its
    ``node_config`` has ``partition-id`` and ``num-partitions``.

    Parameters
    ----------
    client_app : callable
        A ``ClientApp`` (or any ``(Message, Context) -> Message`` callable).
    num_nodes : int
        Number of nodes; node ids are ``101, 102, ...``, partition ids ``0 .. n-1``.
    failing : callable, optional
        ``failing(server_round, node_id) -> bool``; such nodes reply with an error.
    state_dir : str, optional
        Keep each node's ``Context.state`` in this folder (written atomically after every
        reply, read back at start), like SuperNodes that outlive a crashed server.
    """

    def __init__(self, client_app: Callable[[Message, Context], Message], num_nodes: int,
                 failing: Callable[[int, int], bool] | None = None,
                 state_dir: str | None = None) -> None:
        self.client_app = client_app
        if TaskIdentity._run_id is None:  # outside a Flower runtime: act as the server
            TaskIdentity.run_id, TaskIdentity.task_id = 1, 1
            TaskIdentity.node_id = SUPERLINK_NODE_ID
        self.contexts = {
            NODE_ID_BASE + i: Context(run_id=1, node_id=NODE_ID_BASE + i,
                           node_config={"partition-id": i, "num-partitions": num_nodes},
                           state=RecordDict(), run_config={})
            for i in range(num_nodes)
        }
        self.failing = failing
        self.state_dir = Path(state_dir) if state_dir else None
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            for node, ctx in self.contexts.items():
                path = self._state_path(node)
                if path.exists():
                    ctx.state = recorddict_from_proto(ProtoRecordDict.FromString(path.read_bytes()))
        self._run = None
        self.sent: list[Message] = []
        self._counter = 0

    def set_run(self, run) -> None:  # noqa: D102
        self._run = run

    @property
    def run(self):  # noqa: D102
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: D102
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102
        return list(self.contexts)

    def push_messages(self, messages):  # noqa: D102
        raise NotImplementedError("use send_and_receive")

    def pull_messages(self, message_ids):  # noqa: D102
        raise NotImplementedError("use send_and_receive")

    def send_and_receive(self, messages, *, timeout=None):  # noqa: D102
        replies = []
        for msg in messages:
            self._counter += 1
            msg.metadata.__dict__["_message_id"] = f"m{self._counter}"
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            if self.failing is not None and self.failing(round_of(msg) or 0, node):
                replies.append(Message(Error(code=0, reason="simulated failure"), reply_to=msg))
                continue
            try:
                reply = self.client_app(msg, self.contexts[node])
            except Exception as exc:  # noqa: BLE001  (a crashed client is an error reply)
                reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"),
                                reply_to=msg)
            replies.append(reply)
            self._persist(node)
        return replies

    def _state_path(self, node: int) -> Path:
        return cast(Path, self.state_dir) / f"node-{node}.bin"

    def _persist(self, node: int) -> None:
        if self.state_dir is not None:
            tmp = self._state_path(node).with_suffix(".tmp")
            tmp.write_bytes(recorddict_to_proto(self.contexts[node].state).SerializeToString())
            os.replace(tmp, self._state_path(node))
