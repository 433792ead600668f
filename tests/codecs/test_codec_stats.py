"""Statistics: unbiasedness by seeded Monte-Carlo, variance bounds and comparisons.

The unbiasedness checker passes for the unbiased codecs and, unchanged, fails for biased
ones (sign, bingrad, and the stochastic but clipped terngrad): it can fail.
"""

import math

import numpy as np
import pytest

from dq_flower.codecs import make
from dq_flower.codecs.qsgd import qsgd_variance_bound

K_SIGMA = 5.0  # per-coordinate tolerance in standard errors; 64-256 coordinates per check


def draws(codec, x, n, seed):
    rng = np.random.default_rng(seed)
    return np.stack([codec.decode(codec.encode(x, rng)) for _ in range(n)]).astype(np.float64)


def bias_z(codec, x, n=3000, seed=0):
    """Largest |mean - x| over coordinates in units of the Monte-Carlo standard error.

    Each coordinate's mean over ``n`` seeded draws should lie within ``K_SIGMA * sd /
    sqrt(n)`` of ``x``. The spread used is at least a tenth of the median spread (a
    coordinate close to a level rounds up so rarely that ``n`` draws may show no spread at
    all) and at least ``1e-6 * max|x|`` (float32 rounding); a deterministic codec has zero
    spread everywhere, so any systematic error shows up as a huge deviation.
    """
    y = draws(codec, x, n, seed)
    sd = y.std(axis=0, ddof=1)
    sd = np.maximum(sd, max(0.1 * float(np.median(sd)), 1e-6 * float(np.abs(x).max())))
    return float((np.abs(y.mean(axis=0) - x.astype(np.float64)) / (sd / math.sqrt(n))).max())


def gaussian(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def student_t(shape, seed=0, df=3):
    return np.random.default_rng(seed).standard_t(df, shape).astype(np.float32)


UNBIASED = [
    ("uniform", {"bits": 2}, (4, 32)),
    ("uniform", {"bits": 1, "per_channel": 2}, (4, 32)),
    ("qsgd", {"levels": 2, "bucket": 32}, (128,)),
    ("qsgd", {"levels": 1, "bucket": 100}, (128,)),
    ("terngrad", {}, (128,)),
    ("orq", {"levels": 3, "bucket": 32}, (128,)),
    ("orq", {"levels": 6, "bucket": 50, "iters": 3}, (128,)),
]


@pytest.mark.parametrize(("name", "params", "shape"), UNBIASED)
def test_unbiased(name, params, shape):
    x = student_t(shape, seed=1)
    if name == "uniform":
        x = np.abs(x)  # data-like: non-negative
    n = 1000 if name == "orq" else 3000  # ORQ draws cost more; tolerance scales with n
    assert bias_z(make(name, **params), x, n=n) < K_SIGMA


def test_dithered_uniform_unbiased_over_seeds():
    # With a fixed dither seed the output is a deterministic function of x; subtractive
    # dither is unbiased over the dither, i.e. over seeds: one draw for each of 2,000 seeds.
    x = np.abs(student_t((2, 32), seed=2))
    y = np.stack(
        [make("uniform", bits=2, dither_seed=s).roundtrip(x) for s in range(2000)]
    ).astype(np.float64)
    se = y.std(axis=0, ddof=1) / math.sqrt(2000)
    assert (np.abs(y.mean(axis=0) - x) <= K_SIGMA * se + 1e-6).all()


@pytest.mark.parametrize(
    ("name", "params"),
    [("sign", {}), ("bingrad", {"bucket": 32}), ("terngrad", {"clip": 1.0})],
)
def test_same_checker_fails_on_biased_codecs(name, params):
    x = student_t((128,), seed=1)
    assert bias_z(make(name, **params), x, n=300) > 10 * K_SIGMA


def empirical_mse(codec, x, n=200, seed=0):
    y = draws(codec, x, n, seed)
    return float(((y - x.astype(np.float64)) ** 2).sum(axis=1).mean())


def qsgd_exact_variance(x, levels, bucket):
    """Closed form: per coordinate (n/s)^2 p (1 - p), p the fractional part of s|v|/n."""
    total = 0.0
    flat = x.astype(np.float64)
    for start in range(0, flat.size, bucket):  # loop over buckets, test only
        v = flat[start : start + bucket]
        n = np.linalg.norm(v)
        if n == 0:
            continue
        r = levels * np.abs(v) / n
        p = r - np.floor(r)
        total += float(((n / levels) ** 2 * p * (1 - p)).sum())
    return total


@pytest.mark.parametrize("levels", [1, 2, 4, 8])
@pytest.mark.parametrize("make_x", [gaussian, student_t])
def test_qsgd_variance_within_known_bound(levels, make_x):
    x = make_x((1024,), seed=3)
    codec = make("qsgd", levels=levels, bucket=256)
    mse = empirical_mse(codec, x, n=400)
    exact = qsgd_exact_variance(x, levels, 256)
    # 400 draws of a sum of 1024 independent terms: the mean is within a few percent
    assert mse == pytest.approx(exact, rel=0.08)
    assert mse <= qsgd_variance_bound(x, levels, 256)


# ORQ vs QSGD at equal code bits per coordinate (both with 512-coordinate buckets):
#   2 bits: qsgd levels=1 (3 values, ceil(log2 3) = 2) vs orq levels=3 (4 values, 2 bits);
#   3 bits: qsgd levels=3 (7 values, 3 bits)           vs orq levels=7 (8 values, 3 bits).
# ORQ carries (s + 1) float32 levels per bucket instead of one norm; the "total" rows give
# QSGD smaller buckets so that its side information matches ORQ's (equal total bits).
EQUAL_BITS = [
    ("2-bit codes", {"levels": 1, "bucket": 512}, {"levels": 3, "bucket": 512}),
    ("3-bit codes", {"levels": 3, "bucket": 512}, {"levels": 7, "bucket": 512}),
    ("2-bit total", {"levels": 1, "bucket": 128}, {"levels": 3, "bucket": 512}),
    ("3-bit total", {"levels": 3, "bucket": 64}, {"levels": 7, "bucket": 512}),
]


@pytest.mark.parametrize(("label", "qsgd", "orq"), EQUAL_BITS, ids=[e[0] for e in EQUAL_BITS])
@pytest.mark.parametrize("make_x", [gaussian, student_t])
def test_orq_variance_not_above_qsgd_at_equal_bits(label, qsgd, orq, make_x):
    x = make_x((4096,), seed=4)
    q, o = make("qsgd", **qsgd), make("orq", **orq)
    assert q.nbits_for(x.size) <= o.nbits_for(x.size)  # QSGD never gets fewer bits here
    if "total" in label:
        assert q.nbits_for(x.size) == o.nbits_for(x.size)
    assert empirical_mse(o, x, n=100) <= empirical_mse(q, x, n=100)


def test_orq_sweeps_lower_variance():
    x = student_t((4096,), seed=5)
    flat = empirical_mse(make("orq", levels=7, iters=0), x, n=100)
    swept = empirical_mse(make("orq", levels=7, iters=3), x, n=100)
    assert swept < flat


def scaled_sign_se(x, bucket=None):
    if bucket is None:
        return float(((make("ef-sign").roundtrip(x) - x).astype(np.float64) ** 2).sum())
    v = x.reshape(-1, bucket).astype(np.float64)
    scale = np.abs(v).mean(axis=1, keepdims=True)
    return float(((np.where(v < 0, -scale, scale) - v) ** 2).sum())


def logistic_gradient(seed=0):
    """Gradient of a random logistic-regression loss: a real, skewed gradient vector."""
    rng = np.random.default_rng(seed)
    feats = rng.random((256, 1024)) * (rng.random((256, 1024)) < 0.3)
    labels = rng.integers(0, 2, 256)
    w = rng.standard_normal(1024) * 0.1
    prob = 1 / (1 + np.exp(-(feats @ w)))
    return (feats.T @ (prob - labels) / 256).astype(np.float32)


@pytest.mark.parametrize(
    "x",
    [
        gaussian((4096,), 6),
        student_t((4096,), 6),
        np.exp(gaussian((4096,), 6)),
        logistic_gradient(),
    ],
    ids=["gaussian", "student-t", "lognormal", "logistic-gradient"],
)
def test_bingrad_error_not_above_scaled_sign(x):
    se = float(((make("bingrad", bucket=512).roundtrip(x) - x).astype(np.float64) ** 2).sum())
    # relative slack 1e-6 covers float32 rounding of the levels
    assert se <= scaled_sign_se(x) * (1 + 1e-6)
    assert se <= scaled_sign_se(x, bucket=512) * (1 + 1e-6)
