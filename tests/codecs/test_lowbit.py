"""The low-precision model codecs ``int8`` and ``int4``: error bounds, sizes, bad payloads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.codecs.model import BUCKET
from dq_flower.wire.model import decode_model_payload


def _weights(size, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(size) * rng.uniform(0.01, 1.0, size)).astype(np.float32)


@pytest.mark.parametrize("name,bits", [("int8", 8), ("int4", 4)])
@pytest.mark.parametrize("size", [1, 255, 256, 257, 10_000])
def test_each_weight_is_within_half_a_step_of_its_bucket(name, bits, size):
    x = _weights(size)
    p = make(name).encode(x)
    y = make(name).decode(Payload.from_record(p.to_record()))
    assert y.shape == x.shape and y.dtype == np.float32
    padded = np.pad(x, (0, -size % BUCKET), mode="edge").reshape(-1, BUCKET)
    step = (padded.max(axis=1) - padded.min(axis=1)) / (2**bits - 1)
    bound = np.repeat(step / 2, BUCKET)[:size] * (1 + 1e-5) + 1e-7
    assert (np.abs(y - x) <= bound).all()
    # the bits: a code per weight of every (padded) bucket and a float32 min and scale
    buckets = math.ceil(size / BUCKET)
    assert p.nbits == buckets * (BUCKET * bits + 64)


def test_the_codes_keep_the_arrays_shape_and_a_constant_bucket_is_exact():
    x = np.full((3, 200), 0.25, dtype=np.float32)
    y = make("int8").roundtrip(x)
    assert y.shape == (3, 200)
    np.testing.assert_array_equal(y, x)
    assert make("int4").decode(make("int4").encode(np.zeros(0, np.float32))).shape == (0,)


def test_the_same_weights_give_the_same_payload():
    x = _weights(5000, seed=3)
    a, b = make("int8").encode(x), make("int8").encode(x.copy())
    assert a.buffers["codes"].tobytes() == b.buffers["codes"].tobytes()


@pytest.mark.parametrize("breaks", ["short codes", "no scales", "nan min", "other bits"])
def test_a_malformed_payload_is_refused(breaks):
    p = make("int8").encode(_weights(1000))
    if breaks == "short codes":
        p.buffers["codes"] = p.buffers["codes"][:-1]
    elif breaks == "no scales":
        del p.buffers["scales"]
    elif breaks == "nan min":
        p.buffers["mins"] = p.buffers["mins"].copy()
        p.buffers["mins"][0] = np.nan
    else:
        p.codec = "int4"
    with pytest.raises(PayloadError):
        make(p.codec).decode(p)


def test_a_model_payload_at_int8_decodes_to_the_receivers_size_only():
    x = _weights(3000)
    p = make("int8", entropy="zlib").encode(x)
    y = decode_model_payload(Payload.from_record(p.to_record()), 3000)
    np.testing.assert_array_equal(y, make("int8").roundtrip(x))  # zlib is lossless
    with pytest.raises(PayloadError):
        decode_model_payload(p, 2999)
