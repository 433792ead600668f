"""Codec and Payload: the contract every codec follows, and its one import path.

A payload is an encoded array's buffers and side information; it knows its exact wire size
in bits (``nbits``) and travels inside a Flower ``ArrayRecord`` as raw bytes, with one small
JSON header array, parsed strictly: bounded in size (:data:`MAX_HEADER_BYTES`) and depth
(:data:`MAX_HEADER_DEPTH`, measured before ``json.loads``), strict JSON (no NaN, no repeated
keys); every failure is a :class:`PayloadError`. Here too: the numeric kernels the codecs
share (input checks, random draws, bucket loops; pure numpy, vectorised), the checks their
decoders run on a payload before they allocate or trust anything, and
:class:`ErrorFeedback`.
"""

from __future__ import annotations

import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

from dq_flower.knob import knob

__all__ = ["PAYLOAD_VERSION", "MAX_ELEMENTS", "MAX_HEADER_BYTES", "MAX_HEADER_DEPTH",
           "ALLOWED_DTYPES", "Codec", "SymbolSpec", "Payload", "PayloadError", "expect_buffer",
           "expect_floats", "expect_stream", "meta_equal", "expect_nbits", "expect_shape",
           "int_param", "check_finite", "check_int", "require_rng", "random_u16",
           "stochastic_floor", "BUCKET_RANGE", "bucket_chunks", "bucket_blocks", "n_buckets",
           "flat_input", "ErrorFeedback"]

class PayloadError(ValueError):
    """A payload or record is malformed: inconsistent sizes, dtypes, widths or versions."""


#: Version of the payload layout; decoders refuse any other.
PAYLOAD_VERSION = 1
#: Upper bound on the elements any declared shape may have (checked before allocation).
MAX_ELEMENTS = 1 << 31
#: Buffer dtypes a payload may carry.
ALLOWED_DTYPES = frozenset({"uint8", "float16", "float32", "int32", "uint32", "int64"})
RAW_STYPE = "raw"
HEADER_KEY = "header"
#: Types a header's ``meta`` values may have (codecs write flat scalars only).
_META_TYPES = (str, int, float, bool, type(None))
#: Upper bound on the JSON header of a record, in bytes.
MAX_HEADER_BYTES = 1 << 16
#: Deepest nesting of JSON arrays and objects a header may have (``to_record`` writes 3),
#: checked before ``json.loads`` runs so that it cannot exhaust the parser's recursion.
MAX_HEADER_DEPTH = 8
# A JSON string, up to its closing quote or (unterminated) the end of the text: every
# attempt from a quote matches, so the scan is linear on any text.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.DOTALL)
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)


def _json_depth(raw: bytes) -> int:
    """Deepest ``[``/``{`` nesting of JSON text ``raw`` (strings removed first), linear time."""
    bare = np.frombuffer(_JSON_STRING.sub(b"", raw), dtype=np.uint8)
    step = np.isin(bare, _OPEN).astype(np.int64) - np.isin(bare, _CLOSE)
    return int(np.cumsum(step).max(initial=0))


def _reject_constant(name: str) -> Any:
    raise PayloadError(f"payload header holds the non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise PayloadError(f"payload header number {text[:20]!r} overflows a float")
    return value


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise PayloadError("payload header repeats a key in an object")
    return obj


def parse_header(raw: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Parse a header's bytes into a dict, turning every failure into :class:`PayloadError`."""
    if len(raw) > MAX_HEADER_BYTES:
        raise PayloadError(f"payload header is too large ({len(raw)} > {MAX_HEADER_BYTES} bytes)")
    raw = bytes(raw)
    depth = _json_depth(raw)
    if depth > MAX_HEADER_DEPTH:
        raise PayloadError(f"payload header nests {depth} levels deep; at most "
                           f"{MAX_HEADER_DEPTH} allowed")
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant,
                            parse_float=_finite_float, object_pairs_hook=_unique_object)
    except PayloadError:
        raise
    except (RecursionError, MemoryError) as exc:  # pragma: no cover - the depth bound stops it
        raise PayloadError(f"payload header cannot be parsed: {type(exc).__name__}") from None
    except Exception as exc:  # UnicodeDecodeError, JSONDecodeError, int digit limits, ...
        raise PayloadError(f"payload header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise PayloadError("payload header must be a JSON object")
    return header


def record_array(record: Any, name: str) -> tuple[str, bytes | bytearray | memoryview]:
    """Return ``(dtype, raw bytes)`` of ``record[name]`` or raise :class:`PayloadError`."""
    try:
        arr = record[name]
        dtype, data = arr.dtype, arr.data
    except Exception as exc:  # KeyError, AttributeError, TypeError from a foreign object
        raise PayloadError(f"payload record entry {name!r} is not a readable array") from exc
    if isinstance(data, memoryview):
        try:
            data = data.cast("B")  # count bytes, whatever the view's item format
        except TypeError as exc:
            raise PayloadError(f"payload record entry {name!r} is not contiguous") from exc
    elif not isinstance(data, (bytes, bytearray)):
        raise PayloadError(f"payload record entry {name!r} does not carry raw bytes")
    return str(dtype), data


def check_int(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    """Return ``value`` as an int, or raise ``ValueError`` naming ``name`` if out of range."""
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo
            or (hi is not None and value > hi)):
        span = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be an integer {span}, got {value!r}")
    return int(value)


def checked_shape(shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of at most 8 non-negative ints, at most :data:`MAX_ELEMENTS`."""
    if not isinstance(shape, (list, tuple)) or len(shape) > 8:
        raise PayloadError(f"shape must be a list of at most 8 ints, got {shape!r}")
    dims = []
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 0:
            raise PayloadError(f"shape dimensions must be non-negative ints, got {shape!r}")
        dims.append(int(dim))
    if math.prod(dims) > MAX_ELEMENTS:
        raise PayloadError(f"declared shape {dims} exceeds {MAX_ELEMENTS} elements")
    return tuple(dims)


@dataclass
class Payload:
    """An encoded array: named flat buffers plus the metadata needed to decode them.

    Attributes
    ----------
    codec : str
        Registry name of the codec that made it.
    shape : tuple of int
        Shape of the decoded array.
    meta : dict
        Small JSON-serialisable parameters (widths, counts, levels count, ...).
    buffers : dict of str to numpy.ndarray
        Flat arrays: packed codes (uint8) and side information (float32, ...).
    nbits : int
        Exact number of bits the receiver needs: packed code bits plus side information.
    version : int
        Payload layout version.
    """

    codec: str
    shape: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    buffers: dict[str, np.ndarray] = field(default_factory=dict)
    nbits: int = 0
    version: int = PAYLOAD_VERSION

    @property
    def nbytes(self) -> int:
        """Bytes of all buffers as carried (packed codes are already whole bytes)."""
        return int(sum(b.nbytes for b in self.buffers.values()))

    def to_record(self):  # -> flwr.app.ArrayRecord
        """Serialise to a Flower ``ArrayRecord`` of raw bytes (no ``np.save`` headers)."""
        # Flower's app side: loaded when a simulation or record needs it
        from flwr.app import Array, ArrayRecord

        if HEADER_KEY in self.buffers:
            raise ValueError(f"a payload buffer cannot be named {HEADER_KEY!r}")
        header = {
            "codec": self.codec,
            "version": self.version,
            "shape": list(self.shape),
            "meta": self.meta,
            "nbits": int(self.nbits),
            "buffers": {k: [str(v.dtype), int(v.size)] for k, v in self.buffers.items()},
        }
        raw = np.frombuffer(json.dumps(header, separators=(",", ":")).encode(), dtype=np.uint8)
        arrays = {}
        for name, buf in {HEADER_KEY: raw, **self.buffers}.items():
            flat = np.ascontiguousarray(buf).reshape(-1)
            arrays[name] = Array(dtype=str(flat.dtype), shape=(flat.size,), stype=RAW_STYPE,
                                 data=flat.tobytes())
        return ArrayRecord(arrays)

    def expect_elements(self, n: int) -> None:
        """Raise :class:`PayloadError` unless the declared shape holds exactly ``n`` elements.

        Some payloads (``topk``, ``powersgd``, entropy-coded ``uniform``) carry far fewer
        bytes than they decode to: a receiver that knows the size calls this before
        :meth:`Codec.decode`, so nothing larger is allocated.

        Raises
        ------
        PayloadError
            If ``math.prod(self.shape) != n`` (or the shape itself is malformed).
        ValueError
            If ``n`` is not a non-negative int.
        """
        n = check_int(n, "n", 0)
        shape = checked_shape(self.shape)
        count = math.prod(shape)
        if count != n:
            raise PayloadError(f"{self.codec!r} payload declares {count} elements (shape "
                               f"{list(shape)}); expected {n}")

    @classmethod
    def from_record(cls, record) -> Payload:
        """Parse an ``ArrayRecord`` made by :meth:`to_record`, strictly.

        The header is bounded in size (:data:`MAX_HEADER_BYTES`) and depth
        (:data:`MAX_HEADER_DEPTH`), strict JSON (no NaN, no repeated keys), every field
        type-checked. Decoders compare shape and buffers; call :meth:`expect_elements` first.

        Raises
        ------
        PayloadError
            On any malformed record or header, unknown version or dtype, or a buffer whose
            byte count differs from its declaration.
        """
        keys = _record_keys(record)
        head_dtype, head_data = record_array(record, HEADER_KEY)
        if head_dtype != "uint8":
            raise PayloadError(f"payload header array is {head_dtype}, expected uint8")
        codec, shape, meta, nbits, declared = _header_fields(parse_header(head_data))
        return cls(codec=codec, shape=shape, meta=meta, buffers=_buffers(record, keys, declared),
                   nbits=nbits, version=PAYLOAD_VERSION)


def _record_keys(record: Any) -> list[str]:
    """The names of a record's arrays, one of them the header."""
    try:
        keys = list(record.keys())
    except Exception as exc:  # AttributeError, TypeError: not an ArrayRecord
        raise PayloadError("payload record is not an ArrayRecord") from exc
    if not all(isinstance(k, str) for k in keys):
        raise PayloadError("payload record keys must be strings")
    if HEADER_KEY not in keys:
        raise PayloadError("payload record has no header")
    return keys


def _header_fields(header: dict[str, Any]) -> tuple[str, tuple[int, ...], dict[str, Any], int,
                                                    dict[str, Any]]:
    """``(codec, shape, meta, nbits, declared buffers)`` of a parsed header, each checked."""
    missing = {"codec", "version", "shape", "meta", "nbits", "buffers"} - header.keys()
    if missing:
        raise PayloadError(f"payload header misses keys {sorted(missing)}")
    version = header["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version != PAYLOAD_VERSION:
        raise PayloadError(f"unknown payload version {version!r}; expected {PAYLOAD_VERSION}")
    codec = header["codec"]
    if not isinstance(codec, str) or not codec:
        raise PayloadError(f"payload codec must be a non-empty string, got {codec!r}")
    shape = checked_shape(header["shape"])
    meta, declared = header["meta"], header["buffers"]
    if not isinstance(meta, dict) or not isinstance(declared, dict):
        raise PayloadError("payload header 'meta' and 'buffers' must be objects")
    for key, value in meta.items():
        if not isinstance(value, _META_TYPES):
            raise PayloadError(f"payload meta {key!r} must be a string, number, bool or null, "
                               f"got {type(value).__name__}")
    nbits = header["nbits"]
    if isinstance(nbits, bool) or not isinstance(nbits, int) or nbits < 0:
        raise PayloadError(f"payload nbits must be a non-negative int, got {nbits!r}")
    return codec, shape, meta, nbits, declared


def _buffers(record: Any, keys: list[str], declared: dict[str, Any]) -> dict[str, np.ndarray]:
    """The declared buffers, each checked against the bytes the record carries."""
    if HEADER_KEY in declared:
        raise PayloadError(f"payload header declares a buffer named {HEADER_KEY!r}")
    extra = set(keys) - {HEADER_KEY} - set(declared)
    if extra:
        raise PayloadError(f"payload record carries undeclared arrays {sorted(extra)}")
    buffers: dict[str, np.ndarray] = {}
    for name, spec in declared.items():
        if name not in keys:
            raise PayloadError(f"payload buffer {name!r} is declared but missing")
        if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str)):
            raise PayloadError(f"payload buffer {name!r} has a malformed declaration")
        dtype, size = spec
        if dtype not in ALLOWED_DTYPES:
            raise PayloadError(f"payload buffer {name!r} has unsupported dtype {dtype!r}")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_ELEMENTS:
            raise PayloadError(f"payload buffer {name!r} declares invalid size {size!r}")
        arr_dtype, data = record_array(record, name)
        if arr_dtype != dtype:
            raise PayloadError(f"payload buffer {name!r} is {arr_dtype} but declared {dtype}")
        itemsize = np.dtype(dtype).itemsize
        if len(data) != size * itemsize:
            raise PayloadError(f"payload buffer {name!r} carries {len(data)} bytes, "
                               f"declared {size} x {itemsize}")
        buffers[name] = np.frombuffer(data, dtype=dtype)
    return buffers


def check_finite(x: np.ndarray, what: str = "input") -> np.ndarray:
    """Return ``x`` as a float32 array, raising ``ValueError`` if it has NaN or inf."""
    arr = np.asarray(x, dtype=np.float32)
    if arr.size == 0:
        return arr
    # Fast path: a finite dot product proves every entry finite (NaN and inf propagate);
    # an overflowing one falls back to the exact elementwise check.
    flat = arr.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.dot(flat, flat)):
            return arr
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} contains NaN or inf; codecs accept finite values only")
    return arr


def int_param(name: str, default: int, lo: int, hi: int | None = None) -> Any:
    """A codec parameter field: an int in ``lo..hi``, stored as a plain ``int`` (JSON meta)."""
    return knob(default, coerce=lambda value: check_int(value, name, lo, hi))


def require_rng(rng: Any, codec: str) -> np.random.Generator:
    """Return ``rng`` if it is a ``numpy.random.Generator``, else raise ``ValueError``."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"codec {codec!r} draws random numbers: pass an explicit "
                         "numpy.random.Generator")
    return rng


def random_u16(rng: np.random.Generator, count: int) -> np.ndarray:
    """Draw ``count`` uniform 16-bit integers from ``rng``'s bit stream (4 per 64-bit draw)."""
    raw = rng.bit_generator.random_raw((count + 3) // 4)
    return np.asarray(raw, dtype=np.uint64).view(np.uint16)[:count]


def stochastic_floor(a: np.ndarray, rng: np.random.Generator, top: int) -> np.ndarray:
    """Return ``min(floor(a + u), top)`` as uint8, ``u`` uniform in [0, 1), overwriting ``a``.

    ``0 <= a <= top + tiny``, ``top <= 255``; ``u = r / 2**16`` for uniform 16-bit ``r`` (four
    per 64-bit draw): unbiased up to ``2**-16`` of a step.
    """
    r = random_u16(rng, a.size).reshape(a.shape)
    a *= np.float32(65536.0)
    np.add(a, r, out=a)
    a *= np.float32(1.0 / 65536.0)
    np.clip(a, np.float32(0.0), np.float32(top), out=a)  # faster than np.minimum here
    return a.astype(np.uint8)


#: Inclusive range of a codec's ``bucket`` parameter (coordinates per bucket).
BUCKET_RANGE = (1, 1 << 30)


def bucket_chunks(n_rows: int, row_len: int, target: int = 1 << 17):
    """Yield ``(start, stop)`` row ranges of about ``target`` elements (cache-sized blocks)."""
    step = max(1, target // max(1, row_len))
    for start in range(0, n_rows, step):
        yield start, min(n_rows, start + step)


def bucket_blocks(n: int, bucket: int, target: int = 1 << 17):
    """Yield ``(b0, b1, i0, i1)``: buckets ``b0:b1`` covering elements ``i0:i1`` of a flat array.

    Full buckets come in cache-sized blocks; a final shorter bucket comes alone.
    """
    nfull, tail = divmod(int(n), int(bucket))
    for s, e in bucket_chunks(nfull, bucket, target):
        yield s, e, s * bucket, e * bucket
    if tail:
        yield nfull, nfull + 1, nfull * bucket, n


def n_buckets(n: int, bucket: int) -> int:
    """Number of buckets of ``bucket`` elements (the last may be shorter) covering ``n``."""
    return -(-int(n) // int(bucket))


def flat_input(x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """Return ``(flat float32 C-contiguous view or copy, shape)``; NaN or inf raise ValueError."""
    arr = check_finite(x)
    return np.ascontiguousarray(arr).reshape(-1), tuple(arr.shape)


def expect_buffer(p: Payload, name: str, dtype: str, size: int) -> np.ndarray:
    """Return ``p.buffers[name]``, its dtype and element count checked (before allocating)."""
    if name not in p.buffers:
        raise PayloadError(f"{p.codec} payload misses buffer {name!r}")
    buf = p.buffers[name]
    if str(buf.dtype) != dtype:
        raise PayloadError(f"{p.codec} buffer {name!r} is {buf.dtype}, expected {dtype}")
    if buf.size != size:
        raise PayloadError(f"{p.codec} buffer {name!r} holds {buf.size} elements, expected {size}")
    return buf


def expect_floats(p: Payload, name: str, size: int) -> np.ndarray:
    """Return float32 side information ``p.buffers[name]`` of ``size`` elements, all finite."""
    arr = expect_buffer(p, name, "float32", size)
    if not np.isfinite(arr).all():
        raise PayloadError(f"{p.codec} payload side information {name!r} holds NaN or inf")
    return arr


def expect_stream(p: Payload, name: str, owner: str = "") -> np.ndarray:
    """Return ``p.buffers[name]`` after checking it is a flat uint8 stream."""
    stream = p.buffers.get(name)
    if stream is None or stream.dtype != np.uint8 or stream.ndim != 1:
        raise PayloadError(f"{owner or p.codec} payload {name!r} must be a flat uint8 stream")
    return stream


def meta_equal(p: Payload, key: str, expected: Any) -> None:
    """Raise :class:`PayloadError` unless ``p.meta[key] == expected`` (the decoder's own value)."""
    value = p.meta.get(key)
    if type(value) is not type(expected) or value != expected:
        raise PayloadError(f"{p.codec} payload meta {key!r}={value!r} does not match the "
                           f"decoder's {expected!r}")


def expect_nbits(p: Payload, expected: int) -> None:
    """Raise :class:`PayloadError` unless the payload's declared ``nbits`` equals ``expected``."""
    if p.nbits != expected:
        raise PayloadError(f"{p.codec} payload declares {p.nbits} bits; its layout has {expected}")


def expect_shape(p: Payload, ndim: int | None = None) -> int:
    """Check ``p.shape`` (ints, at most :data:`MAX_ELEMENTS` elements); return the element count."""
    shape = checked_shape(p.shape)
    if ndim is not None and len(shape) != ndim:
        raise PayloadError(f"{p.codec} payload shape {shape} is not {ndim}-D")
    return math.prod(shape)


class SymbolSpec(NamedTuple):
    """Where a codec's payload keeps its integer codes, for the ``context`` coder.

    ``buffer`` holds one ``width``-bit code per element (:mod:`.bitpack` packing) in
    ``[0, alphabet)``; ``side`` names the payload's other buffers (sent as they are).
    """

    buffer: str
    width: int
    alphabet: int
    side: tuple[str, ...]


class Codec(ABC):
    """Maps float32 arrays to payloads and back.

    Subclasses are frozen dataclasses of checked parameters (``ValueError`` naming the field);
    encoders build payloads with :meth:`payload`, decoders start with :meth:`open_payload`.
    """

    #: Registry name, set by :func:`dq_flower.codecs.registry.register`.
    name: ClassVar[str] = ""
    #: True when ``E[decode(encode(x))] != x``; such codecs are used with error feedback.
    biased: ClassVar[bool] = False
    #: True when ``decode(encode(x)) == x`` exactly.
    lossless: ClassVar[bool] = False
    #: Parameters every payload's meta carries, in this order, and its decoder requires equal.
    meta_fields: ClassVar[tuple[str, ...]] = ()
    @abstractmethod
    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Encode ``x`` (float32, finite) into a payload; random choices draw from ``rng``."""

    @abstractmethod
    def decode(self, p: Payload) -> np.ndarray:
        """Decode a payload to a float32 array of its declared shape.

        Buffers are checked against the shape before allocating; the declared size (up to
        :data:`MAX_ELEMENTS`) is the caller's to bound: call :meth:`Payload.expect_elements`.
        """

    def symbol_spec(self) -> SymbolSpec | None:
        """The layout of the payload's codes for the ``context`` coder (None: it has none)."""
        return None

    def check_payload(self, p: Payload) -> None:
        """Raise :class:`PayloadError` unless ``p`` was made by this codec."""
        if p.codec != self.name:
            raise PayloadError(f"payload made by {p.codec!r} given to codec {self.name!r}")
        if p.version != PAYLOAD_VERSION:
            raise PayloadError(f"unknown payload version {p.version!r}")

    def payload(self, shape: tuple[int, ...], buffers: dict[str, np.ndarray], nbits: int,
                **meta: Any) -> Payload:
        """A payload of this codec, its header meta: :attr:`meta_fields`, then ``meta``."""
        own = {key: getattr(self, key) for key in self.meta_fields}
        return Payload(self.name, shape, {**own, **meta}, buffers, nbits=nbits)

    def open_payload(self, p: Payload, nbits: Callable[[int], int] | None = None,
                     ndim: int | None = None) -> int:
        """Check ``p``'s codec, version, shape and :attr:`meta_fields`; return its element count.

        Raises
        ------
        PayloadError
            Another codec or version, a malformed (or not ``ndim``-D) shape, a meta field unlike
            this codec's, or ``p.nbits`` unlike ``nbits(count)`` where ``nbits`` is given.
        """
        self.check_payload(p)
        size = expect_shape(p, ndim)
        for key in self.meta_fields:
            meta_equal(p, key, getattr(self, key))
        if nbits is not None:
            expect_nbits(p, nbits(size))
        return size

    def roundtrip(self, x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return ``decode(encode(x, rng))``."""
        return self.decode(self.encode(x, rng))


_RESIDUAL = "residual"
_CODEC_PREFIX = "codec/"


class ErrorFeedback:
    """Wrap ``codec`` with a residual ``e`` (zero at first).

    Residual memory around any codec (Seide et al. 2014; Karimireddy et al. 2019):
    ``encode(x)`` codes ``p = x + e`` and keeps ``e' = p - decode(payload)``, so that
    ``x + e == decode(payload) + e'`` at every step (up to float32 rounding): nothing the codec
    drops is lost, it is sent later. The state (the residual, and the wrapped codec's own
    state such as PowerSGD's warm start) goes in and out as a dict of numpy arrays, for
    Flower's ``Context.state``.

    Parameters
    ----------
    codec : Codec
        The codec to wrap (typically a biased one: sign, ef-sign, topk, powersgd, bingrad).
    """

    def __init__(self, codec: Codec) -> None:
        if not isinstance(codec, Codec):
            raise ValueError(f"ErrorFeedback wraps a Codec, got {type(codec).__name__}")
        self.codec = codec
        self.residual: np.ndarray | None = None

    @property
    def name(self) -> str:
        """The wrapped codec's registry name (payloads carry it)."""
        return self.codec.name

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.codec!r})"

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Encode ``x + residual`` and keep the new residual.

        Raises ``ValueError`` if ``x`` holds NaN or inf or its shape differs from the residual's.
        """
        arr = check_finite(x)
        if self.residual is None:
            target = arr.astype(np.float32, copy=True)
        else:
            if self.residual.shape != arr.shape:
                raise ValueError(f"input shape {arr.shape} differs from the residual's "
                                 f"{self.residual.shape}; call reset() when the model changes")
            target = arr + self.residual
        payload = self.codec.encode(target, rng)
        target -= self.codec.decode(payload)
        self.residual = target
        return payload

    def decode(self, p: Payload) -> np.ndarray:
        """Decode with the wrapped codec (the residual lives on the sender only)."""
        return self.codec.decode(p)

    def reset(self) -> None:
        """Drop the residual (and the codec's own state, if it has any)."""
        self.residual = None
        if hasattr(self.codec, "reset"):
            self.codec.reset()

    def state_dict(self) -> dict[str, np.ndarray]:
        """The residual (if any) and the codec's state, as float32 arrays."""
        state: dict[str, np.ndarray] = {}
        if self.residual is not None:
            state[_RESIDUAL] = self.residual.copy()
        if hasattr(self.codec, "state_dict"):
            for key, value in self.codec.state_dict().items():
                state[_CODEC_PREFIX + key] = value
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned.

        No ``residual`` means zero; without ``codec/`` keys the codec keeps its own state.

        Raises
        ------
        ValueError
            On unknown keys or a residual with NaN or inf.
        """
        unknown = [k for k in state if k != _RESIDUAL and not k.startswith(_CODEC_PREFIX)]
        if unknown:
            raise ValueError(f"unknown error-feedback state keys {unknown}")
        residual = state.get(_RESIDUAL)
        codec_state = {k[len(_CODEC_PREFIX):]: v for k, v in state.items()
                       if k.startswith(_CODEC_PREFIX)}
        if codec_state and not hasattr(self.codec, "load_state_dict"):
            raise ValueError(f"codec {self.codec.name!r} keeps no state")
        new_residual = None if residual is None else check_finite(residual, "residual").copy()
        if codec_state and hasattr(self.codec, "load_state_dict"):  # checked above
            self.codec.load_state_dict(codec_state)
        self.residual = new_residual
