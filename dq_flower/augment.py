"""Server-side augmentation of DQ's minibatches (the ``augmentation`` knob).

``DQStrategy(model, augment=...)`` takes any ``augment(x) -> x`` on a batch instead.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["RandomShift", "RandomFlip", "augmentation_for", "MIN_SIDE", "MAX_ASPECT"]

#: Smallest image side (pixels) that ``auto`` shifts: smaller images are left alone.
MIN_SIDE = 14
#: ``auto`` shifts image-shaped samples only: the long side at most this many times the
#: short (a (channels, time) series, an EEG's 22 x 256, would shift channels into each other).
MAX_ASPECT = 2


class RandomShift:
    """Shift each image by up to ``max_shift`` pixels along each spatial axis.

    The pixels a shift uncovers take each image channel's smallest value, its background
    in most images: 0 for raw pixels, -2 for an image normalised to a background of -2.
    """

    def __init__(self, max_shift: int = 2, seed: int = 0) -> None:
        if max_shift < 0:
            raise ValueError(f"max_shift must be >= 0, got {max_shift}")
        self.max_shift = int(max_shift)
        self.generator = torch.Generator().manual_seed(int(seed))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Shifted copies of the images ``x`` of shape ``(n, ..., height, width)``."""
        if self.max_shift == 0 or x.ndim < 3:
            return x
        s = self.max_shift
        n, h, w = x.shape[0], x.shape[-2], x.shape[-1]
        flat = x.reshape(n, -1, h, w)  # every leading axis after the batch as channels
        low = flat.amin(dim=(-2, -1), keepdim=True)  # each image channel's background
        padded = F.pad(flat - low, (s, s, s, s)) + low
        dy = torch.randint(0, 2 * s + 1, (n,), generator=self.generator)
        dx = torch.randint(0, 2 * s + 1, (n,), generator=self.generator)
        rows = dy[:, None] + torch.arange(h)[None, :]  # (n, h): rows of the padded image
        cols = dx[:, None] + torch.arange(w)[None, :]  # (n, w)
        out = padded[torch.arange(n)[:, None, None, None],
                     torch.arange(flat.shape[1])[None, :, None, None],
                     rows[:, None, :, None], cols[:, None, None, :]]
        return out.reshape(x.shape)


class RandomFlip:
    """Flip each image left-right with probability one half (seeded, own generator)."""

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(int(seed))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` of shape ``(n, ..., height, width)``, half of its images mirrored."""
        if x.ndim < 3:
            return x
        flip = torch.rand(x.shape[0], generator=self.generator) < 0.5
        return torch.where(flip.reshape(-1, *([1] * (x.ndim - 1))), x.flip(-1), x)


def augmentation_for(name: str, sample_shape: tuple[int, ...], rng: np.random.Generator
                     ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The built-in augmentation ``name`` for samples of ``sample_shape`` (or ``None``).

    ``auto`` and ``shift`` shift by up to ``min(H, W) // 14`` pixels (``auto``: sides of
    :data:`MIN_SIDE` up, the long one at most :data:`MAX_ASPECT` times the short),
    ``shift-flip`` also flips; seeded by one draw of ``rng``.
    """
    if name == "none" or len(sample_shape) < 2:
        return None
    side = min(int(sample_shape[-1]), int(sample_shape[-2]))
    long_side = max(int(sample_shape[-1]), int(sample_shape[-2]))
    if name == "auto" and (side < MIN_SIDE or long_side > MAX_ASPECT * side):
        return None
    seed = int(rng.integers(2**31))
    shift = RandomShift(max(side // 14, 1), seed)
    if name != "shift-flip":
        return shift
    flip = RandomFlip(seed + 1)
    return lambda x: flip(shift(x))
