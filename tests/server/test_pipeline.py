"""The shared round pipeline: every reply checked against what was sent, silence counted.

Each test here failed on the strategies before they shared the pipeline: a baseline round
averaged a node's second reply, accepted replies from nodes it never sampled or for
another round, counted no silent node as failed, and a resumed baseline run forgot its
norm screen's reference.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from dq_flower.baselines.config import GradientConfig
from dq_flower.baselines.strategy import GradientStrategy
from dq_flower.codecs import Payload, make
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.model_ops import get_flat
from dq_flower.server.common import ClientFailureError
from dq_flower.server.evaluation import FederatedEvaluation
from tests.server.replies import gradient_content, node, reply_from, sent_and_answered

TASK = TaskConfig(num_partitions=3, seed=0)


def _strategy(**knobs) -> GradientStrategy:
    model = build_model(TASK, task_info(TASK))
    # random vectors stand in for updates: no direction screen (they are near-orthogonal)
    knobs.setdefault("min_cosine", -1.0)
    return GradientStrategy(model, seed=0, min_available_nodes=1,
                            config=GradientConfig(codec="identity", **knobs), method="test")


def _config():
    return client_task_config(TASK, "sgd")


def _contents(strategy, n=3, seed=1, examples=32):
    rng = np.random.default_rng(seed)
    dim = get_flat(strategy.model).size
    return {node(i): gradient_content(make("identity").encode(
        rng.normal(size=dim).astype(np.float32)), examples) for i in range(n)}


def test_a_second_reply_from_a_node_is_rejected_and_counted():
    strategy = _strategy()
    contents = _contents(strategy)
    messages, replies = sent_and_answered(strategy, contents, _config())
    twice = [*replies, reply_from(messages[0], contents[node(0)])]
    _, metrics = strategy.aggregate_train(1, twice)
    assert metrics["replies"] == 3 and metrics["rejected"] == 1


def test_replies_the_round_did_not_ask_for_are_rejected():
    strategy = _strategy()
    contents = _contents(strategy)
    messages, replies = sent_and_answered(strategy, contents, _config())
    spoofed = reply_from(messages[0], contents[node(0)], src=node(9))  # never sampled
    wrong_type = reply_from(messages[1], contents[node(1)])
    wrong_type.metadata.__dict__["_message_type"] = "evaluate"
    other_round = reply_from(messages[2], contents[node(2)])
    other_round.metadata.__dict__["_group_id"] = "7"
    _, metrics = strategy.aggregate_train(1, [replies[0], spoofed, wrong_type, other_round])
    # one honest reply, three rejected; the two nodes whose replies were bad count as silent
    assert metrics["replies"] == 1 and metrics["rejected"] == 3 and metrics["failed"] == 2


def test_a_spoof_of_a_sampled_node_that_arrives_first_does_not_displace_it():
    strategy = _strategy()
    contents = _contents(strategy)
    messages, replies = sent_and_answered(strategy, contents, _config())
    # node 2's reply to node 1's message, claiming to be node 1
    spoof = reply_from(messages[2], contents[node(2)], src=node(1))
    _, metrics = strategy.aggregate_train(1, [spoof, *replies])
    assert metrics["replies"] == 3 and metrics["rejected"] == 1


def test_silent_nodes_are_failed_and_an_all_silent_run_stops():
    strategy = _strategy(max_failed_rounds=2)
    contents = _contents(strategy)
    _, replies = sent_and_answered(strategy, contents, _config())
    _, metrics = strategy.aggregate_train(1, replies[:1])
    assert metrics["failed"] == 2
    sent_and_answered(strategy, contents, _config(), server_round=2)
    _, metrics = strategy.aggregate_train(2, [])
    assert metrics["failed"] == 3 and metrics["stepped"] == 0
    sent_and_answered(strategy, contents, _config(), server_round=3)
    with pytest.raises(ClientFailureError, match="no reply from the 3 sampled node"):
        strategy.aggregate_train(3, [])


def _norm_round(strategy, server_round, scale_last):
    """Two replies: the second ``scale_last`` times the first's size."""
    contents = _contents(strategy, n=2, seed=server_round)
    vec = make("identity").decode(Payload.from_record(contents[node(1)]["update"]))
    contents[node(1)] = gradient_content(make("identity").encode(vec * scale_last), 32)
    _, replies = sent_and_answered(strategy, contents, _config(), server_round)
    return strategy.aggregate_train(server_round, replies)[1]


def test_a_resumed_baseline_run_keeps_its_norm_screen_reference():
    # rounds of three replies set the reference; a round of two cannot set its own, so
    # only the checkpointed reference rejects its 1000x update
    def three(strategy, server_round):
        _, replies = sent_and_answered(strategy, _contents(strategy, seed=server_round),
                                       _config(), server_round)
        strategy.aggregate_train(server_round, replies)

    straight = _strategy()
    three(straight, 1)
    three(straight, 2)
    state = copy.deepcopy(straight.state_dict())  # a checkpoint, not live tensors
    expected = _norm_round(straight, 3, 1000.0)
    resumed = _strategy()
    resumed.load_state_dict(state)
    got = _norm_round(resumed, 3, 1000.0)
    assert expected["rejected"] == got["rejected"] == 1
    np.testing.assert_array_equal(get_flat(resumed.model), get_flat(straight.model))


class _Evaluation(FederatedEvaluation):
    fraction_evaluate = 1.0


def test_federated_evaluation_caps_a_claimed_example_count():
    strategy = _Evaluation()
    contents = {node(i): RecordDict({"metrics": MetricRecord(
        {"num-examples": 100, "accuracy": 0.5})}) for i in range(4)}
    contents[node(4)] = RecordDict({"metrics": MetricRecord(
        {"num-examples": 2**31 - 1, "accuracy": 1.0})})

    def fake_client(msg, _context):
        return Message(contents[msg.metadata.dst_node_id], reply_to=msg)

    grid = InProcessGrid(fake_client, 5)
    messages = strategy.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid)
    replies = grid.send_and_receive(messages)
    metrics = strategy.aggregate_evaluate(1, [*replies, replies[-1]])
    # the highest value (the claim's) and the lowest are trimmed: the honest 0.5
    assert metrics["accuracy"] == pytest.approx(0.5)
    strategy.evaluate_trim = 0.0  # without the trim the claim weighs 2x the median
    messages = strategy.configure_evaluate(2, ArrayRecord(), ConfigRecord(), grid)
    metrics = strategy.aggregate_evaluate(2, grid.send_and_receive(messages))
    assert metrics["accuracy"] == pytest.approx(400 / 600)  # (4*50 + 200) / 600


def _evaluation_round(contents: dict[int, dict]) -> dict:
    strategy = _Evaluation()

    def fake_client(msg, _context):
        return Message(RecordDict({"metrics": MetricRecord(contents[msg.metadata.dst_node_id])}),
                       reply_to=msg)

    grid = InProcessGrid(fake_client, len(contents))
    messages = strategy.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid)
    return dict(strategy.aggregate_evaluate(1, grid.send_and_receive(messages)))


HONEST = [(0.87, 0.41, 359), (0.88, 0.39, 360), (0.90, 0.33, 359), (0.91, 0.30, 360)]


@pytest.mark.parametrize("claim", [
    {"eval-acc": 0.0, "eval-loss": 1e308, "num-examples": 360},
    {"eval-acc": 0.0, "eval-loss": 50.0, "num-examples": 2**31 - 1},
    {"eval-acc": 1.0, "eval-loss": 0.0, "num-examples": 2**31 - 1},
])
def test_one_node_in_five_moves_the_evaluation_figures_by_at_most_a_few_points(claim):
    contents = {node(i): {"eval-acc": acc, "eval-loss": loss, "num-examples": n}
                for i, (acc, loss, n) in enumerate(HONEST)}
    honest = _evaluation_round(contents)
    contents[node(4)] = claim
    attacked = _evaluation_round(contents)
    # honest figures 0.890 / 0.358; the same averages with the claim, within 3 points
    assert abs(attacked["eval-acc"] - honest["eval-acc"]) < 0.03, (honest, attacked)
    assert np.isfinite(attacked["eval-loss"]) and abs(attacked["eval-loss"]
                                                      - honest["eval-loss"]) < 0.05


@pytest.mark.parametrize("honest", [3, 2])
@pytest.mark.parametrize("claim", [
    {"eval-acc": 1e30, "eval-loss": 1e30, "num-examples": 360},
    {"eval-acc": -1e29, "eval-loss": -1e30, "num-examples": 360},
    {"eval-acc": 1.0, "eval-loss": 0.0, "num-examples": 2**31 - 1},
])
def test_one_node_of_four_or_three_keeps_the_figures_within_the_honest_range(claim, honest):
    # too few nodes to trim one: the extremes are bounded by the others' span, widened by
    # that span and a quarter of the median (before, the plain weighted mean: 1e30 of four
    # gave 2.5e29)
    contents = {node(i): {"eval-acc": acc, "eval-loss": loss, "num-examples": n}
                for i, (acc, loss, n) in enumerate(HONEST[:honest])}
    contents[node(honest)] = claim
    attacked = _evaluation_round(contents)
    for key, column in (("eval-acc", 0), ("eval-loss", 1)):
        values = [row[column] for row in HONEST[:honest]]
        span, slack = max(values) - min(values), 0.25 * max(abs(v) for v in values)
        assert (min(values) - span - slack <= attacked[key] <= max(values) + span + slack), (
            key, attacked)


def test_three_or_four_honest_figures_are_their_weighted_mean():
    """The bound moves no honest figure: four nodes' test rows are the central test rows."""
    for honest in (3, 4):
        rows = HONEST[:honest]
        figures = _evaluation_round({node(i): {"eval-acc": a, "eval-loss": b, "num-examples": n}
                                     for i, (a, b, n) in enumerate(rows)})
        total = sum(n for *_, n in rows)
        assert figures["eval-acc"] == pytest.approx(sum(a * n for a, _, n in rows) / total)
        assert figures["eval-loss"] == pytest.approx(sum(b * n for _, b, n in rows) / total)


def test_a_huge_metric_is_dropped_and_the_sums_stay_finite():
    contents = {node(i): {"eval-loss": 1e29 if i else 1e31, "num-examples": 10}
                for i in range(2)}
    assert _evaluation_round(contents)["eval-loss"] == pytest.approx(1e29)


# ---------------------------------------------------------------------------- DQ
def _dq_round(**knobs):
    from dq_flower.dq.server.strategy import DQStrategy
    from dq_flower.harness.client_app import app as client_app

    task = TaskConfig(num_partitions=3, model="logreg", seed=7)
    strategy = DQStrategy(build_model(task, task_info(task)), seed=7, **knobs)
    grid = InProcessGrid(client_app, 3)
    messages = list(strategy.configure_train(1, None, client_task_config(task, "dq"), grid))
    return strategy, messages, grid.send_and_receive(messages)


def test_dq_rejects_an_unsampled_node_and_a_spoof_that_arrives_first():
    strategy, messages, replies = _dq_round(upload_schedule="fixed")
    stranger = reply_from(messages[0], replies[0].content, src=node(9))
    spoof = reply_from(messages[2], replies[2].content, src=node(1))
    _, metrics = strategy.aggregate_train(1, [stranger, spoof, *replies])
    assert metrics["replies"] == 3 and metrics["rejected"] == 2


def test_dq_counts_silent_nodes_and_stops_a_run_nobody_answers():
    strategy, _, replies = _dq_round(upload_schedule="fixed", max_failed_rounds=1)
    with pytest.raises(ClientFailureError, match="no reply from the 3 sampled node"):
        strategy.aggregate_train(1, [])


def test_a_robust_figure_that_leaves_honest_nodes_out_says_flowers_weighted_mean(caplog):
    # honest nodes of other data: a large site's accuracy is its own (a scanner's mirrored
    # images); the trim and the count cap leave it out, and the figure read 0.917 where the
    # pooled accuracy was 0.686, without a word
    import logging

    rows = [(0.92, 100), (0.91, 100), (0.93, 100), (0.90, 100), (0.30, 400)]
    contents = {node(i): {"accuracy": acc, "num-examples": n} for i, (acc, n) in enumerate(rows)}
    plain = sum(a * n for a, n in rows) / sum(n for _, n in rows)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        first = _evaluation_round(contents)
        _evaluation_round(contents)
    said = [r.getMessage() for r in caplog.records if "federated evaluation" in r.getMessage()]
    assert first["accuracy"] > 0.9 and abs(plain - 0.6075) < 1e-9
    assert len(said) == 2  # once a run: each round here is a strategy of its own
    assert f"accuracy {first['accuracy']:.4g}" in said[0] and f"accuracy {plain:.4g}" in said[0]
    honest = {node(i): {"accuracy": acc, "num-examples": 100} for i, (acc, _) in
              enumerate(rows[:4])}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _evaluation_round(honest)
    assert not any("federated evaluation" in r.getMessage() for r in caplog.records)
