"""Reply factories for the server's round pipeline (like Flower's ``create_mock_reply``)."""

from __future__ import annotations

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from dq_flower.codecs import Payload
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid


def node(i: int) -> int:
    """The in-process grid's id of node ``i``."""
    return NODE_ID_BASE + i


def gradient_content(payload: Payload, examples: int, loss: float = 1.0) -> RecordDict:
    """A gradient baseline's reply content: one ``update`` payload and its metrics."""
    return RecordDict({
        "update": payload.to_record(),
        "metrics": MetricRecord({"num-examples": examples, "train-loss": loss}),
    })


def sent_and_answered(strategy, contents: dict[int, RecordDict], config,
                      server_round: int = 1, failing=None):
    """Run ``configure_train`` against fake clients answering ``contents[node]``.

    Returns ``(messages sent, replies)``; a node missing from ``contents`` stays silent.
    """

    def fake_client(msg, _context):
        return Message(contents[msg.metadata.dst_node_id], reply_to=msg)

    grid = InProcessGrid(fake_client, len(contents), failing=failing)
    messages = list(strategy.configure_train(server_round, ArrayRecord(), config, grid))
    return messages, grid.send_and_receive(messages)


def reply_from(msg: Message, content: RecordDict, src: int | None = None) -> Message:
    """A reply to ``msg`` carrying ``content``, optionally claiming another source node."""
    reply = Message(content, reply_to=msg)
    if src is not None:
        reply.metadata.__dict__["_src_node_id"] = int(src)
    return reply
