"""Bytes per direction, node and round, measured as Flower serialises each message."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from flwr.app import Message, RecordDict
from flwr.common.serde import recorddict_to_proto
from flwr.serverapp import Grid

__all__ = ["content_bytes", "Ledger", "MeasuredGrid", "round_of"]


def content_bytes(content: RecordDict) -> int:
    """Serialized size in bytes of a message's content, as Flower puts it on the wire."""
    return int(recorddict_to_proto(content).ByteSize())


def round_of(message: Message) -> int | None:
    """Server round a message belongs to, read from its ``ConfigRecord`` ("server-round")."""
    for record in message.content.config_records.values():
        value = record.get("server-round")
        if isinstance(value, int):
            return value
    return None


@dataclass
class Ledger:
    """Communication ledger: bytes per (round, node, direction), plus payload bits.

    ``up`` counts replies (client to server), ``down`` counts instructions.
    """

    up: dict[int, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    down: dict[int, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    up_payload_bits: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    down_payload_bits: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def table(self, direction: str) -> dict[int, dict[int, int]]:
        """Bytes per round and node in ``direction`` ("up" or "down")."""
        return self.up if direction == "up" else self.down

    def add(self, direction: str, server_round: int, node_id: int, nbytes: int) -> None:
        """Add ``nbytes`` sent in ``direction`` by or to ``node_id``."""
        per_node = self.table(direction)[server_round]
        per_node[node_id] = per_node.get(node_id, 0) + int(nbytes)

    def round_bytes(self, direction: str, server_round: int) -> int:
        """Total bytes in ``direction`` during ``server_round``."""
        return int(sum(self.table(direction).get(server_round, {}).values()))

    def total_bytes(self, direction: str, through_round: int | None = None) -> int:
        """Cumulative bytes in ``direction`` up to and including ``through_round``."""
        return int(sum(sum(per_node.values()) for rnd, per_node in self.table(direction).items()
                       if through_round is None or rnd <= through_round))

    def state(self) -> dict:
        """Plain-dict copy, for checkpoints."""
        return {"up": {r: dict(v) for r, v in self.up.items()},
                "down": {r: dict(v) for r, v in self.down.items()},
                "up_payload_bits": dict(self.up_payload_bits),
                "down_payload_bits": dict(self.down_payload_bits)}

    @classmethod
    def from_state(cls, state: dict) -> Ledger:
        """Inverse of :meth:`state`."""
        ledger = cls()
        for key in ("up", "down"):
            for r, v in state[key].items():
                ledger.table(key)[int(r)] = {int(k): int(b) for k, b in v.items()}
            getattr(ledger, f"{key}_payload_bits").update(
                {int(k): int(v) for k, v in state[f"{key}_payload_bits"].items()})
        return ledger


class MeasuredGrid(Grid):
    """A ``Grid`` that records the serialized size of every message it carries.

    Wrap the ``grid`` a ServerApp receives and hand the wrapper to any strategy (this
    package's or Flower's own ``FedAvg``)::

        measured = MeasuredGrid(grid)
        result = strategy.start(grid=measured, initial_arrays=..., num_rounds=5)
        print(measured.up_bytes, measured.down_bytes, measured.per_round("up"))

    A message belongs to the round named by its config's ``server-round`` (Flower's
    strategies and this package's set it), else to the last round seen.

    Parameters
    ----------
    grid : Grid
        The grid to delegate to (simulation, deployment, or an in-process test grid).
    ledger : Ledger, optional
        Where sizes are recorded (a new one by default).
    """

    def __init__(self, grid: Grid, ledger: Ledger | None = None) -> None:
        self._grid = grid
        self.ledger = ledger if ledger is not None else Ledger()
        self._last_round = 0

    @property
    def up_bytes(self) -> int:
        """Bytes of every reply so far (client to server)."""
        return self.ledger.total_bytes("up")

    @property
    def down_bytes(self) -> int:
        """Bytes of every instruction so far (server to client)."""
        return self.ledger.total_bytes("down")

    def per_round(self, direction: str) -> dict[int, int]:
        """Bytes per server round in ``direction`` (``up`` or ``down``)."""
        return {int(r): int(sum(v.values()))
                for r, v in sorted(self.ledger.table(direction).items())}

    def per_node(self, direction: str) -> dict[int, int]:
        """Bytes per node over all rounds in ``direction`` (``up`` or ``down``)."""
        out: dict[int, int] = {}
        for per_node in self.ledger.table(direction).values():
            for node, nbytes in per_node.items():
                out[int(node)] = out.get(int(node), 0) + int(nbytes)
        return out

    def _record_out(self, messages: list[Message]) -> int:
        rnd = self._last_round
        for msg in messages:
            found = round_of(msg)
            rnd = found if found is not None else rnd
            self.ledger.add("down", rnd, msg.metadata.dst_node_id, content_bytes(msg.content))
        self._last_round = rnd
        return rnd

    def _record_in(self, replies: Iterable[Message], rnd: int) -> list[Message]:
        replies = list(replies)
        for msg in replies:
            if not msg.has_error():
                self.ledger.add("up", rnd, msg.metadata.src_node_id, content_bytes(msg.content))
        return replies

    def set_run(self, run) -> None:  # noqa: D102
        self._grid.set_run(run)

    @property
    def run(self):  # noqa: D102
        return self._grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: D102
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self):  # noqa: D102
        return self._grid.get_node_ids()

    def get_nodes(self):  # noqa: D102
        return self._grid.get_nodes()

    def push_messages(self, messages):  # noqa: D102
        messages = list(messages)
        self._record_out(messages)
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids):  # noqa: D102
        return self._record_in(self._grid.pull_messages(message_ids), self._last_round)

    def send_and_receive(self, messages, *, timeout=None):  # noqa: D102
        messages = list(messages)
        if not messages:
            return []
        rnd = self._record_out(messages)
        return self._record_in(self._grid.send_and_receive(messages, timeout=timeout), rnd)
