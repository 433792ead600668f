"""Lossless coding of token windows: an adaptive order-k byte model and ANS.

A batch is ``n`` windows of ``length`` token ids below ``vocab``. Each id is written as
``width`` big-endian bytes (1 for a vocabulary of at most 256 symbols, 2 up to 65,536, 3
up to :data:`MAX_VOCAB`), so a window is ``length * width`` bytes, and byte position ``j``
of every window is coded in *wave* ``j``, one vectorised step per wave.

The model both ends rebuild from the message alone: per order ``k = 0 ..`` :data:`ORDER`,
counts of the bytes that followed each context (the previous ``k`` bytes of the window,
positions before its start a distinct pad value, and the byte's position in its token),
order 0 and 1 exact, higher orders hashed into :data:`HASH_ROWS` rows. A byte's
probabilities blend the orders from 0 up, each with a Witten-Bell escape weight::

    p_k(s) = (c_k(s) + e_k p_{k-1}(s)) / (n_k + e_k),   p_{-1}(s) = 1 / 256

(``c_k`` the context's counts, ``n_k`` their sum, ``e_k`` :data:`ESCAPE` times the
distinct bytes seen in it, at least once), counts from every earlier wave: every byte has
a probability above zero, and both ends compute the same floats (integer counts,
elementwise arithmetic only).

The stream opens with the byte count (32 bits); the declared count (at most
:data:`MAX_SYMBOLS` bytes) fixes work and memory, the tables are fixed in size
(:func:`table_bytes`), and a stream with data left over, truncated or corrupt, or decoding
to an id outside the vocabulary, raises :class:`~dq_flower.codecs.base.PayloadError`.
"""

from __future__ import annotations

import constriction  # type: ignore[import-untyped]
import numpy as np

from .payload import PayloadError

__all__ = ["ORDER", "ESCAPE", "HASH_ROWS", "MAX_VOCAB", "MAX_SYMBOLS", "token_width", "table_bytes",
           "encode", "decode"]

#: Highest context order (bytes of history). Order 3 and :data:`ESCAPE` 3 coded held-out
#: Austen text in messages of 4 and 16 KiB in fewer bits than orders 4 and 5 or escape
#: weights 0.5 to 2 (and than absolute discounting), measured here.
ORDER = 3
#: Escape weight per distinct byte of a context: above 1, the lower orders count more.
ESCAPE = 3.0
#: Rows of each hashed order's table (orders 2 and up).
HASH_ROWS = 1 << 13
#: Largest vocabulary: ids of up to 3 bytes.
MAX_VOCAB = 1 << 24
#: Most bytes one stream may declare (``n * length * width``): 4 MiB of text.
MAX_SYMBOLS = 1 << 22
_PAD = 256  # the value of a position before the window's start
_SYMBOLS = 256
_MODEL = constriction.stream.model.Categorical(perfect=False)
_COUNT_MODEL = constriction.stream.model.Uniform(1 << 16)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing of a context to a row


def token_width(vocab: int) -> int:
    """Bytes per token id of a vocabulary of ``vocab`` symbols (1, 2 or 3)."""
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) \
            or not 2 <= vocab <= MAX_VOCAB:
        raise PayloadError(f"vocabulary of {vocab!r} symbols; 2 to {MAX_VOCAB} accepted")
    return 1 if vocab <= 1 << 8 else 2 if vocab <= 1 << 16 else 3


def _rows_per_order(width: int) -> tuple[int, ...]:
    """Rows of each order's table: exact for orders 0 and 1, hashed above."""
    return (width, (_PAD + 1) * width, *([HASH_ROWS] * (ORDER - 1)))


def table_bytes(vocab: int) -> int:
    """Memory of the model's count tables (int32) for ``vocab``: fixed, whatever the count."""
    return 4 * _SYMBOLS * sum(_rows_per_order(token_width(vocab)))


def _context_rows(grid: np.ndarray, j: int, width: int) -> list[np.ndarray]:
    """Each order's table row for byte position ``j`` of every window (reads columns < j)."""
    m = grid.shape[0]
    pos = j % width
    out = [np.full(m, pos, dtype=np.int64)]
    key = np.full(m, pos, dtype=np.int64)
    for k in range(1, ORDER + 1):
        prev = grid[:, j - k].astype(np.int64) if j - k >= 0 else np.full(m, _PAD, np.int64)
        key = key * (_PAD + 1) + prev
        if k == 1:
            out.append(key)  # (pos, previous byte): exact
        else:
            mixed = (key.astype(np.uint64) + np.uint64(k)) * _MIX
            out.append((mixed >> np.uint64(64 - HASH_ROWS.bit_length() + 1)).astype(np.int64))
    return out


def _probabilities(tables: list[np.ndarray], rows: list[np.ndarray]) -> np.ndarray:
    """The blended probability rows ``(m, 256)`` of contexts ``rows`` under ``tables``."""
    m = rows[0].size
    p = np.full((m, _SYMBOLS), 1.0 / _SYMBOLS)
    for table, row in zip(tables, rows, strict=True):
        counts = table[row]
        total = counts.sum(axis=1, dtype=np.int64)
        escape = ESCAPE * np.maximum(np.count_nonzero(counts, axis=1), 1)
        p = (counts + escape[:, None] * p) / (total + escape)[:, None]
    return p


def _update(tables: list[np.ndarray], rows: list[np.ndarray], sym: np.ndarray,
            sign: int) -> None:
    """Add (``sign`` 1) or remove (-1) one count of ``sym`` in each order's context."""
    for table, row in zip(tables, rows, strict=True):
        np.add.at(table.reshape(-1), row * _SYMBOLS + sym, sign)


def _empty_tables(width: int) -> list[np.ndarray]:
    return [np.zeros((r, _SYMBOLS), dtype=np.int32) for r in _rows_per_order(width)]


def _to_bytes(tokens: np.ndarray, width: int) -> np.ndarray:
    """Ids ``(n, length)`` as big-endian bytes ``(n, length * width)``."""
    shifts = np.arange(width - 1, -1, -1, dtype=np.int64) * 8
    parts = (tokens.astype(np.int64)[:, :, None] >> shifts) & 0xFF
    return parts.reshape(tokens.shape[0], -1).astype(np.uint8)


def _count_symbols(count: int) -> np.ndarray:
    return np.array([count & 0xFFFF, count >> 16], dtype=np.int32)


def _check_count(n: int, length: int, width: int) -> int:
    count = int(n) * int(length) * width
    if int(n) < 0 or int(length) < 1 or count > MAX_SYMBOLS:
        raise PayloadError(f"token stream declares {n} windows of {length} tokens of {width} "
                           f"byte(s); at most {MAX_SYMBOLS} bytes in all")
    return count


def encode(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """Code windows ``(n, length)`` of ids in ``[0, vocab)`` into a uint8 stream.

    The stream is a whole number of little-endian 32-bit words.
    """
    width = token_width(vocab)
    ids = np.asarray(tokens)
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise ValueError(f"tokens must be integer windows (n, length), got {ids.dtype} "
                         f"{ids.shape}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"token ids must be in [0, {vocab})")
    count = _check_count(ids.shape[0], ids.shape[1], width)
    coder = constriction.stream.stack.AnsCoder()
    if count:
        grid = _to_bytes(ids, width)
        waves = [_context_rows(grid, j, width) for j in range(grid.shape[1])]
        tables = _empty_tables(width)
        for j, rows in enumerate(waves):
            _update(tables, rows, grid[:, j].astype(np.int64), 1)
        for j in range(grid.shape[1] - 1, -1, -1):  # last wave first: ANS is a stack
            sym = grid[:, j].astype(np.int64)
            _update(tables, waves[j], sym, -1)
            coder.encode_reverse(sym.astype(np.int32), _MODEL,
                                 _probabilities(tables, waves[j]))
        coder.encode_reverse(_count_symbols(count), _COUNT_MODEL)
    words = coder.get_compressed()
    return np.ascontiguousarray(words, dtype="<u4").view(np.uint8).copy()


def decode(stream: np.ndarray, vocab: int, n: int, length: int) -> np.ndarray:
    """Decode exactly ``n`` windows of ``length`` ids (int64) from an :func:`encode` stream.

    :class:`PayloadError` for counts over :data:`MAX_SYMBOLS`, a length that is not whole
    32-bit words, data left over, an undecodable stream or an id outside the vocabulary.
    """
    width = token_width(vocab)
    count = _check_count(n, length, width)
    buf = np.ascontiguousarray(stream, dtype=np.uint8)
    if buf.ndim != 1 or buf.size % 4:
        raise PayloadError(f"token stream holds {buf.size} bytes, not whole 32-bit words")
    if count == 0:
        if buf.size:
            raise PayloadError("token stream carries data for no tokens")
        return np.zeros((int(n), int(length)), dtype=np.int64)
    try:  # a stream whose last word is zero is no valid ANS state
        coder = constriction.stream.stack.AnsCoder(buf.view("<u4").astype(np.uint32))
        head = np.asarray(coder.decode(_COUNT_MODEL, 2), dtype=np.int32)
    except Exception as exc:
        raise PayloadError(f"token stream is corrupt: {exc}") from None
    if not np.array_equal(head, _count_symbols(count)):
        raise PayloadError(f"token stream was made for {int(head[0]) + (int(head[1]) << 16)} "
                           f"bytes, not the declared {count}")
    grid = np.zeros((int(n), int(length) * width), dtype=np.uint8)
    tables = _empty_tables(width)
    try:
        for j in range(grid.shape[1]):
            rows = _context_rows(grid, j, width)
            sym = np.asarray(coder.decode(_MODEL, _probabilities(tables, rows)), np.int64)
            grid[:, j] = sym
            _update(tables, rows, sym, 1)
    except Exception as exc:
        raise PayloadError(f"token stream is corrupt: {exc}") from None
    if not coder.is_empty():
        raise PayloadError(f"token stream does not end after the declared {count} bytes "
                           "(data left over, missing or corrupt)")
    shifts = np.arange(width - 1, -1, -1, dtype=np.int64) * 8
    ids = (grid.reshape(int(n), int(length), width).astype(np.int64) << shifts).sum(axis=2)
    if ids.size and int(ids.max()) >= vocab:
        raise PayloadError(f"token id {int(ids.max())} is outside the vocabulary of {vocab}")
    return ids
