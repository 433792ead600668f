"""The communication ledger and the measuring grid: totals, per round, per node, rounds."""

import json

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.serde import recorddict_to_proto

from dq_flower.accounting import Ledger, MeasuredGrid, content_bytes, round_of
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid

A, B, C = NODE_ID_BASE, NODE_ID_BASE + 1, NODE_ID_BASE + 2


def _ledger():
    ledger = Ledger()
    ledger.add("up", 1, A, 100)
    ledger.add("up", 1, B, 50)
    ledger.add("up", 1, A, 7)  # a second message of node A in round 1 adds up
    ledger.add("up", 3, B, 1000)
    ledger.add("down", 1, A, 20)
    ledger.add("down", 2, C, 30)
    ledger.up_payload_bits[1] = 800
    ledger.down_payload_bits[2] = 64
    return ledger


def test_ledger_rounds_and_totals():
    ledger = _ledger()
    assert ledger.up[1] == {A: 107, B: 50}
    assert ledger.round_bytes("up", 1) == 157 and ledger.round_bytes("up", 2) == 0
    assert ledger.round_bytes("down", 2) == 30
    assert ledger.total_bytes("up") == 1157 and ledger.total_bytes("down") == 50
    assert [ledger.total_bytes("up", r) for r in (0, 1, 2, 3, 4)] == [0, 157, 157, 1157, 1157]
    assert [ledger.total_bytes("down", r) for r in (0, 1, 2)] == [0, 20, 50]


def test_ledger_state_round_trip_keeps_every_entry():
    ledger = _ledger()
    state = ledger.state()
    again = Ledger.from_state(state)
    assert again.state() == state
    assert again.total_bytes("up", 2) == 157 and again.round_bytes("up", 3) == 1000
    assert again.up_payload_bits[1] == 800 and again.down_payload_bits[2] == 64
    # the state is a copy: the ledger goes on without changing it
    ledger.add("up", 1, A, 1)
    assert state["up"][1][A] == 107
    # through JSON (keys become strings): the same ledger, int keys and values again
    from_json = Ledger.from_state(json.loads(json.dumps(state)))
    assert from_json.state() == state
    assert all(isinstance(k, int) for k in from_json.up) and isinstance(
        next(iter(from_json.up[1])), int)
    # a resumed ledger keeps adding to the entries it restored
    again.add("up", 1, A, 3)
    assert again.up[1][A] == 110 and again.total_bytes("up") == 1160
    empty = Ledger.from_state(Ledger().state())
    assert empty.total_bytes("up") == 0 and empty.state() == Ledger().state()


def _app(msg, context):
    """Reply with a payload whose size depends on the node (node A: 40 floats, B: 80...)."""
    n = 40 * (context.node_id - NODE_ID_BASE + 1)
    content = RecordDict({"w": ArrayRecord({"w": Array(np.zeros(n, np.float32))})})
    return Message(content, reply_to=msg)


def _messages(grid, nodes, server_round=None, size=10):
    out = []
    for node in nodes:
        content = RecordDict({"arrays": ArrayRecord({"m": Array(np.ones(size, np.float32))})})
        if server_round is not None:
            content["config"] = ConfigRecord({"server-round": server_round})
        out.append(grid.create_message(content, "train", node, ""))
    return out


class PushPullGrid(InProcessGrid):
    """The in-process grid with Flower's push / pull interface."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending = {}

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            (reply,) = self.send_and_receive([msg])
            ids.append(msg.metadata.message_id)
            self.pending[ids[-1]] = reply
        return ids

    def pull_messages(self, message_ids):
        return [self.pending.pop(i) for i in message_ids]


def test_content_bytes_is_the_serialized_size():
    content = RecordDict({"a": ArrayRecord({"x": Array(np.arange(7, dtype=np.float32))}),
                          "config": ConfigRecord({"server-round": 4})})
    assert content_bytes(content) == len(recorddict_to_proto(content).SerializeToString())
    grid = InProcessGrid(_app, 1)
    assert round_of(_messages(grid, [A], server_round=4)[0]) == 4
    assert round_of(_messages(grid, [A])[0]) is None


def test_measured_grid_totals_per_round_per_node_and_round_attribution():
    # Prepare: three nodes; node C fails in round 2 (its error reply carries no bytes)
    inner = InProcessGrid(_app, 3, failing=lambda rnd, node: rnd == 2 and node == C)
    grid = MeasuredGrid(inner)
    assert list(grid.get_node_ids()) == [A, B, C]
    down, up = {}, {}

    def send(messages, rnd):
        replies = grid.send_and_receive(messages)
        for msg in messages:
            key = (rnd, msg.metadata.dst_node_id)
            down[key] = down.get(key, 0) + content_bytes(msg.content)
        for reply in replies:
            if not reply.has_error():
                key = (rnd, reply.metadata.src_node_id)
                up[key] = up.get(key, 0) + content_bytes(reply.content)
        return replies

    # Execute: round 1 to every node; round 2 to every node (C fails); then a message
    # without a round (an evaluation, say) to A, which belongs to the last round seen (2);
    # then round 3 to B only, twice the size
    send(_messages(grid, [A, B, C], server_round=1), 1)
    replies = send(_messages(grid, [A, B, C], server_round=2), 2)
    send(_messages(grid, [A]), 2)
    send(_messages(grid, [B], server_round=3, size=20), 3)
    assert grid.send_and_receive([]) == []

    # Assert
    assert [r.has_error() for r in replies] == [False, False, True]
    up_a1 = content_bytes(_app(_messages(inner, [A], 1)[0], inner.contexts[A]).content)
    assert up[(1, A)] == up_a1 and up[(1, B)] > up_a1  # B's replies are larger
    assert (2, C) not in up and (2, C) in down
    for direction, table in (("up", up), ("down", down)):
        per_round = {}
        per_node = {}
        for (rnd, node), nbytes in table.items():
            per_round[rnd] = per_round.get(rnd, 0) + nbytes
            per_node[node] = per_node.get(node, 0) + nbytes
        assert grid.per_round(direction) == per_round
        assert grid.per_node(direction) == per_node
        assert list(grid.per_round(direction)) == [1, 2, 3]  # sorted by round
        assert dict(grid.ledger.up if direction == "up" else grid.ledger.down) == {
            rnd: {node: b for (r, node), b in table.items() if r == rnd} for rnd in per_round}
    assert grid.up_bytes == sum(up.values()) and grid.down_bytes == sum(down.values())
    # the round-less message was booked in round 2: node A has two messages there
    one_down = content_bytes(_messages(grid, [A])[0].content)
    assert grid.ledger.down[2][A] == content_bytes(
        _messages(grid, [A], server_round=2)[0].content) + one_down
    assert grid.ledger.round_bytes("down", 3) == down[(3, B)]


def test_push_and_pull_are_measured_like_send_and_receive():
    sent = MeasuredGrid(InProcessGrid(_app, 2))
    sent.send_and_receive(_messages(sent, [A, B], server_round=1))
    sent.send_and_receive(_messages(sent, [A, B], server_round=2))
    pushed = MeasuredGrid(PushPullGrid(_app, 2))
    for rnd in (1, 2):
        ids = pushed.push_messages(_messages(pushed, [A, B], server_round=rnd))
        replies = pushed.pull_messages(ids)
        assert len(replies) == 2
    assert pushed.ledger.state() == sent.ledger.state()
    assert pushed.per_round("up") == sent.per_round("up") and pushed.up_bytes > 0


def test_a_ledger_handed_in_is_the_one_recorded_into():
    ledger = Ledger.from_state(_ledger().state())  # as a resumed server does
    grid = MeasuredGrid(InProcessGrid(_app, 1), ledger)
    grid.send_and_receive(_messages(grid, [A], server_round=4))
    assert grid.ledger is ledger
    assert ledger.total_bytes("up", 3) == 1157  # the restored rounds are kept
    assert ledger.round_bytes("up", 4) > 0 and grid.up_bytes == ledger.total_bytes("up")


def test_measured_grid_hands_every_field_and_the_run_to_the_grid_it_wraps():
    inner = InProcessGrid(_app, 2)
    grid = MeasuredGrid(inner)
    msg = grid.create_message(RecordDict(), "train", B, "group-7", ttl=123.0)
    assert (msg.metadata.dst_node_id, msg.metadata.message_type) == (B, "train")
    assert msg.metadata.group_id == "group-7" and msg.metadata.ttl == 123.0
    run = object()
    grid.set_run(run)
    assert inner.run is run and grid.run is run


def test_messages_before_any_round_belong_to_round_0_and_the_timeout_is_passed_on():
    timeouts = []

    class Recording(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            timeouts.append(timeout)
            return super().send_and_receive(messages, timeout=timeout)

    grid = MeasuredGrid(Recording(_app, 1))
    grid.send_and_receive(_messages(grid, [A]), timeout=12.5)  # e.g. a query at start-up
    assert list(grid.ledger.down) == [0] and list(grid.ledger.up) == [0]
    assert timeouts == [12.5]
