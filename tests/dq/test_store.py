"""The server's sample store: eviction (fifo, random), draws, dtype narrowing, checkpoints."""

import numpy as np
import pytest

from dq_flower.dq.server.store import SampleStore, StoredRows


def _rows(ids, node=7, labels=None, weights=None, width=3):
    """Rows whose codes and side information encode their own id (see ``_dequantize``)."""
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.size
    codes = np.repeat((ids % 256).astype(np.uint8)[:, None], width, axis=1)
    side = np.stack([ids.astype(np.float32), np.ones(n, np.float32)], axis=1)
    return StoredRows(
        codes=codes, side=side,
        labels=np.arange(n) % 10 if labels is None else np.asarray(labels),
        weights=np.ones(n, np.float32) if weights is None else np.asarray(weights, np.float32),
        node=np.full(n, node, dtype=np.uint64), ids=ids,
        dither=np.zeros((n, 0), np.int64))


def _dequantize(codes, side, dither):
    """Float rows: the side's id in column 0, the codes after it."""
    assert dither.shape == (codes.shape[0], 0) and dither.dtype == np.int64  # as stored
    return np.concatenate([side[:, :1], codes.astype(np.float32)], axis=1)


def _ids(store):
    return store.state()["ids"].astype(np.int64).tolist()


def test_unbounded_store_keeps_every_row_in_order():
    store = SampleStore(_dequantize)
    assert len(store) == 0 and store.nbytes == 0
    store.add(_rows([5, 3, 9]))
    store.add(_rows([1, 2], node=8))
    assert len(store) == 5 and store.evicted == 0
    assert _ids(store) == [5, 3, 9, 1, 2]
    np.testing.assert_array_equal(store.has(7, np.array([3, 1, 9, 4])), [True, False, True,
                                                                          False])
    np.testing.assert_array_equal(store.has(8, np.array([1, 2, 3])), [True, True, False])
    assert not store.has(99, np.array([1])).any()  # an unknown node has nothing stored


def test_fifo_eviction_drops_the_oldest_rows():
    store = SampleStore(_dequantize, max_samples=5, eviction="fifo")
    store.add(_rows([0, 1, 2]))
    assert _ids(store) == [0, 1, 2] and store.evicted == 0  # below the bound: nothing goes
    store.add(_rows([3, 4]))
    assert _ids(store) == [0, 1, 2, 3, 4] and store.evicted == 0  # at the bound exactly
    store.add(_rows([5, 6, 7], node=8))
    assert _ids(store) == [3, 4, 5, 6, 7] and store.evicted == 3
    assert not store.has(7, np.array([0, 1, 2])).any() and store.has(7, np.array([3, 4])).all()
    store.add(_rows(range(10, 22)))  # more than the bound at once: only the newest stay
    assert _ids(store) == [17, 18, 19, 20, 21] and store.evicted == 3 + 12


def test_random_eviction_is_seeded_keeps_order_and_is_uniform():
    # One add of 12 rows into a store of 6: which rows stay is drawn uniformly (each row
    # with probability 1/2) and reproducibly from the store's seed.
    def kept(seed):
        store = SampleStore(_dequantize, max_samples=6, eviction="random", seed=seed)
        store.add(_rows(range(12)))
        assert len(store) == 6 and store.evicted == 6
        return _ids(store)

    first = kept(0)
    assert first == sorted(first) and len(set(first)) == 6  # arrival order, no duplicates
    assert kept(0) == first
    assert kept(1) != first
    # 2,000 seeds: each row's frequency is within 4.5 standard errors (0.011) of 1/2;
    # keeping the first or the last six (fifo) misses by 45 errors
    seeds = 2000
    counts = np.zeros(12)
    for seed in range(seeds):
        counts[kept(seed)] += 1
    freq = counts / seeds
    assert np.abs(freq - 0.5).max() < 4.5 * np.sqrt(0.25 / seeds), freq


def test_draw_is_uniform_without_replacement_and_decodes_its_own_rows():
    store = SampleStore(_dequantize)
    labels = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    weights = np.array([1, 2, 3, 4, 5, 6, 7, 8], np.float32)
    store.add(_rows(np.arange(8) * 10, labels=labels, weights=weights))
    rng = np.random.default_rng(0)
    x, y, w = store.draw(3, rng)
    assert x.shape == (3, 4) and x.dtype == np.float32
    assert y.dtype == np.int64 and w.dtype == np.float32
    row = (x[:, 0] / 10).astype(int)  # which stored rows were drawn
    assert len(set(row.tolist())) == 3
    np.testing.assert_array_equal(x[:, 1:], np.repeat((row * 10)[:, None], 3, axis=1))
    np.testing.assert_array_equal(y, labels[row])
    np.testing.assert_array_equal(w, weights[row])
    x, y, w = store.draw(100, rng)  # a batch larger than the store: every row once
    assert sorted(x[:, 0].tolist()) == list(range(0, 80, 10))
    # uniform: 4,000 draws of 3 rows of 8, each row drawn with probability 3/8
    counts = np.zeros(8)
    draws = 4000
    for _ in range(draws):
        counts[(store.draw(3, rng)[0][:, 0] / 10).astype(int)] += 1
    p = 3 / 8
    assert np.abs(counts / draws - p).max() < 4.5 * np.sqrt(p * (1 - p) / draws)
    with pytest.raises(ValueError, match="empty"):
        SampleStore(_dequantize).draw(4, rng)


def test_rows_decode_through_their_own_clients_feature_ranges():
    big = 2**63 + 5  # node ids are uint64
    store = SampleStore(_dequantize)
    store.add(_rows([1, 2], node=big))
    store.add(_rows([3], node=12))
    raw, _, _ = store.draw(3, np.random.default_rng(0))
    store.set_ranges(big, np.full(4, 10.0), np.full(4, 2.0))
    store.set_ranges(12, np.full(4, -1.0), np.full(4, 0.5))
    x, _, _ = store.draw(3, np.random.default_rng(0))  # the same rows, mapped back
    assert x.dtype == np.float32
    scale = {1: (10.0, 2.0), 2: (10.0, 2.0), 3: (-1.0, 0.5)}
    for row_raw, row in zip(raw, x, strict=True):
        lo, span = scale[int(row_raw[0])]
        np.testing.assert_allclose(row, lo + row_raw * span, rtol=1e-6)
    assert set(store.ranges) == {big, 12}
    assert all(lo.dtype == span.dtype == np.float32 for lo, span in store.ranges.values())


def test_metadata_is_kept_in_the_narrowest_exact_dtype():
    store = SampleStore(_dequantize)
    store.add(_rows([1, 200], labels=[0, 9], weights=[1.5, 2.0]))
    s = store.state()
    assert s["labels"].dtype == np.uint8 and s["ids"].dtype == np.uint8
    assert s["node"].dtype == np.uint8 and s["weights"].dtype == np.float16
    # ids above 255 widen to uint16, 1/3 is not a float16: float32
    store.add(_rows([300, 70_000], labels=[300, 1], weights=[1 / 3, 1.0]))
    s = store.state()
    assert s["ids"].dtype == np.uint32 and s["labels"].dtype == np.uint16
    assert s["weights"].dtype == np.float32
    np.testing.assert_array_equal(s["ids"], [1, 200, 300, 70_000])
    np.testing.assert_array_equal(s["weights"], np.array([1.5, 2, 1 / 3, 1], np.float32))
    np.testing.assert_array_equal(s["labels"], [0, 9, 300, 1])
    # float targets (regression): float16 when exact, else float32
    reg = SampleStore(_dequantize)
    reg.add(_rows([0, 1], labels=np.array([0.5, -2.0], np.float32)))
    assert reg.state()["labels"].dtype == np.float16
    reg.add(_rows([2], labels=np.array([0.1], np.float32)))
    labels = reg.state()["labels"]
    assert labels.dtype == np.float32
    np.testing.assert_array_equal(labels, np.array([0.5, -2.0, 0.1], np.float32))
    _, y, _ = reg.draw(3, np.random.default_rng(0))
    assert y.dtype == np.float32
    # nbytes is exactly the arrays' bytes
    assert store.nbytes == sum(v.nbytes for k, v in store.state().items()
                               if k not in ("node_table", "evicted", "rng"))


def test_state_round_trip_continues_identically():
    # Prepare: a bounded store with random eviction, rows from three nodes
    a = SampleStore(_dequantize, max_samples=10, eviction="random", seed=3)
    for node, ids in ((5, range(6)), (2**40, range(6)), (9, range(100, 104))):
        a.add(_rows(list(ids), node=node, weights=np.arange(1, len(ids) + 1) / 3))
    # Execute
    b = SampleStore(_dequantize, max_samples=10, eviction="random", seed=999)
    b.load_state({k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
                  for k, v in a.state().items()})
    # Assert: same rows, counters, node table and draws...
    assert len(b) == len(a) == 10 and b.evicted == a.evicted == 6
    for key in ("codes", "side", "labels", "weights", "node", "ids", "dither", "node_table"):
        np.testing.assert_array_equal(a.state()[key], b.state()[key])
        assert a.state()[key].dtype == b.state()[key].dtype
    for node in (5, 2**40, 9):
        np.testing.assert_array_equal(a.has(node, np.arange(110)), b.has(node, np.arange(110)))
    for _ in range(3):
        xa, ya, wa = a.draw(4, np.random.default_rng(8))
        xb, yb, wb = b.draw(4, np.random.default_rng(8))
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(wa, wb)
    # ... and the eviction generator resumes where it stopped (b was seeded differently)
    a.add(_rows(range(200, 205), node=9))
    b.add(_rows(range(200, 205), node=9))
    assert _ids(a) == _ids(b)
    # an empty store round-trips to an empty store
    empty = SampleStore(_dequantize)
    empty.load_state(SampleStore(_dequantize).state())
    assert len(empty) == 0 and empty.evicted == 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="eviction"):
        SampleStore(_dequantize, eviction="lru")
    with pytest.raises(ValueError, match="max_samples"):
        SampleStore(_dequantize, max_samples=-1)


def test_node_weight_sums_the_weights_of_a_nodes_rows():
    store = SampleStore(_dequantize, max_samples=4, eviction="fifo")
    assert store.node_weight(7) == 0.0  # empty store
    store.add(_rows([0, 1, 2], node=7, weights=[1.5, 2.0, 0.25]))
    store.add(_rows([0], node=8, weights=[10.0]))
    assert store.node_weight(7) == 3.75 and store.node_weight(8) == 10.0
    assert store.node_weight(9) == 0.0  # a node that sent nothing
    store.add(_rows([5], node=8, weights=[1 / 3]))  # evicts node 7's first row
    assert store.node_weight(7) == 2.25
    assert store.node_weight(8) == pytest.approx(10 + 1 / 3, rel=1e-7)


def test_loading_an_empty_state_empties_a_store_and_node_ids_stay_uint64():
    store = SampleStore(_dequantize)
    store.add(_rows([1, 2], node=2**63 + 1))
    assert store.state()["node_table"].dtype == np.uint64
    assert store.state()["node_table"].tolist() == [2**63 + 1]
    store.load_state(SampleStore(_dequantize).state())
    assert len(store) == 0 and store.nbytes == 0
    assert not store.has(2**63 + 1, np.array([1])).any()
    store.add(_rows([5]))
    assert _ids(store) == [5]


def test_rows_are_stored_in_the_packed_dtypes_whatever_they_arrive_in():
    rows = _rows([1, 2, 3])
    store = SampleStore(_dequantize)
    store.add(StoredRows(codes=rows.codes.astype(np.int64), side=rows.side,
                         labels=rows.labels, weights=rows.weights.astype(np.float64),
                         node=rows.node, ids=rows.ids, dither=rows.dither.astype(np.int32)))
    s = store.state()
    assert s["codes"].dtype == np.uint8 and s["dither"].dtype == np.int64
    assert s["weights"].dtype == np.float16
    # codes, side, labels, weights, node, ids, held-out flags (one byte each)
    assert store.nbytes == 3 * 3 + 3 * 2 * 4 + 3 + 3 * 2 + 3 + 3 + 3
    store.add(_rows([]))  # an empty upload adds nothing
    assert _ids(store) == [1, 2, 3] and store.evicted == 0


def test_filling_to_the_bound_evicts_nothing_and_draws_nothing():
    store = SampleStore(_dequantize, max_samples=4, eviction="random", seed=5)
    fresh = store.state()["rng"]
    store.add(_rows([0, 1, 2, 3]))
    assert store.evicted == 0 and store.state()["rng"] == fresh
    store.add(_rows([4]))
    assert store.evicted == 1 and store.state()["rng"] != fresh


def test_has_is_a_boolean_mask_in_every_case():
    store = SampleStore(_dequantize)
    ids = np.array([1, 2])
    assert store.has(7, ids).dtype == bool  # empty store
    store.add(_rows([1]))
    assert store.has(9, ids).dtype == bool  # unknown node
    mask = store.has(7, ids)
    assert mask.dtype == bool and mask.tolist() == [True, False]
    assert ids[~store.has(7, ids)].tolist() == [2]  # usable as a mask to filter with


def test_received_names_every_row_ever_received_evicted_ones_included():
    # Prepare: a bound of 4 rows, FIFO: node 7's first rows go when node 8's arrive
    store = SampleStore(_dequantize, max_samples=4, eviction="fifo")
    assert store.received(7).tolist() == [] and store.clients == []
    store.add(_rows([5, 3, 9]))
    store.add(_rows([1, 2, 40_000], node=8))
    # Assert: node 7's rows 5 and 3 are evicted, yet received (they are not asked again)
    assert not store.has(7, np.array([5, 3])).any()
    assert store.received(7).tolist() == [3, 5, 9] and store.received(8).tolist() == [1, 2,
                                                                                      40_000]
    assert store.was_received(7, np.array([3, 4, 9])).tolist() == [True, False, True]
    assert store.clients == [7, 8]
    # the evicted ids are kept narrow and counted in nbytes, and survive a checkpoint
    state = store.state()
    assert state["evicted_ids"].dtype == np.uint8 and state["evicted_ids"].tolist() == [3, 5]
    assert store.nbytes == sum(v.nbytes for k, v in state.items()
                               if k not in ("node_table", "evicted", "rng", "evicted_nodes",
                                            "evicted_counts"))
    again = SampleStore(_dequantize, max_samples=4, eviction="fifo")
    again.load_state(state)
    assert again.received(7).tolist() == [3, 5, 9] and again.clients == [7, 8]
    # a checkpoint from before evicted ids were kept still loads (its evicted rows unknown)
    old = {k: v for k, v in state.items() if not k.startswith("evicted_")}
    again.load_state(old)
    assert again.received(7).tolist() == [9] and len(again) == 4


def test_a_checkpoint_without_holdout_loads_with_no_row_held_out_and_large_node_ids_survive():
    # Prepare: node ids above 2**63 (Flower's are uint64), FIFO eviction of 2 rows
    big, other = 2**63 + 5, 2**64 - 1
    store = SampleStore(_dequantize, max_samples=3, eviction="fifo")
    store.add(_rows([1, 2], node=big))
    store.add(_rows([7, 8, 9], node=other))
    state = store.state()
    assert state["evicted_nodes"].dtype == np.uint64 and state["evicted_counts"].dtype == np.int64
    # Execute
    again = SampleStore(_dequantize, max_samples=3, eviction="fifo")
    again.load_state(state)
    old = SampleStore(_dequantize)
    old.load_state({k: v for k, v in state.items() if k != "holdout"})
    # Assert
    assert again.received(big).tolist() == [1, 2] and again.received(other).tolist() == [7, 8, 9]
    assert again.clients == store.clients == [big, other]
    assert old.holdout_mask.dtype == bool and old.holdout_mask.tolist() == [False] * 3
    assert len(old) == 3 and old.received(big).tolist() == [1, 2]


def test_a_node_evicted_twice_keeps_every_evicted_id():
    # Prepare: a bound of 2 rows, FIFO: node 7's rows go in two evictions
    store = SampleStore(_dequantize, max_samples=2, eviction="fifo")
    store.add(_rows([3, 4]))
    store.add(_rows([5], node=8))  # evicts 7's row 3
    store.add(_rows([6], node=8))  # evicts 7's row 4
    # Assert
    assert len(store) == 2 and store.evicted == 2
    assert store.received(7).tolist() == [3, 4]
    assert store.received(7).dtype == np.int64 and store.received(99).dtype == np.int64
    assert store.state()["evicted_ids"].tolist() == [3, 4]


def test_drawing_from_a_store_without_training_rows_is_refused_with_the_reason():
    empty = SampleStore(_dequantize)
    with pytest.raises(ValueError, match="^the sample store is empty$"):
        empty.draw(4, np.random.default_rng(0))
    held = SampleStore(_dequantize)
    rows = _rows([1, 2])
    held.add(StoredRows(**{**rows.__dict__, "holdout": np.array([True, True])}))
    with pytest.raises(ValueError, match="^the sample store holds only held-out rows$"):
        held.draw(4, np.random.default_rng(0))
    one = SampleStore(_dequantize)
    one.add(StoredRows(**{**rows.__dict__, "holdout": np.array([True, False])}))
    x, y, w = one.draw(4, np.random.default_rng(0))  # the one training row
    assert x.shape[0] == 1 and x[0, 0] == 2.0


def test_float64_weights_and_targets_that_no_float16_holds_are_kept_as_float32():
    rows = _rows([1, 2])
    store = SampleStore(_dequantize)
    store.add(StoredRows(**{**rows.__dict__, "weights": np.array([1 / 3, 1.0]),
                            "labels": np.array([0.1, 2.5])}))
    s = store.state()
    assert s["weights"].dtype == np.float32 and s["labels"].dtype == np.float32
    np.testing.assert_array_equal(s["weights"], np.float32([1 / 3, 1.0]))


def test_the_default_seed_is_zero():
    def evicted_ids(store):
        store.add(_rows(range(20)))
        return _ids(store)

    default = evicted_ids(SampleStore(_dequantize, max_samples=5, eviction="random"))
    assert default == evicted_ids(SampleStore(_dequantize, max_samples=5, eviction="random",
                                              seed=0))
    assert default != evicted_ids(SampleStore(_dequantize, max_samples=5, eviction="random",
                                              seed=1))


def test_the_refusal_of_a_negative_bound_says_what_it_must_be():
    with pytest.raises(ValueError, match="^max_samples must be >= 0$"):
        SampleStore(_dequantize, max_samples=-1)


def test_evicted_ids_above_float64s_integer_range_are_kept_exactly():
    huge = 2**53 + 1  # float64 rounds it to 2**53
    store = SampleStore(_dequantize, max_samples=1, eviction="fifo")
    store.add(_rows([huge]))
    store.add(_rows([huge + 2]))  # evicts huge
    store.add(_rows([5], node=8))  # evicts huge + 2: the node's evicted ids are merged
    assert store.received(7).tolist() == [huge, huge + 2]
    assert store.state()["evicted_ids"].tolist() == [huge, huge + 2]
    again = SampleStore(_dequantize, max_samples=1, eviction="fifo")
    again.load_state(store.state())
    assert again.received(7).tolist() == [huge, huge + 2]


@pytest.mark.parametrize("evictions", [0, 2])
def test_checkpoint_tables_have_fixed_dtypes_even_when_empty(evictions):
    store = SampleStore(_dequantize, max_samples=3, eviction="fifo")
    store.add(_rows(range(3 + evictions)))
    s = store.state()
    assert s["node_table"].dtype == np.uint64 and s["evicted_nodes"].dtype == np.uint64
    assert s["evicted_counts"].dtype == np.int64
    assert s["evicted_counts"].tolist() == ([evictions] if evictions else [])


def test_a_holdout_mask_given_as_ints_is_a_boolean_mask():
    rows = _rows([1, 2, 3])
    store = SampleStore(_dequantize)
    store.add(StoredRows(**{**rows.__dict__, "holdout": [0, 1, 0]}))
    assert store.holdout_mask.dtype == bool and store.holdout_mask.tolist() == [False, True,
                                                                                 False]
    drawn = {int(v) for _ in range(20) for v in store.draw(3, np.random.default_rng(_))[0][:, 0]}
    assert drawn == {1, 3}  # the held-out row is never drawn


def test_holdout_batches_come_in_chunks_of_1024_with_float32_weights_and_int64_ids():
    n = 1030
    rows = _rows(range(n))
    store = SampleStore(_dequantize)
    store.add(StoredRows(**{**rows.__dict__, "holdout": np.ones(n, dtype=bool)}))
    chunks = list(store.holdout_batches())
    assert [len(c[0]) for c in chunks] == [1024, 6]
    x, y, w, nodes, ids = chunks[1]
    assert w.dtype == np.float32 and ids.dtype == np.int64 and nodes.dtype == np.uint64
    assert ids.tolist() == list(range(1024, n))


def test_a_checkpoint_whose_evicted_tables_disagree_is_refused():
    store = SampleStore(_dequantize, max_samples=1, eviction="fifo")
    store.add(_rows([1]))
    store.add(_rows([2], node=8))  # evicts node 7's row
    store.add(_rows([3], node=9))  # evicts node 8's row
    state = store.state()
    assert state["evicted_nodes"].tolist() == [7, 8]
    bad = {**state, "evicted_counts": np.array([2], dtype=np.int64)}  # one count, two nodes
    with pytest.raises(ValueError):
        SampleStore(_dequantize, max_samples=1).load_state(bad)


def test_node_weights_give_every_row_of_a_node_its_training_rows_mean():
    store = SampleStore(_dequantize)
    store.add(_rows([0, 1, 2], node=7, weights=[1.0, 2.0, 6.0]))
    store.add(_rows([3, 4], node=8, weights=[10.0, 30.0]))
    rng = np.random.default_rng(0)
    x, _, w = store.draw(5, rng, weights="node")
    by_id = dict(zip(x[:, 0].astype(int).tolist(), w.tolist(), strict=True))
    assert by_id == {0: 3.0, 1: 3.0, 2: 3.0, 3: 20.0, 4: 20.0}
    x, _, w = store.draw(5, rng)  # importance: each row's own
    by_id = dict(zip(x[:, 0].astype(int).tolist(), w.tolist(), strict=True))
    assert by_id == {0: 1.0, 1: 2.0, 2: 6.0, 3: 10.0, 4: 30.0}


def test_holding_is_what_counts_received_and_node_weight_say():
    store = SampleStore(_dequantize, max_samples=4)
    store.add(_rows([5, 3, 9], labels=[1, 2, 1], weights=[1, 2, 3]))
    store.add(_rows([1, 2], node=8))
    store.note_received(7, np.array([11]))
    strata = np.array([1, 2])
    for node in (7, 8, 9):
        stored, received, weight = store.holding(node, strata)
        assert stored == int(store.counts(node, strata)[0].sum())
        np.testing.assert_array_equal(received, store.received(node))
        assert weight == store.node_weight(node)
    assert store.holding(7, np.array([2]))[0] == 1  # the other stratum's rows not counted
