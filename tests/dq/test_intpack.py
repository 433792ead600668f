import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dq_flower.codecs.intpack import pack_uint, uint_nbytes, unpack_uint, width_for


@given(st.integers(1, 32), st.lists(st.integers(0, 2**32 - 1), max_size=50))
def test_round_trip(width, values):
    vals = np.array([v % (1 << width) for v in values], dtype=np.int64)
    packed = pack_uint(vals, width)
    assert packed.size == uint_nbytes(vals.size, width)
    np.testing.assert_array_equal(unpack_uint(packed, width, vals.size), vals)


def test_width_and_errors():
    assert width_for(1) == 1 and width_for(2) == 1 and width_for(3) == 2 and width_for(1024) == 10
    with pytest.raises(ValueError, match="fit"):
        pack_uint(np.array([8]), 3)
    with pytest.raises(ValueError, match="bytes"):
        unpack_uint(np.zeros(3, dtype=np.uint8), 10, 4)
