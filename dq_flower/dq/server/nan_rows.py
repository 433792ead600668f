"""Rows with missing values: the store keeps each row's NaN coordinates beside its codes.

Where the server's model reads NaN values otherwise than 0 but to finite outputs
(:func:`~dq_flower.model_inputs.keeps_nan`: ``torch.isnan(x)`` beside the values), flat rows
travel with where they hold NaN (:func:`~dq_flower.wire.input_parts.read_nan`), coded there
at any fixed value; :class:`NanRowLayout` keeps that as ``ceil(dim / 8)`` bytes after each
row's codes and gives the model NaN back there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dq_flower.dq.server.store import RowLayout

__all__ = ["NanRowLayout"]


@dataclass(frozen=True)
class NanRowLayout(RowLayout):
    """A :class:`RowLayout` whose rows end in one bit a value, set where it is NaN."""

    def with_holes(self, codes: np.ndarray, holes: np.ndarray | None) -> np.ndarray:
        """Packed rows ``codes`` with the bits of ``holes`` (bool ``(n, dim)``; ``None``: none)."""
        bits = np.zeros((codes.shape[0], self.dim), dtype=bool) if holes is None else holes
        return np.concatenate([codes, np.packbits(bits, axis=1)], axis=1)

    def dequantize(self, codes: np.ndarray, side: np.ndarray, dither: np.ndarray) -> np.ndarray:
        """Float32 ``(n, dim)`` rows (:meth:`RowLayout.dequantize`), NaN where they were."""
        out = super().dequantize(np.ascontiguousarray(codes[:, :self.row_bytes]), side, dither)
        out[np.unpackbits(codes[:, self.row_bytes:], axis=1, count=self.dim).astype(bool)] = np.nan
        return out
