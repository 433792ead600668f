"""Elias integer codes (gamma, delta, omega) and QSGD's Elias coding of its levels.

Codes of positive integers ``1 <= v < 2**53``, written most-significant bit first:

- ``gamma``: ``L = floor(log2 v)`` zeros, then ``v`` in ``L + 1`` bits (``2L + 1`` bits);
- ``delta``: ``gamma(L + 1)``, then the ``L`` low bits of ``v``;
- ``omega``: Elias' recursive code (QSGD's "Elias integer coding"): the binary forms of
  ``v``, ``bitlen(v) - 1``, ... down to 2 or 3, innermost first, then a ``0``.

Encoding and decoding are vectorised. A decoder computes, for every bit position, where a
codeword starting there would end, and follows that map from the stream's first bit by
pointer doubling (``log2`` of the codeword count numpy passes over the stream).

:func:`encode_levels` codes one QSGD-quantized vector as in Alistarh et al. (2017), Sec. 3.1:
per bucket the float32 norm; per nonzero level the coded gap (zeros since the previous
nonzero of the bucket, plus one), a sign bit and the coded magnitude. Each bucket also
codes a final gap to one past its end, so the decoder knows where the bucket stops. The
stream is planar: all norms (raw little-endian float32), all gaps, all magnitudes, all
signs (1 = negative). It has the same codewords, so the same bit count, as the paper's
interleaved order, and every part decodes vectorised.

A measurement reference for ``benchmarks/qsgd_coding.py``, not a codec of the package: no
codec uses it, because it codes larger than the generic lossless stage.
"""

from __future__ import annotations

import numpy as np

from dq_flower.codecs.base import n_buckets
from dq_flower.codecs.bitpack import unpack
from dq_flower.codecs.payload import Payload

__all__ = [
    "CODES",
    "MAX_VALUE",
    "code_lengths",
    "encode",
    "decode",
    "encode_levels",
    "decode_levels",
    "levels_nbits",
    "payload_levels",
]

#: Code names accepted by every function here.
CODES = ("gamma", "delta", "omega")
#: Largest value that can be coded (53-bit binary forms).
MAX_VALUE = (1 << 53) - 1
_MAXW = 53  # widest binary group any code writes or reads


def _check_code(code: str) -> str:
    if code not in CODES:
        raise ValueError(f"code must be one of {', '.join(CODES)}, got {code!r}")
    return code


def _bitlen(v: np.ndarray) -> np.ndarray:
    """``bit_length`` of each int64 in ``0..2**53`` (exact through float64 ``frexp``)."""
    return np.frexp(v.astype(np.float64))[1].astype(np.int64)


def _values(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values)
    if v.dtype.kind not in "iu":
        raise ValueError(f"values must be integers, got {v.dtype}")
    v = v.astype(np.int64).reshape(-1)
    if v.size and (int(v.min()) < 1 or int(v.max()) > MAX_VALUE):
        raise ValueError(f"values must lie in 1..{MAX_VALUE}")
    return v


def _omega_groups(v: np.ndarray) -> list[np.ndarray]:
    """Omega's binary groups, outermost (``v`` itself) first; 0 marks an absent group."""
    groups, g = [], v
    while g.size and int(g.max()) > 1:
        groups.append(np.where(g > 1, g, 0))
        g = np.where(g > 1, _bitlen(g) - 1, 1)
    return groups


def code_lengths(values: np.ndarray, code: str = "gamma") -> np.ndarray:
    """Codeword length in bits of each value (int64 array)."""
    _check_code(code)
    v = _values(values)
    lo = _bitlen(v) - 1
    if code == "gamma":
        return 2 * lo + 1
    if code == "delta":
        return lo + 2 * _bitlen(lo + 1) - 1
    return 1 + sum((_bitlen(g) for g in _omega_groups(v)), np.zeros(v.size, np.int64))


def _write(bits: np.ndarray, pos: np.ndarray, val: np.ndarray, width: np.ndarray) -> None:
    """Write ``val`` in ``width`` bits (MSB first) at ``pos`` into the 0/1 array ``bits``."""
    top = int(width.max(initial=0))
    for j in range(top):
        sel = width > j
        bits[pos[sel] + j] = (val[sel] >> (width[sel] - 1 - j)) & 1


def _encode_bits(v: np.ndarray, code: str) -> np.ndarray:
    """Concatenated codewords of ``v`` as a 0/1 uint8 array."""
    lengths = code_lengths(v, code)
    starts = np.cumsum(lengths) - lengths
    bits = np.zeros(int(lengths.sum()), dtype=np.uint8)
    lo = _bitlen(v) - 1
    if code == "gamma":
        _write(bits, starts + lo, v, lo + 1)
    elif code == "delta":
        m = lo + 1
        lm = _bitlen(m) - 1
        _write(bits, starts + lm, m, lm + 1)
        _write(bits, starts + 2 * lm + 1, v & ((np.int64(1) << lo) - 1), lo)
    else:
        pos = starts.copy()
        for g in reversed(_omega_groups(v)):  # innermost group first
            w = np.where(g > 0, _bitlen(g), 0)
            _write(bits, pos, g, w)
            pos += w
    return bits


def encode(values: np.ndarray, code: str = "gamma") -> tuple[np.ndarray, int]:
    """Code positive integers; return ``(packed uint8 stream, exact bit count)``."""
    bits = _encode_bits(_values(values), _check_code(code))
    return np.packbits(bits), int(bits.size)


class _Reader:
    """Vectorised reads of up to 53-bit MSB-first fields at arbitrary bit positions."""

    def __init__(self, data: np.ndarray, nbits: int) -> None:
        self.nbits = nbits
        nbytes = (nbits + 7) // 8
        buf = np.zeros(nbytes + 16, dtype=np.uint8)
        buf[:nbytes] = data[:nbytes]
        if nbits % 8:  # ignore whatever follows the stream in its last byte
            buf[nbytes - 1] &= np.uint8((0xFF << (8 - nbits % 8)) & 0xFF)
        self.buf = buf
        self.bits = np.unpackbits(buf)  # zero padded past nbits

    def read(self, pos: np.ndarray, width: np.ndarray) -> np.ndarray:
        """Return the ``width``-bit field at each ``pos`` (0 where ``width`` is 0)."""
        pos = np.minimum(pos, self.nbits)
        win = np.lib.stride_tricks.sliding_window_view(self.buf, 8)[pos >> 3]
        word = np.ascontiguousarray(win).view(">u8").reshape(-1).astype(np.uint64)
        word <<= (pos & 7).astype(np.uint64)
        w = np.clip(width, 1, 64).astype(np.uint64)
        out = (word >> (np.uint64(64) - w)).astype(np.int64)
        return np.where(width > 0, out, 0)


def _steps(
    r: _Reader, p: np.ndarray, code: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a codeword at each ``p``: ``(end, value, valid)``; invalid ones end at ``nbits``."""
    n = r.nbits
    if code in ("gamma", "delta"):
        idx = np.where(r.bits[: n + 1] == 1, np.arange(n + 1), n)
        idx[n] = n
        first1 = np.minimum.accumulate(idx[::-1])[::-1]  # first 1 at or after each position
        q = first1[p]
        lo = q - p
        ok = (q < n) & (lo < _MAXW)
        lo = np.where(ok, lo, 0)
        end = q + lo + 1
        val = r.read(q, lo + 1)
        if code == "delta":
            lo = val - 1
            ok &= (lo >= 0) & (lo < _MAXW)
            lo = np.where(ok, lo, 0)
            val = (np.int64(1) << lo) | r.read(end, lo)
            end = end + lo
    else:
        pos, val = p.copy(), np.ones(p.size, dtype=np.int64)
        ok, done = np.ones(p.size, dtype=bool), np.zeros(p.size, dtype=bool)
        for _ in range(8):  # 53-bit values need at most 5 groups
            live = ok & ~done & (pos < n)
            more = live & (r.bits[np.minimum(pos, n)] == 1)
            done |= live & ~more
            w = np.where(more, val + 1, 0)
            ok &= w <= _MAXW
            more &= ok
            val = np.where(more, r.read(pos, np.where(more, w, 0)), val)
            pos = np.where(more, pos + w, pos)
        ok &= done
        end = pos + 1
    ok &= end <= n
    return np.where(ok, end, n), val, ok


def decode(
    data: np.ndarray, count: int | None, code: str = "gamma", offset: int = 0,
    nbits: int | None = None,
) -> tuple[np.ndarray, int]:
    """Read ``count`` codewords from bit ``offset`` of a packed stream of ``nbits`` bits.

    ``count=None`` reads codewords until the next one would not be valid. Returns
    ``(int64 values, bit position after the last one)``; raises ``ValueError`` when fewer
    than ``count`` valid codewords follow ``offset``.
    """
    _check_code(code)
    buf = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    n = 8 * buf.size if nbits is None else int(nbits)
    if not 0 <= offset <= n <= 8 * buf.size:
        raise ValueError(f"offset {offset} and nbits {n} do not fit {buf.size} bytes")
    if count == 0:
        return np.zeros(0, dtype=np.int64), offset
    r = _Reader(buf, n)
    p = np.arange(offset, n + 1)
    end, val, ok = _steps(r, p, code)
    step = end - offset  # relative successor; n - offset is the sink
    sink = n - offset
    reached = np.zeros(sink + 1, dtype=bool)
    reached[0] = True
    jump = step
    while jump[0] != sink:  # pointer doubling: reached = orbit of 0 up to 2**k steps
        reached[jump[reached]] = True
        jump = jump[jump]
    starts = np.flatnonzero(reached & ok)  # an invalid codeword ends the orbit
    if count is not None:
        if starts.size < count:
            raise ValueError(f"stream holds {starts.size} valid codewords, {count} requested")
        starts = starts[:count]
    if starts.size == 0:
        return np.zeros(0, dtype=np.int64), offset
    return val[starts], int(step[starts[-1]]) + offset


def _layout(levels: np.ndarray, bucket: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(gaps, magnitudes, negative)`` of a flat signed-level vector (see module doc)."""
    size = levels.size
    nb = n_buckets(size, bucket)
    nz = np.flatnonzero(levels)
    ext = nz + nz // bucket  # bucket b occupies bucket + 1 slots, the last for its end
    last = np.arange(nb, dtype=np.int64) * (bucket + 1) + bucket
    if nb:
        last[-1] = size + nb - 1
    marks = np.sort(np.concatenate([ext, last]))
    gaps = np.diff(marks, prepend=-1)
    vals = levels[nz].astype(np.int64)
    return gaps, np.abs(vals), (vals < 0).astype(np.uint8)


def levels_nbits(
    levels: np.ndarray, bucket: int, gap_code: str = "gamma", level_code: str = "gamma",
) -> int:
    """Exact bits :func:`encode_levels` spends on ``levels``, without building the stream."""
    flat = np.asarray(levels).reshape(-1)
    gaps, mags, neg = _layout(flat, int(bucket))
    return int(32 * n_buckets(flat.size, bucket) + code_lengths(gaps, gap_code).sum()
               + code_lengths(mags, level_code).sum() + neg.size)


def encode_levels(
    levels: np.ndarray, norms: np.ndarray, bucket: int,
    gap_code: str = "gamma", level_code: str = "gamma",
) -> tuple[np.ndarray, int]:
    """QSGD's Elias coding of signed integer ``levels`` with per-bucket float32 ``norms``.

    Returns ``(packed uint8 stream, exact bit count)``; see the module doc for the layout.
    """
    flat = np.asarray(levels).reshape(-1)
    if flat.dtype.kind not in "iu":
        raise ValueError(f"levels must be integers, got {flat.dtype}")
    bucket = int(bucket)
    nb = n_buckets(flat.size, bucket)
    nrm = np.ascontiguousarray(norms, dtype="<f4").reshape(-1)
    if nrm.size != nb:
        raise ValueError(f"{flat.size} levels in buckets of {bucket} need {nb} norms, "
                         f"got {nrm.size}")
    gaps, mags, neg = _layout(flat, bucket)
    bits = np.concatenate([np.unpackbits(nrm.view(np.uint8)), _encode_bits(gaps, gap_code),
                           _encode_bits(mags, level_code), neg])
    return np.packbits(bits), int(bits.size)


def decode_levels(
    data: np.ndarray, nbits: int, size: int, bucket: int,
    gap_code: str = "gamma", level_code: str = "gamma",
) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`encode_levels`: ``(int64 signed levels, float32 norms)``.

    Raises ``ValueError`` when the stream is not exactly one coded vector of ``size``.
    """
    buf = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if not 0 <= nbits <= 8 * buf.size or (nbits + 7) // 8 != buf.size:
        raise ValueError(f"{nbits} bits do not fill {buf.size} bytes")
    nb = n_buckets(size, bucket)
    if 32 * nb > nbits:
        raise ValueError("stream is shorter than its norms")
    norms = buf[: 4 * nb].view("<f4").copy()
    gaps, pos = decode(buf, None, gap_code, 32 * nb, nbits)
    marks = np.cumsum(gaps) - 1
    k = int(np.searchsorted(marks, size + nb - 1))
    if nb == 0:
        k = -1
    elif k >= marks.size or marks[k] != size + nb - 1:
        raise ValueError("gap stream does not end at the vector's end")
    marks = marks[: k + 1]
    b, local = np.divmod(marks, bucket + 1)
    blen = np.minimum(bucket, size - b * bucket)
    end = local == blen
    if int(end.sum()) != nb or (local > blen).any():
        raise ValueError("gap stream does not close every bucket once")
    pos = 32 * nb + int(code_lengths(gaps[: k + 1], gap_code).sum())
    idx = (b * bucket + local)[~end]
    mags, pos = decode(buf, idx.size, level_code, pos, nbits)
    if pos + idx.size != nbits:
        raise ValueError(f"stream holds {nbits - pos} sign bits, expected {idx.size}")
    neg = np.unpackbits(buf)[pos:nbits].astype(np.int64)
    out = np.zeros(size, dtype=np.int64)
    out[idx] = mags * (1 - 2 * neg)
    return out, norms


def payload_levels(p: Payload) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(signed levels, norms, levels s, bucket)`` of an uncoded ``qsgd`` payload."""
    s, bucket = int(p.meta["levels"]), int(p.meta["bucket"])
    size = int(np.prod(p.shape))
    codes = unpack(p.buffers["codes"], (2 * s).bit_length(), size)
    return codes.astype(np.int64) - s, np.asarray(p.buffers["norms"], dtype=np.float32), s, bucket
