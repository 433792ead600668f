"""Round trips: shape, dtype and each codec's documented error bound; record round trips."""

import numpy as np
import pytest

from dq_flower.codecs import PayloadError, make
from dq_flower.codecs.payload import Payload

GRADIENT_CODECS = [
    ("identity", {}),
    ("fp16", {}),
    ("qsgd", {"levels": 3, "bucket": 64}),
    ("qsgd", {"levels": 1, "bucket": 50}),
    ("terngrad", {}),
    ("terngrad", {"clip": 2.5}),
    ("sign", {}),
    ("ef-sign", {}),
    ("topk", {"ratio": 0.1}),
    ("topk", {"ratio": 0.5}),
    ("powersgd", {"rank": 2}),
    ("bingrad", {"bucket": 64, "iters": 3}),
    ("orq", {"levels": 3, "bucket": 64}),
    ("orq", {"levels": 7, "bucket": 100, "iters": 3}),
]
UNIFORM = [
    {"bits": 1},
    {"bits": 2},
    {"bits": 3, "stochastic": False},
    {"bits": 8},
    {"bits": 4, "per_channel": 3},
    {"bits": 2, "dither_seed": 7},
    {"bits": 5, "entropy": "zlib"},
    {"bits": 2, "entropy": "lzma", "dither_seed": 3, "per_channel": 3},
]


def gradient_input(shape=(37, 29), seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.exp(rng.standard_normal(shape))).astype(np.float32)


def image_batch(n=40, d=48, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, d), dtype=np.float32)
    x[rng.random((n, d)) < 0.4] = 0.0  # image-like: many background zeros
    x[0] = 0.25  # a constant row
    return x


SHAPES = [(37, 29), (1000,), (1,), (3, 4, 5)]


def contract_failures(codec, x, seed=1):
    """How ``codec`` breaks the round-trip contract on ``x`` (an empty list if it does not):
    the decoded array has ``x``'s shape, is float32 and finite, and the payload survives its
    Flower record with the same bits, shape and decoded values."""
    p = codec.encode(x, np.random.default_rng(seed))
    y = codec.decode(p)
    out = []
    if y.shape != x.shape:
        out.append(f"decoded shape {y.shape}, expected {x.shape}")
    if y.dtype != np.float32:
        out.append(f"decoded dtype {y.dtype}")
    if not np.isfinite(y).all():
        out.append("decoded values are not finite")
    q = Payload.from_record(p.to_record())
    if (q.nbits, q.shape) != (p.nbits, p.shape):
        out.append(f"record changed nbits/shape: {(p.nbits, p.shape)} -> {(q.nbits, q.shape)}")
    elif not np.array_equal(codec.decode(q), y):
        out.append("the record's payload decodes differently")
    return out


def test_every_gradient_codec_keeps_shape_dtype_and_record():
    # One test over 14 codec settings x 4 shapes (56 cases); a failure lists every case
    # that broke, by codec, parameters and shape.
    failures = []
    for name, params in GRADIENT_CODECS:
        for shape in SHAPES:
            try:
                problems = contract_failures(make(name, **params), gradient_input(shape))
            except Exception as exc:  # noqa: BLE001  (report it with the case, go on)
                problems = [f"{type(exc).__name__}: {exc}"]
            failures += [f"{name} {params} shape {shape}: {p}" for p in problems]
    assert not failures, "\n".join(failures)


def test_identity_is_exact_and_fp16_close():
    x = gradient_input()
    np.testing.assert_array_equal(make("identity").roundtrip(x), x)
    # fp16 has an 11-bit significand: relative error <= 2**-11 in the normal range
    y = make("fp16").roundtrip(x)
    np.testing.assert_allclose(y, x, rtol=2**-11, atol=2**-24)


@pytest.mark.parametrize("params", UNIFORM)
def test_uniform_error_at_most_one_step(params):
    codec = make("uniform", **params)
    x = image_batch()
    p = codec.encode(x, np.random.default_rng(2))
    y = codec.decode(Payload.from_record(p.to_record()))
    assert y.shape == x.shape and y.dtype == np.float32
    groups = params.get("per_channel", 0) or 1
    xg = x.reshape(x.shape[0], groups, -1)
    step = (xg.max(axis=2) - xg.min(axis=2)) / (2 ** params["bits"] - 1)
    err = np.abs(y - x).reshape(xg.shape)
    # One step per coordinate (half a step for nearest rounding and for subtractive dither),
    # plus float32 rounding of lo + code * scale: 4 ulps of the row's magnitude.
    nearest = params.get("stochastic") is False or "dither_seed" in params
    bound = step[:, :, None] * (0.5 if nearest else 1.0) * (1 + 2**-15)
    bound = bound + 4 * np.finfo(np.float32).eps * np.abs(xg).max(axis=2, keepdims=True)
    assert (err <= bound).all()
    np.testing.assert_array_equal(y[0], x[0])  # the constant row decodes exactly


def test_uniform_nearest_is_deterministic_and_codes_cover_range():
    x = np.linspace(0, 1, 16, dtype=np.float32)[None, :]
    codec = make("uniform", bits=2, stochastic=False)
    y = codec.roundtrip(x)
    np.testing.assert_allclose(np.unique(y), [0, 1 / 3, 2 / 3, 1], atol=1e-7)
    np.testing.assert_array_equal(y, codec.roundtrip(x))


def test_uniform_dither_decoder_needs_same_seed():
    x = image_batch()
    p = make("uniform", bits=2, dither_seed=5).encode(x)
    with pytest.raises(PayloadError, match="dither_seed"):
        make("uniform", bits=2, dither_seed=6).decode(p)


def test_uniform_entropy_falls_back_when_it_does_not_shrink():
    noise = np.random.default_rng(0).random((8, 64), dtype=np.float32)
    p = make("uniform", bits=8, entropy="zlib").encode(noise, np.random.default_rng(0))
    assert p.meta["entropy"] == "none"  # random bytes do not compress
    assert p.nbits == 8 * 64 * 8 + 64 * 8
    zeros = np.zeros((64, 64), dtype=np.float32)
    q = make("uniform", bits=8, entropy="zlib").encode(zeros, np.random.default_rng(0))
    assert q.meta["entropy"] == "zlib" and q.buffers["codes"].size < 64 * 64


def test_qsgd_error_at_most_one_level_step():
    x = gradient_input((10, 64))
    codec = make("qsgd", levels=4, bucket=64)
    y = codec.roundtrip(x, np.random.default_rng(0))
    step = np.linalg.norm(x, axis=1, keepdims=True) / 4
    assert (np.abs(y - x) <= step * (1 + 1e-5)).all()
    assert (np.sign(y) * np.sign(x) >= 0).all()  # never flips a sign


def test_terngrad_values_and_bound():
    x = gradient_input((500,))
    y = make("terngrad").roundtrip(x, np.random.default_rng(0))
    m = np.abs(x).max()
    assert set(np.unique(y)) <= {-m, 0.0, m}
    assert (np.abs(y - x) <= m * (1 + 1e-6)).all()


def test_sign_and_ef_sign_values():
    x = np.array([-2.0, 0.0, 3.0, -0.5], dtype=np.float32)
    np.testing.assert_array_equal(make("sign").roundtrip(x), [-1, 1, 1, -1])
    scale = np.float32(5.5 / 4)
    np.testing.assert_array_equal(make("ef-sign").roundtrip(x), [-scale, scale, scale, -scale])


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.5, 1.0])
def test_topk_keeps_exactly_the_largest(ratio):
    x = gradient_input((3000,), seed=4)
    y = make("topk", ratio=ratio).roundtrip(x)
    k = int(np.ceil(ratio * x.size))
    kept = np.flatnonzero(y)
    assert kept.size == k
    np.testing.assert_array_equal(y[kept], x[kept])
    assert np.abs(x[kept]).min() >= np.sort(np.abs(x))[-k]


def test_topk_sampled_threshold_path_is_exact():
    # > 2**20 elements takes the sampled-threshold path; the result must equal argpartition's
    x = gradient_input((1 << 20 | 12345,), seed=5)
    y = make("topk", ratio=0.001).roundtrip(x)
    k = int(np.ceil(0.001 * x.size))
    expected = np.zeros_like(x)
    top = np.argpartition(np.abs(x), x.size - k)[x.size - k :]
    expected[top] = x[top]
    np.testing.assert_array_equal(y, expected)


def test_powersgd_exact_on_low_rank_and_contracts_otherwise():
    rng = np.random.default_rng(0)
    low = (rng.standard_normal((60, 2)) @ rng.standard_normal((2, 40))).astype(np.float32)
    codec = make("powersgd", rank=2)
    y = codec.roundtrip(low, np.random.default_rng(1))
    # rank-2 input, rank-2 factors: P spans its column space, so P P^T M = M (float32 noise)
    np.testing.assert_allclose(y, low, atol=1e-4 * np.abs(low).max())
    full = rng.standard_normal((60, 40)).astype(np.float32)
    y = make("powersgd", rank=4).roundtrip(full, np.random.default_rng(1))
    # a projection: the error is orthogonal to the approximation and never exceeds ||M||
    assert np.linalg.norm(full - y) <= np.linalg.norm(full) * (1 + 1e-6)
    assert abs(float(np.sum((full - y) * y))) <= 1e-3 * np.linalg.norm(full) ** 2


def test_powersgd_warm_start_improves_and_is_seeded():
    rng = np.random.default_rng(3)
    m = (rng.standard_normal((80, 6)) @ rng.standard_normal((6, 50))).astype(np.float32)
    m += 0.05 * rng.standard_normal(m.shape).astype(np.float32)
    codec = make("powersgd", rank=3)
    errs = [np.linalg.norm(m - codec.roundtrip(m, np.random.default_rng(9))) for _ in range(6)]
    assert errs[-1] < errs[0]  # repeated power iterations on the same matrix converge
    other = make("powersgd", rank=3)
    assert np.array_equal(
        make("powersgd", rank=3).roundtrip(m, np.random.default_rng(9)),
        other.roundtrip(m, np.random.default_rng(9)),
    )


def test_powersgd_vector_reshaped_and_shape_hint():
    x = gradient_input((1000,))
    p = make("powersgd", rank=2).encode(x, np.random.default_rng(0))
    assert (p.meta["rows"], p.meta["cols"]) == (32, 32)
    q = make("powersgd", rank=2, shape=(20, 50)).encode(x, np.random.default_rng(0))
    assert (q.meta["rows"], q.meta["cols"]) == (20, 50)
    with pytest.raises(ValueError, match="shape hint"):
        make("powersgd", shape=(7, 7)).encode(x, np.random.default_rng(0))
    small = gradient_input((10,))
    np.testing.assert_array_equal(make("powersgd").roundtrip(small), small)  # uncompressed


def test_bingrad_two_levels_per_bucket_and_lloyd_conditions():
    x = gradient_input((640,), seed=6)
    codec = make("bingrad", bucket=64, iters=20)
    p = codec.encode(x)
    y = codec.decode(p)
    levels = p.buffers["levels"].reshape(-1, 2)
    for b in range(10):  # loop over 10 buckets in a test only
        part, dec = x[b * 64 : (b + 1) * 64], y[b * 64 : (b + 1) * 64]
        b1, b2 = levels[b]
        assert set(np.unique(dec)) <= {b1, b2}
        # at convergence, each level is the mean of the coordinates mapped to it
        for level in (b1, b2):
            if (dec == level).any():
                assert abs(part[dec == level].mean() - level) <= 1e-5 * np.abs(part).max()
        # and (a Lloyd fixed point after 20 iterations) each coordinate has its nearest level
        other = np.where(dec == b1, b2, b1)
        assert (np.abs(part - dec) <= np.abs(part - other) + 1e-6).all()


def test_orq_rounds_between_neighbouring_levels():
    x = gradient_input((1000,), seed=7)
    codec = make("orq", levels=5, bucket=100)
    p = codec.encode(x, np.random.default_rng(0))
    y = codec.decode(p)
    table = p.buffers["table"].reshape(10, 6)
    for b in range(10):  # loop over 10 buckets in a test only
        part, dec, lv = x[b * 100 : (b + 1) * 100], y[b * 100 : (b + 1) * 100], table[b]
        assert lv[0] == part.min() and lv[-1] == part.max()
        assert (np.diff(lv) >= 0).all()
        j = np.clip(np.searchsorted(lv, part, side="right") - 1, 0, 4)
        assert np.isin(dec, lv).all()
        assert ((dec == lv[j]) | (dec == lv[j + 1])).all()
