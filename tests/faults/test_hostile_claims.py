"""What one hostile node's reply says is never adopted unless the whole reply is accepted.

Four honest nodes and one hostile node (partition 0, read first) on the README's digits
MLP (see :mod:`tests.faults.digits_attack`); every reply goes through Flower's protobuf.
Each attack once crashed the run, locked the honest nodes out or poisoned the model; each
run must now end within 5 accuracy points of its control (the same run with the hostile
node honest) without raising out of ``strategy.start``. The fast tests use the fixed
schedule (a fraction of a second a run); the slow ones repeat them at the README's
defaults (the adaptive schedule).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message

from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.dq.server.validation import VALUE_FACTOR
from dq_flower.harness.inprocess import InProcessGrid
from tests.faults.ranges_edit import sample_ranges, set_sample_ranges

from .digits_attack import (
    HOSTILE,
    NODES,
    Net,
    X,
    Y,
    buffer,
    claim,
    control,
    edits,
    flip_labels,
    honest,
    raw,
    run,
    set_metrics,
)

FAST = {"upload_schedule": "fixed", "server_steps": 30}
ROUNDS = 3
HONEST_ROWS = 4 * 64 * ROUNDS  # the fixed schedule asks each node for 64 rows a round


def _close_to_control(acc, rounds=ROUNDS, **knobs):
    reference = control(rounds, **knobs)
    assert reference > 0.8, reference
    assert acc > reference - 0.05, (acc, reference)


def _rejected_every_round(metrics):
    """Rejected in each round it is asked: two in a row, then it rests (round 3 of 3)."""
    assert [m["rejected"] for m in metrics] == [1, 1, 0][:len(metrics)], metrics


# ------------------------------------------------------------------ the attacks
def spec_1x64(msg, context, local):
    """Item 1: a well-formed upload of samples shaped ``[1, 64]`` (per-sample ranges)."""
    x, y = local
    return honest(msg, context, (x.reshape(-1, 1, 64), y))


def spec_1x64_bad_quantizer(msg, context, local):
    """Item 2: the same upload, rejected for its quantizer settings."""
    content = spec_1x64(msg, context, local)
    header = json.loads(bytes(content["samples"]["header"].data))
    header["meta"]["dither_seed"] = 12345  # a dither the server did not configure
    content["samples"]["header"] = raw(np.frombuffer(json.dumps(header).encode(), np.uint8))
    return content


@edits
def spans_1e30_then_valid(content, server_round):
    """Item 2: spans of 1e30, on a reply rejected in round 1 (a non-int partition id)."""
    if "feature-ranges" in content:
        values = buffer(content, "feature-ranges", "ranges")
        values[values.size // 2:] = 1e30
        content["feature-ranges"]["ranges"] = raw(values)
    if server_round == 1:
        set_metrics(content, partition_id=0.5)


@edits
def spans_500(content, server_round):
    """Item 3: feature ranges of span 500 on data in [0, 1]."""
    if "feature-ranges" in content:
        values = buffer(content, "feature-ranges", "ranges")
        values[: values.size // 2] = 0.0
        values[values.size // 2:] = 500.0
        content["feature-ranges"]["ranges"] = raw(values)


@edits
def samples_all_500(content, server_round):
    """Item 3: per-sample ranges whose every value decodes to 500."""
    mins, scales = sample_ranges(content)
    set_sample_ranges(content, np.full_like(mins, 500.0), np.zeros_like(scales))


@edits
def claims_2_to_31(content, server_round):
    """Item 4: flipped labels standing for 2**31 - 1 candidates (weights to match)."""
    flip_labels(content)
    claim(content, 2**31 - 1)


# ------------------------------------------------------------------ item 1
def test_a_sample_shape_the_model_cannot_train_on_is_rejected_not_raised():
    acc, strategy, metrics = run(spec_1x64, ROUNDS, **FAST)
    assert strategy.spec.sample_shape == (64,)
    _rejected_every_round(metrics)
    assert strategy.stored == HONEST_ROWS
    _close_to_control(acc, **FAST)


@pytest.mark.parametrize("knobs", [FAST, {}], ids=["fixed", "adaptive"])
def test_a_lone_reply_with_a_shape_the_loss_refuses_is_rejected(knobs):
    """With one node the spec is that reply's: the forward-and-loss check refuses it."""
    acc, strategy, metrics = run(spec_1x64, 2, nodes=1, **knobs)
    assert strategy.spec is None and strategy.stored == 0
    _rejected_every_round(metrics)


# ------------------------------------------------------------------ item 2
def test_a_rejected_reply_does_not_fix_the_data_spec():
    acc, strategy, metrics = run(spec_1x64_bad_quantizer, ROUNDS, **FAST)
    assert strategy.spec.sample_shape == (64,)
    _rejected_every_round(metrics)
    assert strategy.stored == HONEST_ROWS  # the honest rows, every round
    _close_to_control(acc, **FAST)


def test_a_rejected_reply_does_not_set_the_value_bound():
    acc, strategy, metrics = run(spans_1e30_then_valid, ROUNDS, **FAST)
    assert strategy.value_bound == pytest.approx(VALUE_FACTOR)  # the digits span 1
    _rejected_every_round(metrics)
    assert metrics[-1]["rolled-back"] == 0
    assert strategy.stored == HONEST_ROWS
    _close_to_control(acc, **FAST)


# ------------------------------------------------------------------ item 3
def test_feature_spans_of_500_on_unit_data_are_rejected():
    acc, strategy, metrics = run(spans_500, ROUNDS, **FAST)
    _rejected_every_round(metrics)
    assert strategy.stored == HONEST_ROWS and HOSTILE + 101 not in strategy.ranges
    _close_to_control(acc, **FAST)


def test_per_sample_values_of_500_on_unit_data_are_rejected():
    knobs = {**FAST, "ranges": "sample"}
    acc, strategy, metrics = run(samples_all_500, ROUNDS, **knobs)
    _rejected_every_round(metrics)
    assert strategy.stored == HONEST_ROWS
    _close_to_control(acc, **knobs)


# ------------------------------------------------------------------ item 4
def test_a_claim_of_two_to_the_31_examples_counts_as_100_times_the_median():
    """The claim was refused; it now counts as a claim of 100x the lower median would (one
    honest large site must not be refused), its weight clipped to 4x the median's. With
    flipped labels that costs what such a claim always cost (see docs/reliability.md): the
    fixed schedule has no screen for it; the README's defaults exclude the node."""
    _, strategy, metrics = run(claims_2_to_31, ROUNDS, **FAST)
    assert metrics[0]["rejected"] == 0 and strategy.data.sent[HOSTILE][0] == 100 * 300
    acc, strategy, metrics = run(claims_2_to_31, ROUNDS)
    assert strategy.data.sent[HOSTILE][0] == 100 * 300
    assert [m["rejected"] for m in metrics[1:]] == [1] * (ROUNDS - 1)
    _close_to_control(acc, ROUNDS)


def test_a_clipped_weight_is_said_once_a_node_not_every_round(caplog):
    """An honest large node is clipped every round: one warning, not one a round."""
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, _, metrics = run(claims_2_to_31, ROUNDS, **FAST)
    clipped = [r.getMessage() for r in caplog.records if "weight is clipped" in r.getMessage()]
    assert len(metrics) == ROUNDS and len(clipped) == 1, clipped
    assert "said once" in clipped[0]


# ------------------------------------------------------------------ at the README's defaults
@pytest.mark.slow
@pytest.mark.parametrize("attack", [spec_1x64, spec_1x64_bad_quantizer, spans_1e30_then_valid,
                                    spans_500])
def test_each_attack_at_the_readme_defaults(attack):
    acc, strategy, metrics = run(attack, ROUNDS)
    assert all(m["rejected"] >= 1 for m in metrics[:2]), metrics  # then it rests
    assert metrics[-1]["rolled-back"] == 0
    _close_to_control(acc, ROUNDS)


# ------------------------------------------------------------------ adoption after storing
def test_a_bound_whose_rows_were_never_stored_is_learned_again(monkeypatch):
    """Round 1's replies all fail store insertion: what they agreed on is not kept."""
    strategy = DQStrategy(Net(), seed=0, **FAST)

    def scaled(factor):
        def app(msg, context):
            k = int(context.node_config["partition-id"])
            local = (X[k:1500:NODES] * factor, Y[k:1500:NODES])
            return Message(honest(msg, context, local), reply_to=msg)
        return InProcessGrid(app, NODES)

    def broken(*args):
        raise RuntimeError("disk full")

    grid = scaled(1.0)
    replies = grid.send_and_receive(strategy.configure_train(1, None, ConfigRecord(), grid))
    with monkeypatch.context() as patch:
        patch.setattr(strategy.intake, "rows", broken)
        _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["stored"] == 0 and metrics["rejected"] == NODES
    grid = scaled(10.0)  # ten times round 1's values: over the bound round 1 learned
    replies = grid.send_and_receive(strategy.configure_train(2, None, ConfigRecord(), grid))
    _, metrics = strategy.aggregate_train(2, replies)
    assert metrics["rejected"] == 0 and metrics["stored"] == NODES * 64
    assert strategy.value_bound == pytest.approx(VALUE_FACTOR * 10.0)
