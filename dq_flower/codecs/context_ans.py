"""The compiled ``context`` coder: the adaptive model and the ANS coder in one numba loop.

Byte for byte the stream of :mod:`.context`'s constriction path: a stack ANS coder (32-bit
words, 64-bit state, 24-bit probabilities) whose every symbol is coded under its context's
row ``counts + 1/2`` quantized as constriction's lazy ``Categorical(perfect=False)`` model
does: with ``scale = (2**24 - S) / sum(row)``, symbol ``s`` starts at
``floor(sum(row[:s]) * scale) + s`` (the last ends at ``2**24``). Rows hold whole counts plus
halves, so every float sum is exact and only the division and the products round, as there.
Counts grow after each wave, as the vectorised coder's do.

Images of 1-bit and 2-bit codes decode through :func:`_decode_image`: the planes' cells are
laid out wave by wave (a wave's cells of every plane contiguous, the neighbours at fixed
offsets), so each wave's contexts come from one vectorised pass before its codes, and the
serial loop does little more than the ANS step; two-symbol counts alternate between two tables
from code to code, every row is requantized after each wave in one vectorised pass, and a
four-symbol row is one packed word per symbol. The same stream as :func:`_decode`, which
decodes every other batch.

Needs numba (:func:`available`); the kernels compile on first use and are cached on disk.
"""

from __future__ import annotations

import numpy as np

from dq_flower.codecs.ans_step import (
    _ONE,
    _U_BIN,
    _U_LOW,
    _U_MASK,
    _U_ONE,
    _U_ONE_,
    _U_PRECISION,
    _U_REFILL,
    _U_RENORM,
    _U_TWO,
    _U_WORD,
    _U_ZERO,
    BAD_COUNT,
    LEFT_OVER,
    OK,
    ZERO_END,
    _binary,
    _jit,
    _literally,
    _numba,
    _open,
    _quad,
)
from dq_flower.codecs.context_image import _NARROW, _WIDE, _decode_image

__all__ = ["available", "encode_words", "decode_words", "OK", "ZERO_END", "BAD_COUNT",
           "LEFT_OVER"]


@_jit
def _model(rows, symbols):
    """The model: counts (rows x S), inner edges (rows x (S - 1)), marks (rows); offsets."""
    edges = rows * symbols
    return np.zeros(rows * 2 * symbols, np.int64), edges, edges + rows * (symbols - 1)


@_jit
def _layout(geom, feature, codes, into_grid):
    """The grid a batch is coded on and the context base of each block (image plane).

    An image grid holds each plane with a zero border (top, left, right), the codes copied
    in where ``into_grid``; a flat batch's grid is ``codes`` itself (its bases: ``feature``).
    """
    if not geom[0]:
        return codes, feature
    planes, c, h, w, groups, qb = geom[2], geom[3], geom[4], geom[5], geom[6], geom[7]
    chans = np.empty(planes, np.int64)
    for p in range(planes):
        chans[p] = ((p % c) * groups // c) << (4 * qb)
    grid = np.zeros(planes * (h + 1) * (w + 2), np.uint8)
    if into_grid:
        _copy_planes(codes, grid, planes, h, w, True)
    return grid, chans


@_jit
def _copy_planes(codes, grid, planes, h, w, into_grid):
    """Copy the codes into the bordered grid (or back out of it)."""
    for p in range(planes):
        for r in range(h):
            at, a = (p * h + r) * w, (p * (h + 1) + r + 1) * (w + 2) + 1
            for col in range(w):
                if into_grid:
                    grid[a + col] = codes[at + col]
                else:
                    codes[at + col] = grid[a + col]


@_jit
def _wave(geom, k):
    """Wave ``k``: blocks ``[a0, a1)`` of ``m`` codes from ``a * stride + at``, ``step`` apart.

    Blocks are image planes (cells ``(r, k - 2 r)``) or flat samples (features).
    """
    if not geom[0]:
        waves, n, d = geom[1], geom[2], geom[3]
        return k * n // waves, (k + 1) * n // waves, d, d, 0, 1
    planes, h, w = geom[2], geom[4], geom[5]
    first, last = max(0, -(-(k - w + 1) // 2)), min(h - 1, k // 2)
    at = (first + 1) * (w + 2) + k - 2 * first + 1
    return 0, planes, last + 1 - first, (h + 1) * (w + 2), at, w


@_jit
def _neighbours(left, up, up_left, up_right, q_bits, shift):
    """The top bits of the left, upper, upper-left and upper-right codes, weighted."""
    return ((np.uint64(left) >> shift) << (3 * q_bits)
            | (np.uint64(up) >> shift) << (2 * q_bits)
            | (np.uint64(up_left) >> shift) << q_bits | (np.uint64(up_right) >> shift))


@_jit
def _span(s, below, above, last):
    """Symbol ``s``'s interval ``(start, width)`` from the edges below and above it.

    The first symbol starts at 0, the last (``last``) ends at ``2**24``, whatever was loaded.
    """
    lo = _U_ZERO if s == 0 else below
    return lo, (_U_ONE if s == last else above) - lo


@_jit
def _refresh(model, rows, symbols, edges, marks, kind):
    """Every row's inner edges (from ``edges`` on) from its counts, constriction's way.

    Only the marked rows (marks cleared) where ``marks``; rows of ``kind`` (2, 4) symbols
    are all refreshed, a loop unrolled, no mark kept.
    """
    _literally(kind)
    size = kind if kind else symbols
    free = np.float64(_ONE - size)
    for row in range(rows):
        if marks:
            if not model[marks + row]:
                continue
            model[marks + row] = 0
        at, total = row * size, 0
        for s in range(size):
            total += model[at + s]
        scale = free / (np.float64(total) + 0.5 * size)
        cum = 0
        for s in range(1, size):
            cum += model[at + s - 1]
            model[edges + row * (size - 1) + s - 1] = \
                np.int64((np.float64(cum) + 0.5 * s) * scale) + s


@_jit
def _encode(codes, geom, feature, rows, symbols, kind, image):
    """The stream's words of ``codes`` (see :func:`encode_words`).

    ``kind`` (rows of 2, 4 symbols; 0: any) and ``image`` are compile-time constants
    (numba's literal dispatch): each of the six forms keeps only its own branches. The
    encoder and the decoder walk the batch alike, wave by wave, block by block, each code
    under the counts of the waves before its own; the walk is written out in each (a call
    taking arrays would count references on every code).
    """
    _literally(kind)
    _literally(image)
    fixed, one, two = 1 if kind == 2 else (2 if kind == 4 else 0), _U_ONE_, _U_TWO
    if codes.max() >= symbols:  # out of the model: no stream (the caller refuses)
        return np.empty(0, np.uint32)
    model, edges, marks = _model(rows, symbols)
    _refresh(model, rows, symbols, edges, 0, kind)
    grid, base = _layout(geom, feature, codes, True)
    w, q_bits = np.uint64(geom[5]), np.uint64(fixed if fixed else geom[7])
    shift, size = np.uint64(0 if fixed else geom[8]), np.uint64(kind if kind else symbols)
    last, inner, marked = size - one, np.uint64(edges), np.uint64(marks)
    interval = np.empty(2 * codes.size, np.uint64)
    i = 0
    for k in range(geom[1]):
        a0, a1, m, stride, at, step = _wave(geom, k)
        for a in range(a0, a1):
            pos, chan = np.uint64(a * stride + at), np.uint64(base[a] if image else 0)
            for b in range(m):
                if image:
                    ctx = chan + _neighbours(grid[pos - one], grid[pos - w - two],
                                             grid[pos - w - two - one],
                                             grid[pos - w - one], q_bits, shift)
                else:
                    ctx = np.uint64(base[b])
                s = np.uint64(grid[pos])
                e = inner + ctx * last + s  # the edge above s
                interval[i], interval[i + 1] = _span(s, np.uint64(model[e - one]),
                                                     np.uint64(model[e]), last)
                i += 2
                model[ctx * size + s] += 1
                if not kind:
                    model[marked + ctx] = 1
                pos += np.uint64(step)
        _refresh(model, rows, symbols, edges, 0 if kind else marks, kind)
    return _ans_encode(interval)


@_jit
def _decode(words, out, geom, feature, rows, symbols, kind, image):
    """Decode into ``out`` (see :func:`decode_words`)."""
    _literally(kind)
    _literally(image)
    fixed, one, two = 1 if kind == 2 else (2 if kind == 4 else 0), _U_ONE_, _U_TWO
    state, left, head = _open(words)
    if head != out.size:
        return (ZERO_END if head < 0 else BAD_COUNT), head
    model, edges, marks = _model(rows, symbols)
    _refresh(model, rows, symbols, edges, 0, kind)
    grid, base = _layout(geom, feature, out, False)
    w, q_bits = np.uint64(geom[5]), np.uint64(fixed if fixed else geom[7])
    shift, size = np.uint64(0 if fixed else geom[8]), np.uint64(kind if kind else symbols)
    last, inner, marked = size - one, np.uint64(edges), np.uint64(marks)
    for k in range(geom[1]):
        a0, a1, m, stride, at, step = _wave(geom, k)
        for a in range(a0, a1):
            pos, chan = np.uint64(a * stride + at), np.uint64(base[a] if image else 0)
            for b in range(m):
                if image:
                    ctx = chan + _neighbours(grid[pos - one], grid[pos - w - two],
                                             grid[pos - w - two - one],
                                             grid[pos - w - one], q_bits, shift)
                else:
                    ctx = np.uint64(base[b])
                e = inner + ctx * last
                if kind == 2:
                    s, state = _binary(state, np.uint64(model[e]))
                elif kind == 4:
                    s, state = _quad(state, np.uint64(model[e]), np.uint64(model[e + one]),
                                     np.uint64(model[e + one + one]))
                else:  # a binary search of the row's edges
                    q = state & _U_MASK
                    s, top = _U_ZERO, last + one
                    while top - s > one:
                        mid = (s + top) >> one
                        if np.uint64(model[e + mid - one]) <= q:
                            s = mid
                        else:
                            top = mid
                    lo, width = _span(s, np.uint64(model[e + s - one]),
                                      np.uint64(model[e + s]), last)
                    state = (state >> _U_PRECISION) * width + q - lo
                if state < _U_REFILL and left:
                    left -= one
                    state = (state << _U_WORD) | np.uint64(words[left])
                grid[pos] = s
                model[ctx * size + s] += 1
                if not kind:
                    model[marked + ctx] = 1
                pos += np.uint64(step)
        _refresh(model, rows, symbols, edges, 0 if kind else marks, kind)
    if image:
        _copy_planes(out, grid, geom[2], geom[4], geom[5], False)
    return (OK if state == 0 and left == 0 else LEFT_OVER), head



@_jit
def _ans_encode(interval):
    """The stack ANS words of the intervals ``(start, width)``, then of their count.

    Coded last to first, so the decoder meets them first to last; the count last, as two
    16-bit uniform symbols (high half first), so the decoder reads it first.
    """
    size = interval.size // 2
    out = np.empty(size + 6, np.uint32)
    n = 0
    state = _U_ZERO
    for i in range(size + 2):
        if i < size:
            lo, p = interval[2 * (size - 1 - i)], interval[2 * (size - 1 - i) + 1]
        else:
            lo, p = np.uint64((size >> (16 * (size + 1 - i))) & 0xFFFF) * _U_BIN, _U_BIN
        if (state >> _U_RENORM) >= p:
            out[n] = np.uint32(state & _U_LOW)
            n += 1
            state >>= _U_WORD
        quot = state // p
        state = (quot << _U_PRECISION) | (lo + state - quot * p)
    while state:
        out[n] = np.uint32(state & _U_LOW)
        n += 1
        state >>= _U_WORD
    return out[:n]


# Entry points, ``kind`` and ``image`` constants: a literal argument passed from Python would
# be resolved again on every call.
@_jit
def _encode_2_image(codes, geom, feature, rows, symbols):
    return _encode(codes, geom, feature, rows, symbols, 2, True)


@_jit
def _encode_2_flat(codes, geom, feature, rows, symbols):
    return _encode(codes, geom, feature, rows, symbols, 2, False)


@_jit
def _encode_4_image(codes, geom, feature, rows, symbols):
    return _encode(codes, geom, feature, rows, symbols, 4, True)


@_jit
def _encode_4_flat(codes, geom, feature, rows, symbols):
    return _encode(codes, geom, feature, rows, symbols, 4, False)


@_jit
def _encode_any_image(codes, geom, feature, rows, symbols):
    return _encode(codes, geom, feature, rows, symbols, 0, True)


@_jit
def _encode_any_flat(codes, geom, feature, rows, symbols):
    return _encode(codes, geom, feature, rows, symbols, 0, False)


@_jit
def _decode_2_image(words, out, geom, feature, rows, symbols):
    if rows > 256:
        return _decode_image(words, out, geom, rows, 2, _WIDE, 0)
    return _decode_image(words, out, geom, rows, 2, _NARROW, 0)


@_jit
def _decode_2_flat(words, out, geom, feature, rows, symbols):
    return _decode(words, out, geom, feature, rows, symbols, 2, False)


@_jit
def _decode_4_image(words, out, geom, feature, rows, symbols):
    if rows > 1024:  # more channel groups than the context coder makes
        return _decode(words, out, geom, feature, rows, symbols, 4, True)
    if rows > 256:
        return _decode_image(words, out, geom, rows, 4, _WIDE, 1024)
    return _decode_image(words, out, geom, rows, 4, _NARROW, 256)


@_jit
def _decode_4_flat(words, out, geom, feature, rows, symbols):
    return _decode(words, out, geom, feature, rows, symbols, 4, False)


@_jit
def _decode_any_image(words, out, geom, feature, rows, symbols):
    return _decode(words, out, geom, feature, rows, symbols, 0, True)


@_jit
def _decode_any_flat(words, out, geom, feature, rows, symbols):
    return _decode(words, out, geom, feature, rows, symbols, 0, False)


_ENTRIES = {(2, True): (_encode_2_image, _decode_2_image),
            (2, False): (_encode_2_flat, _decode_2_flat),
            (4, True): (_encode_4_image, _decode_4_image),
            (4, False): (_encode_4_flat, _decode_4_flat),
            (0, True): (_encode_any_image, _decode_any_image),
            (0, False): (_encode_any_flat, _decode_any_flat)}


def _entry(symbols: int, geom: np.ndarray) -> tuple:
    return _ENTRIES[symbols if symbols in (2, 4) else 0, bool(geom[0])]


def available() -> bool:
    """Whether numba is installed (the compiled coder can run)."""
    return _numba is not None


def _check() -> None:
    if not available():
        raise RuntimeError("the compiled context coder needs numba (dq-flower[fast])")


def encode_words(codes: np.ndarray, geom: np.ndarray, feature: np.ndarray, rows: int,
                 symbols: int) -> np.ndarray:
    """The stream's ANS words (uint32, in stream order) of ``codes`` (uint8) and their count.

    ``geom`` is the batch's geometry: ``(1, waves, planes, C, H, W, channel groups, neighbour
    bits, shift)`` for images, ``(0, waves, n, d, ...)`` for flat samples, feature ``f``'s
    context ``feature[f]``; a model of ``rows`` contexts of ``symbols`` symbols. No words
    where a code is ``symbols`` or more.
    """
    _check()
    return _entry(symbols, geom)[0](codes, geom, feature, rows, symbols)


def decode_words(words: np.ndarray, out: np.ndarray, geom: np.ndarray, feature: np.ndarray,
                 rows: int, symbols: int) -> tuple[int, int]:
    """Decode ``out.size`` codes into ``out`` (uint8): ``(result, the stream's count)``.

    The arguments are :func:`encode_words`'. The result is :data:`OK`, :data:`ZERO_END`,
    :data:`BAD_COUNT` (no code decoded) or :data:`LEFT_OVER` (the stream does not end after
    the last code).
    """
    _check()
    status, head = _entry(symbols, geom)[1](words, out, geom, feature, rows, symbols)
    return int(status), int(head)
