"""Payload: an encoded array's buffers and side information, and the checks decoders run on it.

A payload knows its exact wire size in bits (``nbits``) and travels inside a Flower
``ArrayRecord`` as raw bytes, with one small JSON header array, parsed strictly: bounded in
size (:data:`MAX_HEADER_BYTES`) and depth (:data:`MAX_HEADER_DEPTH`, measured before
``json.loads``), strict JSON (no NaN, no repeated keys); every failure is a
:class:`PayloadError`. The ``expect_*`` checks run before a decoder allocates or trusts
anything.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import bitpack

__all__ = ["PAYLOAD_VERSION", "MAX_ELEMENTS", "MAX_HEADER_BYTES", "MAX_HEADER_DEPTH",
           "ALLOWED_DTYPES", "Payload", "PayloadError", "check_int", "expect_buffer",
           "expect_floats", "expect_packed", "expect_stream", "meta_equal", "expect_nbits",
           "expect_shape", "check_codec", "open_payload", "raw_array", "read_raw"]


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
        :meth:`Codec.decode`, so nothing larger is allocated. A malformed shape raises
        :class:`PayloadError` too; an ``n`` that is no non-negative int, ``ValueError``.
        """
        n = check_int(n, "n", 0)
        shape = checked_shape(self.shape)
        count = math.prod(shape)
        if count != n:
            raise PayloadError(f"{self.codec!r} payload declares {count} elements (shape "
                               f"{list(shape)}); expected {n}")

    @classmethod
    def from_record(cls, record) -> Payload:
        """Parse an ``ArrayRecord`` made by :meth:`to_record`, strictly (see the module doc).

        Every header field is type-checked; a malformed record or header, an unknown version or
        dtype, or a buffer whose byte count differs from its declaration raises
        :class:`PayloadError`. Decoders compare shape and buffers; call :meth:`expect_elements`
        first.
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


def expect_packed(p: Payload, name: str, bits: int, count: int) -> np.ndarray:
    """Return ``p.buffers[name]``: ``count`` bit-packed ``bits``-bit codes, padding bits zero."""
    packed = expect_buffer(p, name, "uint8", bitpack.packed_nbytes(count, bits))
    if count and not bitpack.padding_is_zero(packed, bits, count):
        raise PayloadError(f"{p.codec} payload has non-zero padding bits")
    return packed


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


def check_codec(p: Payload, name: str) -> None:
    """Raise :class:`PayloadError` unless ``p`` was made by codec ``name`` (this version)."""
    if p.codec != name:
        raise PayloadError(f"payload made by {p.codec!r} given to codec {name!r}")
    if p.version != PAYLOAD_VERSION:
        raise PayloadError(f"unknown payload version {p.version!r}")


def open_payload(p: Payload, codec: Any, nbits: Callable[[int], int] | None = None,
                 ndim: int | None = None) -> int:
    """Check ``p``'s codec, version, shape and ``codec.meta_fields``; return its element count.

    What every decoder checks first; ``p.nbits`` is checked against ``nbits(count)`` where
    ``nbits`` is given, the shape's dimensions against ``ndim`` where that is given.
    """
    check_codec(p, codec.name)
    size = expect_shape(p, ndim)
    for key in codec.meta_fields:
        meta_equal(p, key, getattr(codec, key))
    if nbits is not None:
        expect_nbits(p, nbits(size))
    return size


def raw_array(arr: np.ndarray) -> Any:
    """Flat Flower ``Array`` carrying ``arr``'s bytes as they are (no ``np.save`` header)."""
    from flwr.app import Array  # Flower's app side, as in to_record

    flat = np.ascontiguousarray(arr).reshape(-1)
    return Array(dtype=str(flat.dtype), shape=(flat.size,), stype="raw", data=flat.tobytes())


def read_raw(record: Any, key: str, dtype: str, max_bytes: int,
             what: str = "sample-info") -> np.ndarray:
    """The values of ``record[key]``: of ``dtype``, at most ``max_bytes``, else PayloadError."""
    if key not in record:
        raise PayloadError(f"{what} misses {key!r}")
    arr = record[key]
    if arr.dtype != dtype:
        raise PayloadError(f"{what} {key!r} is {arr.dtype}, expected {dtype}")
    if len(arr.data) > max_bytes or len(arr.data) % np.dtype(dtype).itemsize:
        raise PayloadError(f"{what} {key!r} carries {len(arr.data)} bytes")
    return np.frombuffer(arr.data, dtype=dtype)
