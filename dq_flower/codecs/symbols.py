"""Adaptive order-0 ANS coding of a gradient codec's integer codes: the ``context`` coder.

Codes (QSGD's levels, TernGrad's ternary values) are coded with an ANS coder
(:class:`constriction.stream.stack.AnsCoder`) in *waves* of doubling length
(:data:`FIRST_WAVE` codes, then as many as came before), each code under the
Krichevsky-Trofimov estimate (``counts + 1/2``) of earlier waves: ``log2(count /
FIRST_WAVE) + 2`` vectorised calls. The stream opens with the code count (32 bits) and the
alphabet size (8 bits); :func:`decode` refuses above :data:`MAX_CODES_PER_BYTE` codes per
stream byte before allocating, and a truncated, corrupt or overlong stream raises
:class:`~dq_flower.codecs.base.PayloadError`.
"""

from __future__ import annotations

import constriction  # type: ignore[import-untyped]
import numpy as np

from .payload import MAX_ELEMENTS, PayloadError

__all__ = ["FIRST_WAVE", "MAX_ALPHABET", "MAX_CODES_PER_BYTE", "PRIOR", "wave_bounds",
           "fits", "encode", "decode"]

#: Codes of the first wave (coded with the uniform prior).
FIRST_WAVE = 8
#: Largest alphabet (codes ``0 .. 255``: 8-bit codes).
MAX_ALPHABET = 256
#: Most codes a stream may carry per byte of it (checked before decoding): bounds a
#: decoder's work and memory by its input. An all-zero message of ``n`` codes costs about
#: ``log2(n)`` bits; the encoder leaves such messages to zlib.
MAX_CODES_PER_BYTE = 1 << 12
#: Prior count of every symbol (Krichevsky-Trofimov).
PRIOR = 0.5

_HEAD = constriction.stream.model.Uniform(1 << 16)
_ALPHA = constriction.stream.model.Uniform(MAX_ALPHABET)


def wave_bounds(count: int) -> np.ndarray:
    """Wave boundaries ``0, FIRST_WAVE, 2 FIRST_WAVE, 4 FIRST_WAVE, ..., count`` (int64)."""
    bounds = [0]
    while bounds[-1] < count:
        bounds.append(min(count, max(FIRST_WAVE, 2 * bounds[-1])))
    return np.array(bounds, dtype=np.int64)


def fits(count: int, nbytes: int) -> bool:
    """Whether a stream of ``nbytes`` may carry ``count`` codes (see :data:`MAX_CODES_PER_BYTE`)."""
    return 0 <= count <= min(MAX_ELEMENTS, MAX_CODES_PER_BYTE * nbytes)


def encode(codes: np.ndarray, alphabet: int) -> np.ndarray:
    """Code integer ``codes`` in ``[0, alphabet)`` into a uint8 stream (whole 32-bit words).

    Raises ``ValueError`` for an alphabet outside 2 to :data:`MAX_ALPHABET`, too many
    codes, or a code outside the alphabet.
    """
    if not 2 <= int(alphabet) <= MAX_ALPHABET:
        raise ValueError(f"alphabet must be 2 to {MAX_ALPHABET}, got {alphabet!r}")
    sym = np.ascontiguousarray(codes).reshape(-1)
    if sym.size > MAX_ELEMENTS:
        raise ValueError(f"at most {MAX_ELEMENTS} codes, got {sym.size}")
    if sym.size and (int(sym.min()) < 0 or int(sym.max()) >= alphabet):
        raise ValueError(f"codes must lie in [0, {alphabet})")
    sym = sym.astype(np.int32)
    bounds = wave_bounds(sym.size)
    wave = np.repeat(np.arange(bounds.size - 1), np.diff(bounds))
    hist = np.bincount(wave * alphabet + sym, minlength=(bounds.size - 1) * alphabet)
    hist = hist.reshape(-1, alphabet)
    # one model per wave: the Krichevsky-Trofimov counts of the waves before it
    before = np.cumsum(hist, axis=0, dtype=np.float64) - hist + PRIOR
    models = [constriction.stream.model.Categorical(row, perfect=False) for row in before]
    coder = constriction.stream.stack.AnsCoder()
    for k in range(bounds.size - 2, -1, -1):  # a stack: last wave first
        coder.encode_reverse(sym[bounds[k]:bounds[k + 1]], models[k])
    # the head: ``alphabet - 1``, then the count as two 16-bit symbols (decoded first)
    coder.encode_reverse(np.array([alphabet - 1], dtype=np.int32), _ALPHA)
    coder.encode_reverse(np.array([sym.size & 0xFFFF, sym.size >> 16], dtype=np.int32), _HEAD)
    words = coder.get_compressed()
    return np.ascontiguousarray(words, dtype="<u4").view(np.uint8).copy()


def _open(stream: np.ndarray, alphabet: int, count: int):
    """Check sizes and the stream's head; return the coder positioned at the first code."""
    if not 2 <= int(alphabet) <= MAX_ALPHABET:
        raise PayloadError(f"context stream of a {alphabet!r}-symbol alphabet; 2 to "
                           f"{MAX_ALPHABET} accepted")
    buf = np.ascontiguousarray(stream)
    if buf.dtype != np.uint8 or buf.ndim != 1 or buf.size % 4 or buf.size == 0:
        raise PayloadError(f"context stream holds {buf.size} bytes, not whole 32-bit words")
    if not fits(int(count), buf.size):
        raise PayloadError(f"context stream of {buf.size} bytes cannot hold {count} codes "
                           f"(at most {MAX_CODES_PER_BYTE} per byte, {MAX_ELEMENTS} in all)")
    try:
        coder = constriction.stream.stack.AnsCoder(buf.view("<u4").astype(np.uint32))
        head = np.asarray(coder.decode(_HEAD, 2), dtype=np.int64)
        alpha = int(np.asarray(coder.decode(_ALPHA, 1))[0]) + 1
    except Exception as exc:  # a last word of zero is no valid ANS state
        raise PayloadError(f"context stream is corrupt: {exc}") from None
    made = int(head[0]) + (int(head[1]) << 16)
    if made != count or alpha != alphabet:
        raise PayloadError(f"context stream was made for {made} codes of {alpha} symbols, "
                           f"not the declared {count} of {alphabet}")
    return coder


def decode(stream: np.ndarray, alphabet: int, count: int) -> np.ndarray:
    """Decode exactly ``count`` codes (uint8).

    Raises :class:`PayloadError` for a stream not of whole 32-bit words, too short, made for
    another count or alphabet, corrupt, or with data left after the declared codes.
    """
    coder = _open(stream, alphabet, count)
    bounds = wave_bounds(int(count))
    out = np.empty(int(count), dtype=np.uint8)
    counts = np.full(int(alphabet), PRIOR, dtype=np.float64)
    try:
        for k in range(bounds.size - 1):
            a, b = int(bounds[k]), int(bounds[k + 1])
            model = constriction.stream.model.Categorical(counts, perfect=False)
            sym = np.asarray(coder.decode(model, b - a), dtype=np.int64)
            out[a:b] = sym
            counts += np.bincount(sym, minlength=alphabet)
    except Exception as exc:
        raise PayloadError(f"context stream is corrupt: {exc}") from None
    if not coder.is_empty():
        raise PayloadError(f"context stream does not end after the declared {count} codes "
                           "(data left over, missing or corrupt)")
    return out
