"""RandomShift: seeded shifts of whole images, zero padded."""

import pytest
import torch

from dq_flower.augment import RandomShift


def test_each_image_is_itself_shifted_by_at_most_max_shift():
    x = torch.rand(50, 3, 8, 9) + 1.0  # no zero inside an image
    y = RandomShift(2, seed=3)(x)
    assert y.shape == x.shape
    for i in range(50):
        found = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                 if torch.equal(y[i], _shift(x[i], dy, dx))]
        assert len(found) == 1


def test_the_shifts_come_from_the_seed():
    x = torch.rand(20, 1, 6, 6)
    assert torch.equal(RandomShift(2, seed=1)(x), RandomShift(2, seed=1)(x))
    assert not torch.equal(RandomShift(2, seed=1)(x), RandomShift(2, seed=2)(x))
    assert torch.equal(RandomShift(0)(x), x)


def test_a_negative_shift_is_refused():
    with pytest.raises(ValueError, match="max_shift"):
        RandomShift(-1)


def _shift(img, dy, dx):
    """``img`` moved by (dy, dx) pixels, zero padded (reference implementation)."""
    out = torch.zeros_like(img)
    h, w = img.shape[-2:]
    src = img[..., max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)]
    out[..., max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)] = src
    return out
