"""Error feedback: the invariant x + e_old == decode + e_new, state round trips, accumulation."""

import numpy as np
import pytest

from dq_flower.codecs import ErrorFeedback, make
from dq_flower.codecs.base import Codec

WRAPPED = [
    ("sign", {}),
    ("ef-sign", {}),
    ("topk", {"ratio": 0.05}),
    ("powersgd", {"rank": 2}),
    ("bingrad", {"bucket": 32}),
    ("qsgd", {"levels": 1, "bucket": 32}),
]


def grads(steps, shape=(24, 20), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(steps)]


class Recording(Codec):
    """Delegates to ``inner`` and keeps a copy of every array handed to ``encode``."""

    def __init__(self, inner: Codec) -> None:
        self.inner = inner
        self.name = inner.name
        self.inputs: list[np.ndarray] = []

    def encode(self, x, rng=None):
        self.inputs.append(np.array(x, dtype=np.float32, copy=True))
        return self.inner.encode(x, rng)

    def decode(self, p):
        return self.inner.decode(p)

    def __getattr__(self, attr):  # reset / state_dict / load_state_dict of stateful codecs
        return getattr(self.inner, attr)


@pytest.mark.parametrize(("name", "params"), WRAPPED)
def test_codec_receives_input_plus_residual_and_invariant_holds(name, params):
    # The invariant x + e_old == decode + e_new alone holds for any e_new = (x + e_old) -
    # decode, whatever was encoded; so also check what the codec was actually given.
    codec = Recording(make(name, **params))
    ef = ErrorFeedback(codec)
    rng = np.random.default_rng(0)
    assert ef.residual is None
    for step, x in enumerate(grads(8)):
        e_old = np.zeros_like(x) if ef.residual is None else ef.residual.copy()
        p = ef.encode(x, rng)
        decoded = ef.decode(p)
        given = codec.inputs[-1]
        assert len(codec.inputs) == step + 1
        # float32 arithmetic: one rounding in x + e and one in the subtraction
        scale = np.abs(x).max() + np.abs(e_old).max()
        np.testing.assert_allclose(given, x + e_old, atol=4e-7 * scale, rtol=0,
                                   err_msg=f"{name} step {step}: codec did not get x + e")
        if step:  # every wrapped codec is lossy: the residual really is fed back
            assert np.abs(given - x).max() > 1e-3 * scale, f"{name} step {step}: e == 0"
        np.testing.assert_allclose(x + e_old, decoded + ef.residual, atol=4e-7 * scale, rtol=0)
        np.testing.assert_allclose(ef.residual, given - decoded, atol=4e-7 * scale, rtol=0)
        assert ef.residual.shape == x.shape and ef.residual.dtype == np.float32


def test_topk_with_error_feedback_sends_everything_eventually():
    ef = ErrorFeedback(make("topk", ratio=0.1))
    xs = grads(30, shape=(200,), seed=1)
    sent = sum(ef.decode(ef.encode(x)) for x in xs)
    # telescoping invariant: sum of inputs == sum of decoded + final residual
    np.testing.assert_allclose(sum(xs), sent + ef.residual, atol=1e-4)
    # and the residual stays bounded: nothing is lost, everything is sent later. Measured
    # here: max |e| = 2.5 after 30 steps (2.3 to 2.6 over six seeds), below the largest
    # single input coordinate (3.9); the bound 4.0 leaves a 1.6x margin. Without feedback
    # (the codec given x alone) the dropped coordinates pile up: max |e| = 11.2 (10.5 to 14.0).
    assert np.abs(ef.residual).max() < 4.0


def test_error_feedback_changes_what_is_sent():
    x = np.array([1.0, 0.4, 0.3], np.float32)
    ef = ErrorFeedback(make("topk", ratio=0.3))  # k = ceil(0.9) = 1
    np.testing.assert_array_equal(ef.decode(ef.encode(x)), [1.0, 0, 0])  # residual [0, .4, .3]
    np.testing.assert_array_equal(ef.decode(ef.encode(x)), [1.0, 0, 0])  # p = [1, .8, .6]
    # p = [1, 1.2, .9]: the accumulated second coordinate now wins
    np.testing.assert_allclose(ef.decode(ef.encode(x)), [0, 1.2, 0], rtol=1e-6)


def test_state_dict_round_trip_continues_identically():
    xs = grads(6, seed=2)
    a = ErrorFeedback(make("powersgd", rank=2))
    rng_a = np.random.default_rng(5)
    for x in xs[:3]:
        a.encode(x, rng_a)
    state = a.state_dict()
    assert set(state) == {"residual", "codec/q/24x20x2"}
    assert all(isinstance(v, np.ndarray) for v in state.values())
    b = ErrorFeedback(make("powersgd", rank=2))
    b.load_state_dict({k: v.copy() for k, v in state.items()})
    rng_b = np.random.default_rng(5)
    rng_b.bit_generator.state = rng_a.bit_generator.state
    for x in xs[3:]:
        np.testing.assert_array_equal(a.decode(a.encode(x, rng_a)), b.decode(b.encode(x, rng_b)))
    np.testing.assert_array_equal(a.residual, b.residual)


def test_state_dict_of_fresh_wrapper_and_errors():
    ef = ErrorFeedback(make("sign"))
    assert ef.state_dict() == {}
    ef.load_state_dict({})
    assert ef.residual is None
    with pytest.raises(ValueError, match="unknown"):
        ef.load_state_dict({"momentum": np.zeros(3)})
    with pytest.raises(ValueError, match="NaN or inf"):
        ef.load_state_dict({"residual": np.array([np.nan], np.float32)})
    with pytest.raises(ValueError, match="keeps no state"):
        ef.load_state_dict({"codec/q/1x1x1": np.zeros((1, 1))})
    ef.encode(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="residual"):
        ef.encode(np.ones(5, np.float32))  # the model changed size
    ef.reset()
    assert ef.residual is None
    ef.encode(np.ones(5, np.float32))
    with pytest.raises(ValueError, match="Codec"):
        ErrorFeedback("sign")


def test_error_feedback_refuses_non_finite_input():
    ef = ErrorFeedback(make("ef-sign"))
    with pytest.raises(ValueError, match="NaN or inf"):
        ef.encode(np.array([1.0, np.inf], np.float32))
    assert ef.residual is None  # a refused input leaves the memory untouched


def test_encode_leaves_the_callers_array_alone():
    # the first step has no residual: the working copy must not be the caller's array
    x = np.array([1.0, 0.4, 0.3], np.float32)
    before = x.copy()
    ef = ErrorFeedback(make("topk", ratio=0.3))
    ef.encode(x)
    np.testing.assert_array_equal(x, before)
    np.testing.assert_array_equal(ef.residual, np.array([0.0, 0.4, 0.3], np.float32))
    ef.encode(x)
    np.testing.assert_array_equal(x, before)


def test_reset_also_drops_the_codecs_warm_start():
    xs = grads(3, seed=4)
    used = ErrorFeedback(make("powersgd", rank=2))
    for x in xs[:2]:
        used.encode(x, np.random.default_rng(1))
    used.reset()
    fresh = ErrorFeedback(make("powersgd", rank=2))
    assert used.state_dict() == {} == fresh.state_dict()
    np.testing.assert_array_equal(used.decode(used.encode(xs[2], np.random.default_rng(2))),
                                  fresh.decode(fresh.encode(xs[2], np.random.default_rng(2))))


def test_error_messages_name_the_problem():
    with pytest.raises(ValueError, match="wraps a Codec, got str"):
        ErrorFeedback("sign")
    ef = ErrorFeedback(make("sign"))
    ef.encode(np.ones(4, np.float32))
    with pytest.raises(ValueError, match=r"\(4,\).*call reset\(\) when the model changes"):
        ef.encode(np.ones(5, np.float32))
    with pytest.raises(ValueError, match="residual contains NaN or inf"):
        ef.load_state_dict({"residual": np.array([np.inf], np.float32)})


def test_loading_a_residual_alone_keeps_the_codecs_own_state():
    xs = grads(3, seed=6)
    a, b = ErrorFeedback(make("powersgd", rank=2)), ErrorFeedback(make("powersgd", rank=2))
    for x in xs[:2]:
        a.encode(x, np.random.default_rng(0))
        b.encode(x, np.random.default_rng(0))
    b.load_state_dict({"residual": np.zeros_like(xs[0])})  # no codec/... keys
    assert set(b.state_dict()) == set(a.state_dict()) == {"residual", "codec/q/24x20x2"}
    np.testing.assert_array_equal(b.state_dict()["codec/q/24x20x2"],
                                  a.state_dict()["codec/q/24x20x2"])
    np.testing.assert_array_equal(b.residual, 0)
