"""One node's data cannot steer the asks nor poison the model: noise, flipped labels, copies.

Four honest nodes and a hostile one (partition 0, its reply read first) on the README's
digits MLP at DQ's defaults (the adaptive schedule), every reply through Flower's protobuf
(:mod:`tests.faults.digits_attack`). The hostile node runs the package's own client on
data of its own: 30 times an honest node's row count of uniform noise with random labels;
its rows with labels ``y -> 9 - y``, repeated 4 times under new row ids; the flipped rows
alone; its rows and 20 near-copies of each of its class-3 rows (two pixels moved by one
2-bit level each) labelled 8. An honest Dirichlet(0.1) split checks that the screens leave
honest non-IID nodes alone.
"""

from __future__ import annotations

from functools import lru_cache
from unittest.mock import patch

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid

from .digits_attack import X_TEST, Y_TEST, Net, X, Y, honest, run, wire

ROUNDS = 3  # the screens act after round 1; the honest nodes' rows are all stored by round 2
HONEST_ROWS = 4 * 300  # the honest nodes' rows (every fifth of the first 1,500 each)


def noise30(msg, context, local):
    """30 times an honest node's rows of uniform noise in the data's range, random labels."""
    x, _ = local
    rng = np.random.default_rng(1)
    n = 30 * len(x)
    return honest(msg, context, (rng.random((n, x.shape[1]), dtype=np.float32),
                                 rng.integers(0, 10, n)))


def flipped_copies(msg, context, local):
    """Labels ``y -> 9 - y`` on the node's rows repeated 4 times under new row ids.

    A hostile client offers its repeats (``dq_train`` offers none: its check is left out).
    """
    x, y = local
    with patch("dq_flower.dq.client.train.repeated_rows",
               lambda x, _y: np.zeros(len(x), dtype=bool)):
        return honest(msg, context, (np.tile(x, (4, 1)), 9 - np.tile(y, 4)))


def flipped(msg, context, local):
    """Labels ``y -> 9 - y`` on the node's own rows."""
    x, y = local
    return honest(msg, context, (x, 9 - y))


def near_copies(msg, context, local):
    """Its rows, and 20 near-copies of each class-3 row (two codes moved a level), as 8s."""
    x, y = local
    lo, span = x.min(0), x.max(0) - x.min(0)
    live = np.flatnonzero(span > 0)
    rng = np.random.default_rng(3)
    levels = np.rint((x[y == 3] - lo) / np.where(span > 0, span, 1) * 3)  # its 2-bit codes
    copies = np.repeat(levels, 20, axis=0)
    for row in copies:
        for j in rng.choice(live, 2, replace=False):
            row[j] += 1 if row[j] < 3 else -1
    moved = (lo + copies / 3 * span).astype(np.float32)  # on the levels: quantized exactly
    return honest(msg, context, (np.concatenate([x, moved]),
                                 np.concatenate([y, np.full(len(moved), 8)])))


def class_accuracy(strategy, label: int) -> float:
    with torch.no_grad():
        pred = strategy.model(torch.from_numpy(X_TEST)).argmax(1).numpy()
    return float((pred[label == Y_TEST] == label).mean())


def stored_by_node(strategy) -> dict[int, int]:
    store = strategy.store
    rows = np.zeros(0, dtype=np.uint64) if store is None or not len(store) else (
        store.node_ids(store._rows))
    return {int(n): int((rows == n).sum()) for n in np.unique(rows)}


def uplink(metrics: list[dict]) -> int:
    return int(sum(m.get("up-packed-bytes", 0) for m in metrics))


@lru_cache(maxsize=4)
def control_run(seed: int = 0):
    """The control run: its accuracy, strategy and metrics."""
    return run(None, ROUNDS, seed=seed)


def reference(seed: int = 0) -> tuple[float, int, tuple[int, ...]]:
    """The control run's accuracy, uplink bytes and rows stored per node."""
    acc, strategy, metrics = control_run(seed)
    stored = stored_by_node(strategy)
    return acc, uplink(metrics), tuple(stored.get(n, 0) for n in range(5))


def _noise_holds(seed: int) -> None:
    acc, strategy, metrics = run(noise30, ROUNDS, seed=seed)
    control_acc, control_up, control_rows = reference(seed)
    stored = stored_by_node(strategy)
    honest_rows = sum(v for n, v in stored.items() if n != 0)
    assert stored.get(0, 0) < 0.5 * sum(stored.values()), stored
    assert honest_rows == sum(control_rows[1:]), (stored, control_rows)
    assert uplink(metrics) < 2 * control_up, (uplink(metrics), control_up)
    assert 0 in strategy.trainer.excluded
    assert acc > control_acc - 0.05, (acc, control_acc)


def test_a_node_of_noise_takes_no_store_share_and_is_not_asked_again():
    _noise_holds(0)


def _flips_hold(attack, seed: int) -> tuple[float, object, list[dict]]:
    acc, strategy, metrics = run(attack, ROUNDS, seed=seed)
    control_acc = reference(seed)[0]
    assert control_acc > 0.88, control_acc
    assert acc > control_acc - 0.05, (acc, control_acc)
    assert set(strategy.trainer.excluded) == {0}
    assert "held-out error" in strategy.trainer.screen.excluded[0]
    return acc, strategy, metrics


def test_flipped_labels_on_copied_rows_are_screened():
    _, strategy, metrics = _flips_hold(flipped_copies, 0)
    assert strategy.intake.copies.copying == {0}
    assert metrics[0]["duplicate-rows"] > 0  # the copies, counted once, not stored
    codes = strategy.store._rows.codes[strategy.store.rows_of(frozenset({0}))]
    assert len({c.tobytes() for c in codes}) == len(codes)


def test_flipped_labels_alone_are_screened():
    _, strategy, _ = _flips_hold(flipped, 0)
    assert strategy.intake.copies.copying == set()


def test_near_copies_with_a_new_label_are_screened_as_copies():
    acc, strategy, metrics = run(near_copies, ROUNDS)
    control_acc, control, _ = control_run(0)
    assert strategy.intake.copies.copying == {0}
    assert sum(m["duplicate-rows"] for m in metrics) > 500  # of its 600 near-copies
    assert class_accuracy(strategy, 3) > class_accuracy(control, 3) - 0.05
    assert acc > control_acc - 0.05, (acc, control_acc)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_the_attacks_hold_at_other_seeds(seed):
    _noise_holds(seed)
    _flips_hold(flipped_copies, seed)
    _flips_hold(flipped, seed)


# ------------------------------------------------------------------ honest non-IID nodes
def dirichlet_split(nodes: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Row indices of the first 1,500 digits per node, label proportions Dirichlet(alpha)."""
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(nodes)]
    labels = Y[:1500]
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(rng.dirichlet([alpha] * nodes))[:-1] * len(idx)).astype(int)
        for k, part in enumerate(np.split(idx, cuts)):
            parts[k] += part.tolist()
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]


def dirichlet_run(nodes: int, seed: int, rounds: int = ROUNDS):
    parts = dirichlet_split(nodes, 0.1, seed)

    def app(msg: Message, context) -> Message:
        k = int(context.node_config["partition-id"])
        local = (X[parts[k]], Y[parts[k]])
        return Message(wire(honest(msg, context, local)), reply_to=msg)

    torch.manual_seed(seed)
    model = Net()
    strategy = dq_flower.DQStrategy(model, seed=seed)
    strategy.start(grid=InProcessGrid(app, nodes), initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=rounds)
    return strategy, parts


def test_honest_dirichlet_nodes_are_not_screened():
    strategy, parts = dirichlet_run(5, 0)
    assert min(len(p) for p in parts) < 0.5 * max(len(p) for p in parts)  # a skewed split
    screen = strategy.trainer.screen
    assert any(r["verdicts"] for r in screen.reviews), "no client was judged"
    assert screen.excluded == {}
    assert all(v[4] <= v[5] for r in screen.reviews for v in r["verdicts"])  # nor ever was
    assert strategy.intake.copies.copying == set()
    assert sum(stored_by_node(strategy).values()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("nodes,seed", [(5, 1), (5, 2), (10, 0), (10, 1), (10, 2)])
def test_honest_dirichlet_nodes_are_not_screened_at_other_splits(nodes, seed):
    strategy, _ = dirichlet_run(nodes, seed)
    screen = strategy.trainer.screen
    assert all(v[4] <= v[5] for r in screen.reviews for v in r["verdicts"])
    assert screen.excluded == {}
    assert strategy.intake.copies.copying == set()
