"""Reference rows: the server checks raw rows itself where the nodes hold no model.

A node not given the model cannot compare the model's loss on its raw rows with that on
their codes, and the server's own rows are codes: on pump windows whose wear shows in the
noise, DQ with model-free nodes ended at an MAE of 73.4 hours at 2 bits (FedAvg 13.0). Each
such node now sends, once, a few of its rows at 8 bits; the server compares its model on
them raw and recoded at the run's bits and raises bits auto where they read clearly worse.
"""

from __future__ import annotations

import logging
import pickle
import re
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import MessageType

import dq_flower
import dq_flower.dq.server.reference_rows as reference_rows
from dq_flower.codecs import PayloadError, make
from dq_flower.codecs.payload import raw_array
from dq_flower.dq.config import DQConfig
from dq_flower.dq.raw_gap import paired
from dq_flower.dq.server.bit_width import BitWidth
from dq_flower.dq.server.reference_rows import ReferenceRows
from dq_flower.dq.server.round_metrics import packed_bytes
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.wire.dq_batch import DataSpec
from dq_flower.wire.raw_fit import RawFit
from dq_flower.wire.reference_rows import (
    MAX_ROWS,
    MIN_ROWS,
    REFERENCE_INFO_KEY,
    REFERENCE_KEY,
    read_reference,
    reference_records,
)
from tests.apps import pump_wear
from tests.apps.runner import AppRun, docs_text, run_app
from tests.dq.helpers import LogLines

SPEC = DataSpec((2, 16), "float")


def _coded(x: np.ndarray, bits: int = 8, channels: int = 2):
    return make("uniform", bits=bits, per_channel=channels).encode(
        x, np.random.default_rng(0))


def _content(n: int = 12, bits: int = 8, dim: int = 32, targets=None) -> RecordDict:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 300, (n, dim)).astype(np.float32)
    y = rng.uniform(0, 500, n).astype(np.float32) if targets is None else targets
    return RecordDict(reference_records(_coded(x, bits, 2), y, 0, False))


def test_reference_rows_travel_at_8_bits_and_decode_within_a_step():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 300, (12, 32)).astype(np.float32)
    y = rng.uniform(0, 500, 12).astype(np.float32)
    records = reference_records(_coded(x), y, 0, False)
    rows, targets = read_reference(RecordDict(records), SPEC, None, 2)
    step = (x.max() - x.min()) / 255
    assert rows.shape == (12, 32) and np.abs(rows - x).max() <= step
    np.testing.assert_allclose(targets, y, rtol=1e-2)
    assert len(records[REFERENCE_KEY]["codes"].data) <= 12 * 32  # at most a byte a value
    assert read_reference(RecordDict(), SPEC, None, 2) is None  # none sent: nothing read


def _not_finite() -> RecordDict:
    """Reference rows whose first range starts at infinity."""
    content = _content()
    mins = content[REFERENCE_KEY]["mins"]
    values = np.frombuffer(mins.data, dtype=mins.dtype).copy()
    values[0] = np.inf
    content[REFERENCE_KEY]["mins"] = raw_array(values)
    return content


@pytest.mark.parametrize(("content", "reason"), [
    (lambda: RecordDict({REFERENCE_KEY: _content()[REFERENCE_KEY]}), "without its other"),
    (lambda: _content(bits=4), "expected 8"),
    (lambda: _content(dim=30), r"expected \(n, 32\)"),
    (lambda: _content(n=MIN_ROWS - 1), "fewer than"),
    (lambda: _content(n=MAX_ROWS + 1), "exceed the budget"),
    (lambda: _content(targets=np.zeros(12, np.int64)), "class labels sent where float"),
    (_not_finite, "do not decode: .* NaN or inf"),
])
def test_each_malformed_reference_is_refused_with_its_reason(content, reason):
    with pytest.raises(PayloadError, match=reason):
        read_reference(content(), SPEC, None, 2)


def _strategy(**fields):
    """What the server's check reads of a strategy: spec, mode, knobs, seed, model, loss."""
    data = SimpleNamespace(spec=SPEC, mode="channel", num_classes=None)
    return SimpleNamespace(data=data, cfg=DQConfig(bits=2), seed=0, model=None,
                           trainer=SimpleNamespace(loss_fn=None), **fields)


def _pooled(monkeypatch, losses: dict[int, tuple[float, float]]) -> str | None:
    """The check's verdict where each node's rows lose ``(raw, coded)`` (noisy, seeded)."""
    refs = ReferenceRows(rows={k: (np.zeros((32, 32), np.float32), np.zeros(32, np.float32))
                               for k in losses})
    rng, order = np.random.default_rng(5), iter(sorted(losses))

    def fake(model, rows, y, shape, loss_fn):
        raw, coded = losses[next(order)]
        return [raw + rng.normal(0, 0.3 * raw, 32), coded + rng.normal(0, 0.3 * coded, 32)]

    monkeypatch.setattr(reference_rows, "row_losses", fake)
    return refs.said(_strategy(), 3, 2)


def test_the_pooled_rule_raises_where_most_nodes_read_clearly_worse_raw(monkeypatch):
    said = _pooled(monkeypatch, {1: (6.0, 2.0), 2: (5.0, 2.0), 3: (2.0, 2.0)})
    assert said is not None and "on 96 rows of 3 nodes" in said
    assert _pooled(monkeypatch, {1: (2.6, 2.0), 2: (2.6, 2.0)}) is None  # 1.3 times: no
    # one node's large gap lifts the pooled figures, but the others read raw as well
    assert _pooled(monkeypatch, {1: (60.0, 2.0), 2: (1.9, 2.0), 3: (1.9, 2.0)}) is None


def test_the_paired_t_of_rows_without_a_difference_is_small():
    rng = np.random.default_rng(0)
    coded = rng.uniform(1, 3, 64)
    gap = paired(coded + rng.normal(0, 0.5, 64), coded)
    assert not gap.clear and abs(gap.t) < 3


def _batch(nbytes: int) -> SimpleNamespace:
    """An upload's batch of ``nbytes`` of payload."""
    return SimpleNamespace(payload_bits=8 * nbytes)


def _message(node: int, config: ConfigRecord | None = None,
             content: RecordDict | None = None) -> Message:
    InProcessGrid(client_app, 1)  # outside a Flower runtime: messages as the server's
    content = content if content is not None else RecordDict({"config": config})
    return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node)


def _identity(node: int) -> int:
    """Node ``10 + k`` is client ``k``."""
    return node - 10


def test_only_nodes_holding_no_model_are_asked_and_each_once():
    refs = ReferenceRows(received=8 * 16 * 1000 * 4)  # the rows cost a quarter of that
    uploads = [SimpleNamespace(source=10, node=0, can_score=False, batch=_batch(0)),
               SimpleNamespace(source=11, node=1, can_score=True, batch=_batch(0))]
    refs.take(_strategy(), 1, {}, uploads)
    sent = [_message(n, ConfigRecord({"round-mode": "data"})) for n in (10, 11)]
    refs.ask(sent, 16 * 1000, 1000, _identity)
    asked = [REFERENCE_KEY in m.content.config_records["config"] for m in sent]
    assert asked == [True, False] and refs.asked == {0}
    again = [_message(10, ConfigRecord({"round-mode": "data"}))]
    refs.ask(again, 16 * 1000, 1000, _identity)
    assert REFERENCE_KEY not in again[0].content.config_records["config"]


def test_no_node_is_asked_where_its_rows_would_cost_more_than_the_model():
    refs = ReferenceRows(wanted={0, 1, 2}, received=8 * 10 ** 6)
    sent = [_message(n, ConfigRecord({"round-mode": "data"})) for n in (10, 11, 12)]
    refs.ask(sent, 16 * 1000 - 1, 1000, _identity)  # 16 rows of 1,000 B, a model of 15,999 B
    assert not refs.asked
    refs.ask(sent, 2 * 16 * 1000, 1000, _identity)  # room for two nodes' rows
    assert refs.asked == {0, 1}


def test_rows_cost_at_most_half_the_payload_received_before_them():
    """Two rounds of 16 HAPT windows at 2 bits (about 7 KB a round) asked 26 KB of rows."""
    refs = ReferenceRows(wanted={0, 1})
    sent = [_message(n, ConfigRecord({"round-mode": "data"})) for n in (10, 11)]
    # a round's uploads of 2 x 15,999 B: half of it is short of one node's 16 rows of 1,000 B
    refs.take(_strategy(), 1, {}, [SimpleNamespace(source=s, node=s - 10, can_score=False,
                                                   batch=_batch(15_999)) for s in (10, 11)])
    refs.ask(sent, 10 ** 6, 1000, _identity)
    assert not refs.asked and refs.received == 8 * 2 * 15_999
    refs.take(_strategy(), 2, {}, [SimpleNamespace(source=10, node=0, can_score=False,
                                                   batch=_batch(2))])  # 16,000 B: one node
    refs.ask(sent, 10 ** 6, 1000, _identity)
    assert refs.asked == {0}


def test_rows_sent_unasked_or_malformed_are_refused_and_the_others_kept(caplog):
    refs = ReferenceRows(asked={0, 2})
    good, broken = _content(), _content(bits=4)
    replies = {10: _message(10, content=good), 11: _message(11, content=_content()),
               12: _message(12, content=broken)}
    uploads = [SimpleNamespace(source=s, node=s - 10, can_score=False, batch=_batch(100))
               for s in (10, 11, 12)]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        refs.take(_strategy(), 2, replies, uploads)
    assert set(refs.rows) == {0}
    text = caplog.text
    assert "client 1 refused: sent unasked" in text and "client 2 refused" in text
    assert refs.received == 3 * 8 * 100  # the uploads' payload, counted for later asks


def test_a_server_without_a_federation_spec_compares_nothing():
    assert not ReferenceRows.comparable(SimpleNamespace(
        data=SimpleNamespace(spec=None, mode="sample")))
    flat = SimpleNamespace(data=SimpleNamespace(spec=DataSpec((64,)), mode="feature"))
    assert not ReferenceRows.comparable(flat)  # a table's feature ranges: not compared


def _rounds(strategy, grid, last: int, config: ConfigRecord) -> list[list[Message]]:
    """Rounds 1 to ``last``; each round's ``up-payload-bits`` is the sum of its nodes' own."""
    sent_all = []
    for rnd in range(1, last + 1):
        sent = list(strategy.configure_train(rnd, None, config, grid))
        replies = list(grid.send_and_receive(sent))
        metrics = strategy.aggregate_train(rnd, replies)[1]
        nodes = sum(int(m.content.metric_records["metrics"]["up-payload-bits"]) for m in replies)
        assert metrics["up-payload-bits"] == nodes, rnd  # reference rows included
        rows = sum(len(a.data) for m in replies for name in (REFERENCE_KEY, REFERENCE_INFO_KEY)
                   if name in m.content.array_records
                   for a in m.content.array_records[name].values())
        uploads = strategy.widths.last[2]  # the round's kept uploads, read at the next round
        packed = sum(packed_bytes(u.batch) for u in uploads)
        assert metrics["up-packed-bytes"] == packed + rows, rnd  # and in the packed bytes
        sent_all.append(sent)
    return sent_all


@pytest.fixture(scope="module")
def pump() -> dict[str, tuple[AppRun, str]]:
    """DQ on the pump windows with nodes given no model: bits auto, and ``bits = 2`` set."""
    handler, logger = LogLines(), logging.getLogger("flwr")
    logger.addHandler(handler)
    pump_wear.DQ_CLIENT_MODEL = False
    out = {}
    try:
        for name, knobs in (("auto", {}), ("set", {"bits": 2})):
            handler.lines.clear()
            pump_wear.DQ_KNOBS = knobs
            out[name] = (run_app(pump_wear, "dq"), "\n".join(handler.lines))
    finally:
        logger.removeHandler(handler)
        pump_wear.DQ_CLIENT_MODEL = True
        del pump_wear.DQ_KNOBS
    return out


def test_pump_nodes_without_the_model_raise_bits_auto(pump):
    (auto, text), (kept, kept_text) = pump["auto"], pump["set"]
    raised = "worse than their 2-bit codes (loss "
    assert text.count(raised) == 1 and text.count("bits 2 -> 4 from round 3") == 1, text
    assert text.count("reference rows kept") == 1  # once: round 2's replies, 2 nodes of 16
    assert "round 2: reference rows kept from nodes without the model: 32 rows (2 nodes)" in text
    assert auto.final < 25.0  # measured 19.1 (FedAvg 30.8)
    assert kept.final > 50.0 and "reference rows" not in kept_text  # set: none asked


def test_the_method_page_quotes_the_pump_runs_without_the_model(pump):
    (auto, text), (kept, _) = pump["auto"], pump["set"]
    rows = re.search(r"reference rows kept from nodes without the model: 32 rows \(2 nodes\), "
                     r"([\d,]+) B", text)
    assert rows, text
    quoted = (f"DQ ended at {kept.final:.2f} hours with {kept.up_bytes:,} B of uplink; the rows "
              f"cost {rows[1]} B and DQ now ends at {auto.final:.2f} with {auto.up_bytes:,} B")
    page = docs_text("method.md")
    assert quoted in page, quoted
    said = next(line for line in text.splitlines() if "bits 2 -> 4" in line)
    assert " ".join(said.split("round 2: ", 1)[1].split()) in " ".join(page.split()), said


def test_on_digits_nodes_without_the_model_send_rows_once_and_bits_stay():
    """And the rows count in the round's ``up-payload-bits`` as in the nodes' own."""
    task = TaskConfig(num_partitions=4, seed=3)  # ``uniform``: the nodes hold no model
    strategy = dq_flower.DQStrategy(build_model(task, task_info(task)), seed=3,
                                    upload_schedule="fixed", budget=64, scorer="uniform")
    grid, config = InProcessGrid(client_app, 4), client_task_config(task, "dq")
    sent = _rounds(strategy, grid, 3, config)
    sent.append(list(strategy.configure_train(4, None, config, grid)))  # checked again
    asked = [sum(REFERENCE_KEY in m.content.config_records["config"] for m in r) for r in sent]
    # one node's rows fit half of round 1's uploads, a second's half of rounds 1 and 2
    assert asked == [0, 1, 1, 0] and len(strategy.widths.references.rows) == 2
    assert strategy.cfg.bits == 2  # checked after rounds 2 and 3: no gap, no raise


def test_reference_records_are_named_as_flower_names_keys():
    assert set(_content().array_records) == {"reference-rows", "reference-rows-info"}
    assert REFERENCE_KEY == "reference-rows" and REFERENCE_INFO_KEY == "reference-rows-info"


def _pump_rounds(strategy, grid, rounds, then: int | None = None) -> list[int]:
    """Drive ``rounds`` of ``strategy`` as Flower's ``start`` does, then configure ``then``.

    How many nodes each round asked for reference rows.
    """
    config, asked = ConfigRecord(), []
    for rnd in (*rounds, *([] if then is None else [then])):
        sent = list(strategy.configure_train(rnd, None, config, grid))
        asked.append(sum(REFERENCE_KEY in m.content.config_records["config"] for m in sent))
        if rnd != then:
            strategy.aggregate_train(rnd, list(grid.send_and_receive(sent)))
    return asked


def test_a_checkpoint_keeps_the_reports_and_reference_rows_the_next_round_reads():
    widths = BitWidth(auto=True, reports=([RawFit(3.0, 1.0, 64)], 2),
                      said={"bits is at its widest"})
    widths.references = ReferenceRows(wanted={0, 3}, asked={0}, received=8_000, rows={
        0: (np.ones((16, 32), np.float32), np.arange(16, dtype=np.float32))})
    again = BitWidth(auto=True)
    again.load(None, pickle.loads(pickle.dumps(widths.state(None))))
    assert again.reports == widths.reports
    assert again.said == {"bits is at its widest"}  # said once a run, resumed or not
    refs = again.references
    assert (refs.wanted, refs.asked, refs.received) == ({0, 3}, {0}, 8_000)
    np.testing.assert_array_equal(refs.rows[0][0], widths.references.rows[0][0])
    np.testing.assert_array_equal(refs.rows[0][1], np.arange(16))
    assert BitWidth(auto=True).state(None) == {}  # a run that heard nothing keeps nothing


@pytest.mark.slow
def test_a_resumed_run_keeps_the_reference_rows_and_decides_as_the_run_it_resumes(monkeypatch):
    from tests.apps.runner import client_train

    monkeypatch.setattr(pump_wear, "DQ_CLIENT_MODEL", False)

    def strategy():
        out = dq_flower.DQStrategy(pump_wear.Net(), seed=0, loss_fn=pump_wear.DQ_LOSS_FN())
        out.num_rounds = pump_wear.ROUNDS
        return out

    grid = InProcessGrid(client_train(pump_wear, "dq"), pump_wear.NUM_NODES)
    straight = strategy()
    assert _pump_rounds(straight, grid, (1, 2)) == [0, 2]
    state = pickle.loads(pickle.dumps(straight.state_dict()))  # a checkpoint after round 2
    assert _pump_rounds(straight, grid, (), 3) == [0]
    # round 3: the rows of round 2 read worse raw than their 2-bit codes: bits 2 -> 4
    assert straight.cfg.bits == 4
    resumed = strategy()
    resumed.load_state_dict(state)
    assert _pump_rounds(resumed, grid, (3,), 4) == [0, 0]  # nobody is asked again
    assert resumed.cfg.bits == 4  # raised at round 3 as in the run it resumes
