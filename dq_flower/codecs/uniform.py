"""The data quantizer ``uniform``: per-sample affine ``bits``-bit codes of a batch ``(n, d)``.

Each row (or each of its ``per_channel=C`` channel slices, channel-first; ``channels_last``:
rows ``(L, C)`` coded as their transpose ``(C, L)``, meta ``channels_last``) gets float32
``lo = min`` and ``scale = (max - lo) / (2**bits - 1)``; a code is ``floor(t + u)`` for
``t = (x - lo) / scale``, ``u`` uniform in [0, 1) (stochastic, unbiased) or 1/2 (nearest),
and decodes to ``lo + code * scale`` (error below one step, half with nearest; a constant
row decodes exactly; each row's gain is lowered where float32 rounding could carry its
largest value past the top code, so the encoder needs no clipping pass). ``dither_seed``:
subtractive dither, ``u`` from a stateless counter-based splitmix64 hash of ``(seed, flat
index)`` (row ``i``'s is ``dither_offsets(seed, i * d, d)``, any slice computed alone)
subtracted again by the decoder. ``fixed_range``: values clipped to [0, 1], ``lo = 0``,
``scale = 1 / (2**bits - 1)``, codes only (decoded correctly rounded, so 0 and the top
code give exactly 0 and 1).

``entropy`` codes the packed codes losslessly where that shrinks them (``nbits`` counts what
is sent); ``context`` (:mod:`dq_flower.codecs.context`) models the codes in 2-D with
``sample_shape`` (meta ``context_shape``) or per feature (also tried for images of at most
:data:`~dq_flower.codecs.context.MAX_PER_FEATURE_D` values), or sends zlib's message where
smaller. With any coder the ranges (``mins`` then ``scales``) are zlib-coded into ``ranges``
(meta ``ranges: "zlib"``) where smaller; :func:`expand_ranges` undoes that and refuses a
stream that does not inflate to exactly ``8 * rows`` bytes of finite floats.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dq_flower.config import knob

from . import bitpack, context
from .affine import affine_block, dither_offsets, dither_u16
from .base import Codec, check_finite, int_param, random_u16, require_rng
from .bitpack import bucket_chunks
from .entropy import METHODS, check_method, compress, decompress
from .payload import (
    Payload,
    PayloadError,
    expect_floats,
    expect_nbits,
    expect_packed,
    expect_stream,
    open_payload,
)
from .registry import register

__all__ = ["Uniform", "SAMPLE_CODERS", "RANGE_CODER", "dither_offsets", "expand_ranges",
           "packed_codes", "plain_payload"]

#: Lossless coders of a ``uniform`` payload's codes: the byte coders and ``context``.
SAMPLE_CODERS = (*METHODS, "context")
#: Lossless coder of the per-row ranges (``mins`` then ``scales``) when the codes are coded.
RANGE_CODER = "zlib"

def _sample_shape(shape: Any) -> tuple[int, ...]:
    """``shape`` as 1 to 3 plain positive ints, or ``ValueError``."""
    if (not isinstance(shape, (tuple, list)) or not 1 <= len(shape) <= 3
            or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1
                   for v in shape)):
        raise ValueError(f"sample_shape must be 1 to 3 positive ints, got {shape!r}")
    return tuple(int(v) for v in shape)


def _flag(name: str) -> Any:
    """A coercion to a plain ``bool`` that refuses anything but a (numpy) bool."""
    def coerce(value: Any) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be a bool, got {value!r}")
        return bool(value)
    return coerce


@register("uniform")
@dataclass(frozen=True)
class Uniform(Codec):
    """Per-sample affine ``bits``-bit quantizer of a data batch ``(n, d)``.

    Parameters
    ----------
    bits : int
        Bits per coordinate, 1 to 8.
    stochastic : bool
        Stochastic (unbiased) rounding if True, nearest rounding otherwise.
    per_channel : int
        Number of channels ``C`` that get their own range (``d`` must be a multiple of
        ``C``); 0 gives each row one range. ``channels_last``: rows are ``(d / C, C)``.
    dither_seed : int or None
        Seed of a subtractive dither shared by encoder and decoder (replaces the rounding
        rule above; the decoder must be built with the same seed).
    entropy : str
        Lossless coder of the packed codes: ``none``, ``zlib``, ``lzma``, ``zstd`` or
        ``context`` (see :data:`SAMPLE_CODERS`).
    fixed_range : bool
        Quantize every row on the fixed range [0, 1] (values clipped to it first) and send
        no per-row ranges; incompatible with ``per_channel``.
    sample_shape : tuple of int or None
        Shape of one sample (``d`` values): ``(C, H, W)`` or ``(H, W)`` gives the ``context``
        coder its 2-D neighbourhoods; ``None`` or a 1-D shape codes flat samples. Only the
        ``context`` coder reads it; decoders need not know it.
    """

    bits: int = knob(2, coerce=bitpack.check_width)
    stochastic: bool = knob(True, coerce=_flag("stochastic"))
    per_channel: int = int_param("per_channel", 0, 0, 1 << 24)
    dither_seed: int | None = int_param("dither_seed", None, 0, (1 << 63) - 1)
    entropy: str = knob("none", coerce=lambda v: v if v == "context" else check_method(v))
    fixed_range: bool = knob(False, coerce=_flag("fixed_range"))
    sample_shape: tuple[int, ...] | None = knob(None, coerce=_sample_shape)
    channels_last: bool = knob(False, coerce=_flag("channels_last"))
    meta_fields = ("bits", "per_channel", "dither_seed")

    def __post_init__(self) -> None:
        if self.fixed_range and self.per_channel:
            raise ValueError("per_channel has no meaning with fixed_range: every channel shares "
                             "[0, 1]")
        if self.channels_last and self.per_channel < 2:
            raise ValueError("channels_last needs per_channel >= 2")

    @property
    def levels(self) -> int:
        """Largest code, ``2**bits - 1``."""
        return (1 << self.bits) - 1

    @property
    def fixed_step(self) -> np.float32:
        """The step ``1 / (2**bits - 1)`` of the fixed range [0, 1], as float32."""
        return np.float32(1.0 / self.levels)

    def _image_shape(self, d: int) -> tuple[int, int, int] | None:
        """The context coder's ``(C, H, W)`` for samples of ``d`` values (``None``: flat).

        Channels last (``(H, W, C)`` with ``C <= 4 < H``, as Keras and PIL arrays hold
        images) are one image of ``H`` rows of ``W * C`` values: each pixel's channels
        side by side, as they lie in memory.
        """
        shape = self.sample_shape
        if shape is not None and math.prod(shape) != d:
            raise ValueError(f"sample_shape {shape} does not hold d={d} values")
        if shape is None or len(shape) == 1:
            return None
        shape = shape[::-1] if self.channels_last else shape  # the codes' (C, L)
        if len(shape) == 3 and shape[2] <= 4 < shape[0]:
            shape = (shape[0], shape[1] * shape[2])
        c, h, w = (1, *shape) if len(shape) == 2 else shape
        return (int(c), int(h), int(w))

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Quantize the rows of ``x`` (float32, finite, 2-D); ``rng`` drives stochastic rounding."""
        arr = check_finite(x)
        if arr.ndim != 2:
            raise ValueError(f"uniform encodes a 2-D batch (n, d), one row per sample; got shape "
                             f"{arr.shape}")
        n, d = arr.shape
        groups = self.per_channel or 1
        if d % groups:
            raise ValueError(f"per_channel={self.per_channel} does not divide d={d}")
        if self.dither_seed is None and self.stochastic:
            rng = require_rng(rng, self.name)
        rows, width = n * groups, d // groups
        arr = arr.reshape(n, width, groups).transpose(0, 2, 1) if self.channels_last else arr
        flat = np.ascontiguousarray(arr).reshape(rows, width)
        packed, lo, scale = self._quantize(flat, rng)
        img = self._image_shape(d) if self.entropy == "context" else None
        packed, method, img = self._entropy_code(packed, n, d, img)
        code_bits = n * d * self.bits if method == "none" else 8 * packed.size
        meta: dict[str, Any] = {"entropy": method}
        if self.channels_last:
            meta["channels_last"] = True
        if method == "context" and img is not None:
            meta["context_shape"] = context.shape_text(img)
        if self.fixed_range:
            meta["fixed_range"] = True
            return self.payload((n, d), {"codes": packed}, code_bits, **meta)
        assert lo is not None and scale is not None  # allocated when not fixed
        buffers: dict[str, np.ndarray] = {"codes": packed, "mins": lo, "scales": scale}
        side_bits = 64 * rows
        if self.entropy != "none" and rows:
            raw = np.concatenate([lo.view(np.uint8), scale.view(np.uint8)])
            coded_ranges = compress(raw, RANGE_CODER)
            if coded_ranges.size < raw.size:
                buffers = {"codes": packed, "ranges": coded_ranges}
                meta["ranges"] = RANGE_CODER
                side_bits = 8 * coded_ranges.size
        return self.payload((n, d), buffers, code_bits + side_bits, **meta)

    def _quantize(
        self, flat: np.ndarray, rng: np.random.Generator | None
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``(packed codes, mins, scales)`` of the rows of ``flat`` (no ranges when fixed)."""
        rows, width = flat.shape
        fixed = self.fixed_range
        lo = None if fixed else np.zeros(rows, dtype=np.float32)
        scale = None if fixed else np.zeros(rows, dtype=np.float32)
        # Rows whose codes fill whole bytes are packed block by block while still in cache.
        aligned = (width * self.bits) % 8 == 0
        row_bytes = width * self.bits // 8
        packed = np.empty(bitpack.packed_nbytes(rows * width, self.bits), dtype=np.uint8)
        codes = None if aligned else np.zeros((rows, width), dtype=np.uint8)
        step = next(bucket_chunks(rows, width))[1] if rows and width else 1
        work = np.empty((min(step, rows), width), dtype=np.float32)
        stoch = self.dither_seed is not None or self.stochastic
        # t = (x - lo) * gain, then codes = floor(t + r) / 2**16 (r 16-bit random or dither)
        # or floor(t + 1/2) (nearest); ``safe_gain`` keeps the largest t of each row from
        # rounding past the top code, so no clipping pass is needed.
        unit, bump = (np.float32(65536.0), np.float32(65535.0)) if stoch else (1, 0.5)
        # Fixed range: t = clip(x, 0, 1) * top * unit, a float32 product by an exact power of
        # two times ``top``, so t <= top * unit and t + bump stays below (top + 1) * unit.
        fixed_gain = np.float32(self.levels * unit)
        for s, e in bucket_chunks(rows, width) if width else ():
            blk = flat[s:e]
            t = work[: e - s]
            if fixed:
                np.clip(blk, np.float32(0.0), np.float32(1.0), out=t)
                t *= fixed_gain
            else:
                assert lo is not None and scale is not None  # allocated when not fixed
                affine_block(blk, t, lo[s:e], scale[s:e], self.levels, unit, bump)
            if stoch:
                self._add_noise(t, s * width, rng)
            else:
                t += np.float32(0.5)
            blk_codes = t.astype(np.uint8)
            if aligned:
                packed[s * row_bytes : e * row_bytes] = bitpack.pack(blk_codes, self.bits)
            else:
                assert codes is not None  # allocated when not aligned
                codes[s:e] = blk_codes
        if not aligned:
            assert codes is not None
            packed = bitpack.pack(codes.reshape(-1), self.bits)
        return packed, lo, scale

    def _add_noise(self, t: np.ndarray, start: int, rng: np.random.Generator | None) -> None:
        """``t = (t + r) / 2**16`` in place, r the dither from flat index ``start``, or random."""
        if self.dither_seed is not None:
            r = dither_u16(self.dither_seed, start, t.size)
        else:
            assert rng is not None  # required in encode when stochastic, not dithered
            r = random_u16(rng, t.size)
        np.add(t, r.reshape(t.shape), out=t)
        t *= np.float32(1.0 / 65536.0)

    def _entropy_code(
        self, packed: np.ndarray, n: int, d: int, img: tuple[int, int, int] | None
    ) -> tuple[np.ndarray, str, tuple[int, int, int] | None]:
        """``(codes as sent, coder, context shape)``: ``packed`` coded where that shrinks it."""
        if self.entropy == "none" or not packed.size:
            return packed, "none", img
        if self.entropy == "context":
            coded, chosen, img = self._context_code(packed, n, d, img)
        else:
            coded, chosen = compress(packed, self.entropy), self.entropy
        if coded.size < packed.size:
            return coded, chosen, img
        return packed, "none", img

    def _context_code(
        self, packed: np.ndarray, n: int, d: int, img: tuple[int, int, int] | None
    ) -> tuple[np.ndarray, str, tuple[int, int, int] | None]:
        """The smallest of the context coder's messages (2-D, per feature) and zlib's."""
        flat_codes = bitpack.unpack(packed, self.bits, n * d)
        coded = context.encode(flat_codes, self.bits, n, d, img)
        if img is not None and d <= context.MAX_PER_FEATURE_D:
            # small images: a per-position model may learn more than neighbours
            flat = context.encode(flat_codes, self.bits, n, d, None)
            if flat.size < coded.size:
                coded, img = flat, None
        byte_coded = compress(packed, "zlib")  # wide codes: bytes may code smaller
        if byte_coded.size < coded.size:
            return byte_coded, "zlib", None
        return coded, "context", img

    def decode(self, p: Payload) -> np.ndarray:
        """Dequantize to float32 ``(n, d)``; inconsistent payloads raise PayloadError.

        The payload's ``fixed_range`` (absent: False) must equal the codec's. Buffers are checked
        before allocating, but a coded payload may be far smaller than its ``(n, d)``: callers
        bound ``p.shape`` first (:meth:`Payload.expect_elements`).
        """
        method = self._check_meta(p)
        n, d = p.shape
        groups = self.per_channel or 1
        if d % groups:
            raise PayloadError(f"uniform payload d={d} is not a multiple of {groups} channels")
        rows, width = n * groups, d // groups
        if "ranges" in p.meta and self.fixed_range:
            raise PayloadError("fixed-range uniform payload carries coded ranges")
        p = expand_ranges(p, rows)
        lo, scale = self._ranges(p, rows)
        packed = self._received_codes(p, method, 0 if scale is None else 64 * rows)
        if self.fixed_range:
            # code / top, correctly rounded: codes 0 and top decode to exactly 0 and 1
            ramp = (np.arange(self.levels + 1) / self.levels).astype(np.float32)
            if self.dither_seed is None:
                return bitpack.unpack_to(packed, self.bits, n * d, ramp).reshape(n, d)
        else:
            ramp = np.arange(self.levels + 1, dtype=np.float32)
        out = self._dequantize(packed, ramp, lo, scale, rows, width).reshape(n, groups, width)
        return (out.transpose(0, 2, 1) if self.channels_last else out).reshape(n, d)

    def _check_meta(self, p: Payload) -> object:
        """Check ``p``'s codec, 2-D shape and meta against this decoder; return its coder."""
        open_payload(p, self, ndim=2)
        for key, want in (("fixed_range", self.fixed_range), ("channels_last", self.channels_last)):
            got = p.meta.get(key, False)
            if not isinstance(got, bool) or got != want:
                raise PayloadError(f"uniform payload meta {key!r}={got!r} does not match the "
                                   f"decoder's {want!r}")
        method = p.meta.get("entropy")
        # a context encoder sends a message zlib-coded where that is smaller
        accepted = ("none", self.entropy, "zlib") if self.entropy == "context" \
            else ("none", self.entropy)
        if method not in accepted:
            raise PayloadError(f"uniform payload entropy coder {method!r} is not {self.entropy!r}")
        if "context_shape" in p.meta and method != "context":
            raise PayloadError("uniform payload carries a context shape without the context "
                               "coder")
        return method

    def _ranges(self, p: Payload, rows: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The payload's ``(mins, scales)``, checked; ``(None, None)`` for a fixed range."""
        if self.fixed_range:
            extra = sorted(set(p.buffers) - {"codes"})
            if extra:
                raise PayloadError(f"fixed-range uniform payload carries side buffers {extra}")
            return None, None
        lo = expect_floats(p, "mins", rows)
        scale = expect_floats(p, "scales", rows)
        if (scale < 0).any():
            raise PayloadError("uniform payload has negative scales")
        return lo, scale

    def _received_codes(self, p: Payload, method: object, side_bits: int) -> np.ndarray:
        """The payload's bit-packed codes (entropy decoded), its ``nbits`` checked."""
        n, d = p.shape
        if method == "none":
            packed = expect_packed(p, "codes", self.bits, n * d)
            expect_nbits(p, n * d * self.bits + side_bits)
            return packed
        expect_nbits(p, 8 * expect_stream(p, "codes", "uniform").size + side_bits)
        return packed_codes(p, self.bits)

    def _dequantize(self, packed: np.ndarray, ramp: np.ndarray, lo: np.ndarray | None,
                    scale: np.ndarray | None, rows: int, width: int) -> np.ndarray:
        """``(rows, width)`` float32 values of the codes: ``lo + ramp[code] * scale - dither``."""
        fixed = self.fixed_range
        aligned = (width * self.bits) % 8 == 0
        row_bytes = width * self.bits // 8
        full = None if aligned else bitpack.unpack_to(packed, self.bits, rows * width, ramp)
        out = np.empty((rows, width), dtype=np.float32)
        for s, e in bucket_chunks(rows, width) if width else ():
            blk = out[s:e]
            if aligned:
                chunk = packed[s * row_bytes : e * row_bytes]
                bitpack.unpack_to(chunk, self.bits, (e - s) * width, ramp, out=blk)
            else:
                assert full is not None  # unpacked when not aligned
                blk[...] = full[s * width : e * width].reshape(e - s, width)
            if not fixed:
                assert lo is not None and scale is not None  # read when not fixed
                blk *= scale[s:e, None]
            if self.dither_seed is not None:
                u = dither_offsets(self.dither_seed, s * width, (e - s) * width)
                u -= np.float32(0.5)
                if fixed:
                    u *= self.fixed_step
                else:
                    assert scale is not None
                    u *= np.repeat(scale[s:e], width)
                blk -= u.reshape(blk.shape)
            if not fixed:
                assert lo is not None
                blk += lo[s:e, None]
        return out


def expand_ranges(p: Payload, rows: int) -> Payload:
    """``p`` with its coded ``ranges`` undone into ``mins`` and ``scales`` (``p`` if uncoded).

    ``nbits`` moves by the coded minus the raw size, so the raw payload's checks hold as for
    ``p``. A stream not inflating to exactly ``8 * rows`` bytes, or beside raw
    ``mins``/``scales``, raises :class:`PayloadError`.
    """
    method = p.meta.get("ranges")
    if method is None:
        if "ranges" in p.buffers:
            raise PayloadError("uniform payload carries a 'ranges' buffer its meta does not name")
        return p
    if method != RANGE_CODER:
        raise PayloadError(f"uniform payload ranges coder {method!r} is not {RANGE_CODER!r}")
    if "mins" in p.buffers or "scales" in p.buffers:
        raise PayloadError("uniform payload carries both coded ranges and raw mins/scales")
    stream = expect_stream(p, "ranges", "uniform")
    raw = decompress(stream, RANGE_CODER, 8 * rows).view(np.float32)
    buffers = {k: v for k, v in p.buffers.items() if k != "ranges"}
    buffers.update(mins=raw[:rows].copy(), scales=raw[rows:].copy())
    meta = {k: v for k, v in p.meta.items() if k != "ranges"}
    return dataclasses.replace(p, meta=meta, buffers=buffers,
                               nbits=p.nbits - 8 * int(stream.size) + 64 * rows)


def packed_codes(p: Payload, bits: int) -> np.ndarray:
    """The bit-packed codes of a ``uniform`` payload, its lossless coder undone.

    The caller bounds ``p.shape`` first; a stream not decoding to exactly ``n * d`` codes of
    ``bits`` bits raises :class:`PayloadError`.
    """
    n, d = p.shape
    method = p.meta.get("entropy", "none")
    stream = expect_stream(p, "codes", "uniform")
    if method == "none":
        return stream
    if method == "context":
        shape = context.parse_shape(p.meta.get("context_shape"), d)
        return bitpack.pack(context.decode(stream, bits, n, d, shape), bits)
    if not isinstance(method, str):
        raise PayloadError(f"uniform payload entropy coder {method!r} is not a name")
    return decompress(stream, method, bitpack.packed_nbytes(n * d, bits))


def plain_payload(p: Payload, bits: int) -> Payload:
    """``p`` with its lossless coder and coded ranges undone (its stream decoded once).

    Every check of ``p`` holds for the result exactly where it holds for ``p`` (``nbits``
    moves by the coded minus the packed size, padding bits are cleared).
    """
    if len(p.shape) != 2:
        return p
    groups = p.meta.get("per_channel", 0)
    if "ranges" in p.meta and isinstance(groups, int) and not isinstance(groups, bool):
        p = expand_ranges(p, p.shape[0] * max(groups, 1))  # else malformed: the decoder refuses
    method = p.meta.get("entropy")
    stream = p.buffers.get("codes")
    if not isinstance(method, str) or method == "none" or stream is None:
        return p
    n, d = p.shape
    packed = packed_codes(p, bits)
    spare = 8 * packed.size - n * d * bits
    if 0 < spare < 8:
        packed = packed.copy()
        packed[-1] &= np.uint8((0xFF << spare) & 0xFF)
    meta = {k: v for k, v in p.meta.items() if k != "context_shape" or method != "context"}
    meta["entropy"] = "none"
    return dataclasses.replace(p, meta=meta, buffers={**p.buffers, "codes": packed},
                               nbits=p.nbits - 8 * int(stream.size) + n * d * bits)
