"""Message layout of a DQ upload: quantized samples, labels, ids, weights, compensation.

Built by the client, validated by the server (:class:`~dq_flower.codecs.PayloadError` says
why). Each reply carries its data spec (:class:`DataSpec`, a ``data-spec`` record); the
server adopts the one most first replies carry and rejects replies that disagree.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.codecs.bitpack import packed_nbytes, unpack, unpack_wide
from dq_flower.codecs.payload import raw_array, read_raw
from dq_flower.wire.input_parts import NAN_KEY, parts_width, read_nan, target_width
from dq_flower.wire.ranges import ranges_from_record, ranges_record
from dq_flower.wire.targets import IGNORE_INDEX

__all__ = ["SAMPLES_KEY", "INFO_KEY", "COMPENSATION_KEY", "GRADIENT_KEY", "REFRESH_KEY",
           "SampleBatch", "label_width", "decode_batch", "raw_array", "RANGES_KEY",
           "payload_quantizer", "range_mode", "ranges_record", "ranges_from_record", "SPEC_KEY",
           "channels_last", "IGNORED_KEY", "DataSpec", "spec_record", "spec_from_record",
           "MAX_DIM", "MAX_VOCAB", "ID_VOCAB_KEY", "MIXED_UNITS_KEY", "expect_rows",
           "reply_spec", "DataReply", "read_reply", "as_float_targets", "REFERENCE_KEY",
           "REFERENCE_INFO_KEY"]

SAMPLES_KEY, INFO_KEY, COMPENSATION_KEY = "samples", "sample-info", "compensation"
GRADIENT_KEY = "gradient"  # a gradient round's reply
REFRESH_KEY = "refresh"  # a refreshed residual (compensation-mode refresh)
RANGES_KEY = "feature-ranges"  # a client's per-feature ranges (.ranges)
REFERENCE_KEY, REFERENCE_INFO_KEY = "reference-rows", "reference-rows-info"  # .reference_rows
#: Sample-info key, present where labels of ignored elements travel as the all-ones code.
IGNORED_KEY = "ignored-labels"


def width_for(upper: int) -> int:
    """Bits needed for values in ``[0, upper)`` (at least 1): ``ceil(log2 C)`` per label."""
    return max(1, int(upper - 1).bit_length())


label_width = width_for  # a class label's bits


@dataclass
class SampleBatch:
    """A client's upload for one round, decoded from packed form only where cheap."""

    samples: Payload  # ``uniform`` payload of the quantized rows
    labels: np.ndarray  # int64 class labels, or float32 targets (n,) / (n, k)
    ids: np.ndarray  # client-local sample ids (int64)
    weights: np.ndarray  # original samples each row stands for (1 / pi_i), float32
    compensation: Payload | None = None  # encoded compensation delta
    info_nbits: int = 0  # exact bits of labels, ids, weights and NaN mask as sent
    label_bits: int = 0  # bits per class label as sent (0: float targets)
    nan: np.ndarray | None = None  # bool (n, dim): where its flat rows hold NaN (as coded: lo)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def label_top(self, classes: int) -> int:
        """Most bits a label may take: ``classes``' (with ignored elements, one code more)."""
        return label_width(classes + bool((self.labels == IGNORE_INDEX).any()))

    @classmethod
    def empty(cls, bits: int, dim: int) -> SampleBatch:
        """No row: a reply with every row sent carries no samples record (nothing to decode)."""
        return cls(Payload("uniform", (0, int(dim)), {"bits": int(bits)}),
                   np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))

    @property
    def payload_bits(self) -> int:
        """Analytic bits of the whole upload (codes, side info, labels, ids, weights, delta)."""
        comp = self.compensation.nbits if self.compensation is not None else 0
        return int(self.samples.nbits + self.info_nbits + comp)


def _targets(info: ArrayRecord, n: int, lw: int, num_classes: int | None, target_dim: int,
             binary: bool, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """Decoded targets, their bits: class labels (``lw > 0``, ``shape`` a row), bits, floats."""
    if lw:
        if target_dim != math.prod(shape):
            raise PayloadError("class labels sent where float targets are expected")
        ignored = IGNORED_KEY in info  # its all-ones code: elements no loss reads
        if ignored and target_dim == 1:
            raise PayloadError("labels of ignored elements sent for one label a sample")
        top, count = label_width(num_classes + ignored) if num_classes else 16, n * target_dim
        if not 1 <= lw <= top:
            raise PayloadError(f"labels use {lw} bits; at most {top} expected")
        raw = read_raw(info, "labels", "uint8", packed_nbytes(count, lw))
        if raw.size != packed_nbytes(count, lw):
            raise PayloadError(f"sample-info 'labels' carries {raw.size} bytes; {count} "
                               f"labels of {lw} bits take {packed_nbytes(count, lw)}")
        labels = _unpacked(raw, lw, count).astype(np.int64).reshape(n, *shape)
        if ignored:
            labels[labels == (1 << lw) - 1] = IGNORE_INDEX
        if n and num_classes and labels.max() >= num_classes:
            raise PayloadError(f"label {int(labels.max())} is out of range "
                               f"(num_classes={num_classes})")
        return labels, 8 * raw.size
    if "targets" not in info:
        raise PayloadError("sample-info misses its 'targets'")
    dtype = info["targets"].dtype
    if binary and dtype == "uint8":  # 0/1 targets, one bit each
        raw = read_raw(info, "targets", dtype, packed_nbytes(n * target_dim, 1))
        if raw.size != packed_nbytes(n * target_dim, 1):
            raise PayloadError(f"{raw.size} bytes of 0/1 targets for {n} samples")
        bits = unpack(raw, 1, n * target_dim).astype(np.float32)
        return (bits.reshape(n, target_dim) if target_dim > 1 else bits), 8 * raw.size
    if dtype not in ("float16", "float32"):
        raise PayloadError(f"targets are {dtype}, expected float16 or float32")
    values = read_raw(info, "targets", dtype, n * target_dim * np.dtype(dtype).itemsize)
    if values.size != n * target_dim:
        raise PayloadError(f"{values.size} target values for {n} samples of width {target_dim}")
    if not np.isfinite(out := values.astype(np.float32)).all():
        raise PayloadError("targets must be finite")
    return (out.reshape(n, target_dim) if target_dim > 1 else out), 8 * values.nbytes


def decode_batch(content: RecordDict, num_classes: int | None, dim: int, bits: int,
                 max_samples: int, id_upper: int | None = None, target_dim: int = 1,
                 float_targets: bool = False, vocab: int = 0, binary: bool = False,
                 own_targets: bool = False, target_shape: tuple[int, ...] = ()) -> SampleBatch:
    """One upload parsed and checked, sizes before unpacking (else :class:`PayloadError`).

    Records, counts, shape ``(n, dim)``, ``n <= max_samples``, ``bits``, labels below
    ``num_classes`` (``target_shape`` a row; or finite float targets of width ``target_dim``;
    ``binary``: 0 or 1), unique ids below ``id_upper``, finite positive weights, a NaN mask
    (:func:`.read_nan`); ``vocab``: ids (not decoded).
    """
    if SAMPLES_KEY not in content.array_records or INFO_KEY not in content.array_records:
        raise PayloadError(f"reply misses {SAMPLES_KEY!r} or {INFO_KEY!r}")
    samples = Payload.from_record(content.array_records[SAMPLES_KEY])
    n = expect_rows(samples, "tokens" if vocab else "uniform", dim, max_samples)
    if not vocab and samples.meta.get("bits") != bits:
        raise PayloadError(f"samples use {samples.meta.get('bits')!r} bits, expected {bits}")
    info = content.array_records[INFO_KEY]
    lw, iw, wn = _counts(info, n, float_targets)
    if own_targets and "targets" in info:
        raise PayloadError("targets sent with samples that are their own targets")
    targets, target_bits = ((np.zeros(n, np.float32), 0) if own_targets else _targets(
        info, n, lw, num_classes, target_dim, binary, target_shape))
    if binary and not np.isin(targets, (0.0, 1.0)).all():
        raise PayloadError("binary targets must be 0 or 1")
    ids_raw, weights = (read_raw(info, "ids", "uint8", packed_nbytes(n, iw)),
                        read_raw(info, "weights", "float32", 4 * max(n, 1)))
    ids = _ids(ids_raw, iw, n, id_upper)
    if weights.size != wn or not np.isfinite(weights).all() or (weights <= 0).any():
        raise PayloadError("sample weights must be finite and positive")
    weights = np.broadcast_to(weights, (n,)).astype(np.float32)
    compensation = (Payload.from_record(content.array_records[COMPENSATION_KEY])
                    if COMPENSATION_KEY in content.array_records else None)
    holes, nan_bytes = read_nan(info, n, dim) if NAN_KEY in info else (None, 0)
    info_nbits = target_bits + 8 * (ids_raw.size + nan_bytes) + 32 * wn
    return SampleBatch(samples, targets, ids, weights, compensation, info_nbits, lw, holes)


def expect_rows(samples: Payload, codec: str, dim: int, max_samples: int,
                what: str = "samples") -> int:
    """The rows of a batch's payload: made by ``codec``, shape ``(n, dim)``, ``n`` in budget."""
    if samples.codec != codec:
        raise PayloadError(f"{what} were encoded with {samples.codec!r}, expected {codec!r}")
    if len(samples.shape) != 2 or samples.shape[1] != dim:
        raise PayloadError(f"{what} have shape {samples.shape}, expected (n, {dim})")
    if (n := int(samples.shape[0])) > max_samples:
        raise PayloadError(f"{n} {what} exceed the budget of {max_samples}")
    return n


def _counts(info: ArrayRecord, n: int, float_targets: bool) -> tuple[int, int, int]:
    """``(label width, id width, weight count)`` of sample-info, checked against ``n``."""
    counts = read_raw(info, "counts", "int64", 32)
    if counts.size != 4:
        raise PayloadError("sample-info 'counts' must hold 4 values")
    count, lw, iw, wn = counts.tolist()
    if count != n:
        raise PayloadError(f"sample-info declares {count} samples, payload carries {n}")
    if not 1 <= iw <= 32 or wn not in {1, n} or not 0 <= lw <= 32:
        raise PayloadError(f"sample-info widths are inconsistent (labels {lw}, ids {iw})")
    if float_targets == bool(lw):
        raise PayloadError("class labels sent where float targets are expected" if lw
                           else "float targets sent where class labels are expected")
    return lw, iw, wn


def _unpacked(raw: np.ndarray, width: int, n: int) -> np.ndarray:
    try:
        return unpack(raw, width, n) if width <= 8 else unpack_wide(raw, width, n)
    except ValueError as exc:
        raise PayloadError(str(exc)) from None


def _ids(raw: np.ndarray, iw: int, n: int, id_upper: int | None) -> np.ndarray:
    """The ``n`` sample ids packed at ``iw`` bits: unique, below ``id_upper`` where given."""
    ids = _unpacked(raw, iw, n)
    if np.unique(ids).size != n:
        raise PayloadError("duplicated sample ids")
    if id_upper is not None and n and ids.max() >= id_upper:
        raise PayloadError(f"sample id {int(ids.max())} is out of range")
    return ids


def sensor_window(sample_shape: tuple[int, ...]) -> bool:
    """Whether samples are windows of a few channels ``(C, L)`` or ``(L, C)``, ``1 < C <= L/4``."""
    return len(sample_shape) == 2 and 1 < min(sample_shape) <= max(sample_shape) // 4


def channels_last(sample_shape: tuple[int, ...]) -> bool:
    """Whether samples are windows ``(L, C)`` (:func:`sensor_window`), coded as ``(C, L)``."""
    return sensor_window(sample_shape) and sample_shape[1] < sample_shape[0]


def range_mode(ranges: str, sample_shape: tuple[int, ...], mixed_units: bool = False) -> str:
    """``auto``: ``channel`` for sensor windows, ``feature`` for flat or mixed units."""
    if ranges == "channel":
        return "channel" if len(sample_shape) in (2, 3) and sample_shape[0] > 1 else "sample"
    if ranges == "auto":  # windows: an accelerometer's gravity beside a gyroscope's turns
        return ("channel" if sensor_window(sample_shape) else
                "feature" if len(sample_shape) == 1 or mixed_units else "sample")
    return ranges


def payload_quantizer(p: Payload, bits: int, per_channel: int, fixed_range: bool = False,
                      last: bool = False):
    """The ``uniform`` decoder of ``p`` (``last``: channels last), its settings checked."""
    if (p.meta.get("bits") != bits or p.meta.get("per_channel", 0) != per_channel
            or bool(p.meta.get("fixed_range", False)) != fixed_range):
        raise PayloadError(f"samples use bits={p.meta.get('bits')!r}, "
                           f"per_channel={p.meta.get('per_channel')!r}, fixed_range="
                           f"{p.meta.get('fixed_range', False)!r}; expected {bits}, "
                           f"{per_channel}, {fixed_range}")
    seed, method = p.meta.get("dither_seed"), p.meta.get("entropy", "none")
    try:
        return _quantizer(bits, per_channel, seed, method if isinstance(method, str)
                          else "invalid", fixed_range, last)
    except (ValueError, TypeError) as exc:  # TypeError: a seed that cannot be a cache key
        raise PayloadError(f"samples carry invalid quantizer settings: {exc}") from None


@functools.lru_cache(maxsize=64, typed=True)  # typed: 1 and True build apart
def _quantizer(bits: int, per_channel: int, seed: object, method: str, fixed_range: bool,
               last: bool):
    """The ``uniform`` codec of these settings, built once (codecs are frozen)."""
    return make("uniform", bits=bits, per_channel=per_channel, dither_seed=seed,
                entropy=method, fixed_range=fixed_range, channels_last=last)


#: Record name of the data spec in a reply.
SPEC_KEY = "data-spec"
#: Round-config key: the vocabulary of the embedding the server's model reads samples with.
ID_VOCAB_KEY = "sample-vocab"
#: Spec field and round-config key (the server's pin, once it holds a spec): mixed units.
MIXED_UNITS_KEY = "mixed-units"
COLUMN_KEY = "target-column"  #: Spec field: :attr:`DataSpec.column`.
TARGET_SHAPE_KEY = "target-shape"  #: Spec field: :attr:`DataSpec.target_shape`.
#: Spec field of samples of several inputs: each one's layout (``f5``, ``i3``, ``f3x4``).
INPUT_PARTS_KEY = "input-parts"
TARGET_PARTS_KEY = "target-parts"  #: Spec field: :attr:`DataSpec.target_parts`.
#: Largest sample dimension accepted from a reply (2**24 coordinates, 64 MiB of float32).
MAX_DIM = 1 << 24
MAX_VOCAB = 1 << 24  #: Largest vocabulary of id samples (exact as float32 below 2**24).
TARGET_KINDS = ("class", "float", "binary", "tokens", "inputs")


@dataclass(frozen=True)
class DataSpec:
    """Sample shape and target kind of a federation's data.

    ``sample_shape``: one sample's, e.g. ``(1, 28, 28)``. ``target``: ``class`` (integer
    labels), ``float`` (regression), ``binary`` (floats all 0 or 1, scored on logits),
    ``tokens`` (windows of ids, their own targets: :mod:`.token_batch`) or ``inputs`` (the
    samples are their targets: none sent). ``target_dim``: values per target (``tokens``:
    the vocabulary; ``inputs``: the sample's). ``vocab``: samples of ids below it, sent
    exactly; 0: values, quantized. ``mixed_units``: samples (not flat) on scales one range
    a sample loses. ``inputs``: flat samples of several inputs side by side, each one's
    layout. ``column``: float targets held as ``(n, 1)`` (sent as ``(n,)``; not compared).
    ``target_shape``: a sample's class labels, ``target_dim`` of them (a mask ``(H, W)``).
    ``target_parts``: float targets a dict a sample, ``name=layout`` a part, side by side.
    """

    sample_shape: tuple[int, ...]
    target: str = "class"
    target_dim: int = 1
    vocab: int = 0
    mixed_units: bool = False
    inputs: tuple[str, ...] = ()
    column: bool = field(default=False, compare=False, repr=False)
    target_shape: tuple[int, ...] = ()
    target_parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.sample_shape or min(map(int, self.sample_shape)) < 1:
            raise ValueError(f"sample_shape must be positive sizes, got {self.sample_shape}")
        if self.target not in TARGET_KINDS:
            raise ValueError(f"target must be one of {TARGET_KINDS}, got {self.target!r}")
        if self.target_dim < 1:
            raise ValueError(f"target_dim must be >= 1, got {self.target_dim}")
        if self.target_shape and (self.target != "class" or len(self.target_shape) > 4 or {
                type(s) for s in self.target_shape} != {int} or min(self.target_shape) < 1
                                  or math.prod(self.target_shape) != self.target_dim):
            raise ValueError(f"target_shape {self.target_shape!r}: not {self.target_dim} class "
                             "labels a sample in at most 4 axes")
        if self.target_parts and (self.target not in ("float", "binary") or target_width(
                self.target_parts) != self.target_dim):
            raise ValueError(f"target parts {self.target_parts!r} do not lay out "
                             f"{self.target_dim} float targets a sample")
        if self.vocab and (self.target == "tokens" or not 2 <= self.vocab <= MAX_VOCAB):
            raise ValueError(f"vocab must be 0 or 2 to {MAX_VOCAB} for labelled samples, "
                             f"got {self.vocab}")
        if self.inputs and (len(self.sample_shape) != 1 or parts_width(self.inputs) != self.dim):
            raise ValueError(f"inputs {self.inputs!r} do not lay out the flat sample's "
                             f"{self.dim} values")

    @property
    def dim(self) -> int:
        """Coordinates per sample."""
        return int(math.prod(self.sample_shape))

    @property
    def channels_last(self) -> bool:
        """Sensor windows ``(L, C)``: coded as ``(C, L)`` where ranges go by channel."""
        return channels_last(self.sample_shape)

    @property
    def channels(self) -> int:
        """Channels of an image ``(C, H, W)`` or a window ``(C, L)``, ``(L, C)``; 0 for others."""
        shape = self.sample_shape
        return int(shape[channels_last(shape)]) if len(shape) in (2, 3) else 0

    def __str__(self) -> str:
        """As messages name it: ``samples (7,) as f3 + i4, class targets``."""
        per = (self.target_shape if self.target_shape else self.target_dim
               if self.target_dim > 1 and self.target != "tokens" else None)
        return (f"samples {self.sample_shape}" + f" of ids below {self.vocab}" * bool(self.vocab)
                + f" as {' + '.join(self.inputs)}" * bool(self.inputs)
                + f", {self.target} targets" + (f" ({per} a sample)" if per else ""))


def spec_record(spec: DataSpec) -> ConfigRecord:
    """The spec as it travels in a reply (``vocab`` only for id samples)."""
    record = ConfigRecord({"sample-shape": [int(s) for s in spec.sample_shape],
                           "target": spec.target, "target-dim": int(spec.target_dim)})
    extra: dict[str, Any] = {"vocab": int(spec.vocab), INPUT_PARTS_KEY: list(spec.inputs),
                             MIXED_UNITS_KEY: spec.mixed_units, COLUMN_KEY: spec.column,
                             TARGET_SHAPE_KEY: [int(s) for s in spec.target_shape],
                             TARGET_PARTS_KEY: list(spec.target_parts)}
    record.update({k: v for k, v in extra.items() if v})  # those set
    return record


def spec_from_record(record: ConfigRecord | None) -> DataSpec:
    """Parse a reply's spec; raise :class:`PayloadError` with the reason when malformed."""
    if record is None:
        raise PayloadError(f"reply misses its {SPEC_KEY!r} record")
    shape, target, tdim = (record.get(k) for k in ("sample-shape", "target", "target-dim"))
    if (not isinstance(shape, list) or not 1 <= len(shape) <= 8
            or not all([type(s) is int and s >= 1 for s in shape])):
        raise PayloadError(f"data-spec 'sample-shape'={shape!r} is not a list of sizes")
    if (size := math.prod(cast(list[int], shape))) > MAX_DIM:
        raise PayloadError(f"data-spec sample of {size} values exceeds {MAX_DIM}")
    if target not in TARGET_KINDS:
        raise PayloadError(f"data-spec 'target'={target!r} is not one of {TARGET_KINDS}")
    if not isinstance(tdim, int) or isinstance(tdim, bool) or not 1 <= tdim <= 1 << 16:
        raise PayloadError(f"data-spec 'target-dim'={tdim!r} is not a positive int")
    vocab = record.get("vocab", 0)
    if type(vocab) is not int or (vocab and (target == "tokens" or not 2 <= vocab <= MAX_VOCAB)):
        raise PayloadError(f"data-spec 'vocab'={vocab!r}: not 2 to {MAX_VOCAB} ids, labelled")
    mixed, inputs = record.get(MIXED_UNITS_KEY, False), record.get(INPUT_PARTS_KEY, [])
    if type(mixed) is not bool:
        raise PayloadError(f"data-spec {MIXED_UNITS_KEY!r}={mixed!r} is not a bool")
    column = record.get(COLUMN_KEY) is True and target in ("float", "binary") and tdim == 1
    try:
        return DataSpec(tuple(cast(list[int], shape)), target, tdim, vocab, mixed,
                        tuple(cast(list, inputs)), column,
                        tuple(cast(list, record.get(TARGET_SHAPE_KEY, []))),
                        tuple(cast(list, record.get(TARGET_PARTS_KEY, []))))
    except (ValueError, TypeError) as exc:  # the input parts' own say so by their key
        key = f" {INPUT_PARTS_KEY!r}" if inputs and "input" in str(exc) else ""
        raise PayloadError(f"data-spec{key}: {exc}") from None


@dataclass(frozen=True)
class DataReply:
    """A data reply's checked records (token windows, :mod:`.token_batch`: the spec alone)."""

    spec: DataSpec
    mode: str = "sample"  # range mode: sample, channel or feature
    batch: SampleBatch | None = None
    decoder: Any = None  # the ``uniform`` codec of its samples (:func:`payload_quantizer`)
    ranges: tuple[np.ndarray, ...] | None = None  # its feature ranges (lo, span[, scale])


def read_reply(content: RecordDict, known: DataSpec | None, ranges: str, bits: int,
               num_classes: int | None, max_samples: int, id_upper: int) -> DataReply:
    """A reply's records checked (sizes first), not decoded; ``known``: the spec it carries."""
    if extra := set(content.array_records) - {SAMPLES_KEY, INFO_KEY, COMPENSATION_KEY,
                                              REFRESH_KEY, RANGES_KEY, REFERENCE_KEY,
                                              REFERENCE_INFO_KEY}:
        raise PayloadError(f"reply carries {len(extra)} unknown records: {min(extra)[:40]!r}...")
    sent, spec = _specs(content, known)
    if spec.target == "tokens":
        return DataReply(spec)
    batch = decode_batch(content, num_classes if known is not None else None, spec.dim, bits,
                         max_samples, id_upper, spec.target_dim, spec.target != "class",
                         spec.vocab, sent.target == "binary", spec.target == "inputs",
                         spec.target_shape)
    if spec.vocab:  # id samples: their stream is decoded by .token_batch.decode_windows
        return DataReply(spec, "sample", batch)
    mode = range_mode(ranges, spec.sample_shape, spec.mixed_units)
    decoder = payload_quantizer(batch.samples, bits, spec.channels if mode == "channel" else 0,
                                mode == "feature", mode == "channel" and spec.channels_last)
    record = content.array_records.get(RANGES_KEY) if mode == "feature" else None
    return DataReply(spec, mode, batch, decoder,
                     None if record is None else ranges_from_record(record, spec.dim))


def reply_spec(content: RecordDict, known: DataSpec | None) -> DataSpec:
    """The reply's data spec: ``known`` where the server has one (or 0/1 floats beside it)."""
    return _specs(content, known)[1]


def _specs(content: RecordDict, known: DataSpec | None) -> tuple[DataSpec, DataSpec]:
    """The reply's data spec as sent and as the federation reads it (:func:`reply_spec`)."""
    spec = spec_from_record(content.config_records.get(SPEC_KEY))
    if known is None or spec == known:
        return spec, spec
    if as_float_targets([spec, known])[0] != known:
        raise PayloadError(f"reply's data ({spec}) differs from the federation's ({known})")
    return spec, known


def as_float_targets(specs: Sequence[DataSpec | None]) -> list[DataSpec | None]:
    """``specs``, each of ``binary`` targets read as ``float`` where another is that one's.

    0/1 float targets are float targets that happen to be 0 or 1 (a site logging single
    trials beside sites logging shares of several): beside the same spec's float targets
    they join them (their rows decode to floats 0 and 1) where they were refused every round.
    """
    floats = {s for s in specs if s is not None and s.target == "float"}
    return [replace(s, target="float") if s is not None and s.target == "binary"
            and replace(s, target="float") in floats else s for s in specs]
