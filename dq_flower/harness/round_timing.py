"""What a round cost in time: each client's compute and bytes, the server's compute.

Per round, the history rows carry ``client_time_s`` (the slowest reply's
``client-time-s``, as each client measured its handler), ``server_compute_s`` (the
server's ``configure_train`` plus ``aggregate_train``, for every method) and ``clients``
(``[client_time_s, down_bytes, up_bytes]`` per replying node). :mod:`dq_flower.compare.links`
turns them into the time a round takes on a given link.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from flwr.app import Message

from dq_flower.accounting import Ledger

__all__ = ["CLIENT_TIME_KEY", "reply_compute_s", "round_timing"]

#: Metric every client handler of this package puts in its reply.
CLIENT_TIME_KEY = "client-time-s"


def reply_compute_s(msg: Message) -> float | None:
    """A reply's ``client-time-s`` (``None`` if missing, not finite or negative)."""
    if msg.has_error():
        return None
    for record in msg.content.metric_records.values():
        value = record.get(CLIENT_TIME_KEY)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and value >= 0:
            return float(value)
    return None


def round_timing(replies: Iterable[Message], ledger: Ledger, server_round: int,
                 server_compute_s: float) -> dict[str, Any]:
    """The timing fields of one round's history row.

    ``client_time_s`` (max over the replies that are not errors, 0 without any),
    ``server_compute_s`` and ``clients`` (``[client_time_s, down_bytes, up_bytes]`` per
    replying node, by node id, bytes read from ``ledger``; no metric counts 0 s).
    """
    down = ledger.down.get(server_round, {})
    up = ledger.up.get(server_round, {})
    clients = [[reply_compute_s(msg) or 0.0, int(down.get(msg.metadata.src_node_id, 0)),
                int(up.get(msg.metadata.src_node_id, 0))]
               for msg in sorted((m for m in replies if not m.has_error()),
                                 key=lambda m: m.metadata.src_node_id)]
    return {"client_time_s": max((c[0] for c in clients), default=0.0),
            "server_compute_s": float(server_compute_s), "clients": clients}
