"""The ``fixed_range`` option of the ``uniform`` data quantizer: codes on [0, 1], no side info."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.codecs.uniform import Uniform

MODES = {
    "stochastic": {},
    "nearest": {"stochastic": False},
    "dither": {"dither_seed": 11},
}
# the largest error per mode, in steps: stochastic rounding moves to a neighbouring level,
# nearest rounding and subtractive dither stay within half a step
MAX_ERROR_STEPS = {"stochastic": 1.0, "nearest": 0.5, "dither": 0.5}


def fixed(bits, mode="stochastic", **params):
    return make("uniform", bits=bits, fixed_range=True, **MODES[mode], **params)


def unit_batch(n, d, seed=0):
    return np.random.default_rng(seed).random((n, d), dtype=np.float32)


def altered(p, **changes):
    fields = {"codec": p.codec, "shape": p.shape, "meta": dict(p.meta),
              "buffers": dict(p.buffers), "nbits": p.nbits}
    fields.update(changes)
    return Payload(**fields)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("d", [1, 7, 16, 33])  # whole-byte rows and rows that are not
def test_round_trip_error_is_below_one_step(bits, mode, d):
    codec = fixed(bits, mode)
    x = unit_batch(21, d, seed=bits * 100 + d)
    x[0, 0], x[-1, -1] = 0.0, 1.0  # both ends of the range
    p = codec.encode(x, np.random.default_rng(bits))
    y = codec.decode(p)
    assert y.shape == x.shape and y.dtype == np.float32
    step = 1.0 / (2**bits - 1)
    err = np.abs(y.astype(np.float64) - x)
    assert err.max() <= MAX_ERROR_STEPS[mode] * step * (1 + 1e-5) + 1e-7
    assert err.max() < step  # below one step in every mode
    if mode != "dither":  # codes decode to exact levels in [0, 1]; the ends exactly
        assert y.min() >= 0.0 and y.max() <= 1.0
        assert y[0, 0] == 0.0 and y[-1, -1] == 1.0
        levels = y.astype(np.float64) * (2**bits - 1)
        np.testing.assert_allclose(levels, np.round(levels), atol=1e-4)


@pytest.mark.parametrize(("bits", "mode"), [(1, "stochastic"), (2, "stochastic"),
                                            (3, "dither"), (8, "stochastic")])
def test_unbiased_monte_carlo(bits, mode):
    """Mean over T independent codings of the same rows converges to x.

    One coding's error has mean 0 and a standard deviation of at most half a step, so the
    mean of T = 4000 codings deviates by at most ``step / (2 sqrt(T))`` in standard
    deviation; the tolerance is 6 of those (per coordinate, 120 coordinates), and the mean
    over all coordinates gets the same tolerance divided by sqrt(120). The seed is fixed,
    so the test is deterministic.
    """
    trials, n, d = 4000, 4, 30
    x = unit_batch(n, d, seed=7)
    x[0, :3] = [0.0, 1.0, 0.5]
    batch = np.tile(x, (trials, 1))  # every row coded independently (and, with dither,
    # each copy sits at a different position, so it gets a different dither offset)
    codec = fixed(bits, mode)
    y = codec.decode(codec.encode(batch, np.random.default_rng(2024)))
    mean = y.reshape(trials, n, d).astype(np.float64).mean(axis=0)
    step = 1.0 / (2**bits - 1)
    sigma = step / (2 * np.sqrt(trials))
    assert np.abs(mean - x).max() < 6 * sigma
    assert abs((mean - x).mean()) < 6 * sigma / np.sqrt(n * d)


def test_nearest_rounding_is_deterministic_and_needs_no_rng():
    x = unit_batch(5, 9)
    codec = fixed(3, "nearest")
    a, b = codec.encode(x), codec.encode(x)
    np.testing.assert_array_equal(a.buffers["codes"], b.buffers["codes"])
    np.testing.assert_array_equal(codec.decode(a), np.round(x * 7) / np.float32(7))


def test_dither_needs_no_rng_and_matches_the_seed():
    x = unit_batch(6, 10)
    p = fixed(2, "dither").encode(x)
    np.testing.assert_array_equal(p.buffers["codes"], fixed(2, "dither").encode(x).buffers["codes"])
    with pytest.raises(PayloadError, match="dither_seed"):
        make("uniform", bits=2, fixed_range=True, dither_seed=12).decode(p)


def test_stochastic_needs_an_rng():
    with pytest.raises(ValueError, match="Generator"):
        fixed(2).encode(unit_batch(2, 3))


@pytest.mark.parametrize("bits", [1, 3, 4, 8])
@pytest.mark.parametrize(("n", "d"), [(1, 1), (5, 7), (13, 64), (0, 5), (4, 0)])
def test_nbits_counts_code_bits_only(bits, n, d):
    p = fixed(bits).encode(unit_batch(n, d), np.random.default_rng(0))
    assert set(p.buffers) == {"codes"}  # no mins, no scales
    assert p.meta["fixed_range"] is True and p.meta["entropy"] == "none"
    assert p.nbits == n * d * bits
    assert p.buffers["codes"].size == -(-n * d * bits // 8)
    assert 8 * p.nbytes - 8 < p.nbits <= 8 * p.nbytes or n * d == 0
    # against the per-row ranges: exactly 64 side bits per row saved
    q = make("uniform", bits=bits).encode(unit_batch(n, d), np.random.default_rng(0))
    assert q.nbits - p.nbits == 64 * n


def test_non_fixed_payloads_keep_their_layout():
    p = make("uniform", bits=2).encode(unit_batch(3, 4), np.random.default_rng(0))
    assert "fixed_range" not in p.meta  # old layout, byte for byte
    assert set(p.buffers) == {"codes", "mins", "scales"}


def test_payload_without_the_key_means_not_fixed():
    codec = make("uniform", bits=2)
    p = codec.encode(unit_batch(3, 4), np.random.default_rng(0))
    old = altered(p, meta={k: v for k, v in p.meta.items() if k != "fixed_range"})
    np.testing.assert_array_equal(codec.decode(old), codec.decode(p))
    explicit = altered(p, meta={**p.meta, "fixed_range": False})
    np.testing.assert_array_equal(codec.decode(explicit), codec.decode(p))
    with pytest.raises(PayloadError, match="fixed_range"):
        fixed(2).decode(old)


def test_decode_refuses_a_mismatched_fixed_range():
    x = unit_batch(4, 8)
    p = fixed(2).encode(x, np.random.default_rng(0))
    with pytest.raises(PayloadError, match="fixed_range"):
        make("uniform", bits=2).decode(p)
    q = make("uniform", bits=2).encode(x, np.random.default_rng(0))
    with pytest.raises(PayloadError, match="fixed_range"):
        fixed(2).decode(q)
    for bad in [1, "true", None, 1.0]:
        with pytest.raises(PayloadError, match="fixed_range"):
            fixed(2).decode(altered(p, meta={**p.meta, "fixed_range": bad}))


def test_decode_refuses_side_buffers_on_a_fixed_range_payload():
    x = unit_batch(4, 8)
    codec = fixed(2)
    p = codec.encode(x, np.random.default_rng(0))
    side = np.zeros(4, np.float32)
    for name in ["mins", "scales"]:
        with pytest.raises(PayloadError, match=name):
            codec.decode(altered(p, buffers={**p.buffers, name: side}))
    with pytest.raises(PayloadError, match="side buffers"):
        codec.decode(altered(p, buffers={**p.buffers, "mins": side, "scales": side + 1},
                             nbits=p.nbits + 64 * 4))


def test_decode_refuses_inconsistent_fixed_range_payloads():
    codec = fixed(3)
    p = codec.encode(unit_batch(4, 7), np.random.default_rng(0))  # 84 bits: 4 padding bits
    with pytest.raises(PayloadError, match="bits"):
        codec.decode(altered(p, nbits=p.nbits + 64 * 4))  # side bits that are not there
    with pytest.raises(PayloadError, match="codes"):
        codec.decode(altered(p, shape=(400, 7)))  # declares more than it carries
    codes = p.buffers["codes"].copy()
    codes[-1] |= 1
    with pytest.raises(PayloadError, match="padding"):
        codec.decode(altered(p, buffers={"codes": codes}))
    with pytest.raises(PayloadError, match="bits"):
        fixed(4).decode(p)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("entropy", ["none", "zlib", "lzma"])
def test_record_round_trip(mode, entropy):
    codec = fixed(3, mode, entropy=entropy)
    x = unit_batch(10, 12)
    x[:5] = 0.25  # compressible half, so the entropy coder is used
    p = codec.encode(x, np.random.default_rng(0))
    rec = p.to_record()
    header = json.loads(bytes(rec["header"].data))
    assert header["meta"]["fixed_range"] is True and set(header["buffers"]) == {"codes"}
    q = Payload.from_record(rec)
    assert q.meta == p.meta and q.nbits == p.nbits and q.shape == p.shape
    np.testing.assert_array_equal(q.buffers["codes"], p.buffers["codes"])
    np.testing.assert_array_equal(codec.decode(q), codec.decode(p))


@pytest.mark.parametrize("method", ["zlib", "lzma"])
@pytest.mark.parametrize("value", [0.0, 1.0, 1 / 3])
def test_entropy_coding_shrinks_constant_data(method, value):
    n, d, bits = 64, 100, 4
    x = np.full((n, d), value, np.float32)
    codec = fixed(bits, "nearest", entropy=method)
    p = codec.encode(x)
    assert p.meta["entropy"] == method
    assert p.nbits == 8 * p.buffers["codes"].size  # no side bits either
    assert p.nbits < n * d * bits // 10
    y = codec.decode(Payload.from_record(p.to_record()))
    expected = np.float32(np.round(value * 15) / 15)
    np.testing.assert_array_equal(y, expected)


def test_random_codes_fall_back_to_raw_packing():
    codec = fixed(8, entropy="zlib")
    p = codec.encode(unit_batch(20, 50), np.random.default_rng(0))
    assert p.meta["entropy"] == "none" and p.nbits == 20 * 50 * 8
    codec.decode(p)


@pytest.mark.parametrize("mode", list(MODES))
def test_values_outside_the_range_are_clipped(mode):
    x = np.array([[-5.0, -1e-30, 0.0, 0.5, 1.0, 1.0000001, 2.0, 3e38],
                  [-3e38, 7.0, 0.25, 0.75, -0.0, 1e-45, 0.999, 100.0]], np.float32)
    codec = fixed(2, mode)
    y = codec.decode(codec.encode(x, np.random.default_rng(0)))
    clipped = np.clip(x.astype(np.float64), 0.0, 1.0)
    assert np.abs(y - clipped).max() <= MAX_ERROR_STEPS[mode] / 3 * (1 + 1e-5) + 1e-7
    if mode != "dither":
        assert y[0, 0] == 0.0 and y[0, -2] == 1.0 and y[0, -1] == 1.0
        assert y[1, 0] == 0.0 and y[1, 1] == 1.0 and y[1, -1] == 1.0


def test_non_finite_input_is_still_refused():
    x = unit_batch(2, 3)
    x[1, 1] = np.inf
    with pytest.raises(ValueError, match="NaN or inf"):
        fixed(2).encode(x, np.random.default_rng(0))


def test_parameter_validation():
    with pytest.raises(ValueError, match="per_channel"):
        make("uniform", fixed_range=True, per_channel=3)
    with pytest.raises(ValueError, match="fixed_range"):
        make("uniform", fixed_range=1)
    with pytest.raises(ValueError, match="fixed_range"):
        make("uniform", fixed_range="yes")
    assert Uniform(fixed_range=np.bool_(True)).fixed_range is True
    assert make("uniform").fixed_range is False
    assert fixed(3).fixed_step == np.float32(1 / 7)


def test_encode_refuses_non_2d_input():
    with pytest.raises(ValueError, match="2-D"):
        fixed(2).encode(np.zeros(5, np.float32), np.random.default_rng(0))


UNIT_OR_BEYOND = st.floats(-2.0, 3.0, width=32)


@pytest.mark.parametrize("mode", list(MODES))
@settings(max_examples=30, deadline=None)
@given(x=arrays(np.float32, array_shapes(min_dims=2, max_dims=2, max_side=20),
                elements=UNIT_OR_BEYOND),
       bits=st.integers(1, 8), seed=st.integers(0, 2**32 - 1))
def test_fixed_range_property(mode, x, bits, seed):
    codec = fixed(bits, mode, entropy="zlib")
    p = codec.encode(x, np.random.default_rng(seed))
    q = Payload.from_record(p.to_record())
    y = codec.decode(q)
    assert y.shape == x.shape and y.dtype == np.float32
    assert set(q.buffers) == {"codes"}
    assert q.nbits == (x.size * bits if q.meta["entropy"] == "none"
                       else 8 * q.buffers["codes"].size)
    if x.size:
        err = np.abs(y.astype(np.float64) - np.clip(x, 0.0, 1.0))
        assert err.max() <= MAX_ERROR_STEPS[mode] / (2**bits - 1) * (1 + 1e-5) + 1e-7
