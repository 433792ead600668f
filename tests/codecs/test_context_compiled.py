"""The compiled ``context`` coder (numba) against the constriction coder it replaces.

Both must write the same stream byte for byte (the wire format is one), decode each other's
streams, and refuse the same bad streams with a PayloadError.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dq_flower.codecs import PayloadError, context

pytestmark = pytest.mark.skipif(not context.compiled(), reason="numba is not installed")


def _constriction_encode(codes, bits, n, d, shape):
    waves = context._schedule(n, d, bits, context.check_shape(shape, d))
    words = context._encode_constriction(waves, waves.layout(codes.reshape(-1)), n * d)
    return np.ascontiguousarray(words, dtype="<u4").view(np.uint8).copy()


def _constriction_decode(stream, bits, n, d, shape):
    waves = context._schedule(n, d, bits, context.check_shape(shape, d))
    grid = context._decode_constriction(waves, stream.view("<u4").astype(np.uint32), n * d)
    return waves.unlayout(grid)


@st.composite
def batches(draw):
    """Random codes of every width, image-shaped (C, H, W) or flat, skewed or uniform."""
    bits = draw(st.integers(1, 8))
    n = draw(st.integers(1, 70))
    if draw(st.booleans()):
        shape = (draw(st.integers(1, 6)), draw(st.integers(1, 12)), draw(st.integers(1, 12)))
        d = shape[0] * shape[1] * shape[2]
    else:
        shape, d = None, draw(st.integers(1, 80))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        codes = rng.integers(0, 1 << bits, n * d)
    else:
        codes = np.minimum(rng.geometric(draw(st.sampled_from([0.3, 0.6, 0.95])), n * d) - 1,
                           (1 << bits) - 1)
    return codes.astype(np.uint8), bits, n, d, shape


@settings(max_examples=400, deadline=None, derandomize=True)
@given(batches())
def test_compiled_stream_is_constrictions_byte_for_byte(batch):
    codes, bits, n, d, shape = batch
    stream = context.encode(codes, bits, n, d, shape)
    np.testing.assert_array_equal(stream, _constriction_encode(codes, bits, n, d, shape))
    np.testing.assert_array_equal(context.decode(stream, bits, n, d, shape), codes)
    np.testing.assert_array_equal(_constriction_decode(stream, bits, n, d, shape), codes)


@pytest.mark.parametrize("bits", [1, 2, 3, 8])
def test_large_image_batches_agree(bits):
    """Messages of DQ's size (64 samples of 1x28x28, and many channels: groups of 4)."""
    rng = np.random.default_rng(bits)
    for shape in [(1, 28, 28), (6, 9, 7)]:
        d = int(np.prod(shape))
        smooth = np.cumsum(rng.random((64, d)) < 0.1, axis=1) % (1 << bits)
        codes = smooth.astype(np.uint8).reshape(-1)
        stream = context.encode(codes, bits, 64, d, shape)
        np.testing.assert_array_equal(stream, _constriction_encode(codes, bits, 64, d, shape))
        np.testing.assert_array_equal(context.decode(stream, bits, 64, d, shape), codes)


@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("n,shape", [(64, (1, 28, 28)), (5, (3, 6, 7)), (9, (4, 2, 9)),
                                     (3, (1, 1, 1)), (4, (1, 1, 6)), (6, (2, 5, 1)),
                                     (7, (1, 3, 2)), (2, (6, 4, 3))])
def test_wave_layout_image_decoder_reads_the_same_stream(bits, n, shape):
    """1-bit and 2-bit images decode through the wave-by-wave layout (byte cells where every
    context fits, 16-bit cells for 2-bit codes of several channel groups): the codes of the
    constriction coder's stream, on edge shapes (a single row, column or cell) and DQ's."""
    from dq_flower.codecs import context_ans

    rng = np.random.default_rng(bits * 100 + n)
    d = int(np.prod(shape))
    for skew in (0.3, 0.9):
        codes = np.minimum(rng.geometric(skew, n * d) - 1, (1 << bits) - 1).astype(np.uint8)
        stream = _constriction_encode(codes, bits, n, d, shape)
        np.testing.assert_array_equal(context.encode(codes, bits, n, d, shape), stream)
        np.testing.assert_array_equal(context.decode(stream, bits, n, d, shape), codes)
        geom, feature, rows = context._geometry(n, d, bits, shape)
        out = np.full(n * d, 255, np.uint8)
        status, head = context_ans.decode_words(stream.view("<u4").astype(np.uint32), out,
                                                geom, feature, rows, 1 << bits)
        assert (status, head) == (context_ans.OK, n * d)
        np.testing.assert_array_equal(out, codes)


def test_the_constriction_path_runs_without_numba(monkeypatch):
    """Without numba the module falls back to constriction: the same stream, decoded."""
    codes = np.random.default_rng(5).integers(0, 4, 10 * 64).astype(np.uint8)
    stream = context.encode(codes, 2, 10, 64, (1, 8, 8))
    monkeypatch.setattr(context, "_compiled", lambda: None)
    assert not context.compiled()
    np.testing.assert_array_equal(context.encode(codes, 2, 10, 64, (1, 8, 8)), stream)
    np.testing.assert_array_equal(context.decode(stream, 2, 10, 64, (1, 8, 8)), codes)
    with pytest.raises(ValueError, match="codes must lie"):
        context.encode(codes, 1, 10, 64, (1, 8, 8))


@pytest.mark.parametrize("use_compiled", [True, False])
def test_out_of_range_codes_are_refused(monkeypatch, use_compiled):
    if not use_compiled:
        monkeypatch.setattr(context, "_compiled", lambda: None)
    with pytest.raises(ValueError, match="codes must lie"):
        context.encode(np.array([0, 1, 2, 1], np.uint8), 1, 1, 4, None)
    with pytest.raises(ValueError, match="codes must lie"):
        context.encode(np.array([0, 1, 300, 1]), 8, 1, 4, None)


def _verdict(decode, stream, bits, n, d, shape):
    try:
        return decode(stream, bits, n, d, shape).tobytes()
    except PayloadError:
        return "refused"


def test_both_coders_refuse_the_same_corrupt_streams(monkeypatch):
    """Seeded Monte Carlo: 300 streams with flipped bits, overwritten or dropped words, and
    wrong declared counts; the compiled and the constriction decoder reach the same verdict
    on each (the same codes, or a PayloadError), and nearly all are refused."""
    rng = np.random.default_rng(7)
    refused = 0
    for trial in range(300):
        bits = int(rng.integers(1, 4))
        shape = (1, 8, 8) if trial % 2 else None
        n = int(rng.integers(2, 20))
        codes = np.minimum(rng.geometric(0.5, n * 64) - 1, (1 << bits) - 1).astype(np.uint8)
        bad = context.encode(codes, bits, n, 64, shape).copy()
        declared = n
        kind = trial % 4
        if kind == 0:
            bad[int(rng.integers(bad.size))] ^= np.uint8(1 << int(rng.integers(8)))
        elif kind == 1:
            j = 4 * int(rng.integers(bad.size // 4))
            bad[j:j + 4] = rng.integers(0, 256, 4, dtype=np.uint8)
        elif kind == 2:
            bad = bad[4:] if rng.random() < 0.5 else bad[:-4]
        else:
            declared = n + int(rng.integers(1, 3))
        compiled = _verdict(context.decode, bad, bits, declared, 64, shape)
        monkeypatch.setattr(context, "_compiled", lambda: None)
        fallback = _verdict(context.decode, bad, bits, declared, 64, shape)
        monkeypatch.undo()
        assert compiled == fallback, trial
        refused += compiled == "refused"
    assert refused >= 280


def test_a_zero_last_word_and_left_over_words_are_refused():
    codes = np.zeros(64, np.uint8)
    stream = context.encode(codes, 1, 1, 64, (1, 8, 8))
    with pytest.raises(PayloadError, match="zero word"):
        context.decode(np.concatenate([stream, np.zeros(4, np.uint8)]), 1, 1, 64, (1, 8, 8))
    with pytest.raises(PayloadError, match="does not end"):
        context.decode(np.concatenate([stream[:4], stream]), 1, 1, 64, (1, 8, 8))


def test_the_benchmark_prints_both_ratios(capsys, monkeypatch):
    """benchmarks/context_coder.py on the breast-cancer table at 1 bit: a row with the
    context/zlib encode and decode ratios, and which coder ran."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "context_coder.py"
    spec = importlib.util.spec_from_file_location("context_coder_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["context_coder.py", "--data", "cancer", "--bits", "1",
                                      "--repeats", "1", "--fmnist-dir", "/nonexistent"])
    module.main()
    out = capsys.readouterr().out
    assert out.startswith("context coder: compiled (numba)")
    row = next(line for line in out.splitlines() if line.startswith("| cancer | 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[5]) < float(cells[3])  # context codes smaller than zlib here
    assert cells[8].endswith("x") and cells[11].endswith("x") and cells[12].endswith("x")
