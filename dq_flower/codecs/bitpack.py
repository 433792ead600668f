"""Bit packing of unsigned codes of 1 to 8 bits into uint8 bytes, vectorised.

Codes are written most-significant bit first, without padding between codes; only the last
byte may carry up to 7 zero padding bits. Widths 1, 2, 4 pack whole codes per byte and
unpack through a 256-entry table; 3, 5, 6, 7 pack 8 codes into ``bits`` bytes via one
64-bit word; 8 is a copy. :func:`pack_wide` / :func:`unpack_wide` take 1 to 32 bits;
:func:`bucket_chunks` cuts rows into the cache-sized blocks the codecs pack and unpack.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pack", "unpack", "packed_nbytes", "check_width", "pack_wide", "unpack_wide",
           "padding_is_zero", "unpack_to", "bucket_chunks"]


def check_width(bits: int, name: str = "bits", top: int = 8) -> int:
    """Return ``bits`` as an int, or raise ``ValueError`` naming ``name`` if not in 1..top."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= top:
        raise ValueError(f"{name} must be an integer in 1..{top}, got {bits!r}")
    return int(bits)


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes needed to carry ``count`` codes of ``bits`` bits each."""
    return (int(count) * int(bits) + 7) // 8


def bucket_chunks(n_rows: int, row_len: int, target: int = 1 << 17):
    """Yield ``(start, stop)`` row ranges of about ``target`` elements (cache-sized blocks)."""
    step = max(1, target // max(1, row_len))
    for start in range(0, n_rows, step):
        yield start, min(n_rows, start + step)


def _padded(codes: np.ndarray, multiple: int) -> np.ndarray:
    """Return ``codes`` zero-padded to a multiple of ``multiple`` elements (no copy if aligned)."""
    rem = codes.size % multiple
    return codes if rem == 0 else np.pad(codes, (0, multiple - rem))


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack codes ``< 2**bits`` (not masked) MSB first into ``ceil(n * bits / 8)`` bytes."""
    bits = check_width(bits)
    codes = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    n = codes.size
    nbytes = packed_nbytes(n, bits)
    if bits == 8:
        return codes.copy()
    if bits == 1:
        return np.packbits(codes.astype(bool, copy=False))
    if bits == 2:
        # Four codes c0..c3 in one little-endian word; one multiply moves them to the top byte.
        words = _padded(codes, 4).view("<u4")
        out = (words * np.uint32(0x40100401)) >> np.uint32(24)
        return out.astype(np.uint8)[:nbytes]
    if bits == 4:
        pairs = _padded(codes, 2).view("<u2")
        out = (pairs << np.uint16(4)) | (pairs >> np.uint16(8))
        return out.astype(np.uint8)[:nbytes]
    # Widths 3, 5, 6, 7: eight codes make one 8*bits-bit group, built in a 64-bit word.
    word = _merge8(_padded(codes, 8).view("<u8").astype(np.uint64), bits)
    out = np.empty((word.size, bits), dtype=np.uint8)
    for i in range(bits):  # byte planes, most significant first
        out[:, i] = word >> np.uint64(8 * (bits - 1 - i))
    return out.reshape(-1)[:nbytes]


def _lane_mask(lane: int, width: int) -> np.uint64:
    """``2**width - 1`` repeated in every ``lane``-bit lane of a 64-bit word."""
    return np.uint64(sum(((1 << width) - 1) << (lane * i) for i in range(64 // lane)))


def _merge8(word: np.ndarray, bits: int) -> np.ndarray:
    """Eight ``bits``-bit codes, one per byte (little-endian), to one ``8 * bits``-bit value.

    Three pairwise merges on whole 64-bit words: bytes to 16-bit lanes, to 32-bit lanes, to
    the full word, the earlier code always landing in the higher bits (MSB-first order).
    """
    b = np.uint64(bits)
    m8, m16 = _lane_mask(16, 8), _lane_mask(32, 16)
    word = ((word & m8) << b) | ((word >> np.uint64(8)) & m8)
    word = ((word & m16) << (b + b)) | ((word >> np.uint64(16)) & m16)
    return ((word & np.uint64(0xFFFFFFFF)) << (b * np.uint64(4))) | (word >> np.uint64(32))


def _split8(word: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`_merge8`: one value to eight codes, one per byte (little-endian)."""
    b = np.uint64(bits)
    word = (word >> (b * np.uint64(4))) | ((word & _lane_mask(64, 4 * bits)) << np.uint64(32))
    m2 = _lane_mask(32, 2 * bits)
    word = ((word >> (b + b)) & m2) | ((word & m2) << np.uint64(16))
    m1 = _lane_mask(16, bits)
    return ((word >> b) & m1) | ((word & m1) << np.uint64(8))


def _lut(bits: int) -> np.ndarray:
    """Lookup table: byte value -> the ``8 // bits`` codes it holds (as one word)."""
    per = 8 // bits
    values = np.arange(256, dtype=np.uint16)
    codes = np.stack([(values >> (bits * (per - 1 - j))) & ((1 << bits) - 1)
                      for j in range(per)], axis=1).astype(np.uint8)
    return np.ascontiguousarray(codes).view({2: "<u4", 4: "<u2"}[bits]).reshape(-1)


_LUTS = {2: _lut(2), 4: _lut(4)}
#: byte value -> its codes, shape (256, 8 // bits), for widths 1, 2 and 4.
_BYTE_CODES = {1: np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1),
               2: _LUTS[2].view(np.uint8).reshape(256, 4),
               4: _LUTS[4].view(np.uint8).reshape(256, 2)}


def unpack(data: np.ndarray | bytes, bits: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack`: read ``count`` codes of ``bits`` bits from ``data``.

    Raises ``ValueError`` (before allocating) unless ``data`` holds ``ceil(count * bits / 8)``
    bytes.
    """
    bits = check_width(bits)
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    count = int(count)
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else data
    buf = np.asarray(buf)
    if buf.dtype != np.uint8:
        raise ValueError(f"packed buffer must be uint8, got {buf.dtype}")
    buf = np.ascontiguousarray(buf).reshape(-1)
    expected = packed_nbytes(count, bits)
    if buf.size != expected:
        raise ValueError(f"packed buffer holds {buf.size} bytes but {count} codes of {bits} bits "
                         f"need {expected}")
    if bits == 8:
        return buf.copy()
    if bits == 1:
        return np.unpackbits(buf, count=count)
    if bits in _LUTS:
        return _LUTS[bits][buf].view(np.uint8)[:count]
    groups = _padded(buf, bits).reshape(-1, bits)
    word = np.zeros(groups.shape[0], dtype=np.uint64)
    for i in range(bits):  # byte planes, most significant first
        word |= groups[:, i].astype(np.uint64) << np.uint64(8 * (bits - 1 - i))
    return _split8(word, bits).astype("<u8").view(np.uint8)[:count]


def unpack_to(data: np.ndarray, bits: int, count: int, table: np.ndarray,
              out: np.ndarray | None = None) -> np.ndarray:
    """Return ``table[unpack(data, bits, count)]`` as float32 (into ``out`` if given).

    Widths 1, 2 and 4 map each byte through a 256-entry table straight to its values.
    """
    bits = check_width(bits)
    tab = np.ascontiguousarray(table, dtype=np.float32).reshape(-1)
    if tab.size != 1 << bits:
        raise ValueError(f"table must hold 2**bits={1 << bits} values, got {tab.size}")
    if out is not None and (out.dtype != np.float32 or out.size != count
                            or not out.flags.c_contiguous):
        raise ValueError("out must be a C-contiguous float32 array of count elements")
    if bits not in _BYTE_CODES:
        values = tab[unpack(data, bits, count)]
    else:
        buf = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
        if buf.size != packed_nbytes(count, bits):
            raise ValueError(f"packed buffer holds {buf.size} bytes but {count} codes of {bits} "
                             f"bits need {packed_nbytes(count, bits)}")
        per = 8 // bits
        lut = np.ascontiguousarray(tab[_BYTE_CODES[bits]])  # (256, per): byte -> its values
        if out is not None and count == buf.size * per:
            np.take(lut, buf, axis=0, out=out.reshape(buf.size, per))
            return out
        values = np.take(lut, buf, axis=0).reshape(-1)[:count]
    if out is None:
        return values
    out.reshape(-1)[...] = values
    return out


def padding_is_zero(data: np.ndarray, bits: int, count: int) -> bool:
    """Return True when the padding bits after ``count`` codes of ``bits`` bits are all zero."""
    used = int(count) * int(bits)
    spare = 8 * packed_nbytes(count, bits) - used
    if spare == 0:
        return True
    return int(data[-1]) & ((1 << spare) - 1) == 0


def pack_wide(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned ints below ``2**bits`` (``1 <= bits <= 32``) MSB-first into bytes."""
    check_width(bits, top=32)
    vals = np.ascontiguousarray(values, dtype=">u4").reshape(-1)
    planes = np.unpackbits(vals.view(np.uint8).reshape(-1, 4), axis=1)[:, 32 - bits :]
    return np.packbits(planes.reshape(-1))


def unpack_wide(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack_wide`; returns ``count`` values as int64.

    Raises ``ValueError`` when ``data`` does not hold exactly ``ceil(count * bits / 8)`` bytes.
    """
    check_width(bits, top=32)
    buf = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if buf.size != packed_nbytes(count, bits):
        raise ValueError(f"packed buffer holds {buf.size} bytes but {count} values of {bits} bits "
                         f"need {packed_nbytes(count, bits)}")
    planes = np.unpackbits(buf, count=count * bits).reshape(count, bits)
    full = np.zeros((count, 32), dtype=np.uint8)
    full[:, 32 - bits :] = planes
    return np.packbits(full, axis=1).view(">u4").reshape(-1).astype(np.int64)
