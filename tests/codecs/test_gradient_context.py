"""``entropy="context"`` for gradient codecs: exact, strict, bounded, never above zlib."""

import numpy as np
import pytest

from dq_flower.baselines.config import GradientConfig
from dq_flower.codecs import Payload, PayloadError, coder_for, make, symbols
from dq_flower.codecs.context_coded import ContextCoded
from dq_flower.codecs.lossless import NBITS_META, STREAM, coder_of
from dq_flower.wire.model import decode_model_payload

SIZES = (0, 1, 7, 8, 9, 100, 1000, 20_000)
ALPHABETS = (2, 3, 15, 255, 256)


def _codes(rng, size, alphabet, skew):
    if skew:  # mostly one symbol, as QSGD's and TernGrad's codes are
        return np.minimum(rng.geometric(0.7, size) - 1, alphabet - 1).astype(np.uint8)
    return rng.integers(0, alphabet, size).astype(np.uint8)


def _sparse(size, seed=0):
    """A gradient-like vector: heavy-tailed, a fifth exact zeros."""
    rng = np.random.default_rng(seed)
    v = (rng.standard_t(3, size) * rng.lognormal(0, 1, size)).astype(np.float32)
    v[rng.random(size) < 0.2] = 0
    return v


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("alphabet", ALPHABETS)
@pytest.mark.parametrize("skew", [True, False])
def test_symbols_round_trip(size, alphabet, skew):
    codes = _codes(np.random.default_rng(size * 1000 + alphabet), size, alphabet, skew)
    stream = symbols.encode(codes, alphabet)
    assert stream.dtype == np.uint8 and stream.size % 4 == 0
    np.testing.assert_array_equal(symbols.decode(stream, alphabet, size), codes)


def test_symbols_near_order0_entropy():
    """Skewed codes cost within 2 % of their empirical entropy (plus the head)."""
    codes = _codes(np.random.default_rng(3), 200_000, 3, True)
    counts = np.bincount(codes)
    h0 = -(counts * np.log2(counts / codes.size)).sum()
    bits = 8 * symbols.encode(codes, 3).size
    assert h0 < bits < 1.02 * h0 + 64


def test_symbols_refuse_bad_streams():
    codes = _codes(np.random.default_rng(1), 5000, 15, True)
    stream = symbols.encode(codes, 15)
    cases = {
        "truncated": stream[:-4],
        "extra word": np.concatenate([stream, np.array([1, 0, 0, 0], np.uint8)]),
        "not words": stream[:-1],
        "empty": stream[:0],
    }
    for name, bad in cases.items():
        with pytest.raises(PayloadError):
            symbols.decode(bad, 15, 5000)
        assert name
    with pytest.raises(PayloadError, match="made for"):
        symbols.decode(stream, 15, 4999)  # another count
    with pytest.raises(PayloadError, match="made for"):
        symbols.decode(stream, 16, 5000)  # another alphabet
    with pytest.raises(PayloadError, match="cannot hold"):  # refused before decoding
        symbols.decode(stream[:8], 15, symbols.MAX_CODES_PER_BYTE * 8 + 1)
    with pytest.raises(PayloadError, match="alphabet"):
        symbols.decode(stream, 1, 5000)
    rng = np.random.default_rng(2)
    for _ in range(30):  # seeded single-byte corruptions
        bad = stream.copy()
        i = int(rng.integers(bad.size))
        bad[i] ^= np.uint8(1 + rng.integers(255))
        with pytest.raises(PayloadError):
            symbols.decode(bad, 15, 5000)


def test_symbols_encoder_refuses_bad_codes():
    with pytest.raises(ValueError, match="lie in"):
        symbols.encode(np.array([0, 3], np.uint8), 3)
    with pytest.raises(ValueError, match="alphabet"):
        symbols.encode(np.zeros(4, np.uint8), 257)


CODECS = [("qsgd", {"levels": 1, "bucket": 512}), ("qsgd", {"levels": 7, "bucket": 128}),
          ("qsgd", {"levels": 127, "bucket": 64}), ("terngrad", {}),
          ("terngrad", {"clip": 2.5})]


@pytest.mark.parametrize(("name", "params"), CODECS)
@pytest.mark.parametrize("size", [1, 5, 300, 40_000])
def test_context_payload_round_trip_and_size(name, params, size):
    """Decodes as the zlib payload does; never larger than zlib; says its coder."""
    x = _sparse(size, seed=size)
    ctx, zl = make(name, entropy="context", **params), make(name, entropy="zlib", **params)
    p = ctx.encode(x, np.random.default_rng(7))
    q = zl.encode(x, np.random.default_rng(7))
    got = ctx.decode(Payload.from_record(p.to_record()))
    np.testing.assert_array_equal(got, zl.decode(q))
    assert p.nbits <= q.nbits
    assert coder_of(p) in ("context", "zlib", "none")
    if size == 40_000:  # long sparse messages: the symbol model wins
        assert coder_of(p) == "context" and p.nbits < 0.95 * q.nbits
        assert p.meta[NBITS_META] == make(name, **params).encode(
            x, np.random.default_rng(7)).nbits
    if coder_of(p) != "context":  # the fallback decodes under context too
        np.testing.assert_array_equal(ctx.decode(q), got)


@pytest.mark.parametrize("name", ["sign", "ef-sign", "topk", "fp16", "identity", "orq"])
def test_codecs_without_a_symbol_model_are_zlib_coded(name):
    codec = make(name, entropy="context")  # the registry chooses zlib for it
    assert coder_for(name, "context") == "zlib" and codec == make(name, entropy="zlib")
    x = _sparse(20_000)
    p = codec.encode(x, np.random.default_rng(0))
    q = make(name, entropy="zlib").encode(x, np.random.default_rng(0))
    assert coder_of(p) == coder_of(q) and p.nbits == q.nbits
    np.testing.assert_array_equal(codec.decode(p), make(name).decode(
        make(name).encode(x, np.random.default_rng(0))))


def _coded():
    codec = make("qsgd", levels=1, bucket=512, entropy="context")
    p = codec.encode(_sparse(40_000), np.random.default_rng(0))
    assert coder_of(p) == "context"
    return codec, p


def _with(p, meta=None, buffers=None, nbits=None, shape=None):
    return Payload(p.codec, p.shape if shape is None else shape,
                   {**p.meta, **(meta or {})}, buffers or dict(p.buffers),
                   nbits=p.nbits if nbits is None else nbits)


def test_context_payload_is_strict():
    codec, p = _coded()
    stream = p.buffers[STREAM]
    bad = {
        "flipped byte": _with(p, buffers={**p.buffers, STREAM: stream ^ np.uint8(
            np.arange(stream.size) == stream.size // 2)}),
        "truncated": _with(p, buffers={**p.buffers, STREAM: stream[:-4]},
                           nbits=p.nbits - 32),
        "nbits": _with(p, nbits=p.nbits + 8),
        "original nbits": _with(p, meta={NBITS_META: p.meta[NBITS_META] + 1}),
        "extra buffer": _with(p, buffers={**p.buffers, "x": np.zeros(4, np.uint8)},
                              nbits=p.nbits + 32),
        "no norms": _with(p, buffers={STREAM: stream}, nbits=8 * stream.size),
        "huge shape": _with(p, shape=(1 << 30,)),
    }
    for name, payload in bad.items():
        with pytest.raises(PayloadError):
            codec.decode(payload)
        assert name
    with pytest.raises(PayloadError, match="accepts 'zlib'"):
        make("qsgd", levels=1, bucket=512, entropy="zlib").decode(p)
    with pytest.raises(PayloadError):  # another alphabet (and levels)
        make("qsgd", levels=2, bucket=512, entropy="context").decode(p)
    with pytest.raises(PayloadError, match="entropy-coded with 'context'.*accepts 'zlib'"):
        make("sign", entropy="context").decode(Payload("sign", p.shape, p.meta, p.buffers,
                                                       nbits=p.nbits))


def test_gradient_config_states_the_coder():
    """``context`` stays for qsgd/terngrad uploads, is zlib for the others; downlink zlib."""
    assert GradientConfig(codec="qsgd", entropy_coder="context").entropy_coder == "context"
    assert isinstance(GradientConfig(codec="terngrad", entropy_coder="context").make_codec(),
                      ContextCoded)
    assert GradientConfig(codec="sign", entropy_coder="context").coder == "zlib"
    w = _sparse(5000)
    model = make("identity", entropy="context").encode(w)
    assert coder_of(model) == "zlib"
    np.testing.assert_array_equal(decode_model_payload(model, 5000, "context"), w)
