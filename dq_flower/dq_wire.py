"""Message layout of a DQ upload: quantized samples, labels, ids, weights, compensation.

Shared by the client (which builds it) and the server (which validates and reads it), so
neither strategy nor client knows bit layouts. Everything is checked before use: a reply
that fails any check raises :class:`~dq_flower.codecs.PayloadError` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from .codecs import Payload, PayloadError
from .codecs.bitpack import pack, pack_wide, packed_nbytes, unpack, unpack_wide

__all__ = [
    "SAMPLES_KEY",
    "INFO_KEY",
    "COMPENSATION_KEY",
    "GRADIENT_KEY",
    "SampleBatch",
    "label_width",
    "encode_batch",
    "decode_batch",
    "raw_array",
]

SAMPLES_KEY = "samples"
INFO_KEY = "sample-info"
COMPENSATION_KEY = "compensation"
#: Record of a gradient-round reply (``upload-mode`` gradient or auto).
GRADIENT_KEY = "gradient"
_RAW = "raw"


def width_for(upper: int) -> int:
    """Bits needed for values in ``[0, upper)`` (at least 1)."""
    return max(1, int(upper - 1).bit_length())


def label_width(num_classes: int) -> int:
    """Bits per label: ``ceil(log2 C)``, at least 1."""
    return width_for(num_classes)


@dataclass
class SampleBatch:
    """A client's upload for one round, decoded from packed form only where cheap.

    Attributes
    ----------
    samples : Payload
        ``uniform`` payload of the quantized rows.
    labels, ids : numpy.ndarray
        Labels and client-local sample ids (int64).
    weights : numpy.ndarray
        Original samples each row stands for (``1 / pi_i``), float32.
    compensation : Payload or None
        Encoded compensation delta.
    info_nbits : int
        Exact bits of labels, ids and weights as sent.
    """

    samples: Payload
    labels: np.ndarray
    ids: np.ndarray
    weights: np.ndarray
    compensation: Payload | None = None
    info_nbits: int = 0

    def __len__(self) -> int:
        return int(self.labels.size)

    @property
    def packed_nbytes(self) -> int:
        """Bytes of the upload bit-packed but before entropy coding (samples and info)."""
        n, d = self.samples.shape
        side = sum(b.nbytes for k, b in self.samples.buffers.items() if k != "codes")
        return int(packed_nbytes(n * d, int(self.samples.meta["bits"])) + side
                   + (self.info_nbits + 7) // 8)

    @property
    def payload_bits(self) -> int:
        """Analytic bits of the whole upload (codes, side info, labels, ids, weights, delta)."""
        comp = self.compensation.nbits if self.compensation is not None else 0
        return int(self.samples.nbits + self.info_nbits + comp)


def raw_array(arr: np.ndarray) -> Array:
    """Flat Flower ``Array`` carrying ``arr``'s bytes as they are (no ``np.save`` header)."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    return Array(dtype=str(flat.dtype), shape=(flat.size,), stype=_RAW, data=flat.tobytes())


def encode_batch(
    samples: Payload,
    labels: np.ndarray,
    ids: np.ndarray,
    weights: np.ndarray,
    num_classes: int,
    id_upper: int,
    compensation: Payload | None = None,
) -> tuple[RecordDict, int]:
    """Records of one upload and its exact payload bits.

    Weights are sent as one float when they are all equal, else one float32 per row.
    """
    n = int(labels.size)
    lw, iw = label_width(num_classes), width_for(max(id_upper, 1))
    w = np.asarray(weights, dtype=np.float32)
    if n and np.all(w == w[0]):
        w = w[:1]
    info = ArrayRecord(
        {
            "counts": raw_array(np.array([n, lw, iw, w.size], dtype=np.int64)),
            "labels": raw_array(pack(np.asarray(labels, dtype=np.uint8), lw) if lw <= 8
                           else pack_wide(labels, lw)),
            "ids": raw_array(pack_wide(np.asarray(ids), iw)),
            "weights": raw_array(w),
        }
    )
    info_nbits = 8 * (packed_nbytes(n, lw) + packed_nbytes(n, iw)) + 32 * w.size
    content = RecordDict({SAMPLES_KEY: samples.to_record(), INFO_KEY: info})
    if compensation is not None:
        content[COMPENSATION_KEY] = compensation.to_record()
    return content, int(samples.nbits + info_nbits + (compensation.nbits if compensation else 0))


def _raw_array(record: ArrayRecord, key: str, dtype: str, max_bytes: int) -> np.ndarray:
    if key not in record:
        raise PayloadError(f"sample-info misses {key!r}")
    arr = record[key]
    if arr.dtype != dtype:
        raise PayloadError(f"sample-info {key!r} is {arr.dtype}, expected {dtype}")
    if len(arr.data) > max_bytes or len(arr.data) % np.dtype(dtype).itemsize:
        raise PayloadError(f"sample-info {key!r} carries {len(arr.data)} bytes")
    return np.frombuffer(arr.data, dtype=dtype)


def decode_batch(
    content: RecordDict,
    num_classes: int,
    dim: int,
    bits: int,
    max_samples: int,
    id_upper: int | None = None,
) -> SampleBatch:
    """Parse and validate one upload; raise :class:`PayloadError` with the reason.

    Checks: records present, counts consistent with the samples payload, shape ``(n, dim)``
    with ``n <= max_samples``, the configured bit width, label range, unique ids within
    ``id_upper``, finite positive weights. Sizes are checked before anything is unpacked.
    """
    if SAMPLES_KEY not in content.array_records or INFO_KEY not in content.array_records:
        raise PayloadError(f"reply misses {SAMPLES_KEY!r} or {INFO_KEY!r}")
    samples = Payload.from_record(content.array_records[SAMPLES_KEY])
    if samples.codec != "uniform":
        raise PayloadError(f"samples were encoded with {samples.codec!r}, expected 'uniform'")
    if len(samples.shape) != 2 or samples.shape[1] != dim:
        raise PayloadError(f"samples have shape {samples.shape}, expected (n, {dim})")
    n = samples.shape[0]
    if n > max_samples:
        raise PayloadError(f"{n} samples exceed the budget of {max_samples}")
    if samples.meta.get("bits") != bits:
        raise PayloadError(f"samples use {samples.meta.get('bits')!r} bits, expected {bits}")
    info = content.array_records[INFO_KEY]
    counts = _raw_array(info, "counts", "int64", 32)
    if counts.size != 4:
        raise PayloadError("sample-info 'counts' must hold 4 values")
    count, lw, iw, wn = (int(v) for v in counts)
    if count != n:
        raise PayloadError(f"sample-info declares {count} samples, payload carries {n}")
    if lw != label_width(num_classes) or not 1 <= iw <= 32 or wn not in {1, n}:
        raise PayloadError(f"sample-info widths are inconsistent (labels {lw}, ids {iw})")
    labels_raw = _raw_array(info, "labels", "uint8", packed_nbytes(n, lw) if lw <= 8
                            else packed_nbytes(n, lw))
    ids_raw = _raw_array(info, "ids", "uint8", packed_nbytes(n, iw))
    weights = _raw_array(info, "weights", "float32", 4 * max(n, 1))
    try:
        labels = (unpack(labels_raw, lw, n) if lw <= 8 else unpack_wide(labels_raw, lw, n))
        ids = unpack_wide(ids_raw, iw, n)
    except ValueError as exc:
        raise PayloadError(str(exc)) from None
    labels = labels.astype(np.int64)
    if n and labels.max() >= num_classes:
        raise PayloadError(f"label {int(labels.max())} is out of range (num_classes={num_classes})")
    if np.unique(ids).size != n:
        raise PayloadError("duplicated sample ids")
    if id_upper is not None and n and ids.max() >= id_upper:
        raise PayloadError(f"sample id {int(ids.max())} is out of range")
    if weights.size != wn or not np.isfinite(weights).all() or (weights <= 0).any():
        raise PayloadError("sample weights must be finite and positive")
    weights = np.broadcast_to(weights, (n,)).astype(np.float32)
    compensation = None
    if COMPENSATION_KEY in content.array_records:
        compensation = Payload.from_record(content.array_records[COMPENSATION_KEY])
    info_nbits = 8 * (labels_raw.size + ids_raw.size) + 32 * wn
    return SampleBatch(samples, labels, ids, weights, compensation, info_nbits)
