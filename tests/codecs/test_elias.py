"""Elias gamma/delta/omega codes and QSGD's Elias coding of its levels: exact round trips."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import elias
from dq_flower.codecs import make


def bitstring(values, code):
    packed, nbits = elias.encode(np.asarray(values, dtype=np.int64), code)
    return "".join(map(str, np.unpackbits(packed)[:nbits]))


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("gamma", ["1", "010", "011", "00100", "00101"]),
        ("delta", ["1", "0100", "0101", "01100", "01101"]),
        ("omega", ["0", "100", "110", "101000", "101010"]),
    ],
)
def test_codewords_of_one_to_five_are_the_textbook_ones(code, words):
    # Act
    got = [bitstring([v], code) for v in range(1, 6)]

    # Assert
    assert got == words
    assert bitstring([1, 2, 3, 4, 5], code) == "".join(words)
    assert elias.code_lengths(np.arange(1, 6), code).tolist() == [len(w) for w in words]


def test_larger_codewords():
    assert bitstring([16], "gamma") == "000010000"
    assert bitstring([16], "delta") == "001010000"
    assert bitstring([16], "omega") == "10100100000"
    assert elias.code_lengths(np.array([elias.MAX_VALUE]), "gamma").tolist() == [105]


@pytest.mark.parametrize("code", elias.CODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_values_round_trip_and_bit_count_is_stream_length(code, seed):
    # Prepare
    rng = np.random.default_rng(seed)
    v = np.concatenate([rng.integers(1, 40, 3000), rng.geometric(0.01, 500),
                        rng.integers(1, elias.MAX_VALUE, 50, endpoint=True),
                        [1, elias.MAX_VALUE]])
    rng.shuffle(v)

    # Act
    packed, nbits = elias.encode(v, code)
    out, end = elias.decode(packed, v.size, code, 0, nbits)
    all_of_it, _ = elias.decode(packed, None, code, 0, nbits)

    # Assert
    assert nbits == int(elias.code_lengths(v, code).sum())
    assert packed.size == (nbits + 7) // 8
    assert end == nbits
    assert np.array_equal(out, v)
    assert np.array_equal(all_of_it, v)


def test_decode_from_an_offset_and_refuses_missing_codewords():
    # Prepare
    packed, nbits = elias.encode(np.array([7, 1, 300, 2]), "gamma")  # 5 + 1 + 17 + 3 bits

    # Act
    tail, end = elias.decode(packed, 2, "gamma", offset=6, nbits=nbits)

    # Assert
    assert tail.tolist() == [300, 2]
    assert end == 26 == nbits
    with pytest.raises(ValueError, match="4 valid codewords, 5 requested"):
        elias.decode(packed, 5, "gamma", 0, nbits)


@pytest.mark.parametrize("bad", [[0], [-3], [elias.MAX_VALUE + 1]])
def test_values_out_of_range_are_refused(bad):
    with pytest.raises(ValueError, match="values must lie in"):
        elias.encode(np.array(bad, dtype=np.int64))


def test_known_levels_stream():
    # bucket 4, levels [0, -2, 0, 0 | 1, 0]: one norm per bucket, then
    # gaps 2, 3 (end of bucket 0), 1, 2 (end of bucket 1), magnitudes 2, 1, signs 1, 0
    levels = np.array([0, -2, 0, 0, 1, 0])
    norms = np.array([1.5, 0.25], dtype=np.float32)

    # Act
    packed, nbits = elias.encode_levels(levels, norms, 4)

    # Assert
    bits = "".join(map(str, np.unpackbits(packed)[:nbits]))
    assert bits[64:] == "010" + "011" + "1" + "010" + "010" + "1" + "1" + "0"
    assert nbits == 64 + 16 == elias.levels_nbits(levels, 4)
    out, got_norms = elias.decode_levels(packed, nbits, 6, 4)
    assert out.tolist() == levels.tolist()
    assert got_norms.tolist() == [1.5, 0.25]


@pytest.mark.parametrize("levels", [1, 4, 7])
@pytest.mark.parametrize("codes", [("gamma", "gamma"), ("omega", "omega"), ("delta", "gamma")])
@pytest.mark.parametrize(("size", "bucket", "seed"), [(10_000, 512, 0), (777, 128, 1),
                                                       (513, 512, 2), (1, 512, 3)])
def test_qsgd_levels_round_trip(levels, codes, size, bucket, seed):
    # Prepare
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(size) * rng.lognormal(0, 1, size)).astype(np.float32)
    payload = make("qsgd", levels=levels, bucket=bucket).encode(x, rng)
    q, norms, s, b = elias.payload_levels(payload)

    # Act
    packed, nbits = elias.encode_levels(q, norms, b, *codes)
    out, got_norms = elias.decode_levels(packed, nbits, size, b, *codes)

    # Assert
    assert (s, b) == (levels, bucket)
    assert np.abs(q).max() <= levels
    assert np.array_equal(out, q)
    assert np.array_equal(got_norms, norms)
    assert nbits == elias.levels_nbits(q, b, *codes)
    assert packed.size == (nbits + 7) // 8


@pytest.mark.parametrize("size", [0, 1, 512, 1000])
def test_empty_and_all_zero_vectors(size):
    # Prepare
    q = np.zeros(size, dtype=np.int64)
    nb = -(-size // 512)
    norms = np.zeros(nb, dtype=np.float32)

    # Act
    packed, nbits = elias.encode_levels(q, norms, 512)
    out, got_norms = elias.decode_levels(packed, nbits, size, 512)

    # Assert: per bucket one norm and one gap to one past its end
    lens = [min(512, size - 512 * i) + 1 for i in range(nb)]
    assert nbits == 32 * nb + int(elias.code_lengths(np.array(lens, dtype=np.int64)).sum())
    assert out.shape == (size,) and not out.any()
    assert got_norms.shape == (nb,)


def test_a_stream_of_another_size_is_refused():
    packed, nbits = elias.encode_levels(np.array([0, 1, 0, -1]), np.ones(1, np.float32), 8)
    with pytest.raises(ValueError, match="stream"):
        elias.decode_levels(packed, nbits, 5, 8)
