"""The same lossless coding for every codec's payload: round trips, sizes, strict decoding."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from dq_flower.codecs import EntropyCoded, ErrorFeedback, Payload, PayloadError, lossless, make
from dq_flower.codecs.lossless import (
    CODER_META,
    LAYOUT_META,
    NBITS_META,
    STREAM,
    coder_of,
    max_raw_bytes,
    pack,
    raw_nbits,
    unpack,
)
from dq_flower.codecs.uniform import Uniform

GRADIENT_CODECS = [
    ("identity", {}), ("fp16", {}), ("qsgd", {"levels": 1, "bucket": 512}),
    ("qsgd", {"levels": 7, "bucket": 128}), ("terngrad", {}), ("sign", {}), ("ef-sign", {}),
    ("topk", {"ratio": 0.01}), ("powersgd", {"rank": 2}), ("bingrad", {}), ("orq", {}),
]


def gradient(n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * rng.lognormal(0, 1, n)).astype(np.float32)


@pytest.mark.parametrize(("name", "params"), GRADIENT_CODECS)
def test_entropy_coded_payload_decodes_to_exactly_what_the_plain_codec_decodes(name, params):
    # Prepare
    x = gradient()
    plain, coded = make(name, **params), make(name, entropy="zlib", **params)
    # Execute
    p0 = plain.encode(x, np.random.default_rng(1))
    p1 = coded.encode(x, np.random.default_rng(1))
    received = Payload.from_record(p1.to_record())
    # Assert: lossless, and never larger than the plain payload
    np.testing.assert_array_equal(coded.decode(received), plain.decode(p0))
    assert p1.nbits <= p0.nbits and raw_nbits(p1) == p0.nbits
    if coder_of(p1) == "zlib":
        assert p1.nbits == 8 * p1.buffers[STREAM].size < p0.nbits
        assert set(p1.buffers) == {STREAM} and p1.codec == name
    else:  # sent as it is: identical to the plain payload
        assert p1.nbits == p0.nbits and set(p1.buffers) == set(p0.buffers)


def test_a_low_entropy_payload_shrinks_and_an_incompressible_one_is_sent_as_is():
    x = gradient()
    qsgd2 = make("qsgd", levels=1, bucket=512, entropy="zlib").encode(x,
                                                                     np.random.default_rng(0))
    sign = make("sign", entropy="zlib").encode(x)  # random signs: nothing to gain
    assert coder_of(qsgd2) == "zlib" and qsgd2.nbits < 0.5 * raw_nbits(qsgd2)
    assert coder_of(sign) == "none" and sign.nbits == x.size


def test_make_wraps_every_codec_but_uniform_which_codes_its_own_samples():
    assert isinstance(make("qsgd", entropy="zlib"), EntropyCoded)
    assert not isinstance(make("qsgd", entropy="none"), EntropyCoded)
    u = make("uniform", bits=2, entropy="zlib")
    assert isinstance(u, Uniform) and u.entropy == "zlib"
    with pytest.raises(ValueError, match="entropy"):
        make("qsgd", entropy="gzip")
    with pytest.raises(ValueError, match="EntropyCoded wraps"):
        EntropyCoded(make("qsgd", entropy="zlib"), "zlib")


def test_error_feedback_around_an_entropy_coded_codec_keeps_its_invariant_and_state():
    # Prepare
    ef = ErrorFeedback(make("powersgd", rank=1, entropy="zlib"))
    rng = np.random.default_rng(0)
    # Execute / Assert
    for step in range(3):
        x = rng.standard_normal((40, 30)).astype(np.float32)
        e_old = np.zeros_like(x) if ef.residual is None else ef.residual.copy()
        p = ef.encode(x, rng)
        np.testing.assert_allclose(x + e_old, ef.decode(p) + ef.residual, atol=1e-5)
        assert ef.codec.biased and ef.name == "powersgd", step
    assert any(k.startswith("codec/q/") for k in ef.state_dict())  # the warm start


# ---------------------------------------------------------------------------- strict decoding
def _packed(n=4096, seed=0):
    x = gradient(n, seed)
    p = make("qsgd", levels=1, bucket=512, entropy="zlib").encode(x, np.random.default_rng(0))
    assert coder_of(p) == "zlib"
    return p


def _with(p: Payload, meta=None, buffers=None, nbits=None, shape=None) -> Payload:
    return Payload(p.codec, p.shape if shape is None else shape, {**p.meta, **(meta or {})},
                   dict(p.buffers) if buffers is None else buffers,
                   p.nbits if nbits is None else nbits)


def test_a_decompression_bomb_is_refused_before_anything_is_decompressed(monkeypatch):
    # Prepare: 64 MB of zeros compress to about 64 kB, declared as a 10-element payload
    bomb = np.frombuffer(zlib.compress(bytes(64 << 20), 9), dtype=np.uint8)
    p = Payload("qsgd", (10,), {CODER_META: "zlib", LAYOUT_META: f"codes:uint8:{64 << 20}",
                                NBITS_META: 8}, {STREAM: bomb}, nbits=8 * bomb.size)
    calls = []
    monkeypatch.setattr(lossless, "decompress", lambda *a: calls.append(a))
    # Execute / Assert
    with pytest.raises(PayloadError, match="at most"):
        unpack(p, "zlib")
    with pytest.raises(PayloadError, match="at most"):
        make("qsgd", entropy="zlib").decode(p)
    assert calls == []
    assert max_raw_bytes(10) < 64 << 20


def test_a_stream_longer_than_its_layout_is_refused_by_the_bounded_decompressor():
    p = _packed()
    layout = p.meta[LAYOUT_META]
    name, dtype, size = layout.split(";")[0].split(":")
    shorter = layout.replace(f"{name}:{dtype}:{size}", f"{name}:{dtype}:{int(size) - 1}")
    with pytest.raises(PayloadError, match="decodes to"):
        unpack(_with(p, {LAYOUT_META: shorter, NBITS_META: 8}), "zlib")


@pytest.mark.parametrize(("change", "message"), [
    ({"meta": {CODER_META: "lzma"}}, "accepts 'zlib'"),
    ({"meta": {CODER_META: "none"}}, "accepts"),
    ({"meta": {LAYOUT_META: "codes:uint8"}}, "malformed"),
    ({"meta": {LAYOUT_META: "codes:float64:4"}}, "dtype"),
    ({"meta": {LAYOUT_META: "codes:uint8:-4"}}, "size"),
    ({"meta": {LAYOUT_META: "codes:uint8:4;codes:uint8:4"}}, "buffer name"),
    ({"meta": {LAYOUT_META: ";".join(f"b{i}:uint8:1" for i in range(17))}}, "at most"),
    ({"meta": {LAYOUT_META: 7}}, "layout"),
    ({"meta": {NBITS_META: -1}}, "nbits"),
    ({"meta": {NBITS_META: 10 ** 12}}, "nbits"),
    ({"nbits": 8}, "declares"),
    ({"buffers": {STREAM: np.zeros(4, np.uint8), "extra": np.zeros(1, np.uint8)}}, "exactly"),
    ({"buffers": {STREAM: np.zeros(4, np.float32)}}, "exactly"),
    ({"buffers": {STREAM: np.frombuffer(b"not a zlib stream", np.uint8)}, "nbits": 136},
     "corrupt"),
])
def test_malformed_entropy_coded_payloads_are_refused(change, message):
    with pytest.raises(PayloadError, match=message):
        unpack(_with(_packed(), **change), "zlib")


def test_entropy_fields_without_a_coder_and_coded_payloads_for_a_plain_decoder_are_refused():
    p = _packed()
    stray = Payload(p.codec, p.shape, {LAYOUT_META: "x:uint8:1"}, {"codes": np.zeros(1, np.uint8)},
                    8)
    with pytest.raises(PayloadError, match="without a coder"):
        unpack(stray, "zlib")
    with pytest.raises(PayloadError):
        make("qsgd", levels=1, bucket=512).decode(p)  # a receiver configured without a coder


def test_pack_leaves_empty_oversized_and_already_packed_payloads_alone():
    empty = make("identity").encode(np.zeros(0, np.float32))
    assert pack(empty, "zlib") is empty
    p = _packed()
    assert pack(p, "zlib") is p
    assert pack(make("identity").encode(gradient(100)), "none").meta == {}
