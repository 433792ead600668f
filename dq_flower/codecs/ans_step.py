"""The ANS step of the compiled ``context`` coder: its constants, decode steps and stream head.

Shared by :mod:`.context_ans` (every batch) and :mod:`.context_image` (1-bit and 2-bit
images): the typed constants of a stack ANS coder of 32-bit words, a 64-bit state and 24-bit
probabilities, the numba decorator (kernels compiled on first use, cached on disk), a
branch-free select, one decode step of a two- and of a four-symbol row, and the opening of a
stream (its state and its declared count).

numba's cache checks only the source file of the function called from Python: after an edit
here or in :mod:`.context_image` alone, delete ``__pycache__/*.nbi`` and ``*.nbc`` beside
this file, or :mod:`.context_ans`'s entries load the kernels compiled before it.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

try:
    _numba: Any = importlib.import_module("numba")
except ImportError:  # pragma: no cover - context.py uses the constriction coder instead
    _numba = None

#: :func:`decode_words` results: decoded exactly, a last word of zero (no valid ANS state),
#: the stream's count is not the declared one, data left over or the stream corrupt.
OK, ZERO_END, BAD_COUNT, LEFT_OVER = 0, 1, 2, 3

_PRECISION = 24
_ONE = 1 << _PRECISION
#: The count travels as two 16-bit symbols of a uniform model: 2**24 / 2**16 each.
_COUNT_BIN = 1 << 8


# the kernels' constants, typed: numba turns mixed uint64 / int64 arithmetic into floats
_U_ONE, _U_MASK = np.uint64(_ONE), np.uint64(_ONE - 1)
_U_PRECISION, _U_WORD = np.uint64(_PRECISION), np.uint64(32)
_U_LOW = np.uint64(0xFFFFFFFF)
_U_RENORM = np.uint64(64 - _PRECISION)  # a state this high must shed a word first
_U_REFILL = np.uint64(1 << 32)  # a state below takes a word
_U_BIN = np.uint64(_COUNT_BIN)
_U_ZERO = np.uint64(0)
_U_ONE_, _U_TWO = np.uint64(1), np.uint64(2)
_jit = (lambda f: f) if _numba is None else _numba.njit(cache=True, nogil=True)
_literally = (lambda x: x) if _numba is None else _numba.literally


def _select(cond, a, b):
    """``a if cond else b`` of two uint64 (compiled: a select LLVM keeps branch-free)."""
    return a if cond else b


if _numba is not None:
    def _select_typed(typingctx, cond, a, b):
        """The select marked ``!unpredictable``: a conditional move, never a branch.

        LLVM turns a select of a value loaded for it alone into a branch, which a decoded
        symbol mispredicts about as often as it is not the likeliest.
        """
        types = importlib.import_module("numba.core.types")

        def codegen(context, builder, signature, args):
            out = builder.select(*args)
            out.set_metadata("unpredictable", builder.module.add_metadata([]))
            return out
        return types.uint64(types.boolean, types.uint64, types.uint64), codegen

    _select = importlib.import_module("numba.extending").intrinsic(_select_typed)


@_jit
def _binary(state, e1):
    """``(symbol, next state)`` of a two-symbol row, before any refill.

    Both successors share one product (``x * 2**24 + q`` is the state itself), then one is
    picked: no branch to mispredict.
    """
    q = state & _U_MASK
    t = (state >> _U_PRECISION) * e1
    bit = q >= e1
    return np.uint64(bit), (state - t - e1) if bit else (t + q)


@_jit
def _quad(state, e1, e2, e3):
    """``(symbol, next state)`` of a four-symbol row of inner edges ``e1 < e2 < e3``.

    The interval's start and width are picked from the comparisons first (selects of
    values held in registers, no branch), then one product: ``x * width + q - start``, the
    same state as constriction's, on a shorter chain than three products and their
    differences.
    """
    q = state & _U_MASK
    a, b, c = q >= e1, q >= e2, q >= e3
    lo_low = e1 if a else _U_ZERO
    w_low = (e2 - e1) if a else e1
    lo_high = e3 if c else e2
    w_high = (_U_ONE - e3) if c else (e3 - e2)
    lo = lo_high if b else lo_low
    width = w_high if b else w_low
    return np.uint64(a) + np.uint64(b) + np.uint64(c), (state >> _U_PRECISION) * width + q - lo


@_jit
def _open(words):
    """The initial state, the words left and the stream's count (-1: a last word of zero)."""
    left = words.size
    state = _U_ZERO
    if left:
        left -= 1
        state = np.uint64(words[left])
        if not state:
            return state, np.uint64(left), -1
        while left:
            left -= 1
            state = (state << _U_WORD) | np.uint64(words[left])
            if state >= _U_REFILL:
                break
    head = 0
    for half in range(2):
        q = state & _U_MASK
        s = q // _U_BIN
        state = (state >> _U_PRECISION) * _U_BIN + (q - s * _U_BIN)
        if state < _U_REFILL and left:
            left -= 1
            state = (state << _U_WORD) | np.uint64(words[left])
        head |= np.int64(s) << (16 * half)
    return state, np.uint64(left), head
