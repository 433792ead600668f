"""The compiled decoder of 1-bit and 2-bit image batches of the ``context`` coder.

The same stream as :mod:`.context_ans`'s general decoder, faster: the planes' cells are laid
out wave by wave (a wave's cells of every plane contiguous, the neighbours at fixed offsets),
so each wave's contexts come from one vectorised pass before its codes, and the serial loop
does little more than the ANS step; two-symbol counts alternate between two tables from code
to code, and every row is requantized after each wave in one vectorised pass. A four-symbol
row is four words, one per symbol (its start, its width and the symbol), and its step picks
one with three comparisons and conditional moves before its one product.
"""

from __future__ import annotations

import numpy as np

from dq_flower.codecs.ans_step import (
    _ONE,
    _U_LOW,
    _U_ONE_,
    _U_PRECISION,
    _U_REFILL,
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
    _select,
)

_U_FORTY, _U_BYTE, _U_THREE = np.uint64(40), np.uint64(0xFF), np.uint64(3)
#: Dtypes of :func:`_decode_image`'s cells: contexts of at most 256 rows fit a byte.
_NARROW, _WIDE = np.zeros(0, np.uint8), np.zeros(0, np.uint16)


@_jit
def _wave_contexts(cells, chan, at, count, stride, planes, q_bits):
    """Write the contexts of the ``count`` cells from ``at`` from their neighbours.

    A wave of :func:`_decode_image`'s layout; ``q_bits`` is a constant, so the pass
    vectorises.
    """
    _literally(q_bits)
    left, up = at - stride * planes, at - (2 * stride + 1) * planes
    up_left, up_right = at - (3 * stride + 1) * planes, at - (stride + 1) * planes
    lft, upp = cells[left:left + count], cells[up:up + count]
    upl, upr = cells[up_left:up_left + count], cells[up_right:up_right + count]
    out = cells[at:at + count]
    for i in range(count):
        out[i] = chan[i] + ((lft[i] << (3 * q_bits)) | (upp[i] << (2 * q_bits))
                            | (upl[i] << q_bits) | upr[i])


#: The edge passes: ``error_model="numpy"`` drops the division's zero check (every divisor is
#: at least 1), so the loop over the rows vectorises; the same IEEE operations, the same edges.
_vec = _jit if _numba is None else _numba.njit(cache=True, nogil=True, error_model="numpy")


@_vec
def _edges_2(counts, edges, rows):
    """Every two-symbol row's edge from its counts (two tables, ``2 rows`` apart)."""
    free = np.float64(_ONE - 2)
    for row in range(rows):
        c0 = counts[2 * row] + counts[2 * rows + 2 * row]
        c1 = counts[2 * row + 1] + counts[2 * rows + 2 * row + 1]
        edges[row] = np.int64((np.float64(c0) + 0.5) * (free / (np.float64(c0 + c1) + 1.0))) + 1


@_vec
def _rows_4(counts, table, rows, span):
    """Every four-symbol row's symbols packed for :func:`_quad_packed`, from its counts.

    Symbol ``s`` of row ``r`` (edges ``e_s``, ``e_0 = 0``, ``e_4 = 2**24``): its count at
    ``counts[s span + r]``, its word at ``table[s span + r]``: ``(((e_s - 1) << 8 | s) << 32)
    | (e_(s+1) - e_s)``, symbol 0's high half ``0xFFFFFF00``. Four contiguous runs each: the
    pass vectorises, and costs less than finding the rows a wave touched.
    """
    free = np.float64(_ONE - 4)
    for row in range(rows):
        c0, c1 = counts[row], counts[span + row]
        c2, c3 = counts[2 * span + row], counts[3 * span + row]
        scale = free / (np.float64(c0 + c1 + c2 + c3) + 2.0)
        e1 = np.int64((np.float64(c0) + 0.5) * scale) + 1
        e2 = np.int64((np.float64(c0 + c1) + 1.0) * scale) + 2
        e3 = np.int64((np.float64(c0 + c1 + c2) + 1.5) * scale) + 3
        table[row] = np.uint64(0xFFFFFF00 << 32) | np.uint64(e1)
        table[span + row] = np.uint64((((e1 - 1) << 8) | 1) << 32) | np.uint64(e2 - e1)
        table[2 * span + row] = np.uint64((((e2 - 1) << 8) | 2) << 32) | np.uint64(e3 - e2)
        table[3 * span + row] = np.uint64((((e3 - 1) << 8) | 3) << 32) | np.uint64(_ONE - e3)


@_jit
def _quad_packed(state, p0, p1, p2, p3):
    """:func:`.ans_step._quad` on a row of :func:`_rows_4`: ``(symbol, next state)``.

    With ``q`` the state's low 24 bits, ``q << 40 >= p_s`` exactly where ``q >= e_s``, and
    ``((q << 40) - p_s) >> 40`` is ``q - e_s`` (``q`` for symbol 0): three compares, three
    conditional moves, one product, the symbol read off the chosen word.
    """
    high = state << _U_FORTY
    low_half = _select(high >= p1, p1, p0)
    high_half = _select(high >= p3, p3, p2)
    pick = _select(high >= p2, high_half, low_half)
    return (pick >> _U_WORD) & _U_BYTE, \
        (state >> _U_PRECISION) * (pick & _U_LOW) + ((high - pick) >> _U_FORTY)


@_jit
def _decode_image(words, out, geom, rows, kind, proto, span):
    """:func:`_decode` of an image batch of two- or four-symbol rows (``kind``, a constant).

    The cells (``proto``'s dtype: uint8 where every context fits, else uint16) are laid out
    wave by wave: cell ``(r, c)`` of plane ``p`` at ``((2 r + c + 3) (H + 1) + r + 1) P + p``,
    so a wave is one contiguous run (plane fastest) whose neighbours sit at fixed offsets, and
    only the border (row -1, columns -1 and W) is zeroed. A cell holds its context until its
    code is decoded, then the code. The codes go to ``out`` as they are decoded. Four-symbol
    rows keep each symbol's counts and words ``span`` apart (a constant, at least ``rows``),
    so a code's four words load at fixed offsets from its context.
    """
    _literally(kind)
    _literally(span)
    state, left, head = _open(words)
    if head != out.size:
        return (ZERO_END if head < 0 else BAD_COUNT), head
    planes, c, h, w, groups, q_bits = geom[2], geom[3], geom[4], geom[5], geom[6], geom[7]
    size = np.uint64(kind)
    if kind == 2:  # (table, row, symbol); the table in use
        counts, edges = np.zeros(4 * rows, np.int64), np.empty(rows, np.uint64)
    else:  # (symbol, row): rows ``span`` apart, a constant (as of :func:`_rows_4`'s table)
        counts, edges = np.zeros(4 * span, np.int64), np.empty(4 * span, np.uint64)
    table, other, wide = _U_ZERO, np.uint64(2 * rows), np.uint64(span)
    chan = np.empty(h * planes, proto.dtype)  # each plane's context base, once per row
    for p in range(planes):
        chan[p] = ((p % c) * groups // c) << (4 * q_bits)
    for p in range(planes, h * planes):
        chan[p] = chan[p - planes]
    stride, slots = h + 1, 2 * h + w + 2
    cells = np.empty(slots * stride * planes, proto.dtype)
    for slot in range(slots):
        cells[slot * stride * planes:(slot * stride + 1) * planes] = 0
    for r in range(h):
        for col in (-1, w):
            at = ((2 * r + col + 3) * stride + r + 1) * planes
            cells[at:at + planes] = 0
    plane_codes, step, next_plane = np.uint64(h * w), np.uint64(w - 2), np.uint64(planes)
    for k in range(geom[1]):
        if kind == 2:
            _edges_2(counts, edges, rows)
        else:
            _rows_4(counts, edges, rows, span)
        first = max(0, -(-(k - w + 1) // 2))
        m = min(h - 1, k // 2) + 1 - first
        at = ((k + 3) * stride + first + 1) * planes
        if kind == 2:
            _wave_contexts(cells, chan, at, m * planes, stride, planes, 1)
        else:
            _wave_contexts(cells, chan, at, m * planes, stride, planes, 2)
        cell0, code0 = np.uint64(at), np.uint64(first * (w - 2) + k)
        for a in range(planes):
            cell, code = cell0 + np.uint64(a), code0 + np.uint64(a) * plane_codes
            for _ in range(m):
                x = np.uint64(cells[cell])
                if kind == 2:
                    s, state = _binary(state, np.uint64(edges[x]))
                else:
                    s, state = _quad_packed(state, edges[x], edges[x + wide],
                                            edges[x + _U_TWO * wide],
                                            edges[x + _U_THREE * wide])
                if state < _U_REFILL and left:
                    left -= _U_ONE_
                    state = (state << _U_WORD) | np.uint64(words[left])
                cells[cell] = s
                out[code] = s
                if kind == 2:  # two tables, code by code: no increment waits on the last
                    counts[table + x * size + s] += 1
                    table ^= other
                else:  # the longer four-symbol step outlasts an increment
                    counts[s * wide + x] += 1
                cell += next_plane
                code += step
    return (OK if state == 0 and left == 0 else LEFT_OVER), head
