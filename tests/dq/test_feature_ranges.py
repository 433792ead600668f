"""Tabular rows: per-feature ranges (normalise, travel, parse) and the store's fixed-range
row layout, which must decode exactly like the fixed-range quantizer."""

import numpy as np
import pytest
import torch

from dq_flower import DQStrategy
from dq_flower.codecs import PayloadError, make
from dq_flower.codecs.affine import denormalise, feature_ranges, normalise
from dq_flower.dq.server.store import RowLayout
from dq_flower.wire.dq_batch import range_mode, ranges_from_record, ranges_record


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dither", [False, True])
def test_fixed_range_rows_decode_exactly_like_the_codec(bits, dither):
    rng = np.random.default_rng(bits)
    n, d = 9, 13  # 13 codes a row: rows are padded to whole bytes for most widths
    x = rng.random((n, d)).astype(np.float32)
    codec = make("uniform", bits=bits, fixed_range=True, dither_seed=7 if dither else None)
    payload = codec.encode(x, rng)
    layout = RowLayout(d, bits, fixed=True)

    codes, side, dith = layout.rows(payload)

    assert codes.shape == (n, layout.row_bytes) and side.shape == (n, 0)
    assert dith.shape == ((n, 2) if dither else (n, 0))
    order = rng.permutation(n)  # each row decodes alone, in any order
    got = layout.dequantize(codes[order], side[order], dith[order])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, codec.decode(payload)[order])
    step = 1 / ((1 << bits) - 1)
    assert np.abs(got - x[order]).max() <= step * (1 + 1e-6)  # within one step of the data


def test_feature_ranges_are_per_column_min_and_span():
    x = np.array([[1.0, 5.0, -2.0], [3.0, 5.0, 2.0], [2.0, 5.0, 0.0]], np.float32)
    lo, span = feature_ranges(x)
    np.testing.assert_array_equal(lo, [1.0, 5.0, -2.0])
    np.testing.assert_array_equal(span, [2.0, 1.0, 4.0])  # a constant feature: span 1
    assert lo.dtype == span.dtype == np.float32
    xn = normalise(x, lo, span)
    assert xn.dtype == np.float32 and xn.min() == 0.0 and xn.max() == 1.0
    np.testing.assert_array_equal(xn[:, 1], 0.0)
    np.testing.assert_allclose(denormalise(xn, lo, span), x, rtol=0, atol=1e-6)
    assert denormalise(xn, lo, span).dtype == np.float32
    lo, span = feature_ranges(np.zeros((0, 4), np.float32))  # no rows: the unit range
    np.testing.assert_array_equal(lo, np.zeros(4))
    np.testing.assert_array_equal(span, np.ones(4))
    assert lo.dtype == span.dtype == np.float32


def test_ranges_travel_as_raw_float32_and_are_checked():
    lo = np.array([0.5, -1.0], np.float32)
    span = np.array([2.0, 0.25], np.float32)
    record = ranges_record(lo, span)
    assert len(record["ranges"].data) == 4 * 4  # lo then span, float32 each
    got_lo, got_span = ranges_from_record(record, 2)
    np.testing.assert_array_equal(got_lo, lo)
    np.testing.assert_array_equal(got_span, span)
    with pytest.raises(PayloadError, match="expected 6"):
        ranges_from_record(record, 3)
    for bad_span in ([2.0, 0.0], [2.0, -1.0], [np.inf, 1.0]):
        with pytest.raises(PayloadError,
                           match="^feature ranges must be finite with positive spans$"):
            ranges_from_record(ranges_record(lo, np.array(bad_span, np.float32)), 2)
    with pytest.raises(PayloadError, match="finite"):
        ranges_from_record(ranges_record(np.array([np.nan, 0], np.float32), span), 2)


@pytest.mark.parametrize(("ranges", "shape", "mode"), [
    ("auto", (20,), "feature"),      # flat samples (tabular): per feature
    ("auto", (1, 8, 8), "sample"),   # images: per sample
    ("auto", (3, 8, 8), "sample"),
    ("channel", (3, 4, 4), "channel"),
    ("channel", (1, 8, 8), "sample"),  # one channel: nothing to split
    ("channel", (12,), "sample"),
    ("sample", (20,), "sample"),
    ("feature", (1, 8, 8), "feature"),
])
def test_range_mode(ranges, shape, mode):
    assert range_mode(ranges, shape) == mode


def test_per_channel_is_gone_and_its_key_says_what_replaces_it():
    with pytest.raises(ValueError, match="ranges = 'channel' is the same"):
        DQStrategy.from_run_config(torch.nn.Linear(4, 2), {"per-channel": True})
    with pytest.raises(ValueError, match="unknown knob 'per_channel'.*ranges = 'channel'"):
        DQStrategy(torch.nn.Linear(4, 2), per_channel=True)


def test_rows_refuse_samples_of_another_dimension():
    p = make("uniform", bits=2).encode(np.ones((2, 5), np.float32), np.random.default_rng(0))
    with pytest.raises(PayloadError, match="dimension 5, expected 6"):
        RowLayout(6, 2).rows(p)
