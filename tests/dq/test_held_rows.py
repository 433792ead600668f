"""The server, not the client's memory, says which rows it holds.

Each DQ train message tells the client which of its rows the server holds, keyed by the
client's stable identity (its partition id), so that a lost reply, a client that lost its
``Context`` or a restart that draws new node ids loses and duplicates nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.harness.checkpoint import load_latest
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.harness.task_config import TaskConfig

VOLATILE = {"wall_s", "server_time_s", "client_time_s", "server_compute_s"}
#: what a restart with new node ids changes: the first round after it sends every node
#: the table of all clients' held sets (downlink only)
DOWNLINK = {"down_bytes", "cum_down_bytes", "held_set_bytes"}


class CrashError(Exception):
    pass


def _crash_after(crash):
    def on_round(row):
        if row["round"] == crash:
            raise CrashError
    return on_round


def _rows(history, drop=frozenset(), client_fields=slice(1, None)):
    """History rows without measured times (per-client entries keep their bytes only)."""
    out = []
    for row in history:
        kept = {k: v for k, v in row.items()
                if k not in VOLATILE and k not in drop and k != "clients"}
        kept["clients"] = [entry[client_fields] for entry in row.get("clients", [])]
        out.append(kept)
    return out


def _round_of(messages) -> int:
    return int(messages[0].content["config"]["server-round"]) if messages else 0


def _fresh_contexts(grid: InProcessGrid, first_node_id: int | None = None) -> None:
    """Empty client contexts (a restarted SuperNode), optionally under new node ids."""
    contexts = {}
    for i, ctx in enumerate(grid.contexts.values()):
        node = ctx.node_id if first_node_id is None else first_node_id + i
        contexts[node] = Context(run_id=1, node_id=node, node_config=dict(ctx.node_config),
                                 state=RecordDict(), run_config={})
    grid.contexts = contexts


def _store(tmp_path, name):
    return load_latest(tmp_path / name)["strategy"]["store"]


def _model(tmp_path, name):
    arrays = load_latest(tmp_path / name)["arrays"]
    return np.concatenate([v.reshape(-1) for v in arrays.values()])


# ------------------------------------------------------------------------ a lost reply
class LossyGrid(InProcessGrid):
    """Drops the reply of node ``lose_node`` in round ``lose_round`` (the client sent it)."""

    def __init__(self, *args, lose_round=2, lose_node=NODE_ID_BASE, **kwargs):
        super().__init__(*args, **kwargs)
        self.lose = (lose_round, lose_node)
        self.examples: dict[int, int] = {}

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        rnd = _round_of(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        for r in replies:
            if not r.has_error():
                self.examples[r.metadata.src_node_id] = int(
                    r.content["metrics"]["num-examples"])
        return [r for r in replies if (rnd, r.metadata.src_node_id) != self.lose]


def test_rows_of_a_lost_reply_are_uploaded_later_and_none_twice(tmp_path):
    # Prepare: 6 clients of about 240 rows, 60 rows a round; node 101's round-2 reply is
    # lost on the way (the client built and sent it)
    config = build_run_config("dq", num_clients=6, rounds=7, seed=3, budget=60,
                              upload_schedule="fixed", server_steps=2,
                              checkpoint_dir=str(tmp_path / "ckpt"))
    grid = LossyGrid(client_app, 6)
    # Execute
    run_server(grid, config)
    # Assert: the store holds every row of every client, each once
    store = _store(tmp_path, "ckpt")
    table = store["node_table"].tolist()
    node_of_row = np.asarray(table, dtype=np.uint64)[store["node"].astype(np.int64)]
    assert len(table) == 6
    for key, node in zip(sorted(table), sorted(grid.examples), strict=True):
        ids = store["ids"][node_of_row == key].astype(np.int64)
        assert np.unique(ids).size == ids.size  # none twice
        assert ids.size == grid.examples[node], f"client {key}"  # none lost


# ------------------------------------------------------------------------ resume
def _config(tmp_path, name, **knobs):
    knobs.setdefault("budget", 40)
    return build_run_config("dq", num_clients=3, rounds=5, seed=5, server_steps=6,
                            checkpoint_dir=str(tmp_path / name), checkpoint_every=1,
                            **knobs)


SCHEDULES = [{"upload_schedule": "fixed"},
             {"upload_schedule": "adaptive", "budget": 30, "max_server_steps": 40,
              "plateau_eval_every": 20, "plateau_patience": 1, "min_holdout_rows": 0,
              "max_server_epochs": 1}]


def _crash_and_resume(tmp_path, knobs, first_node_id):
    straight = run_server(InProcessGrid(client_app, 3), _config(tmp_path, "straight",
                                                                 **knobs))
    grid = InProcessGrid(client_app, 3)
    config = _config(tmp_path, "crashed", **knobs)
    with pytest.raises(CrashError):
        run_server(grid, config, on_round=_crash_after(3))
    assert load_latest(tmp_path / "crashed")["round"] == 2  # round 3 is served again
    _fresh_contexts(grid, first_node_id)
    resumed = run_server(grid, config)
    return straight, resumed


@pytest.mark.parametrize("knobs", SCHEDULES, ids=["fixed", "adaptive"])
def test_clients_that_lost_their_context_continue_an_uninterrupted_run(tmp_path, knobs):
    # Same node ids, empty contexts (restarted SuperNodes, resumed server): the server
    # names each node's held rows, so every later upload is accepted
    straight, resumed = _crash_and_resume(tmp_path, knobs, None)
    assert all(r["selected"] > 0 for r in straight.history[1:])  # uploads in every round
    assert sum(r.get("rejected", 0) for r in resumed.history) == 0
    assert _rows(resumed.history) == _rows(straight.history)  # bytes included
    a, b = _store(tmp_path, "straight"), _store(tmp_path, "crashed")
    for key in ("codes", "labels", "ids", "node", "weights", "holdout", "node_table"):
        np.testing.assert_array_equal(a[key], b[key])
    np.testing.assert_array_equal(_model(tmp_path, "straight"), _model(tmp_path, "crashed"))


@pytest.mark.parametrize("knobs", SCHEDULES, ids=["fixed", "adaptive"])
def test_a_restart_with_new_node_ids_ends_like_an_uninterrupted_run(tmp_path, knobs):
    # As the simulation engine restarts: same partitions, new node ids, empty contexts
    straight, resumed = _crash_and_resume(tmp_path, knobs, 9001)
    assert sum(r.get("rejected", 0) for r in resumed.history) == 0
    # accuracy, loss, uplink bytes and payload, store size: all as without the restart
    assert (_rows(resumed.history, DOWNLINK, slice(2, None))
            == _rows(straight.history, DOWNLINK, slice(2, None)))
    a, b = _store(tmp_path, "straight"), _store(tmp_path, "crashed")
    assert b["node_table"].tolist() == [0, 1, 2]  # one identity per client, not per node id
    for key in ("codes", "labels", "ids", "node", "weights", "holdout", "node_table"):
        np.testing.assert_array_equal(a[key], b[key])
    np.testing.assert_array_equal(_model(tmp_path, "straight"), _model(tmp_path, "crashed"))


# ------------------------------------------------------------------------ identities
TASK = TaskConfig(num_partitions=3, seed=1)


def _strategy(**knobs):
    knobs.setdefault("upload_schedule", "fixed")
    return DQStrategy(build_model(TASK, task_info(TASK)), seed=1, budget=8, server_steps=1,
                      **knobs)


def _round(strategy, grid, rnd, replace=None):
    messages = list(strategy.configure_train(rnd, None, client_task_config(TASK, "dq"),
                                             grid))
    replies = grid.send_and_receive(messages)
    if replace is not None:
        replies = replace(messages, replies)
    return messages, replies, strategy.aggregate_train(rnd, replies)[1]


def _stored_by(strategy):
    state = strategy.store.state()
    table = state["node_table"].astype(np.int64)
    return {int(table[c]): int(n) for c, n in zip(*np.unique(state["node"].astype(np.int64),
                                                             return_counts=True),
                                                  strict=True)}


def test_an_identity_two_nodes_claim_is_granted_to_neither():
    # Prepare: node 102 claims node 101's partition id from the first round on
    grid = InProcessGrid(client_app, 3)
    grid.contexts[NODE_ID_BASE + 1].node_config["partition-id"] = 0
    strategy = _strategy()
    a, b = NODE_ID_BASE, NODE_ID_BASE + 1
    for rnd in (1, 2):
        # Execute
        _, _, metrics = _round(strategy, grid, rnd)
        # Assert: contested every round, granted to neither; each claimant's rows are
        # kept under its own node id (no squatting, and no one locked out)
        assert metrics["rejected"] == 0 and metrics["replies"] == 3
        assert _stored_by(strategy) == {a: 8 * rnd, b: 8 * rnd, 2: 8 * rnd}
        assert strategy.identities.node_of == {a: a, b: b, 2: NODE_ID_BASE + 2}
    # after a restart (node 101 gone, 102 gone), one new node id claims identity 0: its own
    restarted = InProcessGrid(client_app, 3)
    _fresh_contexts(restarted, 301)
    del restarted.contexts[302]
    _, _, metrics = _round(strategy, restarted, 3)
    assert metrics["rejected"] == 0 and metrics["replies"] == 2
    assert _stored_by(strategy) == {a: 16, b: 16, 0: 8, 2: 24}


def test_a_connected_node_can_neither_take_a_held_identity_nor_change_its_own():
    grid = InProcessGrid(client_app, 3)
    strategy = _strategy()
    _round(strategy, grid, 1)  # every node binds its own identity
    grid.contexts[NODE_ID_BASE + 1].node_config["partition-id"] = 0  # 102 hops to 101's
    for rnd in (2, 3):
        _, _, metrics = _round(strategy, grid, rnd)
        assert metrics["rejected"] == 1 and metrics["replies"] == 2
        assert _stored_by(strategy) == {0: 8 * rnd, 1: 8, 2: 8 * rnd}
    assert strategy.identities.node_of[0] == NODE_ID_BASE


def test_a_replayed_reply_loses_only_its_rows_the_server_holds():
    grid = InProcessGrid(client_app, 3)
    strategy = _strategy()
    _, first, _ = _round(strategy, grid, 1)

    def replay_round_1(messages, replies):  # node 101's round-1 reply arrives again
        wire = recorddict_from_proto(recorddict_to_proto(first[0].content))
        return [Message(wire, reply_to=messages[0]), *replies[1:]]

    _, _, metrics = _round(strategy, grid, 2, replace=replay_round_1)
    assert metrics["rejected"] == 0 and metrics["duplicate-rows"] == 8
    assert _stored_by(strategy) == {0: 8, 1: 16, 2: 16}
    _, _, metrics = _round(strategy, grid, 3)  # the client is told what is held: no repeat
    assert metrics["duplicate-rows"] == 0 and _stored_by(strategy) == {0: 16, 1: 24, 2: 24}


def test_the_client_takes_its_candidates_from_the_servers_held_set():
    from flwr.app import ConfigRecord, MessageType

    from dq_flower.client import dq_train
    from dq_flower.wire.dq_batch import decode_batch
    from dq_flower.wire.held import HELD_KEY, TABLE_KEY, encode_held, encode_table

    rng = np.random.default_rng(0)
    n = 60
    data = (rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n))
    held = list(range(0, n, 3))
    table = encode_table({0: (5, encode_held(held)), 1: (9, encode_held(range(n)))}, 2)

    def reply(identity, extra, budget=500):
        cfg = ConfigRecord({"server-round": 2, "round-seed": 7, "budget": budget,
                            "num-classes": 10, **extra})
        msg = Message(RecordDict({"config": cfg}), dst_node_id=NODE_ID_BASE,
                      message_type=MessageType.TRAIN)
        context = Context(run_id=1, node_id=NODE_ID_BASE, state=RecordDict(), run_config={},
                          node_config={"partition-id": identity})  # a fresh context
        metrics = dq_train(msg, context, data).content["metrics"]
        return int(metrics["candidates"]), int(metrics["selected"])

    assert reply(0, {}) == (n, n)  # nothing said: nothing held
    assert reply(0, {HELD_KEY: encode_held(held)}) == (n - len(held), n - len(held))
    # a table: the client's own entry (held set and ask)...
    assert reply(0, {TABLE_KEY: table}) == (n - len(held), 5)
    # ... or, for an identity it does not list, nothing held and the table's default ask
    assert reply(7, {TABLE_KEY: table}) == (n, 2)
    assert reply(1, {TABLE_KEY: table}) == (0, 0)  # everything held
    assert reply(0, {TABLE_KEY: encode_table({0: (0, encode_held([]))}, 2)}) == (0, 0)
    # the same message gives the same reply, whatever the client remembers
    cfg = ConfigRecord({"server-round": 3, "round-seed": 9, "budget": 8, "num-classes": 10,
                        HELD_KEY: encode_held(held)})
    context = Context(run_id=1, node_id=NODE_ID_BASE, state=RecordDict(), run_config={},
                      node_config={"partition-id": 0})
    msg = Message(RecordDict({"config": cfg}), dst_node_id=NODE_ID_BASE,
                  message_type=MessageType.TRAIN)
    first = dq_train(msg, context, data).content
    second = dq_train(msg, context, data).content
    for key in ("samples", "sample-info"):
        assert (recorddict_to_proto(RecordDict({key: first[key]})).SerializeToString()
                == recorddict_to_proto(RecordDict({key: second[key]})).SerializeToString())
    ids = decode_batch(first, 10, 64, 2, 8, 2**31).ids
    assert ids.size == 8 and not set(ids.tolist()) & set(held)
