"""A node cannot squat an honest client's identity, nor hop from identity to identity.

The hostile node (partition 0, its reply read first) sends its own honest rows under
another client's ``partition-id``: the honest node 1's (squatting; also from a round node 1
misses, so the squatter holds the identity first), or a new one every round (hopping). A
claim the server cannot grant keeps the reply under the claimant's own node id, so the
honest node 1 is never locked out. Four honest nodes and the hostile one on the README's
digits MLP, every reply through Flower's protobuf (:mod:`tests.faults.digits_attack`).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid

from . import digits_attack
from .digits_attack import control, edits, run, set_metrics

ROUNDS = 4
DEFAULTS: dict = {}  # the README's DQStrategy at its defaults (the adaptive schedule)


@edits
def squat(content, server_round):
    """Claim the honest node 1's identity, every round, before node 1 replies."""
    set_metrics(content, partition_id=1)


HOSTILE_NODE, HONEST_NODE = 101, 102  # partitions 0 and 1 in the in-process grid


def _run_with_node_1_silent_in_round_1(rounds: int):
    """:func:`run` of :func:`squat`, node 1 failing in round 1 (the squatter claims first)."""
    torch.manual_seed(0)
    model = digits_attack.Net()
    strategy = dq_flower.DQStrategy(model, seed=0, **DEFAULTS)
    grid = InProcessGrid(digits_attack._client(squat, digits_attack.NODES),
                         digits_attack.NODES,
                         failing=lambda r, node: r == 1 and node == HONEST_NODE)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=rounds)
    trained = digits_attack.Net()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    metrics = [dict(result.evaluate_metrics_serverapp[r]) for r in range(1, rounds + 1)]
    return digits_attack._accuracy(trained), strategy, metrics


@edits
def hop(content, server_round):
    """Claim a new identity every round (a fresh start of every per-client check)."""
    set_metrics(content, partition_id=100 + server_round)


def test_a_squatter_gains_no_identity_and_locks_no_one_out():
    acc, strategy, metrics = run(squat, ROUNDS, **DEFAULTS)
    reference = control(ROUNDS, **DEFAULTS)
    # identity 1 is claimed by two nodes: granted to neither, each kept under its node id
    assert all(m["rejected"] == 0 for m in metrics), metrics
    assert 1 not in strategy.identities.node_of
    honest = HONEST_NODE  # partition 1's node id in the in-process grid
    assert strategy.identities.of(honest) == honest
    assert strategy.store.counts(honest, np.arange(10))[0].sum() > 0  # its rows are stored
    assert 1 not in set(strategy.store.clients)
    assert acc > reference - 0.05, (acc, reference)


def test_a_squatter_that_took_an_absent_clients_identity_locks_it_out_of_nothing():
    """The squatter holds identity 1 from round 1, when node 1 does not reply."""
    acc, strategy, metrics = _run_with_node_1_silent_in_round_1(ROUNDS)
    reference = control(ROUNDS, **DEFAULTS)
    assert strategy.identities.node_of.get(1) == HOSTILE_NODE  # it took it first
    assert all(m["rejected"] == 0 for m in metrics), metrics
    assert strategy.store.counts(HONEST_NODE, np.arange(10))[0].sum() > 0
    assert acc > reference - 0.05, (acc, reference)


def test_a_hopping_node_keeps_its_first_identity_only():
    acc, strategy, metrics = run(hop, ROUNDS, **DEFAULTS)
    reference = control(ROUNDS, **DEFAULTS)
    stored = set(strategy.store.clients)
    hops = {100 + r for r in range(1, ROUNDS + 1)}
    assert len(stored & hops) <= 1, stored  # its rows live under one identity at most
    asked = [m for m in metrics[1:] if m.get("replies", 0)]
    assert all(m["rejected"] >= 1 for m in asked), metrics
    assert acc > reference - 0.05, (acc, reference)
