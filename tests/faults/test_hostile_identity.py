"""A node cannot squat an honest client's identity, nor hop from identity to identity.

The hostile node (partition 0, its reply read first) sends its own honest rows under
another client's ``partition-id``: the honest node 1's (squatting), or a new one every
round (hopping). Four honest nodes and the hostile one on the README's digits MLP, every
reply through Flower's protobuf (:mod:`tests.faults.digits_attack`).
"""

from __future__ import annotations

from .digits_attack import control, edits, run, set_metrics

ROUNDS = 4
DEFAULTS: dict = {}  # the README's DQStrategy at its defaults (the adaptive schedule)


@edits
def squat(content, server_round):
    """Claim the honest node 1's identity, every round, before node 1 replies."""
    set_metrics(content, partition_id=1)


@edits
def hop(content, server_round):
    """Claim a new identity every round (a fresh start of every per-client check)."""
    set_metrics(content, partition_id=100 + server_round)


def test_a_squatter_gains_no_identity_and_the_run_holds():
    acc, strategy, metrics = run(squat, ROUNDS, **DEFAULTS)
    reference = control(ROUNDS, **DEFAULTS)
    # contested from the first round: granted to neither node, every round it is claimed
    assert metrics[0]["rejected"] == 2, metrics[0]
    assert 1 not in strategy.identities.node_of
    assert 1 not in set(strategy.store.clients)
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
