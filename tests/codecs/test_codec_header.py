"""Hardened record parsing (``Payload.from_record``) and the pre-decode size guard."""

import contextlib
import json
import math
import time
import tracemalloc

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dq_flower.codecs import Payload, PayloadError, make, names
from dq_flower.codecs.bitpack import pack_wide
from dq_flower.codecs.payload import MAX_ELEMENTS, MAX_HEADER_BYTES, MAX_HEADER_DEPTH
from dq_flower.codecs.topk import TopK


def raw(data, dtype="uint8"):
    itemsize = np.dtype(dtype).itemsize
    return Array(dtype=dtype, shape=(len(data) // itemsize,), stype="raw", data=bytes(data))


def record_with_header(header, buffers=None):
    """An ArrayRecord with ``header`` (bytes, or an object to serialise) and raw buffers."""
    data = header if isinstance(header, bytes) else json.dumps(header).encode()
    arrays = {"header": raw(data)}
    for name, buf in (buffers or {}).items():
        arrays[name] = raw(buf.tobytes(), str(buf.dtype))
    return ArrayRecord(arrays)


def sample_payloads():
    x = np.linspace(-1, 1, 60, dtype=np.float32)
    rng = np.random.default_rng(0)
    out = [make(name).encode(x, rng) for name in ["sign", "qsgd", "topk", "powersgd", "orq"]]
    out.append(make("uniform", bits=3).encode(x.reshape(6, 10), rng))
    out.append(make("uniform", bits=2, fixed_range=True, entropy="zlib").encode(
        np.zeros((6, 10), np.float32), rng))
    return out


SAMPLES = sample_payloads()


def header_of(p):
    return json.loads(bytes(p.to_record()["header"].data))


def parse_only_payload_errors(rec):
    """Parse ``rec``; when it parses, decode it too: only PayloadError may come out."""
    try:
        p = Payload.from_record(rec)
    except PayloadError:
        return None
    for n in (0, 60, MAX_ELEMENTS):
        with contextlib.suppress(PayloadError):
            p.expect_elements(n)
    if p.codec in names():
        with contextlib.suppress(PayloadError):
            make(p.codec).decode(p)
    return p


# ------------------------------------------------------------------------ nesting depth
def test_real_headers_are_shallow():
    depth = max(_depth(header_of(p)) for p in SAMPLES)
    assert depth == 3  # header object, 'buffers' object, one [dtype, size] pair
    assert depth < MAX_HEADER_DEPTH


def _depth(obj):
    if isinstance(obj, dict):
        return 1 + max((_depth(v) for v in obj.values()), default=0)
    if isinstance(obj, list):
        return 1 + max((_depth(v) for v in obj), default=0)
    return 0


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deeply_nested_header_is_refused(opener):
    closer = "]" if opener == "[" else "}"
    depth = 1100
    nested = opener * depth + "1" + closer * depth
    head = ('{"codec":"sign","version":1,"shape":[4],"nbits":4,"buffers":{},"meta":{"x":'
            + nested + "}}").encode()
    assert len(head) < MAX_HEADER_BYTES
    with pytest.raises(PayloadError, match="nests"):
        Payload.from_record(record_with_header(head))


@pytest.mark.parametrize("head", [b"[" * 2000, b"{" * 30000, b'{"a":' * 10000,
                                  b"[" * 9, b"[" * 60000])
def test_unclosed_nesting_is_refused(head):
    with pytest.raises(PayloadError):
        Payload.from_record(record_with_header(head))


def test_depth_limit_is_exact_and_ignores_brackets_in_strings():
    base = header_of(SAMPLES[0])
    ok = dict(base, extra=json.loads("[" * (MAX_HEADER_DEPTH - 1) + "]" * (MAX_HEADER_DEPTH - 1)))
    Payload.from_record(record_with_header(ok, SAMPLES[0].buffers))  # unknown keys are ignored
    deep = dict(base, extra=json.loads("[" * MAX_HEADER_DEPTH + "]" * MAX_HEADER_DEPTH))
    with pytest.raises(PayloadError, match="nests"):
        Payload.from_record(record_with_header(deep, SAMPLES[0].buffers))
    # brackets and escaped quotes inside strings are text, not nesting
    text = dict(base, meta={"note": '\\"[[[[[[[[[[{{{{{{{{{{\\"' * 50})
    q = Payload.from_record(record_with_header(text, SAMPLES[0].buffers))
    assert q.meta["note"].startswith('\\"[[[')


@pytest.mark.parametrize("unit", [b'"\\', b'\\"', b'"', b'"a\\"[{', b"[", b'"\\u"'])
def test_depth_scan_is_linear_on_pathological_text(unit):
    head = unit * (MAX_HEADER_BYTES // len(unit))
    start = time.perf_counter()
    with pytest.raises(PayloadError):
        Payload.from_record(record_with_header(head))
    assert time.perf_counter() - start < 1.0  # a quadratic scan takes many seconds here


# ----------------------------------------------------------------- malformed JSON text
@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (b"", "JSON"),
        (b"\xff\xfe{}", "JSON"),
        (b'{"codec": "sign"', "JSON"),
        (b'{"codec": "sign"}}', "JSON"),
        (b"[1, 2]", "object"),
        (b'"header"', "object"),
        (b"null", "object"),
        (b'{"codec":"sign","version":1,"shape":[NaN],"meta":{},"nbits":0,"buffers":{}}',
         "non-finite"),
        (b'{"codec":"sign","version":1,"shape":[1],"meta":{"a":-Infinity},"nbits":1,'
         b'"buffers":{}}', "non-finite"),
        (b'{"codec":"sign","version":1,"shape":[1],"meta":{"a":1e400},"nbits":1,"buffers":{}}',
         "overflows"),
        (b'{"codec":"sign","codec":"qsgd","version":1,"shape":[1],"meta":{},"nbits":1,'
         b'"buffers":{}}', "repeats"),
        (b'{"codec":"sign","version":1,"shape":[' + b"9" * 5000 + b'],"meta":{},"nbits":1,'
         b'"buffers":{}}', "JSON"),
        (b'{"codec":"sign","version":1,"shape":[1],"meta":{},"nbits":1,"buffers":{}}\x00',
         "JSON"),
    ],
)
def test_malformed_json_is_refused(head, reason):
    with pytest.raises(PayloadError, match=reason):
        Payload.from_record(record_with_header(head))


def test_oversized_header_is_refused():
    head = b'{"codec":"' + b"a" * MAX_HEADER_BYTES + b'"}'
    with pytest.raises(PayloadError, match="too large"):
        Payload.from_record(record_with_header(head))


# ------------------------------------------------------------- fields of the wrong type
GOOD = header_of(SAMPLES[0])  # sign: {"bits": [uint8, 8]}
GOOD_BUFFERS = SAMPLES[0].buffers


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"version": True}, "version"),
        ({"version": 1.0}, "version"),
        ({"version": "1"}, "version"),
        ({"version": 2}, "version"),
        ({"codec": 5}, "codec"),
        ({"codec": ""}, "codec"),
        ({"codec": ["sign"]}, "codec"),
        ({"shape": [60.0]}, "shape"),
        ({"shape": ["60"]}, "shape"),
        ({"shape": [True]}, "shape"),
        ({"shape": [-1]}, "shape"),
        ({"shape": 60}, "shape"),
        ({"shape": {"0": 60}}, "shape"),
        ({"shape": [[60]]}, "shape"),
        ({"shape": [1] * 9}, "shape"),
        ({"shape": [1 << 20, 1 << 20]}, "exceeds"),
        ({"meta": []}, "meta"),
        ({"meta": "levels"}, "meta"),
        ({"meta": {"levels": [7]}}, "meta"),
        ({"meta": {"levels": {"v": 7}}}, "meta"),
        ({"nbits": -1}, "nbits"),
        ({"nbits": 60.0}, "nbits"),
        ({"nbits": "60"}, "nbits"),
        ({"nbits": None}, "nbits"),
        ({"buffers": []}, "buffers"),
        ({"buffers": {"bits": "uint8"}}, "malformed"),
        ({"buffers": {"bits": ["uint8"]}}, "malformed"),
        ({"buffers": {"bits": ["uint8", 8, 0]}}, "malformed"),
        ({"buffers": {"bits": [["uint8"], 8]}}, "malformed"),
        ({"buffers": {"bits": [{"u": 8}, 8]}}, "malformed"),
        ({"buffers": {"bits": [None, 8]}}, "malformed"),
        ({"buffers": {"bits": ["object", 8]}}, "dtype"),
        ({"buffers": {"bits": ["uint8", "8"]}}, "size"),
        ({"buffers": {"bits": ["uint8", 8.0]}}, "size"),
        ({"buffers": {"bits": ["uint8", -8]}}, "size"),
        ({"buffers": {"bits": ["uint8", True]}}, "size"),
        ({"buffers": {"bits": ["uint8", 1 << 40]}}, "size"),
        ({"buffers": {"bits": ["uint8", 9]}}, "bytes"),
        ({"buffers": {"bits": ["float32", 2]}}, "float32"),
        ({"buffers": {"bits": ["uint8", 8], "more": ["uint8", 1]}}, "missing"),
        ({"buffers": {}}, "undeclared"),
        ({"buffers": {"bits": ["uint8", 8], "header": ["uint8", 1]}}, "header"),
    ],
)
def test_wrongly_typed_fields_are_refused(change, reason):
    with pytest.raises(PayloadError, match=reason):
        Payload.from_record(record_with_header({**GOOD, **change}, GOOD_BUFFERS))


@pytest.mark.parametrize("key", ["codec", "version", "shape", "meta", "nbits", "buffers"])
def test_missing_keys_are_refused(key):
    head = {k: v for k, v in GOOD.items() if k != key}
    with pytest.raises(PayloadError, match="misses"):
        Payload.from_record(record_with_header(head, GOOD_BUFFERS))


def test_the_good_header_parses():
    p = Payload.from_record(record_with_header(GOOD, GOOD_BUFFERS))
    assert p.codec == "sign" and p.shape == (60,) and p.nbits == 60


class FakeArray:
    def __init__(self, dtype="uint8", data=b"{}"):
        self.dtype, self.data = dtype, data


@pytest.mark.parametrize(
    "record",
    [
        None,
        5,
        "header",
        [("header", 1)],
        {"header": 5},
        {"header": FakeArray(data=5)},
        {"header": FakeArray(data="{}")},
        {"header": FakeArray(dtype="float32")},
        {1: FakeArray()},
        {"other": FakeArray()},
    ],
)
def test_foreign_records_are_refused(record):
    with pytest.raises(PayloadError):
        Payload.from_record(record)


def test_buffer_entries_that_are_not_arrays_are_refused():
    good = GOOD_BUFFERS["bits"].tobytes()
    head = json.dumps(GOOD).encode()
    for bits in [5, FakeArray(data=None), FakeArray(dtype="uint8", data=list(good))]:
        with pytest.raises(PayloadError, match="bits"):
            Payload.from_record({"header": FakeArray(data=head), "bits": bits})
    p = Payload.from_record({"header": FakeArray(data=head), "bits": FakeArray(data=good)})
    assert p.codec == "sign"


def test_to_record_refuses_a_buffer_named_header():
    p = Payload("sign", (8,), {}, {"header": np.zeros(1, np.uint8)}, nbits=8)
    with pytest.raises(ValueError, match="header"):
        p.to_record()


# --------------------------------------------------------------------------- fuzzing
JSON_SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12,
)
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@FUZZ
@given(data=st.binary(max_size=400))
def test_fuzz_arbitrary_header_bytes(data):
    parse_only_payload_errors(record_with_header(data, SAMPLES[0].buffers))


@FUZZ
@given(index=st.integers(0, len(SAMPLES) - 1), data=st.data())
def test_fuzz_mutated_headers(index, data):
    p = SAMPLES[index]
    head = bytearray(json.dumps(header_of(p)).encode())
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(0, len(head) - 1)))
        if op == "flip" and head:
            head[pos] = data.draw(st.sampled_from(b'[]{}",:0123456789-.eEtfnul \\x'))
        elif op == "insert":
            head[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
        elif head:
            del head[pos]
    parse_only_payload_errors(record_with_header(bytes(head), p.buffers))


@FUZZ
@given(index=st.integers(0, len(SAMPLES) - 1),
       key=st.sampled_from(["codec", "version", "shape", "meta", "nbits", "buffers", "extra"]),
       value=JSON_VALUES, data=st.data())
def test_fuzz_header_fields(index, key, value, data):
    p = SAMPLES[index]
    head = header_of(p)
    if data.draw(st.booleans()) and isinstance(head.get(key), dict) and head[key]:
        sub = data.draw(st.sampled_from(sorted(head[key])))  # one meta value or buffer spec
        head[key][sub] = value
    else:
        head[key] = value
    text = json.dumps(head, allow_nan=True).encode()  # may write NaN/Infinity: refused
    parse_only_payload_errors(record_with_header(text, p.buffers))


@FUZZ
@given(shape=st.lists(st.integers(0, 2**33), max_size=3),
       codec=st.sampled_from(["topk", "powersgd", "uniform", "sign", "qsgd", "identity"]),
       nbits=st.integers(0, 2**36), data=st.data())
def test_fuzz_declared_sizes_never_allocate(shape, codec, nbits, data):
    """Consistent-looking headers with lying sizes: refused, without large allocations."""
    meta = {"k": data.draw(st.integers(0, 2**31)), "mode": data.draw(st.sampled_from(
        ["index", "mask"])), "rows": data.draw(st.integers(0, 2**20)),
        "cols": data.draw(st.integers(0, 2**20)), "rank": 2, "compressed": True,
        "bits": 2, "per_channel": 0, "dither_seed": None, "entropy": "none",
        "levels": 7, "bucket": 128}
    buffers = {name: np.zeros(3, dtype) for name, dtype in
               [("values", "float32"), ("where", "uint8"), ("p", "float32"), ("q", "float32"),
                ("codes", "uint8"), ("bits", "uint8"), ("norms", "float32")]}
    head = {"codec": codec, "version": 1, "shape": shape, "meta": meta, "nbits": nbits,
            "buffers": {k: [str(v.dtype), 3] for k, v in buffers.items()}}
    tracemalloc.start()
    try:
        parse_only_payload_errors(record_with_header(head, buffers))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 22


# ------------------------------------------------------------------ the size guard
def test_expect_elements_accepts_the_right_count():
    for p in SAMPLES:
        p.expect_elements(60)
        q = Payload.from_record(p.to_record())
        q.expect_elements(60)
        with pytest.raises(PayloadError, match="61"):
            q.expect_elements(61)


def test_expect_elements_validates_its_argument_and_the_shape():
    p = SAMPLES[0]
    for bad in [-1, True, 1.5, "60", None]:
        with pytest.raises(ValueError, match="n must be"):
            p.expect_elements(bad)
    p.expect_elements(np.int64(60))
    for shape in [None, 60, ("60",), (1 << 20, 1 << 20)]:
        with pytest.raises(PayloadError):
            Payload("sign", shape, {}, {}, 0).expect_elements(60)
    Payload("sign", (), {}, {}, 0).expect_elements(1)  # a scalar holds one element
    Payload("sign", (3, 0), {}, {}, 0).expect_elements(0)


def lying_topk(size=1 << 31, ratio=0.01):
    codec = TopK(ratio=ratio)
    k, mode, nbits = codec.layout(size)
    buffers = {"values": np.ones(3, np.float32), "where": np.zeros(3, np.uint8)}
    return codec, Payload("topk", (size,), {"k": k, "mode": mode}, buffers, nbits=nbits)


def lying_powersgd(shape=(1 << 31,), rank=2):
    codec = make("powersgd", rank=rank)
    rows, cols, r, compressed = codec.layout(shape)
    meta = {"rows": rows, "cols": cols, "rank": r, "compressed": compressed}
    if compressed:
        buffers = {"p": np.ones(4, np.float32), "q": np.ones(4, np.float32)}
    else:
        buffers = {"values": np.ones(4, np.float32)}
    return codec, Payload("powersgd", shape, meta, buffers, nbits=codec.nbits_for(shape))


LYING = {
    "topk-index": lambda: lying_topk(),
    "topk-mask": lambda: lying_topk(ratio=0.5),
    "topk-2**28": lambda: lying_topk(size=1 << 28, ratio=1e-3),
    "powersgd-vector": lambda: lying_powersgd(),
    "powersgd-matrix": lambda: lying_powersgd((1 << 16, 1 << 15)),
    "powersgd-uncompressed": lambda: lying_powersgd((1 << 29, 4), rank=4),
}


@pytest.mark.parametrize("case", list(LYING))
def test_size_guard_refuses_a_huge_declared_shape(case):
    _, p = LYING[case]()
    q = Payload.from_record(p.to_record())  # the header alone is well formed
    assert math.prod(q.shape) >= 1 << 28
    with pytest.raises(PayloadError, match=r"1000\b") as info:
        q.expect_elements(1000)
    assert str(math.prod(q.shape)) in str(info.value)


@pytest.mark.parametrize("case", list(LYING))
def test_lying_payload_is_refused_without_allocating(case):
    """Decoding without the guard: refused from the buffer sizes, before any allocation."""
    codec, p = LYING[case]()
    rec = p.to_record()
    tracemalloc.start()
    try:
        with pytest.raises(PayloadError):
            codec.decode(Payload.from_record(rec))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_consistent_sparse_payload_needs_the_guard():
    """2**31 elements in 17 kB: well formed, so only the caller's bound stops it."""
    size = 1 << 31
    codec = TopK(ratio=1e-6)
    k, mode, nbits = codec.layout(size)
    assert mode == "index"
    idx = np.arange(k, dtype=np.int64) * (size // k)
    buffers = {"values": np.ones(k, np.float32), "where": pack_wide(idx, codec.index_bits(size))}
    p = Payload("topk", (size,), {"k": k, "mode": mode}, buffers, nbits=nbits)
    q = Payload.from_record(p.to_record())
    assert q.nbytes < 20_000
    with pytest.raises(PayloadError, match="2147483648"):
        q.expect_elements(1000)


def test_powersgd_shape_hint_mismatch_is_a_payload_error():
    p = make("powersgd", rank=1).encode(np.ones(50, np.float32), np.random.default_rng(0))
    with pytest.raises(PayloadError, match="hint"):
        make("powersgd", rank=1, shape=(10, 10)).decode(p)
