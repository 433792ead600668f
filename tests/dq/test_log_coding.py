"""Heavy-tailed table columns coded in the log domain (``codecs.affine.log_scales``).

The criterion, the round trip's error per level, the dither's unbiasedness in the log
domain (and its measured bias in raw units), the ranges record and the server's checks of
it, the node's kept ranges, and a fraud table's run with and without it.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, MetricRecord, RecordDict

from dq_flower.codecs import PayloadError, make
from dq_flower.codecs.affine import denormalise, feature_ranges, log_scales, normalise
from dq_flower.codecs.payload import raw_array
from dq_flower.dq.client.sent import RANGES_STATE, coding_ranges, keep_sent, sent_rows
from dq_flower.dq.server.validation import History, Rules, check_upload
from dq_flower.wire.dq_batch import (
    RANGES_KEY,
    SPEC_KEY,
    DataSpec,
    ranges_from_record,
    ranges_record,
    spec_record,
)
from dq_flower.wire.dq_upload import encode_batch

BITS, LEVELS = 4, 16  # DQ's default for tables


def _pareto(rng: np.random.Generator, n: int) -> np.ndarray:
    """Transaction amounts: Pareto-tailed above 20 (as the fraud probe's)."""
    return (rng.pareto(1.3, n) + 1) * 20


def _coded(x: np.ndarray, ranges: tuple[np.ndarray, ...], seed: int = 3) -> np.ndarray:
    """Rows through DQ's table codec (fixed range, dithered) and back, as the server has them."""
    codec = make("uniform", bits=BITS, fixed_range=True, dither_seed=seed)
    payload = codec.encode(normalise(x, *ranges), np.random.default_rng(seed))
    return denormalise(codec.decode(payload), *ranges)


def _ranges(x: np.ndarray) -> tuple[np.ndarray, ...]:
    lo, span = feature_ranges(x)
    scale = log_scales(x, lo, span, LEVELS)
    return (lo, span) if scale is None else (lo, span, scale)


def test_long_tails_go_log_and_other_columns_stay_linear():
    rng = np.random.default_rng(0)
    n = 3000
    columns = [_pareto(rng, n), np.exp(rng.normal(7, 1.2, n)),  # amounts, balances
               np.where(rng.random(n) < 0.9, 0.0, _pareto(rng, n) * 50),  # mostly 0, a tail
               rng.uniform(0, 5000, n), np.exp(rng.normal(6.3, 0.35, n)),  # uniform, skewed
               rng.exponential(30, n), rng.poisson(3, n), rng.random(n) < 0.1]  # counts, flag
    x = np.stack(columns, 1).astype(np.float32)
    lo, span = feature_ranges(x)
    scale = log_scales(x, lo, span, LEVELS)
    assert scale is not None and scale.dtype == np.float32
    assert (scale > 0).tolist() == [True] * 3 + [False] * 5
    above = x[:, 0][x[:, 0] > lo[0]] - lo[0]  # the scale: the bulk's lower quartile
    assert scale[0] == pytest.approx(np.quantile(above.astype(np.float64), 0.25), rel=1e-6)
    assert log_scales(x[:, 3:], lo[3:], span[3:], LEVELS) is None  # nothing heavy: no scales
    assert (log_scales(x, lo, span, 256) > 0).sum() < 3  # 8 bits resolve the balances' bulk


def test_breast_cancer_columns_stay_linear_but_its_area_error():
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_breast_cancer()
    x = data.data.astype(np.float32)
    scale = log_scales(x, *feature_ranges(x), LEVELS)
    assert scale is not None
    # 'area error': 6.8 to 542 with its bulk in 18 to 45 (one 4-bit step is 36)
    assert [data.feature_names[j] for j in np.flatnonzero(scale)] == ["area error"]


def test_a_pareto_column_decodes_within_half_a_log_step_of_each_row():
    rng = np.random.default_rng(1)
    x = _pareto(rng, 4000).astype(np.float32)[:, None]
    ranges = _ranges(x)
    assert len(ranges) == 3
    lo, span, s = (float(a[0]) for a in ranges)
    back = _coded(x, ranges)[:, 0].astype(np.float64)
    half = np.log1p(span / s) / (LEVELS - 1) / 2  # half a step, in the log domain
    ratio = (back - lo + s) / (x[:, 0].astype(np.float64) - lo + s)
    assert np.exp(-half) * (1 - 1e-5) <= ratio.min() and ratio.max() <= np.exp(half) * (1 + 1e-5)
    relative = np.abs(back - x[:, 0]) / x[:, 0]
    uniform = np.abs(_coded(x, ranges[:2])[:, 0] - x[:, 0]) / x[:, 0]
    assert np.median(relative) < 0.1 < 1 < np.median(uniform)  # the bulk: 7% against 670%


def test_the_dither_is_unbiased_in_the_log_domain_and_biased_by_sinh_a_over_a_in_raw_units():
    rng = np.random.default_rng(2)
    base = _pareto(rng, 2000).astype(np.float32)[:, None]
    lo, span, s = (float(a[0]) for a in _ranges(base))
    draws = 4000  # each row's dither differs: the same value in 4000 rows
    values = np.array([lo, lo + s, 60.0, 1000.0, lo + span], np.float32)
    x = np.repeat(values, draws)[:, None]
    back = _coded(x, _ranges(base), seed=11)[:, 0].astype(np.float64).reshape(-1, draws)
    log_span = np.log1p(span / s)
    step = log_span / (LEVELS - 1)
    t = np.log1p((values.astype(np.float64) - lo) / s)
    err = np.log1p((back - lo) / s) - t[:, None]
    assert np.abs(err).max() <= step / 2 * (1 + 1e-4)
    stderr = step / np.sqrt(12 * draws)  # the error is uniform over one step
    assert np.abs(err.mean(1)).max() < 4 * stderr  # unbiased in the log domain
    half = step / 2
    raw_bias = np.exp(err).mean(1)  # (x' - lo + s) / (x - lo + s), on average
    assert raw_bias == pytest.approx(np.sinh(half) / half, abs=4 * stderr * np.exp(half))
    assert (raw_bias > 1).all()  # raw values come out high on average (Jensen)


def test_ranges_carry_the_log_flags_only_where_a_feature_is_log_coded():
    lo, span = np.array([1, 2, 3], np.float32), np.array([4, 5, 6], np.float32)
    plain = ranges_record(lo, span)
    assert set(plain) == {"ranges"}
    assert set(ranges_record(lo, span, np.zeros(3, np.float32))) == {"ranges"}
    scale = np.array([0, 2.5, 0], np.float32)
    record = ranges_record(lo, span, scale)
    assert len(record["log-features"].data) == 1 and len(record["log-scales"].data) == 4
    got = ranges_from_record(record, 3)
    assert len(got) == 3 and all(np.array_equal(a, b) for a, b in zip(got, (lo, span, scale),
                                                                       strict=True))
    assert len(ranges_from_record(plain, 3)) == 2
    wide = ranges_from_record(ranges_record(np.zeros(20, np.float32), np.ones(20, np.float32),
                                            np.arange(20, dtype=np.float32)), 20)
    np.testing.assert_array_equal(wide[2], np.arange(20))  # 19 flags in 3 bytes


def _malformed(**arrays) -> RecordDict:
    record = ranges_record(np.zeros(3, np.float32), np.ones(3, np.float32),
                           np.array([0, 2.5, 0], np.float32))
    for key, value in arrays.items():
        if value is None:
            del record[key]
        else:
            record[key] = raw_array(np.asarray(value))
    return record


@pytest.mark.parametrize(("arrays", "reason"), [
    ({"log-features": np.zeros(2, np.uint8)}, "must be 3 flags"),  # 2 bytes for 3 flags
    ({"log-features": np.zeros(0, np.uint8)}, "must be 3 flags"),
    ({"log-features": np.array([0b01010000], np.uint8)}, "padding clear"),
    ({"log-features": np.zeros(1, np.uint8)}, "one set at least"),
    ({"log-features": np.array([1.0], np.float32)}, "'log-features' is float32"),
    ({"log-scales": np.array([2.5, 1.0], np.float32)}, "must be 1 finite positive"),
    ({"log-scales": np.array([-1.0], np.float32)}, "must be 1 finite positive"),
    ({"log-scales": np.array([np.nan], np.float32)}, "must be 1 finite positive"),
    ({"log-scales": np.array([0.0], np.float32)}, "must be 1 finite positive"),
    ({"log-scales": None}, "feature-ranges misses 'log-scales'"),
    ({"log-features": None}, "feature-ranges misses 'log-features'"),
    ({"log-offsets": np.zeros(3, np.float32)}, "unknown array 'log-offsets'"),
])
def test_malformed_log_flags_are_refused_with_the_reason(arrays, reason):
    with pytest.raises(PayloadError, match=reason):
        ranges_from_record(_malformed(**arrays), 3)


SPEC = DataSpec((3,))
RULES = Rules(bits=BITS, dither=True, selection_rule="topk")


def _reply(x: np.ndarray, ranges: tuple[np.ndarray, ...]) -> RecordDict:
    codec = make("uniform", bits=BITS, fixed_range=True, dither_seed=5)
    samples = codec.encode(normalise(x, *ranges), np.random.default_rng(0))
    n = len(x)
    content, _ = encode_batch(samples, np.zeros(n, np.int64), np.arange(n), np.ones(n), 2, n)
    content[RANGES_KEY] = ranges_record(*ranges)
    content[SPEC_KEY] = spec_record(SPEC)
    content["metrics"] = MetricRecord({"num-examples": n, "candidates": n, "partition-id": 0})
    return content


def test_the_server_decodes_with_the_flags_and_refuses_malformed_ones():
    rng = np.random.default_rng(3)
    x = np.stack([_pareto(rng, 64), rng.uniform(0, 1, 64), rng.uniform(5, 9, 64)],
                 1).astype(np.float32)
    ranges = (*feature_ranges(x), np.array([4.0, 0, 0], np.float32))
    content = _reply(x, ranges)
    upload = check_upload(content, 1, RULES, History(), 64)
    assert upload.ranges is not None and len(upload.ranges) == 3
    codec = make("uniform", bits=BITS, fixed_range=True, dither_seed=5)
    samples = codec.encode(normalise(x, *ranges), np.random.default_rng(0))
    np.testing.assert_array_equal(upload.x, denormalise(codec.decode(samples), *ranges))
    content[RANGES_KEY]["log-features"] = raw_array(np.array([0b10010000], np.uint8))
    with pytest.raises(PayloadError, match="padding clear"):
        check_upload(content, 1, RULES, History(), 64)
    linear = _reply(x, ranges[:2])  # the flags gone since the node first sent them
    with pytest.raises(PayloadError, match="feature ranges changed"):
        check_upload(linear, 1, RULES, History(ranges=ranges), 64)


def test_the_node_keeps_its_scales_with_the_ranges_it_sent():
    rng = np.random.default_rng(4)
    x = np.stack([_pareto(rng, 500), rng.uniform(0, 1, 500)], 1).astype(np.float32)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    sent = coding_ranges(context, ConfigRecord({}), x, BITS, send=True)
    assert len(sent) == 3 and sent[2][0] > 0 and sent[2][1] == 0
    assert set(context.state.array_records[RANGES_STATE]) == {"lo", "span", "scale", "bits"}
    grown = np.concatenate([x, x * 3])
    kept = coding_ranges(context, ConfigRecord({}), grown, BITS, send=False)
    assert all(np.array_equal(a, b) for a, b in zip(kept, sent, strict=True))
    below = np.full((1, 2), -1e9, np.float32)  # grown below its minimum: the lowest code
    assert normalise(below, *kept)[0, 0] == 0
    codec = make("uniform", bits=BITS, fixed_range=True, dither_seed=5)
    payload = codec.encode(normalise(x, *sent), rng)
    keep_sent(context, 1, payload, np.arange(len(x)), np.ones(len(x)))
    got = sent_rows(context, ConfigRecord({}), x, np.zeros(len(x)), "feature", np.arange(len(x)))
    assert got is not None  # re-decoded as the server decodes them, log domain included
    np.testing.assert_array_equal(got[1], denormalise(codec.decode(payload), *sent))
