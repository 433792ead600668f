"""``scorer="auto"``: entropy on the nodes that hold the model, uniform on the others.

Also ``selection-rule="auto"`` and ``model-precision="auto"``: the model travels at int8,
and only to the nodes that score with it.
"""

from __future__ import annotations

import pytest

from dq_flower.codecs import Payload
from dq_flower.dq.config import model_codec
from dq_flower.dq.scorer_choice import (
    AUTO_SCORER_KEY,
    model_knob,
    node_rule,
    node_scorer,
)
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.wire.model import MODEL_KEY

from .helpers import run_inprocess
from .test_adaptive_schedule import _KNOBS

WITHOUT_MODEL = {NODE_ID_BASE + 1, NODE_ID_BASE + 3}  # these nodes run without the model


def test_auto_resolves_by_whether_the_node_holds_the_model():
    assert node_scorer("auto", True) == "entropy"
    assert node_scorer("auto", False) == "uniform"
    assert node_scorer("loss", False) == "loss"  # a set scorer stays as set
    assert node_rule("auto", "entropy") == "sample"
    assert node_rule("auto", "uniform") == "topk"
    assert node_rule("threshold", "entropy") == "threshold"
    assert model_knob({"scorer": "auto"}) is None  # resolved before it needs the model
    assert model_knob({"scorer": "entropy"}) == "scorer='entropy'"
    assert model_codec("auto", "data", "none") == "int8"
    assert model_codec("auto", "data", "qsgd") == "identity"  # gradients: float32
    assert model_codec("auto", "gradient", "none") == "identity"
    assert model_codec("fp16", "data", "none") == "fp16"


def _mixed_run(rounds):
    """Four nodes; two of them run without the model (their ClientApp is given none)."""
    seen: list[tuple[int, int, str, str, str | None]] = []

    def route(msg, context):
        config = msg.content["config"]
        node = msg.metadata.dst_node_id
        model = msg.content.array_records.get(MODEL_KEY)
        codec = None if model is None else Payload.from_record(model).codec
        seen.append((int(config["server-round"]), node, str(config["scorer"]),
                     str(config["selection-rule"]), codec))
        if node in WITHOUT_MODEL:
            del config[AUTO_SCORER_KEY]  # the harness then passes dq_train no model
        return client_app(msg, context)

    run_config = build_run_config("dq", num_clients=4, rounds=rounds, **_KNOBS)
    return run_server(InProcessGrid(route, 4), run_config), seen


@pytest.fixture(scope="module")
def mixed_run():
    return _mixed_run(rounds=3)


def test_the_first_round_draws_uniformly_and_sends_no_model(mixed_run):
    _, seen = mixed_run
    first = [s for s in seen if s[0] == 1]
    assert len(first) == 4
    assert all(s[2:] == ("uniform", "topk", None) for s in first)


def test_later_rounds_score_with_the_model_only_where_a_node_holds_it(mixed_run):
    result, seen = mixed_run
    later = [s for s in seen if s[0] >= 2]
    asked = {s[1] for s in later}
    assert asked & WITHOUT_MODEL and asked - WITHOUT_MODEL  # both kinds are asked again
    for _, node, scorer, rule, codec in later:
        if node in WITHOUT_MODEL:
            assert (scorer, rule, codec) == ("uniform", "topk", None)
        else:
            assert (scorer, rule, codec) == ("entropy", "sample", "int8")
    for row in result.history[1:]:
        assert row["rejected"] == 0 and row["selected"] > 0, row


@pytest.mark.parametrize(("knobs", "expected"), [
    ({}, {"node"}),
    ({"store_weights": "importance"}, {"importance"}),
    # a compensation's control variate needs the rows' own weights
    ({"compensation": "identity", "compensation_mode": "store"}, {"importance"}),
])
def test_the_server_trains_with_the_store_weights_asked_for(monkeypatch, knobs, expected):
    from dq_flower.dq.server.store import SampleStore

    asked: set[str] = set()
    real_draw = SampleStore.draw_batches

    def spy(self, count, batch_size, rng, weights="importance", skip=frozenset(), **kwargs):
        asked.add(weights)
        return real_draw(self, count, batch_size, rng, weights, skip=skip, **kwargs)

    monkeypatch.setattr(SampleStore, "draw_batches", spy)
    run_inprocess(num_clients=2, rounds=2, **dict(_KNOBS, **knobs))
    assert asked == expected


def test_a_node_asked_for_all_it_has_left_draws_uniformly_and_gets_no_model():
    # the digits' four nodes at the defaults: round 2 asks every node for all it has left,
    # so a model sent for scoring would choose nothing (every row goes, each weight 1/n)
    seen: list[tuple[int, str, bool, int, int]] = []

    def route(msg, context):
        reply = client_app(msg, context)
        metrics = reply.content["metrics"]
        seen.append((int(msg.content["config"]["server-round"]),
                     str(msg.content["config"]["scorer"]),
                     MODEL_KEY in msg.content.array_records,
                     int(metrics["candidates"]), int(metrics["selected"])))
        return reply

    result = run_server(InProcessGrid(route, 4),
                        build_run_config("dq", num_clients=4, rounds=2, seed=0))
    second = [s for s in seen if s[0] == 2]
    assert len(second) == 4
    assert all(selected == candidates > 0 for *_, candidates, selected in second), second
    assert all(s[1:3] == ("uniform", False) for s in second), second
    assert result.history[2]["down_bytes"] < 2_000  # the config alone, no model
