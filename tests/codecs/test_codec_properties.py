"""Hypothesis property tests: codec round trips on arbitrary finite inputs, and the registry."""

import ast
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from dq_flower.codecs import ErrorFeedback, Payload, make, names
from dq_flower.codecs.base import Codec

# Finite float32 values; magnitudes kept within [1e-30, 1e30] (and 0) so that norms and
# ranges stay inside float32 (values near float32's limits have their own tests).
TINY, HUGE = float(np.float32(1e-30)), float(np.float32(1e30))
VALUES = st.one_of(
    st.just(0.0),
    st.floats(TINY, HUGE, width=32),
    st.floats(-HUGE, -TINY, width=32),
    st.sampled_from([1.0, -1.0, 0.5]),
)
VECTORS = arrays(np.float32, array_shapes(min_dims=1, max_dims=3, max_side=12), elements=VALUES)
BATCHES = arrays(np.float32, array_shapes(min_dims=2, max_dims=2, max_side=20), elements=VALUES)

CODECS = [
    ("identity", {}),
    ("fp16", {}),
    ("qsgd", {"levels": 3, "bucket": 7}),
    ("terngrad", {}),
    ("sign", {}),
    ("ef-sign", {}),
    ("topk", {"ratio": 0.2}),
    ("powersgd", {"rank": 1}),
    ("bingrad", {"bucket": 5}),
    ("orq", {"levels": 4, "bucket": 9}),
]


def check_roundtrip(codec, x, seed):
    p = codec.encode(x, np.random.default_rng(seed))
    q = Payload.from_record(p.to_record())
    y = codec.decode(q)
    assert y.shape == x.shape and y.dtype == np.float32 and np.isfinite(y).all()
    assert q.nbits == p.nbits <= 8 * p.nbytes
    return y


def _gradient_property(name, params, x, seed):
    codec = make(name, **params)
    y = check_roundtrip(codec, x, seed)
    flat, dec = x.reshape(-1).astype(np.float64), y.reshape(-1).astype(np.float64)
    if name == "identity":
        np.testing.assert_array_equal(y, x)
    elif name == "qsgd":  # within one level step of its bucket's norm
        for i in range(0, flat.size, 7):  # loop over buckets, test only
            n = np.linalg.norm(flat[i : i + 7])
            assert (np.abs(dec[i : i + 7] - flat[i : i + 7]) <= n / 3 * (1 + 1e-5)).all()
    elif name in {"terngrad", "orq"} and flat.size:  # decoded values stay within [min, max]
        m = np.abs(flat).max()
        assert (np.abs(dec) <= m * (1 + 1e-6)).all()
    elif name == "topk" and flat.size:
        kept = np.flatnonzero(dec)
        np.testing.assert_array_equal(dec[kept], flat[kept])


@settings(max_examples=25, deadline=None)
@given(x=VECTORS, seed=st.integers(0, 2**32 - 1))
def test_gradient_codec_roundtrip_property(x, seed):
    # Every example goes through all 10 codecs (25 examples each, as one test); a failure
    # names the codec, and hypothesis shrinks the input that broke it.
    for name, params in CODECS:
        try:
            _gradient_property(name, params, x, seed)
        except AssertionError as exc:
            raise AssertionError(f"{name} {params}: {exc}") from exc


@pytest.mark.parametrize(
    "params",
    [{"bits": 1}, {"bits": 3}, {"bits": 8, "stochastic": False}, {"bits": 2, "dither_seed": 9},
     {"bits": 4, "entropy": "zlib"}],
)
@settings(max_examples=30, deadline=None)
@given(x=BATCHES, seed=st.integers(0, 2**32 - 1))
def test_uniform_roundtrip_property(params, x, seed):
    codec = make("uniform", **params)
    y = check_roundtrip(codec, x, seed)
    if x.size:
        lo = x.min(axis=1, keepdims=True).astype(np.float64)
        hi = x.max(axis=1, keepdims=True).astype(np.float64)
        step = (hi - lo) / (2 ** params["bits"] - 1)
        slack = 4 * np.finfo(np.float32).eps * np.maximum(np.abs(lo), np.abs(hi))
        err = np.abs(y.astype(np.float64) - x)
        assert (err <= step * (1 + 2**-15) + slack).all()


class _Recording(Codec):
    """Delegates to ``inner`` and keeps a copy of every array handed to ``encode``."""

    def __init__(self, inner: Codec) -> None:
        self.inner, self.name, self.inputs = inner, inner.name, []

    def encode(self, x, rng=None):
        self.inputs.append(np.array(x, dtype=np.float32, copy=True))
        return self.inner.encode(x, rng)

    def decode(self, p):
        return self.inner.decode(p)


@settings(max_examples=20, deadline=None)
@given(xs=st.lists(arrays(np.float32, 16, elements=VALUES), min_size=1, max_size=5))
def test_error_feedback_invariant_property(xs):
    codec = _Recording(make("bingrad", bucket=4))
    ef = ErrorFeedback(codec)
    for x in xs:
        before = x.astype(np.float64) + (0 if ef.residual is None else ef.residual)
        decoded = ef.decode(ef.encode(x))
        scale = np.abs(before).max() + 1e-30
        # the codec is given x + e (not x alone: the invariant below would hold either way)
        np.testing.assert_allclose(codec.inputs[-1], before, atol=4e-7 * scale, rtol=0)
        np.testing.assert_allclose(decoded + ef.residual.astype(np.float64), before,
                                   atol=4e-7 * scale, rtol=0)


def test_registry_names_and_make():
    required = {"identity", "fp16", "uniform", "qsgd", "terngrad", "sign", "ef-sign", "topk",
                "powersgd", "bingrad", "orq"}
    assert required <= set(names())
    assert names() == sorted(names())
    for name in required:
        codec = make(name)
        assert codec.name == name
    with pytest.raises(ValueError, match="unknown codec"):
        make("gzip")
    biased = {n for n in required if make(n).biased}
    assert biased == {"sign", "ef-sign", "topk", "powersgd", "bingrad"}


def test_the_package_imports_every_module_that_registers_a_codec():
    # registration happens on import, once, in dq_flower/codecs/__init__.py
    import dq_flower.codecs as package

    root = Path(package.__file__).parent
    registering = {p.stem for p in root.glob("*.py")
                   if re.search(r"^@register\(", p.read_text(), re.MULTILINE)}
    imported = {a.name for node in ast.parse((root / "__init__.py").read_text()).body
                if isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module
                for a in node.names}
    assert registering and registering <= imported, registering - imported
