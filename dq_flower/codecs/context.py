"""Context-model arithmetic coding of quantized codes: the ``context`` sample coder.

An ANS coder (:class:`constriction.stream.stack.AnsCoder`) under an adaptive model both ends
rebuild from the message alone: each probability row is ``counts + 1/2`` (the
Krichevsky-Trofimov estimate) of the codes already coded in its context. Images ``(C, H, W)``
(channel-first): the context is the channel group and the top :data:`NEIGHBOUR_BITS` bits of
the left, upper, upper-left and upper-right codes (zero outside); code ``(r, c)`` is coded in
*wave* ``2 r + c``, after all its neighbours, one vectorised step per wave. Flat samples: the
context is the feature (grouped where there are many), a sample (or group) per wave.

The stream opens with the code count (32 bits); the declared count fixes work and memory,
:data:`MAX_CONTEXT_ROWS` bounds the model, and a stream with data left over, truncated or
corrupt raises :class:`~dq_flower.codecs.base.PayloadError`.

Where numba is installed (the ``server`` and ``fast`` extras), :mod:`.context_ans` codes
the same stream, byte for byte, in one compiled loop (:func:`compiled`); without it the
constriction coder above does.
"""

from __future__ import annotations

import re
from functools import cached_property, lru_cache

import constriction  # type: ignore[import-untyped]
import numpy as np

from .payload import MAX_ELEMENTS, PayloadError

__all__ = ["NEIGHBOUR_BITS", "MAX_CONTEXT_ROWS", "MAX_WAVES", "MAX_PER_FEATURE_D",
           "check_shape", "shape_text", "parse_shape", "compiled", "encode", "decode"]

#: Bits of each neighbour's code that enter the context (2 neighbours' top bits each).
NEIGHBOUR_BITS = 2
#: Channel groups of an image's context (channels beyond are grouped evenly).
MAX_CHANNEL_GROUPS = 4
#: Most probability rows (contexts) a model may have; bounds its memory to 2**20 counts.
MAX_CONTEXT_ROWS = 1 << 12
#: Largest sample (values) for which the ``uniform`` encoder also tries the per-feature
#: model on an image and keeps the smaller stream (digits' 8x8 code smaller that way).
MAX_PER_FEATURE_D = 1024
#: Most waves (sequential steps) of a flat batch; samples are grouped beyond it.
MAX_FLAT_WAVES = 64
#: Most waves of an image (``2 (H - 1) + W``): bounds the image's height and width.
MAX_WAVES = 1 << 14
#: Prior count of every symbol in every context (Krichevsky-Trofimov).
PRIOR = 0.5
#: Most probability-row entries the encoder hands the ANS coder at once.
_BLOCK = 1 << 18

_MODEL = constriction.stream.model.Categorical(perfect=False)
#: The stream starts with the code count, two 16-bit symbols: a stream made for another
#: count (or none) is refused before any code is decoded.
_COUNT_MODEL = constriction.stream.model.Uniform(1 << 16)


def _count_symbols(count: int) -> np.ndarray:
    return np.array([count & 0xFFFF, count >> 16], dtype=np.int32)


def check_shape(shape: object, d: int) -> tuple[int, int, int] | None:
    """Validate an image shape ``(C, H, W)`` of ``d`` codes per sample; ``None`` means flat.

    Raises :class:`PayloadError` for other than three positive ints of product ``d`` and
    at most :data:`MAX_WAVES` waves.
    """
    if shape is None:
        return None
    if type(shape) is tuple and len(shape) == 3:  # the common case, checked at once
        c, h, w = shape
        if type(c) is int and type(h) is int and type(w) is int and c >= 1 and h >= 1 \
                and w >= 1 and c * h * w == d and 2 * (h - 1) + w <= MAX_WAVES:
            return shape
    if (not isinstance(shape, (list, tuple)) or len(shape) != 3
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape)):
        raise PayloadError(f"context shape must be three positive ints, got {shape!r}")
    c, h, w = (int(s) for s in shape)
    if c * h * w != d:
        raise PayloadError(f"context shape {c}x{h}x{w} does not hold {d} codes per sample")
    if 2 * (h - 1) + w > MAX_WAVES:
        raise PayloadError(f"context shape {c}x{h}x{w} needs more than {MAX_WAVES} waves")
    return c, h, w


_SHAPE_TEXT = re.compile(r"([1-9][0-9]{0,8})x([1-9][0-9]{0,8})x([1-9][0-9]{0,8})")


def shape_text(shape: tuple[int, int, int]) -> str:
    """An image shape as it travels in a payload's meta: ``"CxHxW"``."""
    return "x".join(str(int(s)) for s in shape)


def parse_shape(text: object, d: int) -> tuple[int, int, int] | None:
    """Parse and :func:`check_shape` a meta ``"CxHxW"`` (``None`` stays ``None``: flat)."""
    if text is None:
        return None
    match = _SHAPE_TEXT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise PayloadError(f"context shape must read 'CxHxW', got {str(text)[:40]!r}")
    return check_shape(tuple(int(g) for g in match.groups()), d)


class _Waves:
    """The coding schedule of a batch: its codes in coding order, wave by wave.

    The codes live in a flat int32 array (an image batch keeps a zero border around each
    plane, so neighbours are plain offsets). ``order[bounds[k]:bounds[k + 1]]`` are the
    positions wave ``k`` codes; a position's context is ``base`` plus, for images, the
    weighted top bits of its four neighbours ``neighbours[:, i]`` (all in earlier waves).
    """

    def __init__(self, n: int, d: int, bits: int, shape: tuple[int, int, int] | None) -> None:
        self.n = n
        self.symbols = 1 << bits
        self.shape = shape
        self.shift = 0
        self.neighbours: np.ndarray | None = None
        if shape is None:
            self.rows = groups = max(min(d, MAX_CONTEXT_ROWS), 1)
            waves = min(n, MAX_FLAT_WAVES)
            self.size = n * d
            self.order = np.arange(n * d, dtype=np.int64)
            self.bounds = (np.arange(waves + 1, dtype=np.int64) * n // max(waves, 1)) * d
            feature = np.arange(d, dtype=np.int64) * groups // max(d, 1)
            self.base = np.tile(feature, n)
            for arr in (self.order, self.bounds, self.base):
                arr.flags.writeable = False
            return
        c, h, w = shape
        q = min(bits, NEIGHBOUR_BITS)
        self.shift = bits - q
        levels = 1 << q
        groups = min(c, MAX_CHANNEL_GROUPS)
        self.rows = groups * levels ** 4
        planes = n * c
        self.size = planes * (h + 1) * (w + 2)
        cells, counts = _wave_cells(h, w)
        start = np.arange(planes, dtype=np.int64) * ((h + 1) * (w + 2))
        # coding order: wave by wave; within a wave, plane by plane
        pieces = [(start[:, None] + cell[None, :]).reshape(-1) for cell in cells]
        self.order = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        self.bounds = np.concatenate([[0], np.cumsum(counts * planes)]).astype(np.int64)
        chan = (np.arange(planes, dtype=np.int64) % c) * groups // c * levels ** 4
        self.base = np.concatenate([np.repeat(chan, cell.size) for cell in cells]) \
            if cells else np.zeros(0, np.int64)
        offsets = np.array([1, w + 2, w + 3, w + 1], dtype=np.int64)  # L, U, UL, UR
        self.neighbours = self.order[None, :] - offsets[:, None]
        self.weights = np.array([levels ** 3, levels ** 2, levels, 1], dtype=np.int32)
        for arr in (self.order, self.bounds, self.base, self.neighbours):
            arr.flags.writeable = False

    @cached_property
    def steps(self) -> list[tuple[np.ndarray | None, np.ndarray, np.ndarray]]:
        """Per wave (its neighbours ``(4, m)``, contexts' base, positions), built once."""
        steps = []
        for k in range(self.num_waves):
            a, b = int(self.bounds[k]), int(self.bounds[k + 1])
            nb = None if self.neighbours is None \
                else np.ascontiguousarray(self.neighbours[:, a:b], dtype=np.intp)
            steps.append((nb, np.ascontiguousarray(self.base[a:b]),
                          np.ascontiguousarray(self.order[a:b], dtype=np.intp)))
        return steps

    def step_contexts(self, grid: np.ndarray, nb: np.ndarray | None,
                      base: np.ndarray) -> np.ndarray:
        """Contexts of the positions with neighbours ``nb`` (all known) and base ``base``."""
        if nb is None:
            return base
        top = np.take(grid, nb)
        if self.shift:
            top >>= self.shift
        return base + self.weights @ top

    @cached_property
    def wave_rows(self) -> np.ndarray:
        """Per coding-order position, its wave's first row ``wave * rows`` (cached)."""
        rows = np.repeat(np.arange(self.num_waves, dtype=np.int64) * self.rows,
                         np.diff(self.bounds))
        rows.flags.writeable = False
        return rows

    @property
    def num_waves(self) -> int:
        """Sequential steps of the schedule."""
        return int(self.bounds.size - 1)

    def layout(self, flat_codes: np.ndarray) -> np.ndarray:
        """The code array of ``(n * d,)`` codes (images: with a zero border per plane)."""
        if self.shape is None:
            return flat_codes.astype(np.int32)
        c, h, w = self.shape
        out = np.zeros((self.n * c, h + 1, w + 2), dtype=np.int32)
        out[:, 1:, 1:-1] = flat_codes.reshape(self.n * c, h, w)
        return out.reshape(-1)

    def unlayout(self, grid: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`layout`: the ``(n * d,)`` codes as uint8."""
        if self.shape is None:
            return grid.astype(np.uint8)
        c, h, w = self.shape
        inner = grid.reshape(self.n * c, h + 1, w + 2)[:, 1:, 1:-1]
        return inner.reshape(-1).astype(np.uint8)


@lru_cache(maxsize=16)
def _schedule(n: int, d: int, bits: int, shape: tuple[int, int, int] | None) -> _Waves:
    """The (read-only, cached) schedule of a batch."""
    return _Waves(n, d, bits, shape)


@lru_cache(maxsize=32)
def _wave_cells(h: int, w: int) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Per wave ``k``, the in-plane positions ``(r + 1) (w + 2) + c + 1`` with ``2 r + c = k``."""
    waves = []
    for k in range(2 * (h - 1) + w):
        r = np.arange(max(0, -(-(k - w + 1) // 2)), min(h - 1, k // 2) + 1, dtype=np.int64)
        waves.append((r + 1) * (w + 2) + (k - 2 * r) + 1)
    return tuple(waves), np.array([c.size for c in waves], dtype=np.int64)


def _histogram(ctx: np.ndarray, sym: np.ndarray, rows: int, symbols: int) -> np.ndarray:
    """Counts ``(rows, symbols)`` of the pairs ``(ctx, sym)``."""
    flat = np.bincount(ctx * symbols + sym, minlength=rows * symbols)
    return flat.reshape(rows, symbols).astype(np.float64)


def _encode_blocks(coder, waves: _Waves, ctx: np.ndarray, sym: np.ndarray) -> None:
    """Encode wave by wave, last to first, in blocks of at most ``_BLOCK`` row entries.

    The counts before wave ``k`` are all counts minus those of waves ``k, k + 1, ...``.
    """
    counts = _histogram(ctx, sym, waves.rows, waves.symbols) + PRIOR
    bounds = waves.bounds
    k = waves.num_waves
    while k > 0:
        first = k - 1
        while first > 0 and (bounds[k] - bounds[first - 1]) * waves.symbols <= _BLOCK:
            first -= 1
        s0, e0 = int(bounds[first]), int(bounds[k])
        rows = np.empty((e0 - s0, waves.symbols), dtype=np.float64)
        for j in range(k - 1, first - 1, -1):
            a, b = int(bounds[j]), int(bounds[j + 1])
            counts -= _histogram(ctx[a:b], sym[a:b], waves.rows, waves.symbols)
            rows[a - s0:b - s0] = counts[ctx[a:b]]
        if e0 > s0:
            coder.encode_reverse(sym[s0:e0], _MODEL, rows)
        k = first


@lru_cache(maxsize=1)
def _compiled():
    """The compiled coder (:mod:`.context_ans`) where numba is installed, else None."""
    from . import context_ans  # numba (optional, slow to import): deferred to the first use

    return context_ans if context_ans.available() else None


def compiled() -> bool:
    """Whether :func:`encode` and :func:`decode` run the compiled coder (numba installed)."""
    return _compiled() is not None


@lru_cache(maxsize=64)
def _geometry(n: int, d: int, bits: int, shape: tuple[int, int, int] | None) -> tuple:
    """The compiled coder's view of a batch: ``(geometry, feature contexts, rows)``.

    The same schedule as :class:`_Waves` (see :func:`.context_ans.encode_words`).
    """
    if shape is None:
        rows = groups = max(min(d, MAX_CONTEXT_ROWS), 1)
        waves = min(n, MAX_FLAT_WAVES)
        geom = [0, waves, n, d, 0, 0, 0, 0, 0]
        feature = np.arange(d, dtype=np.int64) * groups // max(d, 1)
    else:
        c, h, w = shape
        q = min(bits, NEIGHBOUR_BITS)
        groups = min(c, MAX_CHANNEL_GROUPS)
        rows = groups << (4 * q)
        geom = [1, 2 * (h - 1) + w, n * c, c, h, w, groups, q, bits - q]
        feature = np.zeros(0, dtype=np.int64)
    out = np.array(geom, dtype=np.int64)
    for arr in (out, feature):
        arr.flags.writeable = False
    return out, feature, rows


def _encode_constriction(waves: _Waves, grid: np.ndarray, count: int) -> np.ndarray:
    """The stream's words through constriction's ANS coder, one vectorised step per wave."""
    coder = constriction.stream.stack.AnsCoder()
    size = waves.order.size
    ctx = waves.step_contexts(grid, waves.neighbours, waves.base)
    sym = np.take(grid, waves.order)
    if waves.num_waves * waves.rows * waves.symbols <= _BLOCK \
            and size * waves.symbols <= 4 * _BLOCK:
        # every code's row at once: counts of its context in all earlier waves
        cell = waves.wave_rows + ctx
        hist = np.bincount(cell * waves.symbols + sym,
                           minlength=waves.num_waves * waves.rows * waves.symbols)
        before = np.cumsum(hist.reshape(waves.num_waves, -1), axis=0, dtype=np.float64)
        before -= hist.reshape(waves.num_waves, -1)
        before += PRIOR
        coder.encode_reverse(sym, _MODEL,
                             np.take(before.reshape(-1, waves.symbols), cell, axis=0))
    else:
        _encode_blocks(coder, waves, ctx, sym)
    coder.encode_reverse(_count_symbols(count), _COUNT_MODEL)
    return coder.get_compressed()


def encode(codes: np.ndarray, bits: int, n: int, d: int,
           shape: tuple[int, int, int] | None = None) -> np.ndarray:
    """Code ``n * d`` codes in ``[0, 2**bits)`` (sample after sample) into a uint8 stream.

    ``shape`` is a sample's image shape ``(C, H, W)``, ``None`` for flat samples. The stream
    is a whole number of little-endian 32-bit words.
    """
    img = check_shape(shape, d)
    flat = np.asarray(codes).reshape(-1)
    if flat.size != n * d:
        raise ValueError(f"expected {n * d} codes, got {flat.size}")
    if not n * d:
        return np.zeros(0, dtype=np.uint8)
    if flat.dtype != np.uint8 and (flat.min() < 0 or flat.max() > 255):
        raise ValueError(f"codes must lie in [0, {1 << bits}) for {bits}-bit codes")
    kernels = _compiled()
    if kernels is not None:
        geom, feature, rows = _geometry(int(n), int(d), int(bits), img)
        words = kernels.encode_words(np.ascontiguousarray(flat, dtype=np.uint8), geom,
                                     feature, rows, 1 << bits)
        if not words.size:  # the only stream of no words is that of no codes
            raise ValueError(f"codes must lie in [0, {1 << bits}) for {bits}-bit codes")
    else:
        if flat.max() >= 1 << bits:
            raise ValueError(f"codes must lie in [0, {1 << bits}) for {bits}-bit codes")
        waves = _schedule(int(n), int(d), int(bits), img)
        words = _encode_constriction(waves, waves.layout(flat), n * d)
    return np.ascontiguousarray(words, dtype="<u4").view(np.uint8).copy()


def _decode_constriction(waves: _Waves, words: np.ndarray, count: int) -> np.ndarray:
    """The codes' grid through constriction's ANS coder, one vectorised step per wave."""
    try:  # a stream whose last word is zero is no valid ANS state
        coder = constriction.stream.stack.AnsCoder(words)
        head = np.asarray(coder.decode(_COUNT_MODEL, 2), dtype=np.int32)
    except Exception as exc:
        raise PayloadError(f"context stream is corrupt: {exc}") from None
    if not np.array_equal(head, _count_symbols(count)):
        _refuse_count(int(head[0]) + (int(head[1]) << 16), count)
    grid = np.zeros(waves.size, dtype=np.int32)
    counts = np.full((waves.rows, waves.symbols), PRIOR, dtype=np.float64)
    flat_counts = counts.reshape(-1)
    symbols, cells = waves.symbols, flat_counts.size
    try:
        for nb, base, pos in waves.steps:
            if not pos.size:
                continue
            ctx = waves.step_contexts(grid, nb, base)
            sym = coder.decode(_MODEL, np.take(counts, ctx, axis=0))
            grid[pos] = sym
            flat_counts += np.bincount(ctx * symbols + sym, minlength=cells)
    except Exception as exc:
        raise PayloadError(f"context stream is corrupt: {exc}") from None
    if not coder.is_empty() or coder.num_words():
        _refuse_left_over(count)
    return grid


def _decode_compiled(kernels, words: np.ndarray, bits: int, n: int, d: int,
                     img: tuple[int, int, int] | None) -> np.ndarray:
    """The codes through the compiled coder (the same checks, the same messages)."""
    out = np.empty(n * d, dtype=np.uint8)
    geom, feature, rows = _geometry(n, d, bits, img)
    status, head = kernels.decode_words(words, out, geom, feature, rows, 1 << bits)
    if status == kernels.ZERO_END:
        raise PayloadError("context stream is corrupt: it ends in a zero word")
    if status == kernels.BAD_COUNT:
        _refuse_count(head, n * d)
    if status != kernels.OK:
        _refuse_left_over(n * d)
    return out


def _refuse_count(head: int, count: int) -> None:
    raise PayloadError(f"context stream was made for {head} codes, not the declared {count}")


def _refuse_left_over(count: int) -> None:
    raise PayloadError(f"context stream does not end after the declared {count} codes "
                       "(data left over, missing or corrupt)")


def decode(stream: np.ndarray, bits: int, n: int, d: int,
           shape: tuple[int, int, int] | None = None) -> np.ndarray:
    """Decode exactly ``n * d`` uint8 codes from a :func:`encode` stream.

    The caller bounds ``n * d``. Data left over, a length that is not whole 32-bit words or
    an undecodable stream raise :class:`~dq_flower.codecs.base.PayloadError`.
    """
    if not 1 <= int(bits) <= 8:
        raise PayloadError(f"context stream of {bits!r}-bit codes; 1 to 8 accepted")
    if not 0 <= int(n) * int(d) <= MAX_ELEMENTS:
        raise PayloadError(f"context stream declares {n} x {d} codes; at most {MAX_ELEMENTS}")
    buf = np.ascontiguousarray(stream, dtype=np.uint8)
    if buf.ndim != 1 or buf.size % 4:
        raise PayloadError(f"context stream holds {buf.size} bytes, not whole 32-bit words")
    n, d, bits = int(n), int(d), int(bits)
    img = check_shape(shape, d)
    if n * d == 0:
        if buf.size:
            raise PayloadError("context stream carries data for no codes")
        return np.zeros(0, dtype=np.uint8)
    words = buf.view("<u4").astype(np.uint32)
    kernels = _compiled()
    if kernels is not None:
        return _decode_compiled(kernels, words, bits, n, d, img)
    waves = _schedule(n, d, bits, img)
    return waves.unlayout(_decode_constriction(waves, words, n * d))
