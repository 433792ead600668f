"""A round's timing: what one node says of its compute cannot set the round's time."""

from flwr.app import Message, MessageType, MetricRecord, RecordDict

from dq_flower.accounting import Ledger
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.harness.server_app import round_timing

CLAIMS = {NODE_ID_BASE: 0.8, NODE_ID_BASE + 1: 1e30}


def _replies(claims: dict[int, float]) -> list[Message]:
    def client(msg, _context):
        seconds = claims[msg.metadata.dst_node_id]
        return Message(RecordDict({"metrics": MetricRecord({"client-time-s": seconds})}),
                       reply_to=msg)

    grid = InProcessGrid(client, len(claims))
    sent = [Message(content=RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)
            for node in claims]
    return list(grid.send_and_receive(sent))


def test_a_claimed_compute_time_is_bounded_by_the_exchange_that_carried_it():
    timing = round_timing(_replies(CLAIMS), Ledger(), 1, 0.1, exchange_s=2.5)
    assert timing["client_time_s"] == 2.5
    assert sorted(c[0] for c in timing["clients"]) == [0.8, 2.5]
    honest = round_timing(_replies({**CLAIMS, NODE_ID_BASE + 1: 1.2}), Ledger(), 1, 0.1,
                          exchange_s=2.5)
    assert honest["client_time_s"] == 1.2
