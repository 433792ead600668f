import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dq_flower.codecs import make
from dq_flower.dq.client.scoring import score_candidates
from dq_flower.dq.server.store import RowLayout
from dq_flower.harness.tasks.models import make_model


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 8), n=st.integers(1, 9), channels=st.sampled_from([1, 3]),
       width=st.integers(1, 13), dither=st.booleans(), entropy=st.sampled_from(["none", "zlib"]),
       seed=st.integers(0, 2**31))
def test_row_layout_dequantizes_exactly_like_the_codec(bits, n, channels, width, dither, entropy,
                                                        seed):
    rng = np.random.default_rng(seed)
    d = channels * width
    x = rng.random((n, d)).astype(np.float32)
    codec = make("uniform", bits=bits, per_channel=channels if channels > 1 else 0,
                 dither_seed=seed if dither else None, entropy=entropy)
    payload = codec.encode(x, rng)
    layout = RowLayout(d, bits, channels)

    codes, side, dith = layout.rows(payload)
    assert codes.shape == (n, layout.row_bytes)
    order = rng.permutation(n)  # rows are decoded alone, in any order
    got = layout.dequantize(codes[order], side[order], dith[order])

    np.testing.assert_allclose(got, codec.decode(payload)[order], rtol=0, atol=1e-6)


def test_rows_are_byte_aligned_with_less_than_one_code_group_of_padding():
    import math

    for bits in range(1, 9):
        for d in (1, 7, 64, 784):
            layout = RowLayout(d, bits)
            padding_bits = layout.row_bytes * 8 - d * bits
            assert (layout.padded_dim * bits) % 8 == 0
            assert 0 <= padding_bits < math.lcm(8, bits)
            if (d * bits) % 8 == 0:
                assert padding_bits == 0


@pytest.mark.parametrize("bits,d", [(1, 16), (2, 64), (3, 8), (4, 6), (8, 5), (2, 7)])
def test_rows_of_whole_bytes_are_the_stream_itself(bits, d):
    # rows that end on a whole byte are taken from the packed stream as it is; they equal
    # the codes unpacked, padded and packed again row by row
    from dq_flower.codecs.bitpack import pack, unpack

    rng = np.random.default_rng(bits * d)
    payload = make("uniform", bits=bits).encode(rng.random((5, d)).astype(np.float32), rng)
    layout = RowLayout(d, bits)
    codes = unpack(payload.buffers["codes"], bits, 5 * d).reshape(5, d)
    codes = np.pad(codes, ((0, 0), (0, layout.padded_dim - d)))
    expected = pack(codes.reshape(-1), bits).reshape(5, layout.row_bytes)
    rows = layout.rows(payload)[0]
    np.testing.assert_array_equal(rows, expected)
    assert rows.flags.writeable and not np.shares_memory(rows, payload.buffers["codes"])


def test_gradnorm_score_is_the_last_layer_gradient_norm():
    torch.manual_seed(0)
    model = make_model("mlp", (1, 8, 8), 10, seed=1)
    rng = np.random.default_rng(0)
    x = rng.random((6, 64)).astype(np.float32)
    y = rng.integers(0, 10, 6)
    scores = score_candidates("gradnorm", model, x, y)
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    for i in range(6):
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x[i:i + 1])),
                                                 torch.tensor([y[i]]))
        loss.backward()
        norm = torch.sqrt(last.weight.grad.pow(2).sum() + last.bias.grad.pow(2).sum())
        assert scores[i] == pytest.approx(float(norm), rel=1e-4)


def test_loss_score_is_the_per_sample_loss():
    model = make_model("logreg", (64,), 10, seed=2)
    rng = np.random.default_rng(1)
    x = rng.random((5, 64)).astype(np.float32)
    y = rng.integers(0, 10, 5)
    scores = score_candidates("loss", model, x, y)
    expected = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y),
                                                 reduction="none").detach().numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-5)


# ---------------------------------------------------------------- decoded once
def _samples(bits, crop, entropy, n=63):
    """Digit images cropped to ``crop x crop``: rows a coder shrinks (7 x 7 leaves padding)."""
    from sklearn.datasets import load_digits

    x = (load_digits().images[:n, :crop, :crop] / 16).reshape(n, -1).astype(np.float32)
    return make("uniform", bits=bits, entropy=entropy).encode(x, np.random.default_rng(0))


@pytest.mark.parametrize("entropy", ["zlib", "context"])
@pytest.mark.parametrize(("bits", "crop"), [(2, 8), (1, 8), (2, 7), (3, 7), (4, 7)])
def test_the_plain_payload_decodes_the_same_without_decoding_its_stream_again(entropy, bits,
                                                                               crop):
    from dq_flower.codecs.uniform import packed_codes, plain_payload

    # Prepare
    p = _samples(bits, crop, entropy)
    assert p.meta["entropy"] == entropy  # the coder shrank it
    n, d = p.shape
    # Execute
    plain = plain_payload(p, bits)
    # Assert: the same values and sizes a packed payload of them would have
    codec = make("uniform", bits=bits, entropy=entropy)
    np.testing.assert_array_equal(codec.decode(plain), codec.decode(p))
    assert plain.meta["entropy"] == "none" and "context_shape" not in plain.meta
    assert p.meta["ranges"] == "zlib"  # the ranges are coded too, and undone
    assert plain.nbits == (p.nbits - 8 * p.buffers["codes"].size + n * d * bits
                           - 8 * p.buffers["ranges"].size + 64 * n)
    packed = plain.buffers["codes"]
    assert packed.size == -(-n * d * bits // 8)
    spare = 8 * packed.size - n * d * bits
    assert (spare > 0) == (crop == 7)
    assert int(packed[-1]) & ((1 << spare) - 1) == 0  # the padding bits are cleared
    np.testing.assert_array_equal(packed_codes(plain, bits), packed)
    raw = _samples(bits, crop, "none")  # the same rows, ranges sent raw
    for name in ("mins", "scales"):
        np.testing.assert_array_equal(plain.buffers[name], raw.buffers[name])
    assert "ranges" not in plain.buffers and "ranges" not in plain.meta
    assert p.meta["entropy"] == entropy  # the input is left as it was
    assert plain_payload(plain, bits) is plain  # nothing left to undo


def test_the_plain_payload_clears_padding_bits_a_coded_stream_carried():
    import dataclasses
    import zlib

    from dq_flower.codecs.uniform import packed_codes, plain_payload

    # Prepare: a zlib stream whose last byte has its 3 padding bits set (63 x 49 x 3 bits)
    p = _samples(3, 7, "zlib")
    packed = packed_codes(p, 3).copy()
    packed[-1] |= np.uint8(0b111)
    dirty = dataclasses.replace(p, buffers={
        **p.buffers, "codes": np.frombuffer(zlib.compress(packed.tobytes()), np.uint8)})
    assert packed_codes(dirty, 3)[-1] & 0b111 == 0b111
    # Execute
    plain = plain_payload(dirty, 3)
    # Assert
    assert plain.buffers["codes"][-1] & 0b111 == 0
    np.testing.assert_array_equal(plain.buffers["codes"][:-1], packed[:-1])
    assert plain.buffers["codes"][-1] == packed[-1] & 0b11111000
    assert packed_codes(dirty, 3)[-1] & 0b111 == 0b111  # the input is left as it was


def test_the_plain_payload_keeps_a_context_shape_it_does_not_own_and_passes_odd_shapes():
    import dataclasses

    from dq_flower.codecs.uniform import plain_payload

    p = _samples(2, 8, "zlib")
    tagged = dataclasses.replace(p, meta={**p.meta, "context_shape": "28x28"})
    assert plain_payload(tagged, 2).meta["context_shape"] == "28x28"  # for the check to see
    flat = dataclasses.replace(p, shape=(63 * 64,))
    assert plain_payload(flat, 2) is flat
    assert plain_payload(dataclasses.replace(p, meta={**p.meta, "entropy": 7}), 2).meta[
        "entropy"] == 7
    raw_ranges = _samples(2, 8, "none")
    no_codes = dataclasses.replace(raw_ranges, meta={**raw_ranges.meta, "entropy": "zlib"},
                                   buffers={k: v for k, v in raw_ranges.buffers.items()
                                            if k != "codes"})
    assert plain_payload(no_codes, 2) is no_codes


def test_kept_rows_cut_the_labels_and_name_the_payload_rows_still_used():
    from dq_flower.dq.server.validation import keep_rows, kept_rows
    from dq_flower.wire.dq_batch import SampleBatch

    # Prepare
    p = _samples(2, 8, "none", n=5)
    batch = SampleBatch(p, np.arange(5, dtype=np.int64) * 10, np.arange(100, 105),
                        np.linspace(1, 2, 5).astype(np.float32), info_nbits=9)
    assert kept_rows(batch) is None
    # Execute
    first = keep_rows(batch, np.array([True, False, True, True, False]))
    second = keep_rows(first, [False, True, True])
    # Assert
    np.testing.assert_array_equal(kept_rows(first), [0, 2, 3])
    np.testing.assert_array_equal(first.labels, [0, 20, 30])
    np.testing.assert_array_equal(first.ids, [100, 102, 103])
    np.testing.assert_array_equal(first.weights, batch.weights[[0, 2, 3]])
    np.testing.assert_array_equal(kept_rows(second), [2, 3])  # rows of the payload
    np.testing.assert_array_equal(second.ids, [102, 103])
    assert second.samples is p and second.info_nbits == 9 and len(second) == 2
    assert isinstance(second, SampleBatch)
