"""Fixed-width packing of unsigned integers up to 32 bits wide (sample ids, indices)."""

from __future__ import annotations

import numpy as np

__all__ = ["width_for", "pack_uint", "unpack_uint", "uint_nbytes"]


def width_for(upper: int) -> int:
    """Bits needed for values in ``[0, upper)`` (at least 1)."""
    return max(1, int(upper - 1).bit_length())


def uint_nbytes(count: int, width: int) -> int:
    """Bytes that ``count`` values of ``width`` bits occupy."""
    return (int(count) * int(width) + 7) // 8


def pack_uint(values: np.ndarray, width: int) -> np.ndarray:
    """Pack non-negative ints below ``2**width`` (``1 <= width <= 32``), MSB first."""
    if not 1 <= width <= 32:
        raise ValueError(f"width must be in 1..32, got {width}")
    vals = np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
    if vals.size and (vals.min() < 0 or vals.max() >= (1 << width)):
        raise ValueError(f"values do not fit in {width} bits")
    be = vals.astype(">u4").view(np.uint8).reshape(-1, 4)
    bits = np.unpackbits(be, axis=1)[:, 32 - width :]
    return np.packbits(bits.reshape(-1))


def unpack_uint(data: np.ndarray, width: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack_uint`; the byte count is checked before unpacking."""
    if not 1 <= width <= 32:
        raise ValueError(f"width must be in 1..32, got {width}")
    buf = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if buf.size != uint_nbytes(count, width):
        raise ValueError(
            f"packed ints hold {buf.size} bytes, {count} values of {width} bits need "
            f"{uint_nbytes(count, width)}"
        )
    bits = np.unpackbits(buf, count=count * width).reshape(count, width)
    full = np.zeros((count, 32), dtype=np.uint8)
    full[:, 32 - width :] = bits
    return np.packbits(full, axis=1).view(">u4").reshape(-1).astype(np.int64)
