"""Held-out rows: a seeded, stratified fraction of each node's rows, never drawn to train."""

import numpy as np

from dq_flower.dq.server.holdout import choose_holdout, row_hash
from dq_flower.dq.server.store import SampleStore, StoredRows


def _dequantize(codes, side, dither):
    return codes.astype(np.float32)


def _rows(ids, labels, node, holdout=None):
    n = len(ids)
    return StoredRows(codes=np.asarray(ids, dtype=np.uint8).reshape(n, 1) % 251,
                      side=np.zeros((n, 0), np.float32), labels=np.asarray(labels),
                      weights=np.ones(n, np.float32), node=np.full(n, node, np.uint64),
                      ids=np.asarray(ids, dtype=np.int64), dither=np.zeros((n, 0), np.int64),
                      holdout=holdout)


def _add(store, ids, labels, node, fraction=0.1, seed=0):
    mask = choose_holdout(np.asarray(labels), np.asarray(ids), node, fraction, seed,
                          store.counts)
    store.add(_rows(ids, labels, node, mask))
    return mask


def test_each_class_of_each_node_holds_out_its_fraction_over_many_uploads():
    store = SampleStore(_dequantize)
    rng = np.random.default_rng(0)
    for start in range(0, 2000, 37):  # uploads of 37 rows, labels at random
        ids = np.arange(start, start + 37)
        _add(store, ids, rng.integers(0, 5, 37), node=7)
    for label in range(5):
        total, held = store.counts(7, np.array([label]))
        assert abs(int(held[0]) - 0.1 * int(total[0])) <= 0.5 + 1e-9


def test_which_rows_are_held_out_does_not_depend_on_the_order_of_nodes():
    ids = np.arange(300)
    labels = ids % 3
    a, b = SampleStore(_dequantize), SampleStore(_dequantize)
    ma1 = _add(a, ids, labels, node=1)
    ma2 = _add(a, ids, labels, node=2)
    mb2 = _add(b, ids, labels, node=2)
    mb1 = _add(b, ids, labels, node=1)
    assert np.array_equal(ma1, mb1) and np.array_equal(ma2, mb2)
    assert not np.array_equal(ma1, ma2)  # the hash includes the node
    assert ma1.sum() == 30


def test_the_hash_depends_on_the_seed_and_is_deterministic():
    ids = np.arange(1000)
    assert np.array_equal(row_hash(3, 5, ids), row_hash(3, 5, ids))
    assert not np.array_equal(row_hash(3, 5, ids), row_hash(4, 5, ids))
    assert len(np.unique(row_hash(0, 0, ids))) == 1000


def test_float_targets_are_one_stratum():
    store = SampleStore(_dequantize)
    mask = _add(store, np.arange(200), np.linspace(0, 1, 200).astype(np.float32), node=1,
                fraction=0.25)
    assert mask.sum() == 50


def test_no_fraction_holds_nothing_out():
    store = SampleStore(_dequantize)
    assert not _add(store, np.arange(50), np.zeros(50, int), node=1, fraction=0.0).any()


def test_held_out_rows_are_never_drawn_and_are_all_scored():
    store = SampleStore(_dequantize)
    mask = _add(store, np.arange(200), np.arange(200) % 4, node=3, fraction=0.2)
    held = set(np.flatnonzero(mask).tolist())
    rng = np.random.default_rng(1)
    drawn = set()
    for _ in range(300):
        x, _, _ = store.draw(16, rng)
        drawn |= set(x[:, 0].astype(int).tolist())
    assert drawn.isdisjoint(held) and len(drawn) == 200 - len(held)
    scored = np.concatenate([x[:, 0] for x, *_ in store.holdout_batches(batch_size=7)])
    assert sorted(scored.astype(int).tolist()) == sorted(held)
    assert store.num_train == 200 - len(held)


def test_the_holdout_flags_survive_a_checkpoint():
    store = SampleStore(_dequantize)
    _add(store, np.arange(100), np.arange(100) % 2, node=1)
    again = SampleStore(_dequantize)
    again.load_state(store.state())
    assert np.array_equal(again.holdout_mask, store.holdout_mask)


def test_counts_are_per_node_per_stratum_with_the_held_out_ones_apart():
    # Prepare: node 1 holds labels 0,0,1 (the second 0 held out), node 2 labels 1,1
    store = SampleStore(_dequantize)
    empty_total, empty_held = store.counts(1, [0, 1])
    store.add(_rows([0, 1, 2], [0, 0, 1], node=1, holdout=np.array([False, True, False])))
    store.add(_rows([0, 1], [1, 1], node=2, holdout=np.array([True, False])))
    # Execute
    total1, held1 = store.counts(1, np.array([[0], [1], [2]]))  # any shape of strata
    total2, held2 = store.counts(2, [0, 1])
    unknown = store.counts(99, [0, 1])
    none = store.counts(1, np.array([], dtype=np.int64))
    # Assert
    assert empty_total.tolist() == empty_held.tolist() == [0, 0]
    assert total1.tolist() == [2, 1, 0] and held1.tolist() == [1, 0, 0]
    assert total2.tolist() == [0, 2] and held2.tolist() == [0, 1]
    assert unknown[0].tolist() == unknown[1].tolist() == [0, 0]
    assert none[0].size == none[1].size == 0
    for arr in (empty_total, empty_held, total1, held1, total2, *unknown, *none):
        assert arr.dtype == np.int64
    # float targets: every row is in stratum 0, whatever its value
    reg = SampleStore(_dequantize)
    reg.add(_rows([0, 1, 2], np.array([0.5, 3.0, -1.0], np.float32), node=4,
                  holdout=np.array([True, False, False])))
    total, held = reg.counts(4, [0, 1])
    assert total.tolist() == [3, 0] and held.tolist() == [1, 0] and total.dtype == np.int64
