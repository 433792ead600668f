"""Bits: exact ``nbits`` against hand counts, packed bytes, and the record's overhead."""

import numpy as np
import pytest
from flwr.common.serde import array_record_to_proto

from dq_flower.codecs import Payload, make

D = 1000  # gradient length for the hand counts below


def vec(n=D, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


# (codec, params, input shape, nbits by hand, bytes by hand = ceil(code bits / 8) + side)
HAND = [
    ("identity", {}, (D,), 32 * D, 4 * D),
    ("fp16", {}, (D,), 16 * D, 2 * D),
    # 7 values need 3 bits; ceil(1000 / 128) = 8 norms
    ("qsgd", {"levels": 3, "bucket": 128}, (D,), 3 * D + 32 * 8, 375 + 4 * 8),
    # 3 values need 2 bits; 20 buckets of 50
    ("qsgd", {"levels": 1, "bucket": 50}, (D,), 2 * D + 32 * 20, 250 + 4 * 20),
    # 9 values need 4 bits; one bucket
    ("qsgd", {"levels": 4, "bucket": 4096}, (D,), 4 * D + 32, 500 + 4),
    ("terngrad", {}, (D,), 2 * D + 32, 250 + 4),
    ("sign", {}, (D,), D, 125),
    ("sign", {}, (13,), 13, 2),
    ("ef-sign", {}, (D,), D + 32, 125 + 4),
    # k = 10 indices of ceil(log2 1000) = 10 bits < 1000-bit mask
    ("topk", {"ratio": 0.01}, (D,), 32 * 10 + 10 * 10, 40 + 13),
    # k = 200: 2000 index bits > 1000-bit mask
    ("topk", {"ratio": 0.2}, (D,), 32 * 200 + D, 800 + 125),
    # 1000 -> 32 x 32 (near square, 24 zeros of padding); P 32x2, Q 32x2
    ("powersgd", {"rank": 2}, (D,), 32 * 2 * (32 + 32), 4 * 2 * 64),
    ("powersgd", {"rank": 2, "shape": (10, 100)}, (D,), 32 * 2 * 110, 4 * 2 * 110),
    ("powersgd", {"rank": 3}, (40, 25), 32 * 3 * 65, 4 * 3 * 65),
    # 10 -> 4 x 3: rank 2 needs 14 floats >= 12, so it goes uncompressed
    ("powersgd", {"rank": 2}, (10,), 32 * 10, 40),
    ("bingrad", {"bucket": 128}, (D,), D + 64 * 8, 125 + 8 * 8),
    # 4 values: 2 bits; 5 values: 3 bits; (s + 1) float32 levels per bucket
    ("orq", {"levels": 3, "bucket": 128}, (D,), 2 * D + 32 * 4 * 8, 250 + 4 * 4 * 8),
    ("orq", {"levels": 4, "bucket": 128}, (D,), 3 * D + 32 * 5 * 8, 375 + 4 * 5 * 8),
    # uniform: n * d * bits + 2 float32 per row (or per row and channel)
    ("uniform", {"bits": 3}, (10, 100), 3000 + 64 * 10, 375 + 8 * 10),
    ("uniform", {"bits": 3, "per_channel": 4}, (10, 100), 3000 + 64 * 40, 375 + 8 * 40),
    ("uniform", {"bits": 1}, (3, 7), 21 + 64 * 3, 3 + 8 * 3),
    ("uniform", {"bits": 8}, (5, 16), 640 + 64 * 5, 80 + 8 * 5),
]


@pytest.mark.parametrize(("name", "params", "shape", "nbits", "nbytes"), HAND)
def test_nbits_and_bytes_match_hand_counts(name, params, shape, nbits, nbytes):
    x = vec(int(np.prod(shape))).reshape(shape)
    if name == "uniform":
        x = np.abs(x)
    p = make(name, **params).encode(x, np.random.default_rng(0))
    assert p.nbits == nbits
    assert p.nbytes == nbytes
    assert 8 * p.nbytes >= p.nbits > 8 * p.nbytes - 8  # at most 7 padding bits overall
    assert all(b.ndim == 1 for b in p.buffers.values())


def test_uniform_entropy_counts_compressed_bytes():
    x = np.zeros((100, 64), dtype=np.float32)
    x[:, :8] = np.linspace(0, 1, 8)  # mostly background
    p = make("uniform", bits=2, entropy="zlib").encode(x, np.random.default_rng(0))
    assert p.meta["entropy"] == "zlib"
    # every row spans [0, 1]: its 100 mins and scales zlib-code far below 800 bytes
    assert p.meta["ranges"] == "zlib" and set(p.buffers) == {"codes", "ranges"}
    assert p.nbits == 8 * p.buffers["codes"].size + 8 * p.buffers["ranges"].size
    assert p.buffers["ranges"].size < 100
    assert p.buffers["codes"].size < 100 * 64 * 2 // 8  # smaller than the raw packing


def wire_bytes(p):
    return array_record_to_proto(p.to_record()).ByteSize()


OVERHEAD_BOUND = 512  # bytes: JSON header + protobuf framing of at most 4 arrays


@pytest.mark.parametrize(("name", "params", "shape", "nbits", "nbytes"), HAND)
def test_record_adds_a_small_fixed_overhead(name, params, shape, nbits, nbytes):
    x = np.abs(vec(int(np.prod(shape)))).reshape(shape)
    p = make(name, **params).encode(x, np.random.default_rng(0))
    wire = wire_bytes(p)
    assert 8 * wire >= p.nbits
    assert p.nbytes < wire <= p.nbytes + OVERHEAD_BOUND


@pytest.mark.parametrize("name", ["qsgd", "sign", "orq", "topk", "bingrad", "terngrad"])
def test_record_overhead_does_not_grow_with_size(name):
    small = make(name).encode(vec(1_000), np.random.default_rng(0))
    large = make(name).encode(vec(200_000), np.random.default_rng(0))
    extra_small = wire_bytes(small) - small.nbytes
    extra_large = wire_bytes(large) - large.nbytes
    # only the decimal sizes in the header and protobuf length varints grow: a few bytes each
    assert extra_large - extra_small <= 32


def test_record_round_trip_keeps_raw_bytes():
    p = make("qsgd").encode(vec(), np.random.default_rng(0))
    rec = p.to_record()
    for name, buf in p.buffers.items():
        assert bytes(rec[name].data) == buf.tobytes()  # raw bytes, no np.save header
    q = Payload.from_record(rec)
    assert q.meta == p.meta and q.nbits == p.nbits
    for name, buf in p.buffers.items():
        np.testing.assert_array_equal(q.buffers[name], buf)
