"""Bit packing of small unsigned integer codes (widths 1 to 8) into uint8 bytes."""

from __future__ import annotations

import numpy as np

__all__ = ["pack", "unpack", "packed_nbytes", "check_width"]


def check_width(bits: int, name: str = "bits") -> int:
    """Return ``bits`` as an int, or raise ``ValueError`` naming ``name`` if not in 1..8."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 8:
        raise ValueError(f"{name} must be an integer in 1..8, got {bits!r}")
    return int(bits)


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes needed to carry ``count`` codes of ``bits`` bits each."""
    return (int(count) * int(bits) + 7) // 8


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack a flat array of codes, each ``< 2**bits``, into ``ceil(n * bits / 8)`` bytes.

    Codes are written most-significant bit first, code after code, with no padding between
    codes; only the final byte may carry up to 7 zero padding bits.
    """
    bits = check_width(bits)
    codes = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    if bits == 8:
        return codes.copy()
    if bits in (1, 2, 4):
        # Fast path: whole codes per byte, no code straddles a byte boundary.
        per_byte = 8 // bits
        n = codes.size
        padded = np.zeros(packed_nbytes(n, bits) * per_byte, dtype=np.uint8)
        padded[:n] = codes
        groups = padded.reshape(-1, per_byte)
        shifts = np.arange(per_byte - 1, -1, -1, dtype=np.uint8) * bits
        out = np.zeros(groups.shape[0], dtype=np.uint8)
        for j in range(per_byte):  # at most 8 vectorised passes
            out |= groups[:, j] << shifts[j]
        return out
    # General widths: expand to bits and let numpy pack them.
    bit_planes = np.unpackbits(codes[:, None], axis=1, count=8)[:, 8 - bits :]
    return np.packbits(bit_planes.reshape(-1))


def unpack(data: np.ndarray | bytes, bits: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack`: read ``count`` codes of ``bits`` bits from ``data``.

    Raises ``ValueError`` when ``data`` does not hold exactly ``ceil(count * bits / 8)`` bytes;
    the length is checked before anything is allocated.
    """
    bits = check_width(bits)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else data
    buf = np.ascontiguousarray(buf, dtype=np.uint8).reshape(-1)
    expected = packed_nbytes(count, bits)
    if buf.size != expected:
        raise ValueError(
            f"packed buffer holds {buf.size} bytes but {count} codes of {bits} bits need {expected}"
        )
    if bits == 8:
        return buf.copy()
    if bits in (1, 2, 4):
        per_byte = 8 // bits
        mask = np.uint8((1 << bits) - 1)
        shifts = np.arange(per_byte - 1, -1, -1, dtype=np.uint8) * bits
        out = np.empty((buf.size, per_byte), dtype=np.uint8)
        for j in range(per_byte):
            np.right_shift(buf, shifts[j], out=out[:, j])
            out[:, j] &= mask
        return out.reshape(-1)[:count]
    planes = np.unpackbits(buf, count=count * bits).reshape(count, bits)
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint8)
    return (planes * weights).sum(axis=1, dtype=np.uint16).astype(np.uint8)
