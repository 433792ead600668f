"""What a round cost in time, measured: each client's compute and bytes, the server's compute.

The history rows carry, per round, ``client_time_s`` (the slowest reply's ``client-time-s``,
as each client measured its own handler), ``server_compute_s`` (the server's
``configure_train`` plus ``aggregate_train``, measured by the harness for every method,
Flower's FedAvg included) and ``clients``: one ``[client_time_s, down_bytes, up_bytes]``
triple per node that replied, its bytes measured from the round's messages. From these,
:mod:`dq_flower.compare.links` computes the time a round would take on a given link.
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
    """The ``client-time-s`` a reply reports (any of its metric records), or ``None``.

    A value that is not a finite non-negative number counts as missing.
    """
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

    Parameters
    ----------
    replies : iterable of Message
        The round's train replies (error replies are skipped).
    ledger : Ledger
        The measured bytes; the round's bytes per node are read from it.
    server_round : int
        The round.
    server_compute_s : float
        The server's measured compute for the round.

    Returns
    -------
    dict
        ``client_time_s`` (max over the replies, 0 without any), ``server_compute_s`` and
        ``clients`` (``[client_time_s, down_bytes, up_bytes]`` per replying node, by node
        id; a reply without the metric counts 0 s of compute).
    """
    down = ledger.down.get(server_round, {})
    up = ledger.up.get(server_round, {})
    clients = []
    for msg in sorted((m for m in replies if not m.has_error()),
                      key=lambda m: m.metadata.src_node_id):
        node = msg.metadata.src_node_id
        clients.append([reply_compute_s(msg) or 0.0, int(down.get(node, 0)),
                        int(up.get(node, 0))])
    return {"client_time_s": max((c[0] for c in clients), default=0.0),
            "server_compute_s": float(server_compute_s), "clients": clients}
