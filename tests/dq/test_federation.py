"""FederationData: what the server learned of the data, changed by its own methods only."""

import numpy as np

from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.store import RowLayout, SampleStore, StoredRows
from dq_flower.wire.dq_batch import DataSpec

SPEC = DataSpec((4,))


def _adopted(provisional: bool) -> FederationData:
    data = FederationData(num_classes=None)
    layout = RowLayout(4, 2)
    data.adopt(SPEC, 3, "feature", layout, SampleStore(layout.dequantize), provisional)
    return data


def _one_row(data: FederationData) -> None:
    assert data.store is not None
    data.store.add(StoredRows(np.zeros((1, 1), np.uint8), np.zeros((1, 0), np.float32),
                              np.zeros(1, np.int64), np.ones(1, np.float32),
                              np.full(1, 5, np.uint64), np.zeros(1, np.int64),
                              np.zeros((1, 0), np.int64)))


def test_a_spec_and_bound_learned_from_replies_are_forgotten_while_no_row_is_stored():
    data = _adopted(provisional=True)
    data.learn_bound(7.0)
    assert (data.spec, data.num_classes, data.value_bound, data.mode) == (SPEC, 3, 7.0,
                                                                          "feature")
    data.forget_unconfirmed()
    assert (data.spec, data.store, data.layout, data.num_classes, data.value_bound,
            data.mode) == (None, None, None, None, None, "sample")


def test_what_rows_confirmed_stays_and_a_given_spec_is_never_forgotten():
    data = _adopted(provisional=True)
    data.learn_bound(7.0)
    _one_row(data)
    data.forget_unconfirmed()
    assert (data.spec, data.value_bound, data.stored) == (SPEC, 7.0, 1)
    given = _adopted(provisional=False)
    given.forget_unconfirmed()
    assert given.spec == SPEC and given.store is not None


def test_duplicates_are_counted_until_the_round_takes_them():
    data = FederationData()
    data.count_duplicates(3)
    data.count_duplicates(2)
    assert data.take_duplicates() == 5 and data.take_duplicates() == 0


def test_the_state_round_trips_through_a_new_owner():
    data = _adopted(provisional=True)
    data.learn_bound(2.5)
    _one_row(data)
    copy = FederationData()

    def fix_spec(spec: DataSpec) -> None:
        layout = RowLayout(spec.dim, 2)
        copy.adopt(spec, copy.num_classes, "feature", layout, SampleStore(layout.dequantize))

    copy.load_state(data.state(), fix_spec)
    assert (copy.spec, copy.num_classes, copy.value_bound, copy.stored) == (SPEC, 3, 2.5, 1)
    assert copy.provisional == data.provisional
