"""The payload: an encoded array's buffers and side information, and its wire record.

A payload knows its exact wire size in bits (``nbits``) and travels inside a Flower
``ArrayRecord`` as raw bytes, with one small JSON header array (:mod:`.header` parses it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import PayloadError
from .header import parse_header, record_array
from .kernels import check_int

__all__ = ["PAYLOAD_VERSION", "MAX_ELEMENTS", "ALLOWED_DTYPES", "Payload", "checked_shape"]

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
        raw = json.dumps(header, separators=(",", ":")).encode()
        arrays = {HEADER_KEY: Array(dtype="uint8", shape=(len(raw),), stype=RAW_STYPE, data=raw)}
        for name, buf in self.buffers.items():
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

        The header is bounded in size (:data:`~dq_flower.codecs.header.MAX_HEADER_BYTES`) and
        depth (:data:`~dq_flower.codecs.header.MAX_HEADER_DEPTH`), strict JSON (no NaN, no
        repeated keys), every field type-checked. Decoders compare shape and buffers; call
        :meth:`expect_elements` first where the size is known.

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
