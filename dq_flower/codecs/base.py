"""Codec and Payload: the contract every codec follows.

A :class:`Codec` maps a float32 array to a :class:`Payload` (packed bytes plus side
information) and back. A payload knows its exact wire size in bits (``nbits``) and travels
inside a Flower ``ArrayRecord`` as raw bytes, with one small JSON header array.
"""

from __future__ import annotations

import json
import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "PAYLOAD_VERSION",
    "MAX_ELEMENTS",
    "MAX_HEADER_DEPTH",
    "Codec",
    "Payload",
    "PayloadError",
    "check_finite",
    "check_int",
    "expect_buffer",
    "meta_int",
    "meta_equal",
    "expect_nbits",
    "expect_shape",
    "require_finite",
    "require_rng",
    "random_u16",
    "stochastic_floor",
    "bucket_chunks",
    "bucket_blocks",
    "n_buckets",
    "flat_input",
]

#: Version of the payload layout; decoders refuse any other.
PAYLOAD_VERSION = 1
#: Upper bound on the elements any declared shape may have (checked before allocation).
MAX_ELEMENTS = 1 << 31
#: Upper bound on the JSON header of a record, in bytes.
MAX_HEADER_BYTES = 1 << 16
#: Deepest nesting of JSON arrays and objects a header may have. Headers written by
#: :meth:`Payload.to_record` nest 3 deep (header object, ``buffers`` object, one buffer's
#: ``[dtype, size]`` list); anything deeper is refused before ``json.loads`` runs, so a
#: crafted header cannot exhaust the parser's recursion.
MAX_HEADER_DEPTH = 8
#: Buffer dtypes a payload may carry.
ALLOWED_DTYPES = frozenset({"uint8", "float16", "float32", "int32", "uint32", "int64"})
RAW_STYPE = "raw"
HEADER_KEY = "header"


class PayloadError(ValueError):
    """A payload or record is malformed: inconsistent sizes, dtypes, widths or versions."""


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


def check_int(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    """Return ``value`` as an int, or raise ``ValueError`` naming ``name`` if out of range."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value < lo
        or (hi is not None and value > hi)
    ):
        span = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be an integer {span}, got {value!r}")
    return int(value)


def require_rng(rng: Any, codec: str) -> np.random.Generator:
    """Return ``rng`` if it is a ``numpy.random.Generator``, else raise ``ValueError``."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(
            f"codec {codec!r} draws random numbers: pass an explicit numpy.random.Generator"
        )
    return rng


def random_u16(rng: np.random.Generator, count: int) -> np.ndarray:
    """Draw ``count`` uniform 16-bit integers from ``rng``'s bit stream (4 per 64-bit draw)."""
    raw = rng.bit_generator.random_raw((count + 3) // 4)
    return np.asarray(raw, dtype=np.uint64).view(np.uint16)[:count]


def stochastic_floor(a: np.ndarray, rng: np.random.Generator, top: int) -> np.ndarray:
    """Return ``min(floor(a + u), top)`` as uint8, ``u`` uniform in [0, 1), overwriting ``a``.

    ``a`` is a float32 array with ``0 <= a <= top + tiny`` and ``top <= 255``. ``u`` takes the
    65,536 values ``r / 2**16`` for a uniform 16-bit ``r`` (four per 64-bit draw, a quarter of
    the cost of float32 uniforms), so the probability of rounding up is the fractional part
    of ``a`` truncated to 16 bits: unbiased up to less than ``2**-16`` of a step, far below
    what any Monte-Carlo test of the codecs can resolve.
    """
    r = random_u16(rng, a.size).reshape(a.shape)
    a *= np.float32(65536.0)
    np.add(a, r, out=a)
    a *= np.float32(1.0 / 65536.0)
    np.clip(a, np.float32(0.0), np.float32(top), out=a)  # faster than np.minimum here
    return a.astype(np.uint8)


def bucket_chunks(n_rows: int, row_len: int, target: int = 1 << 17):
    """Yield ``(start, stop)`` row ranges of about ``target`` elements (cache-sized blocks).

    Codecs loop over these blocks and vectorise within each, so temporaries stay in cache.
    """
    step = max(1, target // max(1, row_len))
    for start in range(0, n_rows, step):
        yield start, min(n_rows, start + step)


def bucket_blocks(n: int, bucket: int, target: int = 1 << 17):
    """Yield ``(b0, b1, i0, i1)``: buckets ``b0:b1`` covering elements ``i0:i1`` of a flat array.

    Full buckets come in cache-sized blocks (``flat[i0:i1].reshape(b1 - b0, bucket)``); a
    final shorter bucket, if ``n`` is not a multiple of ``bucket``, comes alone.
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


def require_finite(p: Payload, name: str, arr: np.ndarray) -> np.ndarray:
    """Raise :class:`PayloadError` if side information ``arr`` holds NaN or inf."""
    if not np.isfinite(arr).all():
        raise PayloadError(f"{p.codec} payload side information {name!r} holds NaN or inf")
    return arr


def _checked_shape(shape: Any) -> tuple[int, ...]:
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


# A JSON string: a quote, then characters other than quote and backslash, or escapes, up
# to the closing quote or, for an unterminated string, the end of the text. Every attempt
# from a quote matches, so the scan is linear even on text made of quotes and backslashes.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.DOTALL)
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)
#: Types a header's ``meta`` values may have (codecs write flat scalars only).
_META_TYPES = (str, int, float, bool, type(None))


def _json_depth(raw: bytes) -> int:
    """Deepest nesting of ``[``/``{`` in JSON text ``raw``, brackets inside strings ignored.

    Strings are removed first (a quote up to the next unescaped quote, exactly where a JSON
    parser ends them), then the running depth is a cumulative sum over the bracket bytes:
    linear time, no recursion, whatever the input.
    """
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


def _parse_header(raw: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Parse a header's bytes into a dict, turning every failure into :class:`PayloadError`."""
    if len(raw) > MAX_HEADER_BYTES:
        raise PayloadError(f"payload header is too large ({len(raw)} > {MAX_HEADER_BYTES} bytes)")
    raw = bytes(raw)
    depth = _json_depth(raw)
    if depth > MAX_HEADER_DEPTH:
        raise PayloadError(
            f"payload header nests {depth} levels deep; at most {MAX_HEADER_DEPTH} allowed"
        )
    try:
        header = json.loads(
            raw.decode("utf-8"),
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_object,
        )
    except PayloadError:
        raise
    except (RecursionError, MemoryError) as exc:  # pragma: no cover - the depth bound stops it
        raise PayloadError(f"payload header cannot be parsed: {type(exc).__name__}") from None
    except Exception as exc:  # UnicodeDecodeError, JSONDecodeError, int digit limits, ...
        raise PayloadError(f"payload header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise PayloadError("payload header must be a JSON object")
    return header


def _record_array(record: Any, name: str) -> tuple[str, bytes | bytearray | memoryview]:
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
        raw = json.dumps(header, separators=(",", ":")).encode()
        arrays = {
            HEADER_KEY: Array(dtype="uint8", shape=(len(raw),), stype=RAW_STYPE, data=raw),
        }
        for name, buf in self.buffers.items():
            flat = np.ascontiguousarray(buf).reshape(-1)
            arrays[name] = Array(
                dtype=str(flat.dtype), shape=(flat.size,), stype=RAW_STYPE, data=flat.tobytes()
            )
        return ArrayRecord(arrays)

    def expect_elements(self, n: int) -> None:
        """Raise :class:`PayloadError` unless the declared shape holds exactly ``n`` elements.

        Decoders allocate their output from the declared shape, and some (``topk``,
        ``powersgd``, entropy-coded ``uniform``) legitimately carry far fewer bytes than
        they decode to. A receiver that knows how large the array must be (the model size
        for a gradient or compensation payload) calls this before :meth:`Codec.decode`, so
        a payload declaring a larger array is refused before anything is allocated.

        Parameters
        ----------
        n : int
            The number of elements the receiver expects.

        Raises
        ------
        PayloadError
            If ``math.prod(self.shape) != n`` (or the shape itself is malformed).
        ValueError
            If ``n`` is not a non-negative int.
        """
        n = check_int(n, "n", 0)
        shape = _checked_shape(self.shape)
        count = math.prod(shape)
        if count != n:
            raise PayloadError(
                f"{self.codec!r} payload declares {count} elements (shape {list(shape)}); "
                f"expected {n}"
            )

    @classmethod
    def from_record(cls, record) -> Payload:
        """Parse an ``ArrayRecord`` made by :meth:`to_record`, strictly.

        The header is bounded in size (:data:`MAX_HEADER_BYTES`) and nesting depth
        (:data:`MAX_HEADER_DEPTH`, checked before parsing), must be strict JSON (no NaN or
        infinities, no repeated keys), and every field is type-checked: ``codec`` a string,
        ``version`` the int :data:`PAYLOAD_VERSION`, ``shape`` at most 8 non-negative ints,
        ``meta`` an object of scalars, ``nbits`` a non-negative int and ``buffers`` an object
        of ``[dtype, size]`` pairs. The declared shape is not compared with the buffers here
        (decoders do that); receivers that know the expected size should also call
        :meth:`expect_elements` before decoding.

        Raises
        ------
        PayloadError
            On any malformed record or header: missing, oversized, too deeply nested or
            unparsable header, unknown version, fields of the wrong type, unknown dtype, or
            any buffer whose carried byte count differs from what its header declares.
        """
        try:
            keys = list(record.keys())
        except Exception as exc:  # AttributeError, TypeError: not an ArrayRecord
            raise PayloadError("payload record is not an ArrayRecord") from exc
        if not all(isinstance(k, str) for k in keys):
            raise PayloadError("payload record keys must be strings")
        if HEADER_KEY not in keys:
            raise PayloadError("payload record has no header")
        head_dtype, head_data = _record_array(record, HEADER_KEY)
        if head_dtype != "uint8":
            raise PayloadError(f"payload header array is {head_dtype}, expected uint8")
        header = _parse_header(head_data)
        missing = {"codec", "version", "shape", "meta", "nbits", "buffers"} - header.keys()
        if missing:
            raise PayloadError(f"payload header misses keys {sorted(missing)}")
        version = header["version"]
        if isinstance(version, bool) or not isinstance(version, int) or version != PAYLOAD_VERSION:
            raise PayloadError(f"unknown payload version {version!r}; expected {PAYLOAD_VERSION}")
        codec = header["codec"]
        if not isinstance(codec, str) or not codec:
            raise PayloadError(f"payload codec must be a non-empty string, got {codec!r}")
        shape = _checked_shape(header["shape"])
        meta, declared = header["meta"], header["buffers"]
        if not isinstance(meta, dict) or not isinstance(declared, dict):
            raise PayloadError("payload header 'meta' and 'buffers' must be objects")
        for key, value in meta.items():
            if not isinstance(value, _META_TYPES):
                raise PayloadError(
                    f"payload meta {key!r} must be a string, number, bool or null, "
                    f"got {type(value).__name__}"
                )
        nbits = header["nbits"]
        if isinstance(nbits, bool) or not isinstance(nbits, int) or nbits < 0:
            raise PayloadError(f"payload nbits must be a non-negative int, got {nbits!r}")
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
            arr_dtype, data = _record_array(record, name)
            if arr_dtype != dtype:
                raise PayloadError(f"payload buffer {name!r} is {arr_dtype} but declared {dtype}")
            itemsize = np.dtype(dtype).itemsize
            if len(data) != size * itemsize:
                raise PayloadError(
                    f"payload buffer {name!r} carries {len(data)} bytes, "
                    f"declared {size} x {itemsize}"
                )
            buffers[name] = np.frombuffer(data, dtype=dtype)
        return cls(
            codec=codec,
            shape=shape,
            meta=meta,
            buffers=buffers,
            nbits=nbits,
            version=PAYLOAD_VERSION,
        )


def expect_buffer(p: Payload, name: str, dtype: str, size: int) -> np.ndarray:
    """Return ``p.buffers[name]`` after checking its dtype and element count.

    Decoders call this before allocating their output, so a payload that declares a huge
    shape but carries few bytes is refused without allocating anything.
    """
    if name not in p.buffers:
        raise PayloadError(f"{p.codec} payload misses buffer {name!r}")
    buf = p.buffers[name]
    if str(buf.dtype) != dtype:
        raise PayloadError(f"{p.codec} buffer {name!r} is {buf.dtype}, expected {dtype}")
    if buf.size != size:
        raise PayloadError(
            f"{p.codec} buffer {name!r} holds {buf.size} elements, expected {size}"
        )
    return buf


def meta_int(p: Payload, key: str, lo: int, hi: int) -> int:
    """Return integer ``p.meta[key]`` after checking ``lo <= value <= hi``."""
    value = p.meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise PayloadError(
            f"{p.codec} payload meta {key!r}={value!r} is not an int in [{lo}, {hi}]"
        )
    return value


def meta_equal(p: Payload, key: str, expected: Any) -> None:
    """Raise :class:`PayloadError` unless ``p.meta[key] == expected`` (the decoder's own value)."""
    value = p.meta.get(key)
    if type(value) is not type(expected) or value != expected:
        raise PayloadError(
            f"{p.codec} payload meta {key!r}={value!r} does not match the decoder's {expected!r}"
        )


def expect_nbits(p: Payload, expected: int) -> None:
    """Raise :class:`PayloadError` unless the payload's declared ``nbits`` equals ``expected``."""
    if p.nbits != expected:
        raise PayloadError(f"{p.codec} payload declares {p.nbits} bits; its layout has {expected}")


def expect_shape(p: Payload, ndim: int | None = None) -> int:
    """Check ``p.shape`` (ints, at most :data:`MAX_ELEMENTS` elements); return the element count."""
    shape = _checked_shape(p.shape)
    if ndim is not None and len(shape) != ndim:
        raise PayloadError(f"{p.codec} payload shape {shape} is not {ndim}-D")
    return math.prod(shape)


class Codec(ABC):
    """Maps float32 arrays to payloads and back.

    Subclasses are frozen dataclasses whose fields are the codec's parameters; they validate
    them in ``__post_init__`` and raise ``ValueError`` naming the field.
    """

    #: Registry name, set by :func:`dq_flower.codecs.registry.register`.
    name: ClassVar[str] = ""
    #: True when ``E[decode(encode(x))] != x``; such codecs are used with error feedback.
    biased: ClassVar[bool] = False
    #: True when ``decode(encode(x)) == x`` exactly.
    lossless: ClassVar[bool] = False

    @abstractmethod
    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Encode ``x`` (float32, finite) into a payload; random choices draw from ``rng``."""

    @abstractmethod
    def decode(self, p: Payload) -> np.ndarray:
        """Decode a payload to a float32 array of its declared shape.

        Every decoder checks that the buffers match the declared shape before allocating its
        output, so a payload whose bytes do not back its declared size is refused cheaply.
        The declared size itself (up to :data:`MAX_ELEMENTS`) is the caller's to bound:
        some payloads are legitimately far smaller than their output (sparse or low-rank
        gradients, entropy-coded data), so call :meth:`Payload.expect_elements` (or check
        ``p.shape``) first.
        """

    def check_payload(self, p: Payload) -> None:
        """Raise :class:`PayloadError` unless ``p`` was made by this codec."""
        if p.codec != self.name:
            raise PayloadError(f"payload made by {p.codec!r} given to codec {self.name!r}")
        if p.version != PAYLOAD_VERSION:
            raise PayloadError(f"unknown payload version {p.version!r}")

    def roundtrip(self, x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return ``decode(encode(x, rng))``."""
        return self.decode(self.encode(x, rng))
