"""Subtractive dither: offsets both ends derive from (seed, flat position), no state.

A counter-based hash (splitmix64) of ``(seed, position)``, so the offsets of any slice of a
batch (one row of a store) are computed alone, in any order.
"""

from __future__ import annotations

import numpy as np

__all__ = ["dither_offsets", "dither_u16"]

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def dither_u16(seed: int, start: int, count: int) -> np.ndarray:
    """16-bit dither values for flat positions ``start .. start + count - 1``."""
    first, last = start // 4, (start + count + 3) // 4
    z = np.arange(first, last, dtype=np.uint64)
    z += np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % (1 << 64))
    z *= _M1
    z ^= z >> np.uint64(30)
    z *= _M2
    z ^= z >> np.uint64(27)
    z *= _M3
    z ^= z >> np.uint64(31)
    off = start - 4 * first
    return z.astype("<u8").view(np.uint16)[off : off + count]


def dither_offsets(seed: int, start: int, count: int) -> np.ndarray:
    """Float32 dither offsets ``u = r / 2**16`` in (0, 1) of positions ``start ..``.

    The encoder rounds ``t + u`` down and the decoder adds ``1/2 - u`` back.
    """
    r = dither_u16(int(seed), int(start), int(count))
    return r.astype(np.float32) * np.float32(1.0 / 65536.0)
