import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dq_flower.codecs import make
from dq_flower.dq.rows import RowLayout
from dq_flower.dq.scoring import score_candidates
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
