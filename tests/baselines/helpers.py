"""Helpers shared by the baselines' tests."""

from __future__ import annotations

from dq_flower.accounting import content_bytes
from dq_flower.harness.client_app import app as client_app


def size_recording_app(sizes: dict[tuple[int, int], int]):
    """The package's client app, recording each reply's serialized size by (round, node)."""

    def measured_app(msg, context):
        reply = client_app(msg, context)
        sizes[(int(msg.content["config"]["server-round"]), msg.metadata.dst_node_id)] = \
            content_bytes(reply.content)
        return reply

    return measured_app
