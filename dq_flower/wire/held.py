"""Compact sets of client-local row ids: which of a client's rows the server holds.

A set is sent in the smallest of three forms (first byte: the form):

- ``0`` bitmap: ``varint(m)``, then ``ceil(m / 8)`` bytes, bit ``i`` (LSB first) set where
  id ``i`` is held, ``m = max id + 1``;
- ``1`` runs as varints: ``varint(r)``, then ``r`` gaps and ``r`` lengths as LEB128 varints
  (first gap: the first run's start; later gaps: distance from the previous run's end
  minus one; lengths minus one);
- ``2`` runs bit-packed: ``varint(r)``, widths ``wg`` and ``wl`` (a byte each), then the
  gaps in ``wg`` bits and the lengths in ``wl`` bits, LSB first.

A set costs at most its bitmap or varint runs plus 11 bytes; :func:`encode_table` lists
``(identity, ask, held set)`` per client. Decoding checks every size before it allocates
and raises ``ValueError`` on malformed bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["encode_held", "decode_held", "runs_of", "encode_table", "decode_table",
           "table_entry", "held_for", "held_size_bound", "BITMAP", "RUNS", "PACKED_RUNS",
           "MAX_ID", "HELD_KEY", "TABLE_KEY", "EMPTY", "VALUE_BOUND_KEY"]

BITMAP, RUNS, PACKED_RUNS = 0, 1, 2
MAX_ID = (1 << 63) - 1
_U64 = np.uint64
#: Config keys of a train message: the node's held set, or the table of every client.
HELD_KEY = "held"
TABLE_KEY = "held-table"
#: Config key of a train message: the value bound, for a node whose reply went over it.
VALUE_BOUND_KEY = "value-bound"
EMPTY = bytes([RUNS, 0])


def _varint_bytes(values: np.ndarray) -> np.ndarray:
    """LEB128 bytes of non-negative ints (uint64), concatenated in order."""
    v = np.asarray(values, dtype=_U64).reshape(-1)
    if not v.size:
        return np.zeros(0, dtype=np.uint8)
    size = np.ones(v.size, dtype=np.int64)
    for k in range(1, 10):
        size += v >= _U64(1 << (7 * k))
    starts = np.concatenate([[0], np.cumsum(size)[:-1]])
    out = np.zeros(int(size.sum()), dtype=np.uint8)
    for k in range(10):
        here = size > k
        if not here.any():
            break
        byte = (v[here] >> _U64(7 * k)) & _U64(0x7F)
        more = (size[here] > k + 1).astype(_U64) << _U64(7)
        out[starts[here] + k] = (byte | more).astype(np.uint8)
    return out


def _read_varints(buf: np.ndarray, offset: int, count: int) -> tuple[np.ndarray, int]:
    """``count`` varints from ``buf[offset:]``: ``(uint64 values, offset after them)``."""
    if count < 0:
        raise ValueError("negative varint count")
    if count == 0:
        return np.zeros(0, dtype=_U64), offset
    rest = buf[offset:offset + 10 * count]  # a varint takes at most 10 bytes: linear reads
    ends = np.flatnonzero(rest < 0x80)
    if ends.size < count:
        raise ValueError("held set: truncated varints")
    stop = int(ends[count - 1]) + 1
    chunk = rest[:stop]
    group = np.concatenate([[0], np.cumsum(chunk[:-1] < 0x80)])
    first = np.concatenate([[0], ends[:count - 1] + 1])
    pos = np.arange(stop) - first[group]
    if pos.max() > 9 or ((pos == 9) & (chunk > 1)).any():
        raise ValueError("held set: a varint overflows 64 bits")
    values = np.zeros(count, dtype=_U64)
    for k in range(int(pos.max()) + 1):
        sel = pos == k
        values[group[sel]] |= (chunk[sel] & 0x7F).astype(_U64) << _U64(7 * k)
    return values, offset + stop


def _read_one(buf: np.ndarray, offset: int) -> tuple[int, int]:
    values, offset = _read_varints(buf, offset, 1)
    return int(values[0]), offset


def _field_bits(values: np.ndarray, width: int) -> np.ndarray:
    """The bits of ``values`` as ``width``-bit fields, LSB first (one uint8 per bit)."""
    v = np.asarray(values, dtype=_U64)
    return ((v[:, None] >> np.arange(width, dtype=_U64)) & _U64(1)).astype(np.uint8).reshape(-1)


def _fields(body: np.ndarray, start: int, count: int, width: int) -> np.ndarray:
    """``count`` ``width``-bit fields (uint64) from bit ``start`` of ``body``, LSB first."""
    if width == 0 or count == 0:
        return np.zeros(count, dtype=_U64)
    first, stop = start // 8, -(-(start + count * width) // 8)
    bits = np.unpackbits(body[first:stop], bitorder="little")
    grid = bits[start - 8 * first:start - 8 * first + count * width].reshape(count, width)
    return (grid.astype(_U64) << np.arange(width, dtype=_U64)).sum(axis=1, dtype=_U64)


def _width(values: np.ndarray) -> int:
    return (int(values.max()) if values.size else 0).bit_length()


def runs_of(ids: Iterable[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths)`` of the maximal runs of consecutive ids (sorted, deduplicated)."""
    arr = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
    if not arr.size:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy()
    breaks = np.flatnonzero(np.diff(arr) != 1) + 1
    starts = arr[np.concatenate([[0], breaks])]
    ends = arr[np.concatenate([breaks - 1, [arr.size - 1]])] + 1
    return starts, ends - starts


def _gaps(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runs as coded: gaps and lengths minus one (uint64)."""
    ends = starts + lengths
    gaps = starts.copy()
    gaps[1:] = starts[1:] - ends[:-1] - 1
    return gaps.astype(_U64), (lengths - 1).astype(_U64)


def _candidates(arr: np.ndarray, every_form: bool = False) -> list[bytes]:
    """The set's encodings (the bitmap only where it may be the smallest, or asked for)."""
    starts, lengths = runs_of(arr)
    r = int(starts.size)
    count = _varint_bytes(np.array([r])).tobytes()
    gaps, lens = _gaps(starts, lengths)
    runs = bytes([RUNS]) + count + _varint_bytes(np.concatenate([gaps, lens])).tobytes()
    wg, wl = _width(gaps), _width(lens)
    packed = (bytes([PACKED_RUNS]) + count + bytes([wg, wl])
              + np.packbits(np.concatenate([_field_bits(gaps, wg), _field_bits(lens, wl)]),
                            bitorder="little").tobytes())
    out = [runs, packed]
    m = int(arr[-1]) + 1 if arr.size else 0
    if every_form or m <= 8 * (len(runs) + 16):  # a bitmap only wins when this small
        bits = np.zeros(m, dtype=np.uint8)
        bits[arr] = 1
        out.append(bytes([BITMAP]) + _varint_bytes(np.array([m])).tobytes()
                   + np.packbits(bits, bitorder="little").tobytes())
    return out


def encode_held(ids: Iterable[int] | np.ndarray) -> bytes:
    """The smallest encoding of a set of non-negative row ids (any order, repeats ignored)."""
    arr = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
    if arr.size and (arr[0] < 0 or arr[-1] > MAX_ID):
        raise ValueError(f"row ids must lie in [0, {MAX_ID}]")
    return min(_candidates(arr), key=len)


def decode_held(data: bytes, limit: int) -> np.ndarray:
    """The sorted int64 ids below ``limit`` (at most ``2**31``) of :func:`encode_held`'s bytes.

    No array larger than ``limit`` or the input is allocated.
    """
    buf = np.frombuffer(bytes(data), dtype=np.uint8)
    if not buf.size:
        raise ValueError("held set: no bytes")
    limit = min(max(int(limit), 0), 1 << 31)
    kind = int(buf[0])
    if kind == BITMAP:
        m, off = _read_one(buf, 1)
        if buf.size - off != -(-m // 8):
            raise ValueError(f"held set: a bitmap of {m} bits in {buf.size - off} bytes")
        return _bitmap_ids(buf[off:], min(m, limit))
    if kind not in (RUNS, PACKED_RUNS):
        raise ValueError(f"held set: unknown form {kind}")
    r, off = _read_one(buf, 1)
    if kind == RUNS:
        gaps, lens = _varint_runs(buf, off, r)
    else:
        gaps, lens = _packed_runs(buf, off, r, limit)
    return _expand_runs(gaps, lens, limit)


def _bitmap_ids(body: np.ndarray, count: int) -> np.ndarray:
    """The set bits among the first ``count`` of a bitmap (non-zero bytes, chunk by chunk)."""
    body = body[:-(-count // 8)]
    found = []
    for start in range(0, body.size, 1 << 20):
        chunk = body[start:start + (1 << 20)]
        nonzero = np.flatnonzero(chunk)
        if not nonzero.size:
            continue
        bits = np.unpackbits(chunk[nonzero][:, None], axis=1, bitorder="little")
        byte, bit = np.nonzero(bits)
        found.append((start + nonzero[byte]).astype(np.int64) * 8 + bit)
    ids = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
    return ids[ids < count]


def _varint_runs(buf: np.ndarray, off: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``r`` coded gaps and lengths of a ``RUNS`` set, its varints from ``buf[off:]``."""
    if 2 * r > buf.size - off:  # two varints of at least one byte per run
        raise ValueError(f"held set: {r} runs in {buf.size} bytes")
    coded, off = _read_varints(buf, off, 2 * r)
    if off != buf.size:
        raise ValueError("held set: trailing bytes")
    return coded[:r], coded[r:]


def _packed_runs(buf: np.ndarray, off: int, r: int, limit: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The coded gaps and lengths of a ``PACKED_RUNS`` set, no more than ``limit`` runs."""
    if buf.size < off + 2:
        raise ValueError("held set: truncated widths")
    wg, wl = int(buf[off]), int(buf[off + 1])
    if wg > 64 or wl > 64:
        raise ValueError("held set: field width above 64 bits")
    body = buf[off + 2:]
    if body.size != -(-(r * (wg + wl)) // 8):
        raise ValueError("held set: packed runs of the wrong size")
    # zero-width fields cost nothing: read no more runs than can start below the limit
    total, r = r, min(r, limit)
    return _fields(body, 0, r, wg), _fields(body, total * wg, r, wl)


def _expand_runs(gaps: np.ndarray, lens: np.ndarray, limit: int) -> np.ndarray:
    """The sorted int64 ids below ``limit`` of the runs coded as ``gaps`` and ``lens``."""
    r = int(gaps.size)
    if not r:
        return np.zeros(0, dtype=np.int64)
    # only the first ``limit`` runs can start below it; clipping keeps sums under 2**63
    take = min(r, limit)
    cap = _U64(limit)
    g = np.minimum(gaps[:take], cap).astype(np.int64)
    g[1:] += 1
    n = np.minimum(lens[:take], cap).astype(np.int64) + 1
    starts = np.cumsum(g) + np.cumsum(n) - n
    keep = starts < limit
    starts, ends = starts[keep], np.minimum(starts[keep] + n[keep], limit)
    sizes = ends - starts
    if not sizes.size:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
    return np.arange(int(sizes.sum()), dtype=np.int64) + offsets


def held_size_bound(ids: Iterable[int] | np.ndarray) -> int:
    """``min(bitmap bytes, varint run bytes)`` of a set, without its header (for tests)."""
    arr = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
    starts, lengths = runs_of(arr)
    gaps, lens = _gaps(starts, lengths)
    bitmap = -(-(int(arr[-1]) + 1 if arr.size else 0) // 8)
    return min(bitmap, int(_varint_bytes(np.concatenate([gaps, lens])).size))


def encode_table(entries: Mapping[int, tuple[int, bytes]], default_ask: int = 0) -> bytes:
    """``{identity: (ask, held set bytes)}`` and any other identity's ask, as bytes.

    ``varint(default_ask)``, ``varint(count)``, then per identity (sorted) its varints
    identity, ask and ``len(held)`` and the held set's bytes.
    """
    parts = [_varint_py(int(default_ask)), _varint_py(len(entries))]
    for identity in sorted(entries):
        ask, held = entries[identity]
        parts += [_varint_py(int(identity)), _varint_py(int(ask)), _varint_py(len(held)),
                  bytes(held)]
    return b"".join(parts)


def _varint_py(value: int) -> bytes:
    """One LEB128 varint (plain Python: faster than numpy for one value)."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"held table: {value} is not a 64-bit unsigned value")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_table(data: bytes) -> tuple[int, dict[int, tuple[int, bytes]]]:
    """Inverse of :func:`encode_table`: ``(default_ask, entries)``, in one checked pass."""
    buf = bytes(data)
    default, off = _scan_varint(buf, 0)
    count, off = _scan_varint(buf, off)
    if 4 * count > len(buf) - off:  # each entry takes at least four bytes
        raise ValueError(f"held table: {count} entries in {len(buf)} bytes")
    out: dict[int, tuple[int, bytes]] = {}
    for _ in range(count):
        identity, off = _scan_varint(buf, off)
        ask, off = _scan_varint(buf, off)
        size, off = _scan_varint(buf, off)
        if off + size > len(buf):
            raise ValueError("held table: truncated entry")
        if identity in out:
            raise ValueError(f"held table: identity {identity} twice")
        out[identity] = (ask, buf[off:off + size])
        off += size
    if off != len(buf):
        raise ValueError("held table: trailing bytes")
    return default, out


def _scan_varint(buf: bytes, off: int) -> tuple[int, int]:
    """One LEB128 varint of at most 64 bits from ``buf[off:]``: ``(value, offset after)``."""
    value = shift = 0
    for i in range(off, min(off + 10, len(buf))):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value >> 64:
                raise ValueError("held set: a varint overflows 64 bits")
            return value, i + 1
        shift += 7
    if off + 10 <= len(buf):
        raise ValueError("held set: a varint overflows 64 bits")
    raise ValueError("held set: truncated varints")


def table_entry(data: bytes, identity: int) -> tuple[int, bytes]:
    """``(ask, held set bytes)`` of ``identity`` in a table; absent: the default, none held."""
    default, entries = decode_table(data)
    return entries.get(int(identity), (default, EMPTY))


def held_for(config: Mapping[str, Any], identity: int, n: int) -> tuple[np.ndarray, int | None]:
    """``(held row ids below n, own ask from a table or None)``; ``ValueError`` if malformed."""
    if TABLE_KEY in config:
        ask, held = table_entry(_as_bytes(config[TABLE_KEY], TABLE_KEY), identity)
        return decode_held(held, n), ask
    if HELD_KEY in config:
        return decode_held(_as_bytes(config[HELD_KEY], HELD_KEY), n), None
    return np.zeros(0, dtype=np.int64), None


def _as_bytes(value: Any, key: str) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError(f"'{key}' must be bytes, got {type(value).__name__}")
    return value
