"""Server-side augmentation of DQ's minibatches (``DQStrategy(model, augment=...)``).

Any callable ``augment(x) -> x`` on a float tensor shaped like the samples (batch first)
works; :class:`RandomShift` is a seeded choice for images.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["RandomShift"]


class RandomShift:
    """Shift each image by up to ``max_shift`` pixels along each spatial axis (zero padded).

    Parameters
    ----------
    max_shift : int
        Largest shift in pixels, in each direction.
    seed : int
        Seed of the shifts' own generator (never the global RNG).
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
        padded = F.pad(flat, (s, s, s, s))
        dy = torch.randint(0, 2 * s + 1, (n,), generator=self.generator)
        dx = torch.randint(0, 2 * s + 1, (n,), generator=self.generator)
        rows = dy[:, None] + torch.arange(h)[None, :]  # (n, h): rows of the padded image
        cols = dx[:, None] + torch.arange(w)[None, :]  # (n, w)
        out = padded[torch.arange(n)[:, None, None, None],
                     torch.arange(flat.shape[1])[None, :, None, None],
                     rows[:, None, :, None], cols[:, None, None, :]]
        return out.reshape(x.shape)
