"""The token-window coder: lossless for every width, strict on hostile streams."""

from __future__ import annotations

import tracemalloc
import zlib

import numpy as np
import pytest

from dq_flower.codecs import PayloadError
from dq_flower.codecs import tokens as coder

ENGLISH = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. However little known the feelings or views of "
    "such a man may be on his first entering a neighbourhood, this truth is so well fixed "
    "in the minds of the surrounding families, that he is considered the rightful property "
    "of some one or other of their daughters.\n\n")


def _windows(text: str, length: int) -> np.ndarray:
    raw = np.frombuffer(text.encode(), dtype=np.uint8)
    m = raw.size // length
    return raw[:m * length].reshape(m, length).astype(np.int64)


@pytest.mark.parametrize("vocab, n, length", [
    (256, 7, 33), (2, 3, 50), (300, 5, 16), (49_152, 4, 24), (1 << 24, 2, 9),
    (256, 1, 1), (256, 0, 8), (65_536, 3, 5)])
def test_random_windows_round_trip_exactly(vocab, n, length):
    rng = np.random.default_rng([vocab, n, length])
    ids = rng.integers(0, vocab, size=(n, length))
    stream = coder.encode(ids, vocab)
    assert stream.dtype == np.uint8 and stream.size % 4 == 0
    back = coder.decode(stream, vocab, n, length)
    assert back.dtype == np.int64 and np.array_equal(back, ids)


def test_text_without_long_repeats_is_coded_below_zlib():
    # 4 KB of the paragraph's words in a seeded order: English letter statistics, no long
    # repeats for deflate to find (a repeated paragraph is deflate's case, not this model's)
    words = ENGLISH.split()
    text = " ".join(np.random.default_rng(0).choice(words, size=800))
    ids = _windows(text, 64)
    stream = coder.encode(ids, 256)
    assert np.array_equal(coder.decode(stream, 256, *ids.shape), ids)
    zipped = len(zlib.compress(ids.astype(np.uint8).tobytes(), 9))
    assert stream.size < 0.8 * zipped < ids.size  # measured: 964 against 1,252 bytes


def test_the_same_windows_give_the_same_stream():
    ids = _windows(ENGLISH * 2, 32)
    assert np.array_equal(coder.encode(ids, 256), coder.encode(ids.copy(), 256))


@pytest.fixture(scope="module")
def stream() -> np.ndarray:
    return coder.encode(_windows(ENGLISH * 2, 32), 256)


def test_truncated_or_extended_streams_are_refused(stream):
    n = _windows(ENGLISH * 2, 32).shape[0]
    with pytest.raises(PayloadError):
        coder.decode(stream[:-4], 256, n, 32)
    with pytest.raises(PayloadError, match="made for|left over|corrupt"):
        coder.decode(np.concatenate([stream, np.full(4, 7, np.uint8)]), 256, n, 32)
    with pytest.raises(PayloadError, match="whole 32-bit words"):
        coder.decode(stream[:-1], 256, n, 32)


def test_a_stream_for_another_count_is_refused_before_decoding(stream):
    n = _windows(ENGLISH * 2, 32).shape[0]
    with pytest.raises(PayloadError, match="was made for"):
        coder.decode(stream, 256, n - 1, 32)


def test_random_streams_raise_payload_errors_only():
    rng = np.random.default_rng(5)
    for _ in range(60):
        junk = rng.integers(0, 256, size=4 * int(rng.integers(1, 40)), dtype=np.uint8)
        try:
            out = coder.decode(junk, 256, 2, 16)
        except PayloadError:
            continue
        assert out.shape == (2, 16)  # a lucky stream decodes to valid ids, nothing else


def test_ids_outside_the_vocabulary():
    ids = np.array([[1, 299, 5]])
    stream = coder.encode(ids, 300)
    with pytest.raises(PayloadError, match="token id 299 is outside the vocabulary of 280"):
        coder.decode(stream, 280, 1, 3)  # same width: decodes, then refuses the id
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 280\)"):
        coder.encode(ids, 280)
    with pytest.raises(PayloadError, match="vocabulary of"):
        coder.decode(stream, 1 << 25, 1, 3)


def test_huge_declared_counts_are_refused_before_any_allocation():
    tracemalloc.start()
    try:
        with pytest.raises(PayloadError, match="at most"):
            coder.decode(np.zeros(8, np.uint8), 256, 1 << 20, 1 << 10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    with pytest.raises(PayloadError, match="at most"):
        coder.decode(np.zeros(8, np.uint8), 49_152, coder.MAX_SYMBOLS // 2, 2)


def test_the_tables_are_fixed_in_size():
    assert coder.table_bytes(256) == 4 * 256 * (1 + 257 + (coder.ORDER - 1) * coder.HASH_ROWS)
    assert coder.table_bytes(49_152) == coder.table_bytes(300)
    assert coder.table_bytes(49_152) < 32 << 20
