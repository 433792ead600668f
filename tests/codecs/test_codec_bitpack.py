"""Bit packing: layout against an independent bit-string reference, round trips, strictness."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dq_flower.codecs import bitpack


def reference_pack(codes, bits):
    """MSB-first bit string of every code, concatenated, zero-padded to whole bytes."""
    text = "".join(format(int(c), f"0{bits}b") for c in codes)
    text += "0" * (-len(text) % 8)
    return np.array([int(text[i : i + 8], 2) for i in range(0, len(text), 8)], dtype=np.uint8)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 31, 64, 203])
def test_layout_matches_reference(bits, n):
    codes = np.random.default_rng(bits * 1000 + n).integers(0, 1 << bits, n).astype(np.uint8)
    packed = bitpack.pack(codes, bits)
    assert packed.dtype == np.uint8
    assert packed.size == (n * bits + 7) // 8 == bitpack.packed_nbytes(n, bits)
    np.testing.assert_array_equal(packed, reference_pack(codes, bits))
    np.testing.assert_array_equal(bitpack.unpack(packed, bits, n), codes)
    assert bitpack.padding_is_zero(packed, bits, n) or n == 0


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 8), data=st.data())
def test_roundtrip_property(bits, data):
    values = data.draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=300))
    codes = np.array(values, dtype=np.uint8)
    packed = bitpack.pack(codes, bits)
    assert packed.size == bitpack.packed_nbytes(len(values), bits)
    np.testing.assert_array_equal(bitpack.unpack(packed, bits, len(values)), codes)
    table = np.arange(1 << bits, dtype=np.float32) * 0.5 - 3
    np.testing.assert_array_equal(
        bitpack.unpack_to(packed, bits, len(values), table), table[codes]
    )


@settings(max_examples=40, deadline=None)
@given(bits=st.integers(1, 32), data=st.data())
def test_wide_roundtrip_property(bits, data):
    values = data.draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=200))
    arr = np.array(values, dtype=np.int64)
    packed = bitpack.pack_wide(arr, bits)
    assert packed.size == bitpack.packed_nbytes(len(values), bits)
    np.testing.assert_array_equal(bitpack.unpack_wide(packed, bits, len(values)), arr)


def test_wide_layout_matches_reference():
    vals = np.array([5, 1023, 0, 77], dtype=np.int64)
    expected = reference_pack(vals, 10)
    np.testing.assert_array_equal(bitpack.pack_wide(vals, 10), expected)


@pytest.mark.parametrize("bits", [0, 9, -1, 2.0, True])
def test_bad_width_names_bits(bits):
    with pytest.raises(ValueError, match="bits"):
        bitpack.pack(np.zeros(3, np.uint8), bits)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_unpack_refuses_wrong_length(bits):
    packed = bitpack.pack(np.ones(20, np.uint8), bits)
    with pytest.raises(ValueError, match="bytes"):
        bitpack.unpack(packed[:-1], bits, 20)
    with pytest.raises(ValueError, match="bytes"):
        bitpack.unpack(np.concatenate([packed, packed[:1]]), bits, 20)


def test_unpack_to_writes_into_out():
    codes = np.arange(16, dtype=np.uint8) % 4
    out = np.empty(16, np.float32)
    res = bitpack.unpack_to(bitpack.pack(codes, 2), 2, 16, np.array([1, 2, 3, 4]), out=out)
    assert res is out
    np.testing.assert_array_equal(out, codes + 1)


def test_padding_detection():
    packed = bitpack.pack(np.ones(3, np.uint8), 1)  # 0b11100000
    assert bitpack.padding_is_zero(packed, 1, 3)
    assert not bitpack.padding_is_zero(packed | np.uint8(1), 1, 3)
