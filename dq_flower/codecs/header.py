"""Strict, bounded parsing of a payload record's JSON header and raw byte arrays.

Bounded in size (:data:`MAX_HEADER_BYTES`) and depth (:data:`MAX_HEADER_DEPTH`, measured
before ``json.loads``), strict JSON (no NaN, no repeated keys); every failure is a
:class:`~dq_flower.codecs.errors.PayloadError`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from .errors import PayloadError

__all__ = ["MAX_HEADER_BYTES", "MAX_HEADER_DEPTH", "parse_header", "record_array"]

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
