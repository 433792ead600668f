"""Edge cases, parameter validation and the strict decoder."""

import json
import tracemalloc

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.codecs.entropy import check_method, compress, decompress

GRADIENT = [
    ("identity", {}),
    ("fp16", {}),
    ("qsgd", {"levels": 2, "bucket": 16}),
    ("terngrad", {"clip": 3.0}),
    ("sign", {}),
    ("ef-sign", {}),
    ("topk", {"ratio": 0.3}),
    ("powersgd", {"rank": 2}),
    ("bingrad", {"bucket": 16}),
    ("orq", {"levels": 3, "bucket": 16}),
]
SPECIAL = {
    "zero": np.zeros(50, np.float32),
    "constant": np.full(50, -2.5, np.float32),
    "length-1": np.array([3.0], np.float32),
    "length-1-zero": np.zeros(1, np.float32),
    "not-a-bucket-multiple": np.linspace(-1, 2, 37, dtype=np.float32),
    "tiny": np.full(20, 1e-38, np.float32),
    "huge": np.array([3e38, -3e38, 1.0, 0.0], np.float32),
    "empty": np.zeros(0, np.float32),
}
EXACT_ON_CONSTANT = {"identity", "fp16", "terngrad", "ef-sign", "bingrad", "orq", "powersgd"}


def _special_failures(name, params, case):
    """What goes wrong when codec ``name`` codes special vector ``case`` (empty: nothing)."""
    codec = make(name, **params)
    x = SPECIAL[case]
    if case == "huge" and name == "qsgd":
        # a norm beyond float32 cannot be carried: refused with a clear error
        with pytest.raises(ValueError, match="float32"):
            codec.encode(x, np.random.default_rng(0))
        return []
    p = codec.encode(x, np.random.default_rng(0))
    y = codec.decode(Payload.from_record(p.to_record()))
    if y.shape != x.shape or y.dtype != np.float32 or not np.isfinite(y).all():
        return [f"decoded {y.dtype} {y.shape} (finite: {np.isfinite(y).all()}), "
                f"expected float32 {x.shape}"]
    out = []
    if case in {"zero", "length-1-zero"} and name != "sign" and not (y == 0).all():
        out.append(f"zeros decode to {y[:4]}")
    # fp16 represents -2.5 exactly; the others decode a constant bucket exactly
    if case == "constant" and name in EXACT_ON_CONSTANT and not np.allclose(
            y, x, rtol=1e-6, atol=0):
        out.append(f"constant -2.5 decodes to {y[:4]}")
    if case == "length-1" and name != "sign" and not np.allclose(y, x, rtol=1e-6, atol=0):
        out.append(f"[3.0] decodes to {y}")
    return out


def test_special_vectors():
    # One test over 10 codecs x 8 special vectors (80 cases); a failure lists every case
    # that broke, by codec and vector.
    failures = []
    for name, params in GRADIENT:
        for case in SPECIAL:
            try:
                problems = _special_failures(name, params, case)
            except Exception as exc:  # noqa: BLE001  (report it with the case, go on)
                problems = [f"{type(exc).__name__}: {exc}"]
            failures += [f"{name} {params} on {case!r}: {p}" for p in problems]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "x",
    [np.zeros((0, 5)), np.zeros((3, 0)), np.zeros((1, 1)), np.full((4, 9), 7.0)],
    ids=["no-rows", "no-columns", "1x1", "constant"],
)
@pytest.mark.parametrize("params", [{}, {"dither_seed": 1}, {"entropy": "zlib"}])
def test_uniform_special_batches(x, params):
    codec = make("uniform", bits=3, **params)
    p = codec.encode(x.astype(np.float32), np.random.default_rng(0))
    y = codec.decode(Payload.from_record(p.to_record()))
    np.testing.assert_array_equal(y, x)


def test_uniform_needs_a_2d_batch():
    with pytest.raises(ValueError, match="2-D"):
        make("uniform").encode(np.zeros(5, np.float32), np.random.default_rng(0))
    with pytest.raises(ValueError, match="per_channel"):
        make("uniform", per_channel=3).encode(np.zeros((2, 10), np.float32), None)


@pytest.mark.parametrize(("name", "params"), GRADIENT + [("uniform", {})])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_refused(name, params, bad):
    x = np.ones((4, 8), np.float32)
    x[2, 3] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        make(name, **params).encode(x, np.random.default_rng(0))


def test_stochastic_codecs_need_an_explicit_generator():
    for name in ["qsgd", "terngrad", "orq"]:
        with pytest.raises(ValueError, match="Generator"):
            make(name).encode(np.ones(10, np.float32), None)
    with pytest.raises(ValueError, match="Generator"):
        make("uniform").encode(np.ones((2, 3), np.float32), None)
    make("uniform", stochastic=False).encode(np.ones((2, 3), np.float32), None)  # no randomness


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("uniform", {"bits": 0}, "bits"),
        ("uniform", {"bits": 9}, "bits"),
        ("uniform", {"bits": 2.0}, "bits"),
        ("uniform", {"bits": True}, "bits"),
        ("uniform", {"stochastic": "yes"}, "stochastic"),
        ("uniform", {"per_channel": -1}, "per_channel"),
        ("uniform", {"dither_seed": -3}, "dither_seed"),
        ("uniform", {"entropy": "gzip"}, "entropy"),
        ("qsgd", {"levels": 0}, "levels"),
        ("qsgd", {"levels": 128}, "levels"),
        ("qsgd", {"bucket": 0}, "bucket"),
        ("terngrad", {"clip": 0}, "clip"),
        ("terngrad", {"clip": float("nan")}, "clip"),
        ("topk", {"ratio": 0}, "ratio"),
        ("topk", {"ratio": 1.5}, "ratio"),
        ("powersgd", {"rank": 0}, "rank"),
        ("powersgd", {"shape": (3,)}, "shape"),
        ("bingrad", {"iters": 0}, "iters"),
        ("bingrad", {"bucket": -4}, "bucket"),
        ("orq", {"levels": 256}, "levels"),
        ("orq", {"iters": -1}, "iters"),
        ("qsgd", {"nonsense": 1}, "nonsense"),
    ],
)
def test_bad_parameters_name_the_field(name, params, field):
    with pytest.raises(ValueError, match=field):
        make(name, **params)


def test_zstd_needs_the_package():
    try:
        import zstandard  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="zstandard"):
            make("uniform", entropy="zstd")
    else:  # pragma: no cover - only where zstandard is installed
        assert check_method("zstd") == "zstd"


# ------------------------------------------------------------------- strict decoding
def encoded(name, params, x=None):
    x = np.linspace(-1, 1, 100, dtype=np.float32) if x is None else x
    codec = make(name, **params)
    return codec, codec.encode(x, np.random.default_rng(0))


def altered(p, **changes):
    fields = {"codec": p.codec, "shape": p.shape, "meta": dict(p.meta),
              "buffers": dict(p.buffers), "nbits": p.nbits}
    fields.update(changes)
    return Payload(**fields)


@pytest.mark.parametrize(("name", "params"), GRADIENT)
def test_truncated_and_extended_buffers_are_refused(name, params):
    codec, p = encoded(name, params)
    for key, buf in p.buffers.items():
        with pytest.raises(PayloadError, match=key):
            codec.decode(altered(p, buffers={**p.buffers, key: buf[:-1]}))
        with pytest.raises(PayloadError, match=key):
            codec.decode(altered(p, buffers={**p.buffers, key: np.concatenate([buf, buf[:1]])}))


@pytest.mark.parametrize(("name", "params"), GRADIENT)
def test_wrong_dtype_missing_buffer_and_wrong_nbits_are_refused(name, params):
    codec, p = encoded(name, params)
    key, buf = next(iter(p.buffers.items()))
    other = np.zeros(buf.size, np.float64 if buf.dtype != np.float64 else np.float32)
    with pytest.raises(PayloadError, match="float|uint8"):
        codec.decode(altered(p, buffers={**p.buffers, key: other}))
    with pytest.raises(PayloadError, match=key):
        codec.decode(altered(p, buffers={k: v for k, v in p.buffers.items() if k != key}))
    with pytest.raises(PayloadError, match="bits"):
        codec.decode(altered(p, nbits=p.nbits + 1))
    with pytest.raises(PayloadError, match="payload made by"):
        make("identity" if name != "identity" else "fp16").decode(p)


@pytest.mark.parametrize(("name", "params"), GRADIENT + [("uniform", {"bits": 2})])
def test_huge_declared_shape_fails_fast_without_allocating(name, params):
    shape = (10**9,) if name != "uniform" else (10**5, 10**4)
    p = Payload(name, shape, {"bits": 2, "per_channel": 0, "dither_seed": None,
                              "entropy": "none", "levels": 2, "bucket": 16, "k": 3,
                              "mode": "index", "clip": 3.0, "iters": 3, "rows": 31623,
                              "cols": 31623, "rank": 2, "compressed": True},
                {"codes": np.zeros(3, np.uint8)}, nbits=24)
    codec = make(name, **params)
    tracemalloc.start()
    with pytest.raises(PayloadError):
        codec.decode(p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20  # refused before any large allocation


def test_shape_beyond_the_element_limit_is_refused():
    p = Payload("identity", (1 << 20, 1 << 20), {}, {"values": np.zeros(3, np.float32)}, nbits=96)
    with pytest.raises(PayloadError, match="exceeds"):
        make("identity").decode(p)


@pytest.mark.parametrize(
    ("name", "params", "side"),
    [
        ("qsgd", {"bucket": 16}, "norms"),
        ("terngrad", {}, "scale"),
        ("ef-sign", {}, "scale"),
        ("bingrad", {"bucket": 16}, "levels"),
        ("orq", {"bucket": 16}, "table"),
        ("topk", {"ratio": 0.3}, "values"),
        ("powersgd", {}, "p"),
    ],
)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_side_information_is_refused(name, params, side, bad):
    codec, p = encoded(name, params)
    buf = p.buffers[side].copy()
    buf[0] = bad
    with pytest.raises(PayloadError, match="NaN or inf"):
        codec.decode(altered(p, buffers={**p.buffers, side: buf}))


def test_uniform_strictness():
    x = np.random.default_rng(0).random((6, 20), dtype=np.float32)
    codec = make("uniform", bits=3)
    p = codec.encode(x, np.random.default_rng(0))
    scales = p.buffers["scales"].copy()
    scales[1] = np.nan
    with pytest.raises(PayloadError, match="scales"):
        codec.decode(altered(p, buffers={**p.buffers, "scales": scales}))
    with pytest.raises(PayloadError, match="negative"):
        codec.decode(altered(p, buffers={**p.buffers, "scales": -p.buffers["scales"]}))
    with pytest.raises(PayloadError, match="bits"):
        make("uniform", bits=4).decode(p)  # width mismatch
    with pytest.raises(PayloadError, match="mins"):
        codec.decode(altered(p, shape=(7, 20)))  # rows do not match the side information
    with pytest.raises(PayloadError, match="2-D"):
        codec.decode(altered(p, shape=(120,)))
    codes = p.buffers["codes"].copy()
    codes[-1] |= 1  # 6 * 20 * 3 = 360 bits: whole bytes, so corrupt a code instead
    codec.decode(altered(p, buffers={**p.buffers, "codes": codes}))  # a valid code: decodes
    odd = make("uniform", bits=3).encode(x[:, :7], np.random.default_rng(0))  # 126 bits
    codes = odd.buffers["codes"].copy()
    codes[-1] |= 1
    with pytest.raises(PayloadError, match="padding"):
        codec.decode(altered(odd, buffers={**odd.buffers, "codes": codes}))
    with pytest.raises(PayloadError, match="entropy"):
        codec.decode(altered(p, meta={**p.meta, "entropy": "zlib"}))


def test_invalid_codes_are_refused():
    codec, p = encoded("qsgd", {"levels": 2, "bucket": 16})  # 5 values in 3-bit codes
    codes = p.buffers["codes"].copy()
    codes[0] = 0xFF  # code 7 > 2 * levels
    with pytest.raises(PayloadError, match="codes above"):
        codec.decode(altered(p, buffers={**p.buffers, "codes": codes}))
    codec, p = encoded("terngrad", {})
    codes = p.buffers["codes"].copy()
    codes[0] = 0xFF  # code 3
    with pytest.raises(PayloadError, match="invalid code"):
        codec.decode(altered(p, buffers={**p.buffers, "codes": codes}))
    codec, p = encoded("orq", {"levels": 5, "bucket": 16})  # 6 values in 3-bit codes
    codes = p.buffers["codes"].copy()
    codes[0] = 0xFF
    with pytest.raises(PayloadError, match="codes above"):
        codec.decode(altered(p, buffers={**p.buffers, "codes": codes}))
    table = p.buffers["table"].copy()
    table[:6] = table[:6][::-1]
    with pytest.raises(PayloadError, match="decreasing"):
        codec.decode(altered(p, buffers={**p.buffers, "table": table}))


def test_topk_index_and_mask_strictness():
    codec, p = encoded("topk", {"ratio": 0.05})  # 5 indices of 7 bits
    assert p.meta["mode"] == "index"
    from dq_flower.codecs.bitpack import pack_wide

    for idx in ([3, 3, 5, 9, 11], [9, 3, 5, 10, 11], [1, 2, 3, 4, 120]):
        where = pack_wide(np.array(idx), 7)
        with pytest.raises(PayloadError, match="increasing"):
            codec.decode(altered(p, buffers={**p.buffers, "where": where}))
    codec, p = encoded("topk", {"ratio": 0.5})
    assert p.meta["mode"] == "mask"
    mask = p.buffers["where"].copy()
    mask[0] ^= 0x80
    with pytest.raises(PayloadError, match="marks"):
        codec.decode(altered(p, buffers={**p.buffers, "where": mask}))
    with pytest.raises(PayloadError, match="'k'"):
        codec.decode(altered(p, meta={**p.meta, "k": 49}))


def test_meta_mismatch_is_refused():
    codec, p = encoded("qsgd", {"levels": 2, "bucket": 16})
    with pytest.raises(PayloadError, match="bucket"):
        make("qsgd", levels=2, bucket=32).decode(p)
    with pytest.raises(PayloadError, match="levels"):
        codec.decode(altered(p, meta={**p.meta, "levels": "2"}))
    codec, p = encoded("bingrad", {"bucket": 16})
    levels = p.buffers["levels"].copy().reshape(-1, 2)[:, ::-1].reshape(-1)
    with pytest.raises(PayloadError, match="b1 > b2"):
        codec.decode(altered(p, buffers={**p.buffers, "levels": np.ascontiguousarray(levels)}))
    codec, p = encoded("powersgd", {"rank": 2})
    with pytest.raises(PayloadError, match="rows"):
        codec.decode(altered(p, meta={**p.meta, "rows": 5}))


def test_record_level_strictness():
    p = make("sign").encode(np.ones(20, np.float32))
    rec = p.to_record()
    header = json.loads(bytes(rec["header"].data))
    header["shape"] = [10**9]
    raw = json.dumps(header).encode()
    rec["header"] = Array(dtype="uint8", shape=(len(raw),), stype="raw", data=raw)
    q = Payload.from_record(rec)  # the record is self-consistent; the decoder is not fooled
    with pytest.raises(PayloadError, match="bits"):
        make("sign").decode(q)
    bad = ArrayRecord({"header": rec["header"], "bits": Array(dtype="uint8", shape=(2,),
                                                              stype="raw", data=b"\x00")})
    with pytest.raises(PayloadError, match="bytes"):
        Payload.from_record(bad)


def test_entropy_streams_are_bounded():
    data = np.zeros(100_000, np.uint8)
    for method in ["zlib", "lzma"]:
        stream = compress(data, method)
        np.testing.assert_array_equal(decompress(stream, method, data.size), data)
        with pytest.raises(PayloadError, match="decodes to"):
            decompress(stream, method, data.size - 1)  # longer than declared
        with pytest.raises(PayloadError, match="decodes to"):
            decompress(stream, method, data.size + 1)  # shorter than declared
        with pytest.raises(PayloadError, match="cannot expand"):
            decompress(stream[:4], method, 10**9)  # declared size beyond the format's ratio
        with pytest.raises(PayloadError):
            decompress(stream[: stream.size // 2], method, data.size)  # truncated
    with pytest.raises(PayloadError, match="corrupt|decodes"):
        decompress(np.frombuffer(b"not a zlib stream at all", np.uint8), "zlib", 30)


@pytest.mark.parametrize("name, params", [
    ("qsgd", {"levels": np.int64(3), "bucket": np.int32(64)}),
    ("orq", {"levels": np.uint8(3), "bucket": np.int64(64), "iters": np.int16(2)}),
    ("bingrad", {"bucket": np.int64(64)}),
    ("powersgd", {"rank": np.int64(2)}),
])
def test_numpy_integer_parameters_become_ints_and_the_payload_travels(name, params):
    codec = make(name, **params)
    assert all(type(getattr(codec, key)) is int for key in params)
    x = np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)
    payload = codec.encode(x, np.random.default_rng(1))
    back = Payload.from_record(payload.to_record())
    assert back.meta == payload.meta
    assert codec.decode(back).shape == x.shape
