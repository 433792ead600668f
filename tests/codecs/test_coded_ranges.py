"""The ``uniform`` quantizer's coded per-row ranges: lossless, counted, refused when malformed."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from dq_flower.codecs import PayloadError, make
from dq_flower.codecs.uniform import expand_ranges, plain_payload


def images(n: int = 40, d: int = 64, seed: int = 0) -> np.ndarray:
    """Rows that all span [0, 255], as Fashion-MNIST's do."""
    x = np.random.default_rng(seed).integers(0, 256, size=(n, d)).astype(np.float32)
    x[:, 0], x[:, 1] = 0.0, 255.0
    return x


@pytest.mark.parametrize("entropy", ["zlib", "context"])
@pytest.mark.parametrize("per_channel", [0, 2])
def test_coded_ranges_decode_exactly_what_raw_ranges_decode(entropy, per_channel):
    x = images()
    if per_channel:
        x[:, 32], x[:, 33] = 0.0, 255.0  # the second channel spans [0, 255] too
    coded = make("uniform", bits=3, entropy=entropy, per_channel=per_channel)
    p = coded.encode(x, np.random.default_rng(1))
    assert p.meta["ranges"] == "zlib" and "mins" not in p.buffers
    # the same quantizer without any coder sends the ranges raw: same codes, same rows
    raw = make("uniform", bits=3, per_channel=per_channel).encode(x, np.random.default_rng(1))
    rows = 40 * max(per_channel, 1)
    assert p.nbits == 8 * (p.buffers["codes"].size + p.buffers["ranges"].size)
    assert 8 * p.buffers["ranges"].size < 64 * rows  # smaller than the raw ranges
    np.testing.assert_array_equal(coded.decode(p), raw_decoder(3, per_channel).decode(raw))
    expanded = expand_ranges(p, rows)
    np.testing.assert_array_equal(expanded.buffers["mins"], raw.buffers["mins"])
    np.testing.assert_array_equal(expanded.buffers["scales"], raw.buffers["scales"])
    assert expanded.nbits == p.nbits - 8 * p.buffers["ranges"].size + 64 * rows


def raw_decoder(bits: int, per_channel: int):
    return make("uniform", bits=bits, per_channel=per_channel)


def test_ranges_stay_raw_without_a_coder_or_where_coding_would_not_shrink_them():
    x = images()
    p = make("uniform", bits=2).encode(x, np.random.default_rng(0))
    assert "ranges" not in p.meta and {"mins", "scales"} <= set(p.buffers)
    one = np.random.default_rng(0).normal(size=(1, 64)).astype(np.float32)  # 8 bytes of ranges
    q = make("uniform", bits=2, entropy="zlib").encode(one, np.random.default_rng(0))
    assert "ranges" not in q.meta and q.nbits % 8 == 0


def test_the_plain_payload_carries_raw_ranges_and_decodes_identically():
    x = images()
    p = make("uniform", bits=2, entropy="context").encode(x, np.random.default_rng(0))
    plain = plain_payload(p, 2)
    assert "ranges" not in plain.meta and {"mins", "scales"} <= set(plain.buffers)
    decoder = make("uniform", bits=2, entropy="context")
    np.testing.assert_array_equal(decoder.decode(plain), decoder.decode(p))


def _with(p, buffers=None, meta=None):
    return dataclasses.replace(p, buffers={**p.buffers, **(buffers or {})},
                               meta={**p.meta, **(meta or {})})


@pytest.mark.parametrize(("change", "message"), [
    (lambda p: _with(p, buffers={"ranges": np.frombuffer(zlib.compress(bytes(8 * 39)),
                                                          dtype=np.uint8)}), "expected 320"),
    (lambda p: _with(p, buffers={"ranges": np.frombuffer(zlib.compress(bytes(8 * 41)),
                                                          dtype=np.uint8)}), "expected 320"),
    (lambda p: _with(p, buffers={"ranges": np.frombuffer(
        zlib.compress(np.full(80, np.nan, np.float32).tobytes()), dtype=np.uint8)}),
     "NaN or inf"),
    (lambda p: _with(p, buffers={"mins": np.zeros(40, np.float32)}), "both coded ranges"),
    (lambda p: _with(p, meta={"ranges": "lzma"}), "ranges coder"),
    (lambda p: _with(p, buffers={"ranges": p.buffers["ranges"][:-3]}), "zlib"),
    (lambda p: _with(p, buffers={"ranges": p.buffers["ranges"].astype(np.float32)}),
     "flat uint8"),
    (lambda p: dataclasses.replace(p, meta={k: v for k, v in p.meta.items()
                                            if k != "ranges"}), "does not name"),
])
def test_malformed_coded_ranges_are_refused_with_a_reason(change, message):
    p = make("uniform", bits=2, entropy="zlib").encode(images(), np.random.default_rng(0))
    assert p.meta["ranges"] == "zlib"
    with pytest.raises(PayloadError, match=message):
        make("uniform", bits=2, entropy="zlib").decode(change(p))


def test_a_fixed_range_decoder_refuses_coded_ranges():
    p = make("uniform", bits=2, entropy="zlib").encode(images(), np.random.default_rng(0))
    with pytest.raises(PayloadError, match="fixed"):
        make("uniform", bits=2, entropy="zlib", fixed_range=True).decode(p)


def test_a_wrong_nbits_is_refused_with_coded_ranges():
    p = make("uniform", bits=2, entropy="zlib").encode(images(), np.random.default_rng(0))
    with pytest.raises(PayloadError, match="declares"):
        make("uniform", bits=2, entropy="zlib").decode(dataclasses.replace(p, nbits=p.nbits + 8))
